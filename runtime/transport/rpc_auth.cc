#include "transport/rpc_auth.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "longhaul.grpc.pb.h"

namespace longhaul {
namespace {

// What a call's metadata proves: the secret, over the call's method, time (as the metadata writes
// it), nonce and request bytes.
std::string CallProof(const JobSecret& secret, absl::string_view method, absl::string_view when,
                      absl::string_view nonce, const google::protobuf::Message& request) {
  return secret.Proof("longhaul coordinator call", {method, when, nonce, Sha256(request.SerializeAsString())});
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read the TLS %s %s", what, path));
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrFormat("the TLS %s %s is not a PEM file", what, path));
  }
  return text.str();
}

// This side's certificate and key (--tls-cert, --tls-key), read.
absl::StatusOr<grpc::SslServerCredentialsOptions::PemKeyCertPair> ReadKeyPair(const TlsFiles& tls) {
  absl::StatusOr<std::string> cert = ReadPem(tls.cert, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key, "key");
  if (!key.ok()) return key.status();
  return grpc::SslServerCredentialsOptions::PemKeyCertPair{*key, *cert};
}

// Signs each call as it leaves: a unary call's initial metadata and its message go out in one
// batch, so both are at hand here.
class SignInterceptor : public grpc::experimental::Interceptor {
 public:
  SignInterceptor(const JobSecret& secret, std::string method) : secret_(secret), method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* batch) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (batch->QueryInterceptionHookPoint(Hook::PRE_SEND_INITIAL_METADATA) &&
        batch->QueryInterceptionHookPoint(Hook::PRE_SEND_MESSAGE)) {
      const auto* request = static_cast<const google::protobuf::Message*>(batch->GetSendMessage());
      absl::StatusOr<std::string> nonce = RandomNonce();
      // Without a nonce (the random source failed) the call goes unsigned and the coordinator says why.
      if (request != nullptr && nonce.ok()) {
        batch->GetSendInitialMetadata()->insert({kRpcAuthKey, SignCall(secret_, method_, *request, UnixMs(), *nonce)});
      }
    }
    batch->Proceed();
  }

 private:
  const JobSecret& secret_;
  const std::string method_;
};

class SignFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SignFactory(JobSecret secret) : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo* info) override {
    return new SignInterceptor(secret_, info->method());
  }

 private:
  const JobSecret secret_;  // the channel owns its factories, and they outlive every call
};

}  // namespace

std::string SignCall(const JobSecret& secret, absl::string_view method, const google::protobuf::Message& request,
                     int64_t unix_ms, absl::string_view nonce) {
  const std::string when = absl::StrCat(unix_ms);
  return absl::StrCat(when, ".", absl::BytesToHexString(nonce), ".",
                      absl::BytesToHexString(CallProof(secret, method, when, nonce, request)));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(const std::string& address, const JobSecret& secret,
                                                                  const TlsFiles& tls, grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (tls.enabled()) {
    grpc::SslCredentialsOptions ssl;
    if (tls.ca.empty()) return absl::InvalidArgumentError("TLS to the coordinator needs --tls-ca: the CA that signed its certificate");
    absl::StatusOr<std::string> ca = ReadPem(tls.ca, "CA certificate");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!tls.cert.empty() || !tls.key.empty()) {
      auto pair = ReadKeyPair(tls);
      if (!pair.ok()) return pair.status();
      ssl.pem_cert_chain = pair->cert_chain;
      ssl.pem_private_key = pair->private_key;
    }
    creds = grpc::SslCredentials(ssl);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<SignFactory>(secret));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args, std::move(interceptors));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CoordinatorCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("a coordinator with TLS needs --tls-cert and --tls-key (deploy/make_certs.sh makes them)");
  }
  auto pair = ReadKeyPair(tls);
  if (!pair.ok()) return pair.status();
  grpc::SslServerCredentialsOptions ssl(tls.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                       : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_key_cert_pairs.push_back(*pair);
  if (!tls.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(tls.ca, "CA certificate");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  return grpc::SslServerCredentials(ssl);
}

grpc::Status RpcVerifier::Check(const grpc::ServerContext& ctx, absl::string_view method,
                                const google::protobuf::Message& request) {
  if (!secret_.set()) return grpc::Status::OK;
  auto refuse = [&](const std::string& why,
                    absl::string_view fix = "; start every process of the job with the same --secret-file") {
    ++refused_;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, absl::StrCat("refused ", method, ": ", why, fix));
  };
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kRpcAuthKey);
  if (it == md.end()) return refuse("the call carries no proof of the job secret");
  const std::vector<absl::string_view> f = absl::StrSplit(absl::string_view(it->second.data(), it->second.size()), '.');
  int64_t when = 0;
  if (f.size() != 3 || !absl::SimpleAtoi(f[0], &when) || f[1].size() != 2 * kNonceBytes ||
      f[2].size() != 2 * kProofBytes) {
    return refuse("its proof of the job secret is malformed");
  }
  const std::string nonce = absl::HexStringToBytes(f[1]), proof = absl::HexStringToBytes(f[2]);
  const std::string full = absl::StrCat("/", proto::Coordinator::service_full_name(), "/", method);
  if (!ProofsEqual(proof, CallProof(secret_, full, f[0], nonce, request))) {
    return refuse("it does not prove the job secret this coordinator holds");
  }
  const int64_t now = UnixMs();
  const double skew_s = std::abs(static_cast<double>(now - when)) / 1e3;
  if (skew_s > kRpcClockSkewS) {
    return refuse(absl::StrFormat("it was signed %.0f s away from this coordinator's clock (at most %.0f s): a replay, "
                                  "or a clock to set right (NTP)",
                                  skew_s, kRpcClockSkewS),
                  "");
  }
  absl::MutexLock lock(&mu_);
  const int64_t forget_before = now - static_cast<int64_t>(2e3 * kRpcClockSkewS);
  while (!aged_.empty() && aged_.front().first < forget_before) {
    seen_.erase(aged_.front().second);
    aged_.pop_front();
  }
  if (!seen_.insert(nonce).second) return refuse("it repeats an earlier call (a replay)", "");
  aged_.emplace_back(now, nonce);
  return grpc::Status::OK;
}

}  // namespace longhaul
