#pragma once
// The coordinator's gRPC port, authenticated: every call carries, in its metadata, a proof that the
// caller holds the job secret (job_secret.h) over the method, the request's bytes, the time and a
// fresh nonce. The coordinator checks it before it acts on the request, refuses a call more than
// kRpcClockSkewS from its own clock, and remembers the nonces it accepted for twice that long, so a
// recorded call replayed is refused as well. With TLS (optional, the user's certificates through
// gRPC's own credentials) the channel is encrypted too, and with a CA on the coordinator's side
// only clients with a certificate that CA signed connect at all (mutual TLS).
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message.h"
#include "transport/job_secret.h"

namespace longhaul {

inline constexpr char kRpcAuthKey[] = "longhaul-auth";
inline constexpr double kRpcClockSkewS = 300;

// PEM files; all empty: plaintext.
struct TlsFiles {
  std::string cert, key;  // this side's certificate and key (the coordinator's: required for TLS)
  std::string ca;         // the CA that signed the other side (coordinator: require client certificates)
  bool enabled() const { return !cert.empty() || !ca.empty(); }
};

// A channel to the coordinator whose every call is signed with `secret`; over TLS where `tls`
// names files (the CA to trust the coordinator by, and for mutual TLS this side's certificate).
absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(const std::string& address, const JobSecret& secret,
                                                                  const TlsFiles& tls, grpc::ChannelArguments args);

// The coordinator's listening credentials: plaintext, TLS, or mutual TLS (tls.ca set).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CoordinatorCredentials(const TlsFiles& tls);

// The metadata value a call of `method` ("/longhaul.proto.Coordinator/Register") with `request`
// carries at `unix_ms`.
std::string SignCall(const JobSecret& secret, absl::string_view method, const google::protobuf::Message& request,
                     int64_t unix_ms, absl::string_view nonce);

// Checks the coordinator's incoming calls. Without a secret it checks nothing (there is nothing to
// prove; RunCoordinator says so when it starts).
class RpcVerifier {
 public:
  explicit RpcVerifier(JobSecret secret) : secret_(std::move(secret)) {}
  // OK, or UNAUTHENTICATED naming what is wrong and the fix. `method` is the short name ("Register").
  grpc::Status Check(const grpc::ServerContext& ctx, absl::string_view method, const google::protobuf::Message& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  const JobSecret& secret() const { return secret_; }
  // Calls refused so far.
  int64_t refused() const { return refused_.load(); }

 private:
  const JobSecret secret_;
  std::atomic<int64_t> refused_{0};  // counted without the lock
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);  // nonces accepted within the replay window
  std::deque<std::pair<int64_t, std::string>> aged_ ABSL_GUARDED_BY(mu_);  // (unix_ms, nonce), oldest first
};

}  // namespace longhaul
