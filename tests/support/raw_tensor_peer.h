#pragma once
// Test helper: a connection to a tensor port that writes whatever bytes a test crafts, as a
// hostile or broken peer could send them (TensorClient always fills in sizes that fit), and reads
// the receiver's acknowledgements.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "longhaul.pb.h"
#include "tests/support/loopback.h"
#include "util/crc32c.h"
#include "transport/identity.h"
#include "transport/tensor_transport.h"

namespace longhaul::testing {

inline void AppendU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// The hello a peer of `job` opens with, up to its nonce.
inline std::string HelloFrame(const std::string& job, uint32_t version = kProtocolVersion) {
  std::string out(kTensorMagic, 4);
  AppendU32(out, version);
  AppendU32(out, static_cast<uint32_t>(job.size()));
  return out + job;
}

// A header frame alone: what a peer that stops after its header sends.
inline std::string HeaderFrame(const proto::TensorHeader& header) {
  std::string out;
  AppendU32(out, static_cast<uint32_t>(header.ByteSizeLong()));
  return out + header.SerializeAsString();
}

// A well-formed part: header frame, the wire bytes `payload`, their CRC-32C.
inline std::string PartFrame(const proto::TensorHeader& header, const std::string& payload) {
  std::string out = HeaderFrame(header) + payload;
  AppendU32(out, Crc32c(0, payload.data(), payload.size()));
  return out;
}

// The same with the fp32 bytes of `values`.
inline std::string PartFrame(const proto::TensorHeader& header, const std::vector<float>& values) {
  return PartFrame(header, std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
}

// Who says what in a hello: a worker id and its public key.
inline std::string IdentityFrame(int worker, const std::string& public_key) {
  std::string out;
  AppendU32(out, static_cast<uint32_t>(worker));
  return out + public_key;
}

// The worker id of an identity in `bytes` at `at`.
inline int IdAt(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(bytes[at + i]);
  return static_cast<int32_t>(v);
}

// What a receiver answers a hello with (its acknowledgement aside), and what a sender answers
// that with.
inline constexpr size_t kChallengeBytes = kNonceBytes + kProofBytes + kHelloIdentityBytes + kSignatureBytes;
inline constexpr size_t kSenderProofBytes = kProofBytes + kSignatureBytes;

// A receiver's answer to `hello` (a sender's whole hello, which ends with its nonce and identity):
// acknowledgement, its nonce, its proof of `secret`, and its identity as worker `receiver` of
// `key`, signed.
inline std::string ReceiverChallenge(const std::string& hello, const JobSecret& secret, const std::string& job,
                                     const WorkerKey& key, int receiver) {
  const std::string said = hello.substr(hello.size() - kNonceBytes - kHelloIdentityBytes);
  const HelloTranscript t{job, said.substr(0, kNonceBytes), RandomNonce().value(), IdAt(said, kNonceBytes), receiver};
  proto::TensorAck ok;
  ok.set_ok(true);
  std::string out;
  AppendU32(out, static_cast<uint32_t>(ok.ByteSizeLong()));
  return out + ok.SerializeAsString() + t.receiver_nonce +
         ReceiverProof(secret, job, t.sender_nonce, t.receiver_nonce) + IdentityFrame(receiver, key.public_key()) +
         SignHello(key, HelloSide::kReceiver, t);
}

// Who a RawPeer says it is in its hello: a worker id and the key it signs with (none: a key of
// its own, which nobody registered).
struct Speaker {
  int worker = -1;
  std::shared_ptr<const WorkerKey> key;
};

class RawPeer {
 public:
  // Connects to a loopback `address` (from loopback address `from`, where given) and, unless `job`
  // is empty, says hello as a peer of `job` holding `secret`, speaking `as` (TensorServer's
  // handshake, every byte it wrote kept in handshake()).
  RawPeer(const std::string& address, const std::string& job, const JobSecret& secret = JobSecret(),
          Speaker as = {}, const char* from = nullptr)
      : as_(std::move(as)) {
    fd_ = ConnectLoopback(address, from);
    if (fd_ < 0) {
      hello_ = absl::UnavailableError("cannot connect");
      return;
    }
    if (!job.empty()) Hello(job, secret);
  }
  ~RawPeer() { Close(); }

  // What the receiver answered the hello and the proof.
  const absl::Status& hello() const { return hello_; }
  // The worker the receiver said it is in the hello, and its key.
  int receiver() const { return receiver_; }
  const std::string& receiver_key() const { return receiver_key_; }
  // What this peer wrote to get there: a recording to replay.
  const std::string& handshake() const { return handshake_; }
  // Says hello as a peer of `job` holding `secret`, as the constructor does; a peer constructed
  // with no job may have written the hello's first `sent` bytes (HelloFrame) by hand already.
  // The receiver's proof of the secret and its signature are not checked: a test checks what the
  // receiver does with what it gets.
  const absl::Status& Hello(const std::string& job, const JobSecret& secret, size_t sent = 0) {
    hello_ = Handshake(job, secret, sent);
    return hello_;
  }
  bool Write(const std::string& bytes) {
    return fd_ >= 0 && send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }
  // The next acknowledgement as a status; Unavailable when the receiver closed without one,
  // DeadlineExceeded when nothing came within `timeout`.
  absl::Status Ack(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    uint8_t len[4];
    if (absl::Status s = Read(len, 4, timeout); !s.ok()) return s;
    const uint32_t n = uint32_t{len[0]} | uint32_t{len[1]} << 8 | uint32_t{len[2]} << 16 | uint32_t{len[3]} << 24;
    if (n > (64u << 10)) return absl::DataLossError("oversized acknowledgement");
    std::string bytes(n, '\0');
    if (absl::Status s = Read(bytes.data(), bytes.size(), timeout); !s.ok()) return s;
    proto::TensorAck ack;
    if (!ack.ParseFromString(bytes)) return absl::DataLossError("unparseable acknowledgement");
    return ack.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(ack.code()), ack.error());
  }
  // Reads and drops n bytes.
  absl::Status Discard(size_t n) {
    std::string sink(n, '\0');
    return Read(sink.data(), n, std::chrono::seconds(30));
  }
  // Whether the receiver has answered or closed (without waiting).
  bool Answered() {
    pollfd p{fd_, POLLIN, 0};
    return fd_ < 0 || poll(&p, 1, 0) > 0;
  }
  // Goes away, as a peer that dies.
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  absl::Status Handshake(const std::string& job, const JobSecret& secret, size_t sent) {
    if (!as_.key) as_.key = std::make_shared<const WorkerKey>(WorkerKey::Generate().value());
    const std::string nonce = RandomNonce().value();
    handshake_ = HelloFrame(job) + nonce + IdentityFrame(as_.worker, as_.key->public_key());
    Write(handshake_.substr(sent));
    if (absl::Status s = Ack(); !s.ok()) return s;
    std::string challenge(kChallengeBytes, '\0');
    if (absl::Status s = Read(challenge.data(), challenge.size(), std::chrono::seconds(30)); !s.ok()) return s;
    const size_t id_at = kNonceBytes + kProofBytes;
    receiver_ = IdAt(challenge, id_at);
    receiver_key_ = challenge.substr(id_at + 4, kPublicKeyBytes);
    const HelloTranscript t{job, nonce, challenge.substr(0, kNonceBytes), as_.worker, receiver_};
    const std::string proof = SenderProof(secret, job, t.sender_nonce, t.receiver_nonce) +
                              SignHello(*as_.key, HelloSide::kSender, t);
    handshake_ += proof;
    Write(proof);
    return Ack();
  }

  absl::Status Read(void* data, size_t n, std::chrono::milliseconds timeout) {
    char* p = static_cast<char*>(data);
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (n > 0) {
      pollfd pf{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (fd_ < 0 || left.count() <= 0 || poll(&pf, 1, static_cast<int>(left.count())) <= 0) {
        return absl::DeadlineExceededError("still open");
      }
      const ssize_t r = recv(fd_, p, n, 0);
      if (r <= 0) return absl::UnavailableError("closed by the receiver");
      p += r;
      n -= static_cast<size_t>(r);
    }
    return absl::OkStatus();
  }

  Speaker as_;
  int fd_ = -1;
  absl::Status hello_;
  int receiver_ = -1;
  std::string receiver_key_;
  std::string handshake_;
};

}  // namespace longhaul::testing
