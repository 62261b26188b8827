#include "transport/coordinator_gate.h"

#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/socket_io.h"

namespace longhaul {
namespace {

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(absl::string_view b) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(b[i]);
  return v;
}

// The gate's side: reads the hello, answers with its nonce and proof, checks the client's proof.
class GateHandshake : public RelayHandshake {
 public:
  explicit GateHandshake(const JobSecret& secret) : secret_(secret) {}
  absl::StatusOr<Step> Next(absl::string_view read) override {
    switch (step_++) {
      case 0:
        return Step{"", kGateHelloBytes};
      case 1: {
        if (std::memcmp(read.data(), kGateMagic, 4) != 0 || GetU32(read.substr(4, 4)) != kGateVersion) {
          return absl::InvalidArgumentError("not a longhaul client of this protocol version");
        }
        client_nonce_ = std::string(read.substr(8, kNonceBytes));
        absl::StatusOr<std::string> nonce = RandomNonce();
        if (!nonce.ok()) return nonce.status();
        gate_nonce_ = *nonce;
        return Step{gate_nonce_ + GateProof(secret_, client_nonce_, gate_nonce_), kProofBytes};
      }
      default:
        if (!ProofsEqual(read, ClientProof(secret_, client_nonce_, gate_nonce_))) {
          return absl::PermissionDeniedError("the client does not hold the job secret");
        }
        return Step{"", 0, true};
    }
  }

 private:
  const JobSecret& secret_;
  int step_ = 0;
  std::string client_nonce_, gate_nonce_;
};

}  // namespace

std::string GateProof(const JobSecret& secret, absl::string_view client_nonce, absl::string_view gate_nonce) {
  return secret.Proof("longhaul coordinator gate: gate", {client_nonce, gate_nonce});
}

std::string ClientProof(const JobSecret& secret, absl::string_view client_nonce, absl::string_view gate_nonce) {
  return secret.Proof("longhaul coordinator gate: client", {client_nonce, gate_nonce});
}

absl::StatusOr<std::unique_ptr<CoordinatorGate>> CoordinatorGate::Start(const std::string& address,
                                                                        const JobSecret& secret,
                                                                        const std::string& backend) {
  std::unique_ptr<CoordinatorGate> gate(new CoordinatorGate());
  absl::StatusOr<int> fd = ListenTcp(address, &gate->address_);
  if (!fd.ok()) return fd.status();
  gate->port_ = SplitHostPort(gate->address_)->second;
  RelayOptions options;
  options.dial = "unix:" + backend;
  options.handshake_on_accepted = true;
  // The handshakes refer to the loop's own copy of the secret.
  options.handshake = [secret] { return std::make_unique<GateHandshake>(secret); };
  options.handshake_timeout = kGateHandshakeTimeout;
  options.max_pending = kMaxGateHandshakes;
  options.max_relayed = kMaxGateConnections;
  options.buffer_bytes = kGateBufferBytes;
  options.nodelay_accepted = true;
  absl::StatusOr<std::unique_ptr<RelayLoop>> loop = RelayLoop::Start(*fd, std::move(options));
  if (!loop.ok()) return loop.status();
  gate->loop_ = *std::move(loop);
  return gate;
}

// The client's side: says hello, checks the gate's proof, answers with its own.
class GateForwarder::Handshake : public RelayHandshake {
 public:
  explicit Handshake(GateForwarder* forwarder) : forwarder_(forwarder) {}
  absl::StatusOr<Step> Next(absl::string_view read) override {
    if (client_nonce_.empty()) {
      absl::StatusOr<std::string> nonce = RandomNonce();
      if (!nonce.ok()) return nonce.status();
      client_nonce_ = *nonce;
      std::string hello(kGateMagic, 4);
      PutU32(hello, kGateVersion);
      return Step{hello + client_nonce_, kGateChallengeBytes};
    }
    const absl::string_view gate_nonce = read.substr(0, kNonceBytes);
    if (!ProofsEqual(read.substr(kNonceBytes), GateProof(forwarder_->secret_, client_nonce_, gate_nonce))) {
      const std::string why = absl::StrFormat(
          "the coordinator at %s holds another job secret than this process's (%s); give every process of the job "
          "the same --secret-file",
          forwarder_->address_, forwarder_->secret_.source());
      forwarder_->SetRefusal(why);
      return absl::PermissionDeniedError(why);
    }
    forwarder_->SetRefusal("");
    return Step{ClientProof(forwarder_->secret_, client_nonce_, gate_nonce), 0, true};
  }

 private:
  GateForwarder* const forwarder_;
  std::string client_nonce_;
};

absl::StatusOr<std::unique_ptr<GateForwarder>> GateForwarder::Start(const std::string& address, JobSecret secret) {
  if (absl::Status s = SplitHostPort(address).status(); !s.ok()) return s;
  std::unique_ptr<GateForwarder> f(new GateForwarder(address, std::move(secret)));
  absl::StatusOr<std::string> random = RandomNonce();
  if (!random.ok()) return random.status();
  f->name_ = "longhaul-coordinator-" + absl::BytesToHexString(random->substr(0, 16));
  absl::StatusOr<int> fd = ListenUnix("@" + f->name_);
  if (!fd.ok()) return fd.status();
  RelayOptions options;
  options.dial = address;
  options.handshake_on_accepted = false;
  options.this_process_only = true;
  options.handshake = [p = f.get()] { return std::make_unique<Handshake>(p); };
  options.handshake_timeout = kGateHandshakeTimeout;
  options.max_pending = kMaxGateHandshakes;
  options.max_relayed = kMaxGateConnections;
  options.buffer_bytes = kGateBufferBytes;
  absl::StatusOr<std::unique_ptr<RelayLoop>> loop = RelayLoop::Start(*fd, std::move(options));
  if (!loop.ok()) return loop.status();
  f->loop_ = *std::move(loop);
  return f;
}

std::string GateForwarder::refusal() const {
  absl::MutexLock lock(&mu_);
  return refusal_;
}

void GateForwarder::SetRefusal(std::string why) {
  absl::MutexLock lock(&mu_);
  refusal_ = std::move(why);
}

}  // namespace longhaul
