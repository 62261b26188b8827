#pragma once
// The coordinator's public port is a gate: gRPC buffers what a connection sends (HTTP/2 headers,
// messages) before any handler can check the call's proof of the job secret, so a stranger could
// make the coordinator hold hundreds of MiB, and gRPC's allocator kept them after the connection
// closed. The gate accepts the TCP connections and relays a connection's bytes to the
// coordinator's gRPC server, which listens only on a Unix socket in a private directory, once the
// client proved it holds the job secret in a handshake of a few bytes:
//
//   client -> gate:  "LHC1", the protocol version (u32 little-endian), the client's nonce (32 bytes)
//   gate -> client:  the gate's nonce (32 bytes), GateProof over both nonces (32 bytes)
//   client -> gate:  ClientProof over both nonces (32 bytes)
//
// after which both directions carry the gRPC connection's bytes unchanged (TLS included, end to
// end). A gate that does not prove the client's secret is left at once, and the client never
// proves its own to it; the gate reads nothing after a hello that is not this protocol's, a wrong
// proof or a silence, and closes the connection. Without a job secret both sides use the empty key
// (job_secret.h): anyone passes, as anyone could call before.
//
// The client side is a GateForwarder: gRPC channels need an address to connect to, so a channel to
// the coordinator connects to a forwarder in its own process (a Unix socket of a random name in
// the abstract namespace, which serves this process alone and leaves nothing on disk), which
// dials the gate, proves the secret, and relays; gRPC's reconnections go through it the same way,
// each dialing anew.
//
// Bounds before a connection proved the secret: kMaxGateHandshakes connections at once (a newer one
// closes the oldest), each holding at most kGateHelloBytes + kProofBytes of it for at most
// kGateHandshakeTimeout. After: kMaxGateConnections relayed at once, each with a buffer of
// kGateBufferBytes per direction.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "transport/job_secret.h"
#include "transport/relay_loop.h"

namespace longhaul {

inline constexpr char kGateMagic[4] = {'L', 'H', 'C', '1'};
inline constexpr uint32_t kGateVersion = 1;
inline constexpr size_t kGateHelloBytes = 4 + 4 + kNonceBytes;
inline constexpr size_t kGateChallengeBytes = kNonceBytes + kProofBytes;
inline constexpr int kMaxGateHandshakes = 1024;
inline constexpr int kMaxGateConnections = 1024;
inline constexpr size_t kGateBufferBytes = 64 << 10;
inline constexpr auto kGateHandshakeTimeout = std::chrono::seconds(10);

// Each side's proof of the job secret over both nonces; labelled apart (JobSecret::Proof), so that
// neither can stand for the other, nor for a tensor port's.
std::string GateProof(const JobSecret& secret, absl::string_view client_nonce, absl::string_view gate_nonce);
std::string ClientProof(const JobSecret& secret, absl::string_view client_nonce, absl::string_view gate_nonce);

class CoordinatorGate {
 public:
  // Listens on `address` ("host:port"; port 0 picks a free one) and relays each connection that
  // proves `secret` to the Unix socket at `backend`.
  static absl::StatusOr<std::unique_ptr<CoordinatorGate>> Start(const std::string& address, const JobSecret& secret,
                                                                const std::string& backend);
  // "host:port" bound.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // Connections in their handshake now, relayed now, and closed before they proved the secret.
  int handshaking() const { return loop_->pending(); }
  int relayed() const { return loop_->relayed(); }
  int64_t refused() const { return loop_->turned_away(); }

 private:
  CoordinatorGate() = default;
  std::string address_;
  int port_ = 0;
  std::unique_ptr<RelayLoop> loop_;
};

class GateForwarder {
 public:
  // Serves a Unix socket whose connections, from this process only, it relays to the gate at
  // `address` ("host:port"), each after proving `secret` there.
  static absl::StatusOr<std::unique_ptr<GateForwarder>> Start(const std::string& address, JobSecret secret);
  // The socket, as a gRPC target: "unix-abstract:NAME".
  std::string target() const { return "unix-abstract:" + name_; }
  // Why the gate at `address` was left at the last handshake (it does not hold this secret), or
  // empty where the last handshake that got that far proved it.
  std::string refusal() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Handshake;
  GateForwarder(std::string address, JobSecret secret) : address_(std::move(address)), secret_(std::move(secret)) {}
  void SetRefusal(std::string why) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string address_;
  const JobSecret secret_;
  std::string name_;  // of the socket, in the abstract namespace
  mutable absl::Mutex mu_;
  std::string refusal_ ABSL_GUARDED_BY(mu_);  // set by the loop's thread, read by any
  std::unique_ptr<RelayLoop> loop_;           // last: stopped before what its handshakes use goes
};

}  // namespace longhaul
