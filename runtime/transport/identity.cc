#include "transport/identity.h"

#include <openssl/evp.h>

#include <cstdint>

#include "absl/status/status.h"

namespace longhaul {
namespace {

// `label` and each part, each preceded by its length as 8 bytes little-endian: no two different
// inputs encode alike.
std::string Message(absl::string_view label, std::initializer_list<absl::string_view> parts) {
  std::string msg;
  auto put = [&msg](absl::string_view s) {
    uint64_t n = s.size();
    for (int i = 0; i < 8; ++i, n >>= 8) msg.push_back(static_cast<char>(n & 0xff));
    msg.append(s.data(), s.size());
  };
  put(label);
  for (absl::string_view p : parts) put(p);
  return msg;
}

const unsigned char* Bytes(absl::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

}  // namespace

void WorkerKey::Free::operator()(void* key) const { EVP_PKEY_free(static_cast<EVP_PKEY*>(key)); }

absl::StatusOr<WorkerKey> WorkerKey::Generate() {
  EVP_PKEY* pkey = nullptr;
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr),
                                                                   EVP_PKEY_CTX_free);
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &pkey) != 1) {
    return absl::InternalError("cannot make this worker's Ed25519 key pair (OpenSSL)");
  }
  WorkerKey key;
  key.key_.reset(pkey);
  key.public_key_.resize(kPublicKeyBytes);
  size_t n = kPublicKeyBytes;
  if (EVP_PKEY_get_raw_public_key(pkey, reinterpret_cast<unsigned char*>(key.public_key_.data()), &n) != 1 ||
      n != kPublicKeyBytes) {
    return absl::InternalError("cannot read this worker's Ed25519 public key (OpenSSL)");
  }
  return key;
}

std::string WorkerKey::Sign(absl::string_view label, std::initializer_list<absl::string_view> parts) const {
  const std::string msg = Message(label, parts);
  std::string sig(kSignatureBytes, '\0');
  size_t n = sig.size();
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  // Ed25519 signs the message whole (no digest first): EVP_DigestSign in one call.
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, static_cast<EVP_PKEY*>(key_.get())) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &n, Bytes(msg), msg.size()) != 1) {
    return std::string();  // verifies nowhere: the peer refuses it, naming the proof
  }
  return sig;
}

bool VerifySignature(absl::string_view public_key, absl::string_view signature, absl::string_view label,
                     std::initializer_list<absl::string_view> parts) {
  if (public_key.size() != kPublicKeyBytes || signature.size() != kSignatureBytes) return false;
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, Bytes(public_key), public_key.size()), EVP_PKEY_free);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!pkey || !ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey.get()) != 1) return false;
  const std::string msg = Message(label, parts);
  return EVP_DigestVerify(ctx.get(), Bytes(signature), signature.size(), Bytes(msg), msg.size()) == 1;
}

}  // namespace longhaul
