#pragma once
// The coordinator's gRPC port, authenticated: every call carries, in its metadata, a proof that the
// caller holds the job secret (job_secret.h) over the method, the request's bytes, the time and a
// fresh nonce. The coordinator checks it before it acts on the request, refuses a call more than
// kRpcClockSkewS from its own clock, and remembers the nonces it accepted for twice that long, so a
// recorded call replayed is refused as well. With TLS (optional, the user's certificates through
// gRPC's own credentials) the channel is encrypted too, and with a CA on the coordinator's side
// only clients with a certificate that CA signed connect at all (mutual TLS). Before any of that,
// the port is a gate (coordinator_gate.h): a connection reaches gRPC only once it proved the job
// secret, so gRPC never buffers a stranger's bytes.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <functional>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message.h"
#include "transport/coordinator_gate.h"
#include "transport/identity.h"
#include "transport/job_secret.h"

namespace longhaul {

inline constexpr char kRpcAuthKey[] = "longhaul-auth";
// A worker's call also carries its signature (transport/identity.h) over the method, the request's
// bytes, a time and a nonce of its own: the job secret proves that the caller is of the job, the
// signature which worker it is.
inline constexpr char kRpcWorkerKey[] = "longhaul-worker";
inline constexpr double kRpcClockSkewS = 300;

// PEM files; all empty: plaintext.
struct TlsFiles {
  std::string cert, key;  // this side's certificate and key (the coordinator's: required for TLS)
  std::string ca;         // the CA that signed the other side (coordinator: require client certificates)
  bool enabled() const { return !cert.empty() || !ca.empty(); }
};

// A channel to the coordinator at `address` ("host:port") through its gate, whose every call is
// signed with `secret`, and with `key` where one is given (a worker's); over TLS where `tls` names
// files (the CA to trust the coordinator by, and for mutual TLS this side's certificate). Its
// connections go through a GateForwarder the channel keeps for as long as it lives. A call that
// fails because the gate does not hold `secret` fails UNAUTHENTICATED, saying so.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(const std::string& address, const JobSecret& secret,
                                                                  const TlsFiles& tls, grpc::ChannelArguments args,
                                                                  std::shared_ptr<const WorkerKey> key = nullptr);
// The same channel without the calls' signatures: for tools and tests that write a call's
// metadata themselves (SignCall).
absl::StatusOr<std::shared_ptr<grpc::Channel>> UnsignedCoordinatorChannel(const std::string& address,
                                                                          const JobSecret& secret, const TlsFiles& tls,
                                                                          grpc::ChannelArguments args);

// The coordinator's listening credentials: plaintext, TLS, or mutual TLS (tls.ca set).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CoordinatorCredentials(const TlsFiles& tls);

// A gRPC server behind a gate: gRPC listens on a Unix socket in a private directory, and the gate
// on the public address relays to it the connections that prove the job secret.
class CoordinatorServer {
 public:
  // Serves `service` (which must outlive the server) with `credentials` behind a gate on `listen`
  // ("host:port"; port 0 picks one) that admits holders of `secret`.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const std::string& listen, const JobSecret& secret,
                                                                  std::shared_ptr<grpc::ServerCredentials> credentials,
                                                                  grpc::Service* service);
  // Shuts the server down at once (where Shutdown did not), then the gate.
  ~CoordinatorServer();
  // Stops the server: calls still running get until `deadline`.
  void Shutdown(std::chrono::system_clock::time_point deadline = std::chrono::system_clock::now());
  // The gate's "host:port" and port.
  const std::string& address() const { return gate_->address(); }
  int port() const { return gate_->port(); }
  const CoordinatorGate& gate() const { return *gate_; }

 private:
  CoordinatorServer() = default;
  std::unique_ptr<PrivateSocketPath> socket_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorGate> gate_;
};

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
  // OK where the call carries a fresh signature (kRpcWorkerKey) of the key `public_key`, which
  // worker `worker` registered; else UNAUTHENTICATED naming what is wrong: a process of the job
  // speaking for another worker, a forgery, or a replay.
  grpc::Status CheckWorker(const grpc::ServerContext& ctx, absl::string_view method,
                           const google::protobuf::Message& request, int worker, absl::string_view public_key)
      ABSL_LOCKS_EXCLUDED(mu_);
  const JobSecret& secret() const { return secret_; }
  // Calls refused so far.
  int64_t refused() const { return refused_.load(); }

 private:
  // A call signed at `when` (unix ms) with `nonce`: refused (`refuse`'s status) where that is too
  // far from this clock, or where the nonce came before within the replay window.
  grpc::Status Fresh(int64_t when, const std::string& nonce,
                     const std::function<grpc::Status(const std::string&, absl::string_view)>& refuse)
      ABSL_LOCKS_EXCLUDED(mu_);

  const JobSecret secret_;
  std::atomic<int64_t> refused_{0};  // counted by every call, read by the metrics
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);  // nonces accepted within the replay window
  std::deque<std::pair<int64_t, std::string>> aged_ ABSL_GUARDED_BY(mu_);  // (unix_ms, nonce), oldest first
};

}  // namespace longhaul
