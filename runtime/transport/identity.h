#pragma once
// A worker's identity: an Ed25519 key pair it makes when it starts. The job secret proves that a
// process belongs to the job; the key proves which worker it is. The public key is registered with
// the coordinator and travels to the peers in the plan; the private key never leaves the process.
// A proof is a signature over a label and the parts of what is proved (length-prefixed, as
// JobSecret::Proof's), so nothing secret crosses a link, with or without TLS, and a proof made for
// one purpose (a call, a tensor hello) cannot stand for another.
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace longhaul {

inline constexpr size_t kPublicKeyBytes = 32;
inline constexpr size_t kSignatureBytes = 64;

class WorkerKey {
 public:
  // A fresh key pair from the system's random source.
  static absl::StatusOr<WorkerKey> Generate();

  // The raw 32-byte Ed25519 public key.
  const std::string& public_key() const { return public_key_; }
  // The 64-byte signature over `label` and `parts`.
  std::string Sign(absl::string_view label, std::initializer_list<absl::string_view> parts) const;

 private:
  struct Free {
    void operator()(void* key) const;
  };
  std::unique_ptr<void, Free> key_;  // EVP_PKEY
  std::string public_key_;
};

// Whether `signature` is the signature of the key `public_key` over `label` and `parts`; false for
// a key or signature of the wrong size.
bool VerifySignature(absl::string_view public_key, absl::string_view signature, absl::string_view label,
                     std::initializer_list<absl::string_view> parts);

}  // namespace longhaul
