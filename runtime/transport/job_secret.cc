#include "transport/job_secret.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {
namespace {

void PutLength(std::string& out, size_t n) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
}

}  // namespace

absl::StatusOr<JobSecret> JobSecret::Load(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat(
        "cannot read the job secret file %s: %s; make one with `longhaul secret %s` and give every process of the job "
        "the same file",
        path, std::strerror(errno), path));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "the job secret file %s may be read by others (mode %o); run `chmod 600 %s`", path, st.st_mode & 0777, path));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  std::string key = text.str();
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (key.size() < kMinSecretBytes || key.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the job secret file %s holds %d bytes; a secret has %d to %d (`longhaul secret %s` makes one)",
                        path, key.size(), kMinSecretBytes, kMaxSecretBytes, path));
  }
  JobSecret s;
  s.key_ = std::move(key);
  s.source_ = path;
  return s;
}

absl::StatusOr<JobSecret> JobSecret::FromFlagOrEnv(const std::string& path) {
  if (!path.empty()) return Load(path);
  const char* env = std::getenv("LONGHAUL_SECRET_FILE");
  if (env != nullptr && *env != '\0') return Load(env);
  return JobSecret();
}

absl::Status JobSecret::WriteNew(const std::string& path) {
  absl::StatusOr<std::string> key = RandomNonce();
  if (!key.ok()) return key.status();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create %s: %s (an existing secret is never overwritten)", path, std::strerror(errno)));
  }
  const std::string text = absl::StrCat(absl::BytesToHexString(*key), "\n");
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok) return absl::DataLossError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string JobSecret::Proof(absl::string_view label, std::initializer_list<absl::string_view> parts) const {
  std::string msg;
  PutLength(msg, label.size());
  msg.append(label.data(), label.size());
  for (absl::string_view p : parts) {
    PutLength(msg, p.size());
    msg.append(p.data(), p.size());
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  // An empty key is HMAC's all-zero key: valid, and what every process without a secret uses.
  static const unsigned char kNoKey = 0;
  HMAC(EVP_sha256(), key_.empty() ? &kNoKey : reinterpret_cast<const unsigned char*>(key_.data()),
       static_cast<int>(key_.size()), reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

absl::StatusOr<std::string> RandomNonce() {
  std::string n(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    return absl::InternalError("the system's random source failed (OpenSSL RAND_bytes)");
  }
  return n;
}

bool ProofsEqual(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string Sha256(absl::string_view bytes) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), out);
  return std::string(reinterpret_cast<char*>(out), sizeof(out));
}

}  // namespace longhaul
