#include "transport/rpc_auth.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "transport/socket_io.h"
#include "longhaul.grpc.pb.h"

namespace longhaul {
namespace {

// What a call's metadata proves: the secret, over the call's method, time (as the metadata writes
// it), nonce and request bytes.
std::string CallProof(const JobSecret& secret, absl::string_view method, absl::string_view when,
                      absl::string_view nonce, const google::protobuf::Message& request) {
  return secret.Proof("longhaul coordinator call", {method, when, nonce, Sha256(request.SerializeAsString())});
}

// What a worker's signature covers: the call's method, time, nonce and request bytes, labelled
// apart from the secret's proof.
std::string WorkerCallSignature(const WorkerKey& key, absl::string_view method, absl::string_view when,
                                absl::string_view nonce, const google::protobuf::Message& request) {
  return key.Sign("longhaul worker call", {method, when, nonce, Sha256(request.SerializeAsString())});
}

// "when.nonce.proof", each of the sizes given, hex where binary: the fields, or nullopt.
struct SignedFields {
  int64_t when = 0;
  std::string when_text, nonce, proof;
};
// Lower- or upper-case hex to bytes; false on any other character (Abseil's one-argument
// HexStringToBytes neither checks nor survives newer Abseil releases).
bool HexToBytes(absl::string_view hex, std::string* bytes) {
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return false;
  bytes->resize(hex.size() / 2);
  for (size_t i = 0; i < bytes->size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*bytes)[i] = static_cast<char>(hi << 4 | lo);
  }
  return true;
}

std::optional<SignedFields> ParseSigned(absl::string_view value, size_t proof_bytes) {
  const std::vector<absl::string_view> f = absl::StrSplit(value, '.');
  SignedFields out;
  if (f.size() != 3 || !absl::SimpleAtoi(f[0], &out.when) || f[1].size() != 2 * kNonceBytes ||
      f[2].size() != 2 * proof_bytes || !HexToBytes(f[1], &out.nonce) || !HexToBytes(f[2], &out.proof)) {
    return std::nullopt;
  }
  out.when_text = std::string(f[0]);
  return out;
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
  SignInterceptor(const JobSecret& secret, const WorkerKey* key, std::string method)
      : secret_(secret), key_(key), method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* batch) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (batch->QueryInterceptionHookPoint(Hook::PRE_SEND_INITIAL_METADATA) &&
        batch->QueryInterceptionHookPoint(Hook::PRE_SEND_MESSAGE)) {
      const auto* request = static_cast<const google::protobuf::Message*>(batch->GetSendMessage());
      // Without a nonce (the random source failed) the call goes unsigned and the coordinator says why.
      const absl::StatusOr<std::string> nonce = RandomNonce(), worker_nonce = RandomNonce();
      if (request != nullptr && nonce.ok()) {
        batch->GetSendInitialMetadata()->insert({kRpcAuthKey, SignCall(secret_, method_, *request, UnixMs(), *nonce)});
      }
      if (request != nullptr && key_ != nullptr && worker_nonce.ok()) {
        const std::string when = absl::StrCat(UnixMs());
        batch->GetSendInitialMetadata()->insert(
            {kRpcWorkerKey, absl::StrCat(when, ".", absl::BytesToHexString(*worker_nonce), ".",
                                         absl::BytesToHexString(WorkerCallSignature(*key_, method_, when,
                                                                                    *worker_nonce, *request)))});
      }
    }
    batch->Proceed();
  }

 private:
  const JobSecret& secret_;
  const WorkerKey* const key_;
  const std::string method_;
};

class SignFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  SignFactory(JobSecret secret, std::shared_ptr<const WorkerKey> key) : secret_(std::move(secret)), key_(std::move(key)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo* info) override {
    return new SignInterceptor(secret_, key_.get(), info->method());
  }

 private:
  // The channel owns its factories, and they outlive every call.
  const JobSecret secret_;
  const std::shared_ptr<const WorkerKey> key_;
};

// Says why where a call failed for want of a connection and the gate was left for not holding
// this process's secret: the forwarder knows, gRPC only that the connection closed.
class GateRefusalInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit GateRefusalInterceptor(const GateForwarder& forwarder) : forwarder_(forwarder) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* batch) override {
    if (batch->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::POST_RECV_STATUS)) {
      grpc::Status* status = batch->GetRecvStatus();
      if (status->error_code() == grpc::StatusCode::UNAVAILABLE ||
          status->error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        if (std::string why = forwarder_.refusal(); !why.empty()) {
          *status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
        }
      }
    }
    batch->Proceed();
  }

 private:
  const GateForwarder& forwarder_;
};

// Holds the channel's forwarder: the channel owns its interceptor factories, so the forwarder
// lives exactly as long as the channel.
class GateRefusalFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit GateRefusalFactory(std::unique_ptr<GateForwarder> forwarder) : forwarder_(std::move(forwarder)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new GateRefusalInterceptor(*forwarder_);
  }

 private:
  const std::unique_ptr<GateForwarder> forwarder_;
};

// A channel to the coordinator's gate at `address` through a forwarder of its own, with
// `interceptors` (the signatures) before the one that names a refusal.
absl::StatusOr<std::shared_ptr<grpc::Channel>> GatedChannel(
    const std::string& address, const JobSecret& secret, const TlsFiles& tls, grpc::ChannelArguments args,
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors) {
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
    // gRPC connects to the forwarder's socket; the certificate it checks is the coordinator's.
    args.SetSslTargetNameOverride(HostOf(address));
  }
  absl::StatusOr<std::unique_ptr<GateForwarder>> forwarder = GateForwarder::Start(address, secret);
  if (!forwarder.ok()) return forwarder.status();
  const std::string target = (*forwarder)->target();
  args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, address);
  interceptors.push_back(std::make_unique<GateRefusalFactory>(*std::move(forwarder)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, args, std::move(interceptors));
}

}  // namespace

std::string SignCall(const JobSecret& secret, absl::string_view method, const google::protobuf::Message& request,
                     int64_t unix_ms, absl::string_view nonce) {
  const std::string when = absl::StrCat(unix_ms);
  return absl::StrCat(when, ".", absl::BytesToHexString(nonce), ".",
                      absl::BytesToHexString(CallProof(secret, method, when, nonce, request)));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(const std::string& address, const JobSecret& secret,
                                                                  const TlsFiles& tls, grpc::ChannelArguments args,
                                                                  std::shared_ptr<const WorkerKey> key) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<SignFactory>(secret, std::move(key)));
  return GatedChannel(address, secret, tls, std::move(args), std::move(interceptors));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> UnsignedCoordinatorChannel(const std::string& address,
                                                                          const JobSecret& secret, const TlsFiles& tls,
                                                                          grpc::ChannelArguments args) {
  return GatedChannel(address, secret, tls, std::move(args), {});
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

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const std::string& listen, const JobSecret& secret, std::shared_ptr<grpc::ServerCredentials> credentials,
    grpc::Service* service) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  absl::StatusOr<std::unique_ptr<PrivateSocketPath>> socket = PrivateSocketPath::Make("grpc.sock");
  if (!socket.ok()) return socket.status();
  s->socket_ = *std::move(socket);
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + s->socket_->path(), std::move(credentials));
  b.RegisterService(service);
  s->server_ = b.BuildAndStart();
  if (!s->server_) return absl::InternalError(absl::StrCat("gRPC cannot listen on its socket ", s->socket_->path()));
  absl::StatusOr<std::unique_ptr<CoordinatorGate>> gate = CoordinatorGate::Start(listen, secret, s->socket_->path());
  if (!gate.ok()) {
    return absl::Status(gate.status().code(), absl::StrCat(gate.status().message(),
                                                           " (the coordinator's port: choose another with --listen)"));
  }
  s->gate_ = *std::move(gate);
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (server_) server_->Shutdown(deadline);
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
  const std::optional<SignedFields> f = ParseSigned(absl::string_view(it->second.data(), it->second.size()), kProofBytes);
  if (!f) return refuse("its proof of the job secret is malformed");
  const std::string full = absl::StrCat("/", proto::Coordinator::service_full_name(), "/", method);
  if (!ProofsEqual(f->proof, CallProof(secret_, full, f->when_text, f->nonce, request))) {
    return refuse("it does not prove the job secret this coordinator holds");
  }
  return Fresh(f->when, f->nonce, refuse);
}

grpc::Status RpcVerifier::CheckWorker(const grpc::ServerContext& ctx, absl::string_view method,
                                      const google::protobuf::Message& request, int worker,
                                      absl::string_view public_key) {
  auto refuse = [&](const std::string& why, absl::string_view fix = "") {
    ++refused_;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, absl::StrCat("refused ", method, ": ", why, fix));
  };
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kRpcWorkerKey);
  // A registration (worker < 0) proves that the caller holds the key it registers.
  const std::string who = worker < 0 ? "the registration" : absl::StrFormat("the call speaks for worker %d but", worker);
  if (it == md.end()) {
    return refuse(absl::StrCat(who, " carries no signature of a worker's key"), "; run the same longhaul build everywhere");
  }
  const std::optional<SignedFields> f =
      ParseSigned(absl::string_view(it->second.data(), it->second.size()), kSignatureBytes);
  if (!f) return refuse("its worker signature is malformed");
  const std::string full = absl::StrCat("/", proto::Coordinator::service_full_name(), "/", method);
  if (!VerifySignature(public_key, f->proof, "longhaul worker call",
                       {full, f->when_text, f->nonce, Sha256(request.SerializeAsString())})) {
    return refuse(worker < 0 ? std::string("the registration is not signed with the key it registers")
                             : absl::StrFormat("%s is not signed with the key worker %d registered (another process "
                                               "of the job, or a forgery)",
                                               who, worker));
  }
  return Fresh(f->when, f->nonce, refuse);
}

grpc::Status RpcVerifier::Fresh(int64_t when, const std::string& nonce,
                                const std::function<grpc::Status(const std::string&, absl::string_view)>& refuse) {
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
