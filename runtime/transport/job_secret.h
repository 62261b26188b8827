#pragma once
// The job secret: a key every process of a job holds (read from a file the user distributes, never
// from the config, which travels in the plan) and that never crosses the network. Each side proves
// it holds the key with HMAC-SHA256 over fresh nonces (tensor ports, tensor_transport.h) or over
// the call, a timestamp and a nonce (the coordinator's gRPC port, rpc_auth.h), so a captured
// exchange is worth nothing to whoever replays it.
//
// A job without a secret file uses the empty key: the protocol is the same, and anyone can
// compute the proofs (the coordinator says so when it starts). A process with a secret and one
// without refuse each other, naming the file.
#include <cstddef>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace longhaul {

inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256

class JobSecret {
 public:
  JobSecret() = default;  // the empty key: no secret
  // The file's bytes, a trailing newline dropped; 16 to 4096 bytes. A file that others than its
  // owner may read is refused: the secret would not be secret.
  static absl::StatusOr<JobSecret> Load(const std::string& path);
  // `path` if set, else $LONGHAUL_SECRET_FILE if set, else no secret.
  static absl::StatusOr<JobSecret> FromFlagOrEnv(const std::string& path);
  // Writes 32 random bytes, hex-encoded, to a new file readable by its owner alone.
  static absl::Status WriteNew(const std::string& path);

  bool set() const { return !key_.empty(); }
  // Where it came from, for messages: the file, or "no secret file".
  const std::string& source() const { return source_; }
  // HMAC-SHA256 over `label` and each part, each preceded by its length (so no two different
  // inputs hash alike).
  std::string Proof(absl::string_view label, std::initializer_list<absl::string_view> parts) const;

 private:
  std::string key_, source_ = "no secret file";
};

// kNonceBytes from the system's random source.
absl::StatusOr<std::string> RandomNonce();
// Compares two proofs in time that does not depend on where they differ.
bool ProofsEqual(absl::string_view a, absl::string_view b);
std::string Sha256(absl::string_view bytes);

}  // namespace longhaul
