#include "transport/tensor_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/sock_diag.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <iostream>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/job_config.h"
#include "util/crc32c.h"
#include "util/hash.h"

namespace longhaul {
namespace {

constexpr size_t kMaxAckBytes = 64 << 10;
constexpr auto kHelloTimeout = std::chrono::seconds(10);

Deadline After(std::chrono::steady_clock::duration d) { return std::chrono::steady_clock::now() + d; }

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// A worker id as the hello carries it.
std::string IdBytes(int id) {
  std::string out;
  PutU32(out, static_cast<uint32_t>(id));
  return out;
}

absl::StatusOr<uint32_t> ReadU32(int fd, Deadline deadline, const WakeFd& wake, bool* closed = nullptr) {
  uint8_t b[4];
  if (absl::Status s = ReadAll(fd, b, 4, deadline, wake, closed); !s.ok()) return s;
  return GetU32(b);
}

// One acknowledgement frame: u32 length, serialized TensorAck.
std::string AckFrame(const absl::Status& s, bool dropped = false) {
  proto::TensorAck ack;
  ack.set_ok(s.ok());
  ack.set_dropped(dropped);
  if (!s.ok()) {
    ack.set_code(static_cast<int32_t>(s.code()));
    ack.set_error(std::string(s.message()));
  }
  std::string frame;
  PutU32(frame, static_cast<uint32_t>(ack.ByteSizeLong()));
  return frame + ack.SerializeAsString();
}

absl::Status AckStatus(const proto::TensorAck& ack) {
  if (ack.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(ack.code());
  return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code, ack.error());
}

absl::Status ReadAck(int fd, Deadline deadline, const WakeFd& wake) {
  auto n = ReadU32(fd, deadline, wake);
  if (!n.ok()) return n.status();
  if (*n > kMaxAckBytes) {
    return absl::DataLossError(absl::StrFormat("an acknowledgement of %d bytes: the peer is not a longhaul worker", *n));
  }
  std::string bytes(*n, '\0');
  if (absl::Status s = ReadAll(fd, bytes.data(), bytes.size(), deadline, wake); !s.ok()) return s;
  proto::TensorAck ack;
  if (!ack.ParseFromString(bytes)) return absl::DataLossError("unparseable acknowledgement");
  return AckStatus(ack);
}

// Says what it has to say, then lets the peer read it before the caller closes the socket:
// closing with unread bytes in the receive queue would reset the connection and could destroy the
// reason before the peer reads it.
void SayAndDrain(int fd, const absl::Status& why) {
  const std::string ack = AckFrame(why);
  WakeFd never;
  (void)WriteAll(fd, ack.data(), ack.size(), After(std::chrono::seconds(1)), never);
  shutdown(fd, SHUT_WR);
  char sink[64 << 10];
  const Deadline until = After(std::chrono::seconds(1));
  for (size_t drained = 0; drained < (64u << 20);) {
    if (!WaitReadable(fd, until, never).ok()) break;
    const ssize_t r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (r <= 0 && !(r < 0 && (errno == EAGAIN || errno == EINTR))) break;
    if (r > 0) drained += static_cast<size_t>(r);
  }
}

}  // namespace

// ---- receiving --------------------------------------------------------------------------------

absl::StatusOr<uint64_t> AnyTensorUpTo::Admit(const proto::TensorHeader& h, int) const {
  if (h.total_elements() == 0 || h.total_elements() > max_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a tensor of %d elements; this receiver takes 1 to %d", h.total_elements(), max_));
  }
  return h.total_elements();
}

std::string ReceiverProof(const JobSecret& secret, const std::string& job, const std::string& sender_nonce,
                          const std::string& receiver_nonce) {
  return secret.Proof("longhaul tensor port: receiver", {job, sender_nonce, receiver_nonce});
}

std::string SenderProof(const JobSecret& secret, const std::string& job, const std::string& sender_nonce,
                        const std::string& receiver_nonce) {
  return secret.Proof("longhaul tensor port: sender", {job, receiver_nonce, sender_nonce});
}

namespace {

std::string HelloLabel(HelloSide side) {
  return side == HelloSide::kSender ? "longhaul tensor hello: sender" : "longhaul tensor hello: receiver";
}

}  // namespace

std::string SignHello(const WorkerKey& key, HelloSide side, const HelloTranscript& t) {
  return key.Sign(HelloLabel(side), {t.job, t.sender_nonce, t.receiver_nonce, IdBytes(t.sender), IdBytes(t.receiver)});
}

bool HelloSignatureValid(absl::string_view public_key, absl::string_view signature, HelloSide side,
                         const HelloTranscript& t) {
  return VerifySignature(public_key, signature, HelloLabel(side),
                         {t.job, t.sender_nonce, t.receiver_nonce, IdBytes(t.sender), IdBytes(t.receiver)});
}

TensorServer::TensorServer(std::string job_id, Mailbox* mailbox, const TensorAdmission* admission, JobSecret secret,
                           std::shared_ptr<const WorkerKey> key)
    : secret_(std::move(secret)),
      key_(std::move(key)),
      mailbox_(mailbox),
      admission_(admission),
      job_id_(std::move(job_id)) {}

TensorServer::~TensorServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<TensorServer>> TensorServer::Start(const std::string& address, const std::string& job_id,
                                                                  Mailbox* mailbox, const TensorAdmission* admission,
                                                                  JobSecret secret,
                                                                  std::shared_ptr<const WorkerKey> key) {
  if (!key) {
    absl::StatusOr<WorkerKey> own = WorkerKey::Generate();
    if (!own.ok()) return own.status();
    key = std::make_shared<const WorkerKey>(*std::move(own));
  }
  std::unique_ptr<TensorServer> s(new TensorServer(job_id, mailbox, admission, std::move(secret), std::move(key)));
  auto fd = ListenTcp(address, &s->address_);
  if (!fd.ok()) return fd.status();
  s->listen_fd_ = *fd;
  s->acceptor_ = std::thread([srv = s.get()] { srv->AcceptLoop(); });
  return s;
}

void TensorServer::AcceptLoop() {
  for (;;) {
    const std::optional<int> accepted = AcceptOrStop(listen_fd_, stop_);
    if (!accepted) return;
    ReapFinished();
    const int fd = *accepted;
    if (fd < 0) continue;
    // A peer whose machine vanishes is noticed within minutes even while nothing is expected.
    const int one = 1, idle = 60, interval = 10, count = 6;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    sockaddr_in peer{};
    socklen_t peer_len = sizeof(peer);
    getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len);
    absl::MutexLock lock(&conns_mu_);
    size_t serving = 0;
    for (Connection& c : conns_) serving += !c.done && c.hello != Connection::kEvicted;
    const std::optional<std::string> evicted = serving >= kMaxTensorConnections ? EvictOne() : "";
    if (evicted && !evicted->empty()) {
      Refuse(absl::StrFormat("%s: all %d connections this worker serves at once were taken", *evicted,
                             kMaxTensorConnections));
    } else if (!evicted) {
      const absl::Status why = absl::ResourceExhaustedError(
          absl::StrFormat("a connection beyond the %d this worker serves at once", kMaxTensorConnections));
      Refuse(std::string(why.message()));
      const std::string ack = AckFrame(why);
      (void)!send(fd, ack.data(), ack.size(), MSG_DONTWAIT | MSG_NOSIGNAL);  // best effort: never block here
      close(fd);
      continue;
    }
    Connection& c = conns_.emplace_back();
    c.fd = fd;
    c.peer_ip = peer.sin_addr.s_addr;
    c.thread = std::thread([this, &c] { Serve(&c); });
  }
}

std::optional<std::string> TensorServer::EvictOne() {
  // A connection refused already (counted then) only waits for its peer to read why: a flood of
  // hellos that are refused, never read, would hold every slot for as long.
  for (Connection& c : conns_) {
    if (!c.done && Evict(c, Connection::kEnded)) return "";
  }
  // Whoever holds every slot with hellos it never finishes would keep the job's own peers out for
  // kHelloTimeout after kHelloTimeout. A connection still in its hello gives way next: a flood's
  // from one address first, so that it pushes out its own, not a far peer of the job whose hello
  // takes a round trip. Then a member's that the plan does not need: a spare, or a worker past
  // its share, may hold no more than a few each, but a job may have many of them.
  if (EvictOneInHello()) return "a connection still in its hello gave way to a newer one";
  std::string proven = EvictOneProven();
  if (proven.empty()) return std::nullopt;
  return proven;
}

bool TensorServer::Evict(Connection& c, int state) {
  absl::MutexLock fd_lock(&c.fd_mu);
  if (c.closed || !c.hello.compare_exchange_strong(state, Connection::kEvicted)) return false;
  shutdown(c.fd, SHUT_RDWR);  // its thread, blocked on the peer, reads the end
  return true;
}

bool TensorServer::EvictOneInHello() {
  std::unordered_map<uint32_t, int> in_hello_from;
  for (const Connection& c : conns_) in_hello_from[c.peer_ip] += !c.done && c.hello == Connection::kInHello;
  // An address with more than half of the connections a worker serves in their hellos (one at
  // most) floods: its own give way first. Below that (a host of the job opens up to
  // transport.connections per link for each of its workers at once), the oldest gives way,
  // whoever holds it; so too where each of the flood's ended its hello meanwhile.
  std::optional<uint32_t> flood;
  for (const auto& [ip, n] : in_hello_from) {
    if (n > kMaxTensorConnections / 2) flood = ip;
  }
  return (flood && EvictOldestInHello(flood)) || EvictOldestInHello(std::nullopt);
}

bool TensorServer::EvictOldestInHello(std::optional<uint32_t> from) {
  for (Connection& c : conns_) {
    if ((!from || c.peer_ip == *from) && Evict(c, Connection::kInHello)) return true;
  }
  return false;
}

std::string TensorServer::EvictOneProven() {
  std::map<int, int> held;
  {
    absl::MutexLock lock(&mu_);
    held = proven_;
  }
  std::map<int, TensorAdmission::Share> shares;
  for (const auto& [worker, n] : held) shares[worker] = admission_->ShareOf(worker);
  // First the workers the plan does not place, then those placed but past their share.
  for (const bool placed : {false, true}) {
    for (Connection& c : conns_) {
      const int worker = c.worker;
      const auto share = shares.find(worker);
      if (c.done || c.hello != Connection::kProved || share == shares.end()) continue;
      if (share->second.placed != placed || (placed && held[worker] <= share->second.connections)) continue;
      if (!Evict(c, Connection::kProved)) continue;
      return placed ? absl::StrFormat("a connection of worker %d, one of %d where its share is %d, gave way to a "
                                      "newer one",
                                      worker, held[worker], share->second.connections)
                    : absl::StrFormat("a connection of worker %d, which the plan does not place now, gave way to a "
                                      "newer one",
                                      worker);
    }
  }
  return "";
}

void TensorServer::ReapFinished() {
  absl::MutexLock lock(&conns_mu_);
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (it->done.load()) {
      it->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void TensorServer::Serve(Connection* c) {
  const absl::StatusOr<int> from = ServeHello(c->fd);
  absl::Status s = from.status();
  if (s.ok()) s = Claim(c, *from);
  int in_hello = Connection::kInHello;
  if (!c->hello.compare_exchange_strong(in_hello, s.ok() ? Connection::kProved : Connection::kEnded)) {
    // Evicted (AcceptLoop): the socket was shut down.
    Release(c);
    End(c);
    return;
  }
  if (s.ok()) {
    const std::string ok = AckFrame(absl::OkStatus());
    s = WriteAll(c->fd, ok.data(), ok.size(), After(kHelloTimeout), stop_);
  }
  std::optional<Sender> sender;
  bool left = false;  // the sender closed the connection, or it broke
  while (s.ok()) {
    bool closed = false;
    auto header_bytes = ReadU32(c->fd, Forever(), stop_, &closed);
    if (!header_bytes.ok()) {
      left = closed || absl::IsUnavailable(header_bytes.status());
      s = closed ? absl::OkStatus() : header_bytes.status();  // closing between parts is how a peer leaves
      break;
    }
    s = ServePart(c->fd, *header_bytes, *from, &sender);
    left = absl::IsUnavailable(s);
  }
  // Ended from here on (an eviction may cut its refusal short), unless an eviction pushed it out
  // first, as one may in its hello; a hello that failed ended it already.
  int proved = Connection::kProved;
  const bool evicted = !c->hello.compare_exchange_strong(proved, Connection::kEnded) && proved == Connection::kEvicted;
  Release(c);
  if (left && sender && !evicted) {
    std::function<void(const Sender&)> observer;
    {
      absl::MutexLock lock(&mu_);
      observer = sender_left_;
    }
    if (observer) observer(*sender);
  }
  // Pushed out (counted where it was), shutting down or a broken connection: nobody to tell. A
  // refusal: the peer hears why, unless the connection gives way meanwhile (EvictOne).
  if (!evicted && !s.ok() && !absl::IsCancelled(s) && !absl::IsUnavailable(s)) {
    Refuse(std::string(s.message()));
    SayAndDrain(c->fd, s);
  }
  End(c);
}

void TensorServer::End(Connection* c) {
  {
    absl::MutexLock fd_lock(&c->fd_mu);
    c->closed = true;
    close(c->fd);
  }
  c->done = true;
}

absl::Status TensorServer::Claim(Connection* c, int worker) {
  const TensorAdmission::Share share = admission_->ShareOf(worker);
  absl::MutexLock lock(&mu_);
  int& held = proven_[worker];
  if (held >= share.connections) {
    const int n = held;
    if (n == 0) proven_.erase(worker);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "refused: worker %d holds %d connections to worker %d already, its share as %s (a few per link its clients "
        "open to this worker)",
        worker, n, worker_id_, share.placed ? "a worker the plan places" : "a member the plan does not place"));
  }
  ++held;
  c->worker = worker;
  return absl::OkStatus();
}

void TensorServer::Release(Connection* c) {
  const int worker = c->worker.exchange(-1);
  if (worker < 0) return;
  absl::MutexLock lock(&mu_);
  if (--proven_[worker] == 0) proven_.erase(worker);
}

absl::StatusOr<int> TensorServer::ServeHello(int fd) {
  const Deadline deadline = After(kHelloTimeout);
  char magic[4];
  if (absl::Status s = ReadAll(fd, magic, 4, deadline, stop_); !s.ok()) return s;
  if (std::memcmp(magic, kTensorMagic, 4) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a connection that does not speak longhaul's tensor protocol (first bytes %s); only longhaul workers send here",
        absl::CHexEscape(std::string(magic, 4))));
  }
  auto version = ReadU32(fd, deadline, stop_);
  if (!version.ok()) return version.status();
  auto job_bytes = ReadU32(fd, deadline, stop_);
  if (!job_bytes.ok()) return job_bytes.status();
  if (*job_bytes > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("a job id of %d bytes (at most %d)", *job_bytes, kMaxJobIdBytes));
  }
  std::string job(*job_bytes, '\0');
  if (absl::Status s = ReadAll(fd, job.data(), job.size(), deadline, stop_); !s.ok()) return s;
  if (job != job_id() || *version != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("refused: the peer runs job '%s' with protocol version %d, this worker runs job '%s' with "
                        "protocol version %d; start every process of a job from the same config and build",
                        absl::CHexEscape(job), *version, job_id(), kProtocolVersion));
  }
  // The sender's nonce, and who it says it is.
  std::string said(kNonceBytes + kHelloIdentityBytes, '\0');
  if (absl::Status s = ReadAll(fd, said.data(), said.size(), deadline, stop_); !s.ok()) return s;
  const int sender = static_cast<int32_t>(GetU32(reinterpret_cast<const uint8_t*>(said.data()) + kNonceBytes));
  const std::string sender_key = said.substr(kNonceBytes + 4);
  // Both sides prove they hold the job secret over both nonces (job_secret.h), and sign them with
  // their keys: the server's nonce is fresh, so a recorded handshake replayed here proves nothing.
  absl::StatusOr<std::string> server_nonce = RandomNonce();
  if (!server_nonce.ok()) return server_nonce.status();
  const HelloTranscript t{job, said.substr(0, kNonceBytes), *server_nonce, sender, worker_id()};
  std::string challenge = AckFrame(absl::OkStatus()) + *server_nonce +
                          ReceiverProof(secret_, job, t.sender_nonce, t.receiver_nonce) + IdBytes(t.receiver) +
                          key_->public_key() + SignHello(*key_, HelloSide::kReceiver, t);
  if (absl::Status s = WriteAll(fd, challenge.data(), challenge.size(), deadline, stop_); !s.ok()) return s;
  std::string proof(kProofBytes + kSignatureBytes, '\0');
  if (absl::Status s = ReadAll(fd, proof.data(), proof.size(), deadline, stop_); !s.ok()) {
    // A sender that finds this worker's proof wrong (it holds another secret, or meant another
    // worker) hangs up here.
    if (!absl::IsUnavailable(s)) return s;
    return absl::PermissionDeniedError(absl::StrFormat(
        "refused: the peer closed the connection instead of proving it holds this job's secret (this worker's: %s) "
        "and is the worker it says (worker %d)",
        secret_.source(), sender));
  }
  if (!ProofsEqual(proof.substr(0, kProofBytes), SenderProof(secret_, job, t.sender_nonce, t.receiver_nonce))) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "refused: the peer does not hold this job's secret (this worker's: %s); give every process of the job the "
        "same --secret-file",
        secret_.source()));
  }
  if (!HelloSignatureValid(sender_key, proof.substr(kProofBytes), HelloSide::kSender, t)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "refused: the peer's signature of its hello as worker %d does not verify with the key it presents", sender));
  }
  // Which worker it is: the key the job's membership gives that worker id. News of a member may
  // reach this worker a moment after the member itself.
  absl::Status member;
  for (const auto asked = std::chrono::steady_clock::now();;) {
    member = admission_->Member(sender, sender_key);
    const auto now = std::chrono::steady_clock::now();
    if (!absl::IsUnavailable(member) || now - asked >= kUnheardMemberPatience || now >= deadline) break;
    pollfd p{stop_.fd(), POLLIN, 0};
    if (poll(&p, 1, 1) > 0) return absl::CancelledError("the server is shutting down");
  }
  if (!member.ok()) return absl::PermissionDeniedError(absl::StrCat("refused: ", member.message()));
  return sender;
}

absl::Status TensorServer::ServePart(int fd, uint32_t header_bytes, int from, std::optional<Sender>* sender) {
  if (header_bytes == 0 || header_bytes > kMaxTensorHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a tensor header of %d bytes (at most %d)", header_bytes, kMaxTensorHeaderBytes));
  }
  // Once a part has begun, all of it must come within the part timeout: a stalled or vanished
  // sender must not hold its buffer and reservation for good.
  const Deadline deadline = After(part_timeout());
  std::string bytes(header_bytes, '\0');
  if (absl::Status s = ReadAll(fd, bytes.data(), bytes.size(), deadline, stop_); !s.ok()) return s;
  proto::TensorHeader h;
  if (!h.ParseFromString(bytes)) return absl::InvalidArgumentError("unparseable tensor header");
  if (h.job_id() != job_id() || h.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor header of job '%s', protocol %d; this worker runs job '%s', protocol %d",
                        absl::CHexEscape(h.job_id()), h.protocol_version(), job_id(), kProtocolVersion));
  }
  if (!IsWireDtype(h.dtype())) {
    return absl::InvalidArgumentError(absl::StrFormat("unknown wire dtype %d", h.dtype()));
  }
  // A part of a version this worker has left comes from a peer that has not heard yet, or was
  // written just before it did: dropped, its connection kept (a refusal closes it, and the next
  // version's first tensor on it paid a round trip to connect again).
  if (admission_->Stale(h)) return DropPart(fd, h, deadline);
  // Every size is checked against what the plan allows, overflow-safe, and the part is reserved in
  // the mailbox before any buffer exists.
  const TensorKey key{h.kind(), h.iteration(), h.micro_batch(), h.from_stage(), h.from_replica(), h.shard()};
  // Nothing is read past the header meanwhile: the sender's bytes wait in the socket buffers.
  for (const auto header_in = std::chrono::steady_clock::now();;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline || !admission_->Ahead(h, now - header_in)) break;
    pollfd p{stop_.fd(), POLLIN, 0};
    if (poll(&p, 1, 1) > 0) return absl::CancelledError("the server is shutting down");
  }
  absl::StatusOr<uint64_t> allowed = admission_->Admit(h, from);
  if (!allowed.ok()) return absl::Status(allowed.status().code(), absl::StrCat("refused: ", allowed.status().message()));
  if (h.total_elements() != *allowed) {
    return absl::InvalidArgumentError(absl::StrFormat("refused: %s announces %d elements; the plan has %d",
                                                      key.DebugString(), h.total_elements(), *allowed));
  }
  if (h.kind() == proto::LINK_PROBE) return ServeProbe(fd, h, deadline);
  *sender = Sender{h.from_stage(), h.from_replica(), h.plan_version()};
  if (absl::Status s = mailbox_->BeginPart(key, h.plan_version(), h.total_elements(), h.part_offset(), h.part_elements()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("refused: ", s.message()));
  }
  const size_t expected = WireBytes(h.part_elements(), static_cast<WireDtype>(h.dtype()));
  std::vector<float> values;
  std::vector<uint8_t> wire;
  bool whole = false;  // every byte read and its checksum right: the part may be dropped, not refused
  auto received = [&]() -> absl::Status {
    // Allocated once the first payload byte is here, so a peer that stops after its header holds
    // no memory.
    if (absl::Status s = WaitReadable(fd, deadline, stop_); !s.ok()) return s;
    values = mailbox_->Acquire(h.part_elements());
    if (h.dtype() != proto::F32) wire.resize(expected);
    uint8_t* dst = h.dtype() == proto::F32 ? reinterpret_cast<uint8_t*>(values.data()) : wire.data();
    uint32_t crc = 0;
    for (size_t at = 0; at < expected;) {
      const size_t n = std::min<size_t>(expected - at, 4 << 20);
      if (absl::Status s = ReadAll(fd, dst + at, n, deadline, stop_); !s.ok()) return s;
      crc = Crc32c(crc, dst + at, n);  // the bytes are still in cache
      at += n;
    }
    auto sent_crc = ReadU32(fd, deadline, stop_);
    if (!sent_crc.ok()) return sent_crc.status();
    if (crc != *sent_crc) {
      return absl::DataLossError(
          absl::StrFormat("tensor part checksum %08x, sender says %08x: corrupted in transit, or more or fewer "
                          "bytes than its header announced (%d)",
                          crc, *sent_crc, expected));
    }
    if (h.dtype() != proto::F32) DecodeWire(wire.data(), values.size(), static_cast<WireDtype>(h.dtype()), values.data());
    whole = true;
    return mailbox_->CompletePart(key, h.plan_version(), h.part_offset(), std::move(values));
  }();
  if (!received.ok()) {
    mailbox_->AbandonPart(key, h.plan_version(), h.part_offset());
    mailbox_->Recycle(std::move(values));
    // The worker left the part's version while its bytes came (the next version's mailbox took its
    // place): dropped as a stale part is, the connection kept. Refused, it closed the connection
    // under the sender's first part of the next version, whose failure started the layout again
    // (bench/recovery.sh: one restart in 25 failures, 67 ms of stall).
    if (whole && admission_->Stale(h)) return AckDropped(fd, h);
    return received;
  }
  const std::string ok = AckFrame(absl::OkStatus());
  return WriteAll(fd, ok.data(), ok.size(), After(part_timeout()), stop_);
}

absl::StatusOr<bool> TensorServer::ReadAndDiscard(int fd, uint64_t bytes, uint8_t* scratch, size_t scratch_bytes,
                                                   Deadline deadline) {
  uint32_t crc = 0;
  for (uint64_t at = 0; at < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes - at, scratch_bytes));
    if (absl::Status s = ReadAll(fd, scratch, n, deadline, stop_); !s.ok()) return s;
    crc = Crc32c(crc, scratch, n);
    at += n;
  }
  auto sent_crc = ReadU32(fd, deadline, stop_);
  if (!sent_crc.ok()) return sent_crc.status();
  return crc == *sent_crc;
}

absl::Status TensorServer::DropPart(int fd, const proto::TensorHeader& h, Deadline deadline) {
  // Only a peer that proved the job secret gets here; the bound keeps the byte count from
  // overflowing, and the part timeout bounds the time.
  constexpr uint64_t kMaxDroppedElements = uint64_t{1} << 34;
  if (h.part_elements() > kMaxDroppedElements) {
    return absl::InvalidArgumentError(absl::StrFormat("refused: a part of %d elements of plan version %d, which this "
                                                      "worker has left",
                                                      h.part_elements(), h.plan_version()));
  }
  uint8_t scratch[64 << 10];
  const absl::StatusOr<bool> read = ReadAndDiscard(
      fd, WireBytes(h.part_elements(), static_cast<WireDtype>(h.dtype())), scratch, sizeof(scratch), deadline);
  if (!read.ok()) return read.status();
  // A wrong checksum is a stream out of step (more or fewer bytes than announced): what follows
  // would be read as a header.
  if (!*read) return absl::DataLossError("checksum mismatch in a part of a plan version this worker has left");
  return AckDropped(fd, h);
}

absl::Status TensorServer::AckDropped(int fd, const proto::TensorHeader& h) {
  const std::string dropped = AckFrame(
      absl::AbortedError(absl::StrFormat("dropped: this worker has left plan version %d", h.plan_version())), true);
  return WriteAll(fd, dropped.data(), dropped.size(), After(part_timeout()), stop_);
}

absl::Status TensorServer::ServeProbe(int fd, const proto::TensorHeader& h, Deadline deadline) {
  if (h.part_offset() != 0 || h.part_elements() != h.total_elements()) {
    return absl::InvalidArgumentError("a link probe comes in one part");
  }
  const size_t bytes = WireBytes(h.part_elements(), static_cast<WireDtype>(h.dtype()));
  std::vector<uint8_t> scratch(std::min<size_t>(bytes, 1 << 20));
  const absl::StatusOr<bool> whole = ReadAndDiscard(fd, bytes, scratch.data(), scratch.size(), deadline);
  if (!whole.ok()) return whole.status();
  if (!*whole) return absl::DataLossError("link probe checksum mismatch: corrupted in transit");
  const std::string ok = AckFrame(absl::OkStatus());
  return WriteAll(fd, ok.data(), ok.size(), After(part_timeout()), stop_);
}

void TensorServer::SetSenderLeftObserver(std::function<void(const Sender&)> observer) {
  absl::MutexLock lock(&mu_);
  sender_left_ = std::move(observer);
}

void TensorServer::SetPartTimeout(std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  part_timeout_ = timeout;
}

std::chrono::milliseconds TensorServer::part_timeout() const {
  absl::MutexLock lock(&mu_);
  return part_timeout_;
}

void TensorServer::SetJobId(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  job_id_ = job_id;
}

std::string TensorServer::job_id() const {
  absl::MutexLock lock(&mu_);
  return job_id_;
}

void TensorServer::SetWorkerId(int worker_id) {
  absl::MutexLock lock(&mu_);
  worker_id_ = worker_id;
}

int TensorServer::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

void TensorServer::Refuse(const std::string& why) {
  ++refused_;
  absl::MutexLock lock(&mu_);
  last_refusal_ = why;
}

std::string TensorServer::last_refusal() const {
  absl::MutexLock lock(&mu_);
  return last_refusal_;
}

void TensorServer::Shutdown() {
  if (!acceptor_.joinable()) return;
  stop_.Wake();
  acceptor_.join();
  {
    absl::MutexLock lock(&conns_mu_);
    for (Connection& c : conns_) c.thread.join();
    conns_.clear();
  }
  close(listen_fd_);
}

// ---- sending ----------------------------------------------------------------------------------

struct OutPart {
  std::shared_ptr<SendOp> op;
  std::string header;  // u32 length and the serialized TensorHeader
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  Deadline deadline;
  bool written = false;
  // A boundary tensor's part is encoded by whichever thread writes it, just before (TensorClient::
  // Send): the `count` floats at `from` into `encode_into` (= data). Null once done, or for a part
  // encoded by Send itself.
  const float* from = nullptr;
  uint8_t* encode_into = nullptr;
  size_t count = 0;
  WireDtype dtype = WireDtype::kF32;
  std::optional<StochasticRounding> rounding = std::nullopt;
  void Done(const absl::Status& s) { op->PartDone(s, written); }
  void Encode() {
    if (from == nullptr) return;
    EncodeWire(from, count, dtype, encode_into, rounding ? &*rounding : nullptr);
    from = nullptr;
  }
};

// A part this small goes out from the caller's thread where the connection's thread sleeps and
// the socket takes it at once (PeerConnection::Enqueue).
constexpr size_t kDirectWriteBytes = 16u << 10;

class PeerConnection {
 public:
  PeerConnection(std::string address, const TransportOptions& opt, PeerIdentity to)
      : address_(std::move(address)), opt_(opt), to_(std::move(to)), canceller_(opt.canceller) {
    if (canceller_ && !canceller_->Register(this)) cancelled_ = canceller_->reason();
    thread_ = std::thread([this] { Run(); });
  }

  ~PeerConnection() {
    Close();
    thread_.join();
  }

  // Tells the thread to fail what it holds and end, without waiting for it.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
    }
    if (canceller_) canceller_->Unregister(this);
    cv_.SignalAll();
    cancel_.Wake();
  }

  // Connects and says hello on the connection's thread now, not at the first part.
  void OpenSoon() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      open_soon_ = true;
    }
    cv_.SignalAll();
  }

  void Enqueue(OutPart p) ABSL_LOCKS_EXCLUDED(mu_) {
    mu_.Lock();
    // The thread sleeps, between tensors or waiting for acknowledgements, and no other caller
    // writes: a small part is written from the caller's thread at once where the socket's
    // buffer has room for it whole, sparing it the thread's wake-up (tens of microseconds on a
    // virtual CPU, the larger share of a small tensor's cost). The thread then only reads the
    // acknowledgement. A pipeline's next small tensor often leaves before the last one's
    // acknowledgement is back. The room is checked: a caller must never wait on the peer.
    if ((idle_ || polling_) && !claimed_ && fd_ >= 0 && queue_.empty() && cancelled_.empty() && !stop_ &&
        p.bytes <= kDirectWriteBytes && Fits(p.header.size() + p.bytes + 4)) {
      claimed_ = true;
      const int fd = fd_;
      mu_.Unlock();
      Send(std::move(p));
      mu_.Lock();
      claimed_ = false;
      // The thread polls the connection it saw: this write broke it.
      if (polling_ && fd_ != fd) kick_.Wake();
      mu_.Unlock();
    } else {
      queue_.push_back(std::move(p));
      mu_.Unlock();
      kick_.Wake();
    }
    cv_.SignalAll();
  }

  void Cancel(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_.empty()) cancelled_ = reason;
    }
    cv_.SignalAll();
    cancel_.Wake();
  }

  // Serves `canceller` from now on, once the thread has ended what the last cancellation ended.
  void Rearm(std::shared_ptr<SendCanceller> canceller) ABSL_LOCKS_EXCLUDED(mu_) {
    if (canceller_) canceller_->Unregister(this);
    {
      absl::MutexLock lock(&mu_);
      while (!cancelled_.empty() && !cancel_handled_) cv_.Wait(&mu_);
      cancelled_.clear();
      cancel_handled_ = false;
      cancel_.Clear();
      canceller_ = std::move(canceller);
    }
    if (canceller_ && !canceller_->Register(this)) Cancel(canceller_->reason());
  }

 private:
  void Run() {
    for (;;) {
      std::deque<OutPart> next;
      std::string cancelled;
      bool stop, open;
      {
        absl::MutexLock lock(&mu_);
        // With parts awaiting acknowledgement, AwaitAcks waits instead (new parts kick it). While
        // idle, as while polling there, a caller may claim the connection to write a part itself
        // (Enqueue): the thread touches nothing of the connection's until the caller is done.
        if (awaiting_.empty()) {
          idle_ = true;
          while (claimed_ || !(stop_ || (!cancelled_.empty() && !cancel_handled_) || !queue_.empty() ||
                               !awaiting_.empty() || open_soon_)) {
            cv_.Wait(&mu_);
          }
          idle_ = false;
        }
        open = std::exchange(open_soon_, false);
        stop = stop_;
        cancelled = cancelled_;
        if (!cancelled.empty() || stop) {
          next.swap(queue_);
        } else if (!queue_.empty()) {
          next.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      if (!cancelled.empty() || stop) {
        // Once cancelled, every part fails at once, those queued later too.
        const absl::Status why = absl::CancelledError(stop && cancelled.empty() ? "the sender was closed" : cancelled);
        for (OutPart& p : next) p.Done(why);
        // A connection whose parts were all written whole is between tensors (a write the
        // cancellation cut short broke it in Send): it stays open for whoever rearms it (a plan
        // version's next, which then pays no connect and no handshake on a long link), and the
        // acknowledgements of the parts failed here are read and dropped before any later part's.
        // Closing it too cost a recovery's first tensor between two survivors a round trip.
        const bool whole = std::all_of(awaiting_.begin(), awaiting_.end(), [](const OutPart& p) { return p.written; });
        if (stop || !whole) {
          Broken(why);
        } else {
          orphaned_ += awaiting_.size();
          FailAwaiting(why);
        }
        {
          absl::MutexLock lock(&mu_);
          cancel_handled_ = true;
        }
        cv_.SignalAll();
        if (stop) return;
        continue;
      }
      if (!next.empty()) {
        Send(std::move(next.front()));
        continue;
      }
      if (open) {
        // A failure here is the first send's to report, when it tries again.
        if (fd_ < 0) (void)Open(std::chrono::steady_clock::now() + opt_.timeout);
        continue;
      }
      AwaitAcks();
    }
  }

  // Connects and says hello if needed, then writes the part, reading acknowledgements whenever
  // they arrive meanwhile (so each is timed when it came, and a refusal of this very part stops
  // its bytes at once).
  void Send(OutPart p) {
    // A connection kept between tensors that its peer or a middlebox closed meanwhile is replaced
    // before the part is written into it: the part would fail, and with it the plan version, over
    // a link that works. Nothing is awaited on it, so what there is to read is its end, or the
    // acknowledgements of parts a cancellation gave up, taken here.
    if (fd_ >= 0 && awaiting_.empty() && !proof_unacknowledged_) {
      pollfd f{fd_, POLLIN, 0};
      if (poll(&f, 1, 0) > 0 && (orphaned_ == 0 || !PumpAcks().ok())) {
        Broken(absl::UnavailableError("the receiver closed the connection"));
      }
    }
    if (fd_ < 0) {
      if (absl::Status s = Open(p.deadline); !s.ok()) return p.Done(Why(s));
    }
    p.Encode();
    const Deadline deadline = p.deadline;
    const uint8_t* data = p.data;
    const size_t bytes = p.bytes;
    const std::string header = p.header;
    // Acknowledgements come in order: this part's is the one after those awaited already. Only
    // an error takes it off the list before it is written (PumpAcks), so `self` stays valid
    // wherever it is used below.
    awaiting_.push_back(std::move(p));
    OutPart* self = &awaiting_.back();
    // One gather write per chunk, the header with the first and the checksum with the last: a
    // small tensor is one segment on the wire, not three.
    uint32_t crc = 0;
    absl::Status s;
    for (size_t at = 0;;) {
      const size_t n = std::min(opt_.chunk_bytes, bytes - at);
      crc = Crc32c(crc, data + at, n);
      const bool first = at == 0, last = at + n == bytes;
      std::string trailer;
      if (last) PutU32(trailer, crc);
      s = Write({{first ? header.data() : nullptr, first ? header.size() : 0},
                 {data + at, n},
                 {trailer.data(), trailer.size()}},
                deadline);
      at += n;
      if (!s.ok() || last) break;
    }
    if (s.ok()) {
      self->written = true;
      self->op->PartWritten();
      return;
    }
    // A receiver that refused closes the connection: its reason may be waiting to be read (unless
    // Write read it already, which `s` then says).
    if (absl::IsUnavailable(s) && absl::StartsWith(s.message(), "connection broken")) {
      if (absl::Status acks = PumpAcks(); !acks.ok()) s = acks;
    }
    Broken(Why(s));
  }

  // Writes the segments, in order, by `deadline`, reading acknowledgements that arrive
  // meanwhile. An error means the connection is finished (Broken with it).
  absl::Status Write(std::initializer_list<std::pair<const void*, size_t>> segments, Deadline deadline) {
    iovec iov[3];
    int count = 0;
    for (const auto& [p, n] : segments)
      if (n > 0) iov[count++] = {const_cast<void*>(p), n};
    for (int at = 0; at < count;) {
      msghdr msg{};
      msg.msg_iov = iov + at;
      msg.msg_iovlen = static_cast<size_t>(count - at);
      const ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        for (size_t left = static_cast<size_t>(w); left > 0 && at < count;) {
          const size_t take = std::min(left, iov[at].iov_len);
          iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + take;
          iov[at].iov_len -= take;
          left -= take;
          if (iov[at].iov_len == 0) ++at;
        }
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        return absl::UnavailableError(absl::StrCat("connection broken while sending: ", strerror(errno)));
      }
      pollfd f[2] = {{fd_, POLLOUT | POLLIN, 0}, {cancel_.fd(), POLLIN, 0}};
      if (poll(f, 2, PollTimeoutMs(deadline)) < 0 && errno != EINTR) return absl::InternalError(strerror(errno));
      if (f[1].revents != 0) return absl::CancelledError("woken");
      if ((f[0].revents & POLLIN) != 0) {
        if (absl::Status s = PumpAcks(); !s.ok()) return s;
      }
      if (f[0].revents == 0 && std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrFormat("could not send within %.1f s", std::chrono::duration<double>(opt_.timeout).count()));
      }
    }
    return absl::OkStatus();
  }

  // Reads every acknowledgement that has arrived, without waiting, and completes its part. An
  // error means the connection is finished: the receiver closed it (after refusing a part, whose
  // reason that part got) or sent what is no acknowledgement.
  absl::Status PumpAcks() {
    char buf[4096];
    for (;;) {
      const ssize_t r = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r > 0) acks_.append(buf, static_cast<size_t>(r));
      const bool closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      // Whole acknowledgements are taken as soon as they are in: what waits is at most one.
      while (acks_.size() >= 4) {
        const uint32_t n = GetU32(reinterpret_cast<const uint8_t*>(acks_.data()));
        if (n > kMaxAckBytes || (awaiting_.empty() && orphaned_ == 0 && !proof_unacknowledged_)) {
          return absl::DataLossError("the receiver sent what is no acknowledgement: is it a longhaul worker?");
        }
        if (acks_.size() < 4 + n) break;
        proto::TensorAck ack;
        if (!ack.ParseFromArray(acks_.data() + 4, static_cast<int>(n))) {
          return absl::DataLossError("unparseable acknowledgement");
        }
        acks_.erase(0, 4 + n);
        const absl::Status s = AckStatus(ack);
        const bool refused = !s.ok() && !ack.dropped();  // a refusal closes the connection; a drop does not
        if (std::exchange(proof_unacknowledged_, false)) {
          if (!s.ok()) return s;  // every part written after the proof fails with the refusal
          continue;
        }
        if (orphaned_ > 0) {  // a part a cancellation failed already
          --orphaned_;
          if (refused) {
            return absl::UnavailableError(
                absl::StrCat("the receiver closed the connection after refusing a tensor given up: ", s.message()));
          }
          continue;
        }
        // A part is acknowledged after its last byte; a refusal may come sooner.
        if (s.ok() && !awaiting_.front().written) {
          return absl::DataLossError("the receiver acknowledged a tensor before it was sent: is it a longhaul worker?");
        }
        OutPart done = std::move(awaiting_.front());
        awaiting_.pop_front();
        done.Done(s);
        if (refused) {
          return absl::UnavailableError(
              absl::StrCat("the receiver closed the connection after refusing an earlier tensor: ", s.message()));
        }
      }
      if (closed) return absl::UnavailableError("the receiver closed the connection");
      if (r < 0) return absl::OkStatus();  // nothing more for now
    }
  }

  // Whether `bytes` more go into the socket's send buffer at once: what the buffer holds, as the
  // kernel counts it (packets' overhead included), leaves room for twice the bytes and a page.
  bool Fits(size_t bytes) const {
    uint32_t memory[SK_MEMINFO_VARS] = {};
    socklen_t len = sizeof(memory);
    return getsockopt(fd_, SOL_SOCKET, SO_MEMINFO, memory, &len) == 0 && len == sizeof(memory) &&
           memory[SK_MEMINFO_WMEM_QUEUED] + 2 * bytes + 4096 <= memory[SK_MEMINFO_SNDBUF];
  }

  // Waits for acknowledgements, new parts or cancellation, until the oldest part's deadline. A
  // caller may claim the connection meanwhile to write a small part (Enqueue).
  void AwaitAcks() {
    const int fd = fd_, timeout = PollTimeoutMs(awaiting_.front().deadline);
    pollfd p[3] = {{fd, POLLIN, 0}, {kick_.fd(), POLLIN, 0}, {cancel_.fd(), POLLIN, 0}};
    SetPolling(true);  // from here until SetPolling(false) a caller may change awaiting_
    const int r = poll(p, 3, timeout);
    SetPolling(false);
    kick_.Clear();
    // A caller's write meanwhile broke the connection the poll saw, or read the acknowledgements
    // it waited for.
    if (fd != fd_ || awaiting_.empty()) return;
    if (r > 0 && p[0].revents != 0) {
      if (absl::Status s = PumpAcks(); !s.ok()) Broken(s);
    } else if (r == 0 && std::chrono::steady_clock::now() >= awaiting_.front().deadline) {
      Broken(absl::DeadlineExceededError(absl::StrFormat("no acknowledgement within %.1f s",
                                                         std::chrono::duration<double>(opt_.timeout).count())));
    }
  }

  // Lends the connection to callers while the thread polls, and takes it back once no caller
  // writes.
  void SetPolling(bool polling) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!polling) {
      while (claimed_) cv_.Wait(&mu_);
    }
    polling_ = polling;
  }

  absl::Status Open(Deadline deadline) {
    std::string warning;
    auto fd = ConnectTcp(address_, deadline, cancel_, opt_.congestion_control, &warning);
    if (!fd.ok()) return fd.status();
    if (!warning.empty()) {
      static std::once_flag warned;
      std::call_once(warned, [&] { std::cerr << "longhaul transport: " << warning << "\n"; });
    }
    absl::Status s = Handshake(*fd, deadline);
    if (!s.ok()) {
      close(*fd);
      return s;
    }
    fd_ = *fd;
    acks_.clear();
    proof_unacknowledged_ = true;
    return absl::OkStatus();
  }

  // The hello, then each side's proof that it holds the job secret and is the worker it says
  // (TensorServer::ServeHello). The receiver's acknowledgement of this side's proof is read with
  // the parts' (PumpAcks): the first part follows the proof at once, one round trip after the
  // hello rather than two, which on a long link is what a new plan version's first tensor would
  // wait for. The receiver has proved itself by then, so nothing reaches a peer without the job's
  // secret, nor another worker than the one meant.
  absl::Status Handshake(int fd, Deadline deadline) {
    if (!opt_.key) return absl::InternalError("no key to sign this worker's hello with (OpenSSL could not make one)");
    absl::StatusOr<std::string> nonce = RandomNonce();
    if (!nonce.ok()) return nonce.status();
    std::string hello(kTensorMagic, 4);
    PutU32(hello, kProtocolVersion);
    PutU32(hello, static_cast<uint32_t>(opt_.job_id.size()));
    hello += opt_.job_id + *nonce + IdBytes(opt_.worker_id) + opt_.key->public_key();
    if (absl::Status s = WriteAll(fd, hello.data(), hello.size(), deadline, cancel_); !s.ok()) return s;
    if (absl::Status s = ReadAck(fd, deadline, cancel_); !s.ok()) return s;
    std::string challenge(kNonceBytes + kProofBytes + kHelloIdentityBytes + kSignatureBytes, '\0');
    if (absl::Status s = ReadAll(fd, challenge.data(), challenge.size(), deadline, cancel_); !s.ok()) return s;
    const absl::string_view said(challenge);
    const std::string server_nonce(said.substr(0, kNonceBytes));
    if (!ProofsEqual(said.substr(kNonceBytes, kProofBytes), ReceiverProof(opt_.secret, opt_.job_id, *nonce, server_nonce))) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "the peer at %s does not hold this job's secret (this worker's: %s); nothing was sent to it. Give every "
          "process of the job the same --secret-file",
          address_, opt_.secret.source()));
    }
    const size_t id_at = kNonceBytes + kProofBytes;
    const int receiver = static_cast<int32_t>(GetU32(reinterpret_cast<const uint8_t*>(challenge.data()) + id_at));
    const absl::string_view receiver_key = said.substr(id_at + 4, kPublicKeyBytes);
    if (to_.worker_id >= 0 && (receiver != to_.worker_id || receiver_key != to_.public_key)) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "the peer at %s is worker %d%s, not worker %d, which this worker meant to reach; nothing was sent to it",
          address_, receiver, receiver == to_.worker_id ? " with another key than the job's" : "", to_.worker_id));
    }
    const HelloTranscript t{opt_.job_id, *nonce, server_nonce, opt_.worker_id, receiver};
    if (!HelloSignatureValid(receiver_key, said.substr(id_at + kHelloIdentityBytes), HelloSide::kReceiver, t)) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "the peer at %s does not prove it is worker %d: its signature of the hello does not verify; nothing was sent "
          "to it",
          address_, receiver));
    }
    const std::string proof = SenderProof(opt_.secret, opt_.job_id, *nonce, server_nonce) +
                              SignHello(*opt_.key, HelloSide::kSender, t);
    return WriteAll(fd, proof.data(), proof.size(), deadline, cancel_);
  }

  // A cancelled wait means this connection was cancelled: say by whom.
  absl::Status Why(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!absl::IsCancelled(s) || s.message() != "woken") return s;
    absl::MutexLock lock(&mu_);
    return absl::CancelledError(cancelled_.empty() ? "the sender was closed" : cancelled_);
  }

  // Every part waiting for an acknowledgement fails with `why`.
  void FailAwaiting(const absl::Status& why) {
    std::deque<OutPart> lost;
    lost.swap(awaiting_);
    for (OutPart& p : lost) p.Done(why);
  }

  // Every part waiting for an acknowledgement fails with `why`; the next part connects afresh.
  void Broken(const absl::Status& why) {
    FailAwaiting(why);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    orphaned_ = 0;
  }

  const std::string address_;
  const TransportOptions opt_;
  const PeerIdentity to_;  // whom the receiver must prove it is
  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled whenever a field under mu_ changes that a waiter waits on
  std::deque<OutPart> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string cancelled_ ABSL_GUARDED_BY(mu_);
  bool idle_ ABSL_GUARDED_BY(mu_) = false;     // the thread waits for work, with nothing awaiting acknowledgement
  bool polling_ ABSL_GUARDED_BY(mu_) = false;  // the thread waits for acknowledgements (AwaitAcks)
  bool claimed_ ABSL_GUARDED_BY(mu_) = false;  // a caller writes a part on the idle or polling thread's behalf
  bool open_soon_ ABSL_GUARDED_BY(mu_) = false;       // OpenSoon asked the thread to connect
  bool cancel_handled_ ABSL_GUARDED_BY(mu_) = false;  // the thread failed what cancelled_ ends
  // The one this connection is registered with: the owner's alone (the constructor, Rearm and
  // Close run on the thread that owns the TensorClient), never the connection thread's.
  std::shared_ptr<SendCanceller> canceller_;
  WakeFd cancel_, kick_;  // eventfds, woken from any thread (Cancel and Close; Enqueue)
  // Not under mu_: the thread's alone, or the caller's that claimed it (claimed_, set under mu_
  // while the thread is idle or polling and touches none of these until it is cleared again):
  std::deque<OutPart> awaiting_;  // written (or being written), acknowledgement not yet read
  std::string acks_;              // bytes of acknowledgements not yet whole
  bool proof_unacknowledged_ = false;  // the next acknowledgement is the handshake's (Handshake)
  size_t orphaned_ = 0;  // acknowledgements still to come of parts a cancellation failed
  int fd_ = -1;
  std::thread thread_;
};

void SendCanceller::Cancel(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (!reason_.empty()) return;
  reason_ = reason.empty() ? "cancelled" : reason;
  for (PeerConnection* c : connections_) c->Cancel(reason_);
}

std::string SendCanceller::reason() {
  absl::MutexLock lock(&mu_);
  return reason_;
}

bool SendCanceller::Register(PeerConnection* c) {
  absl::MutexLock lock(&mu_);
  if (!reason_.empty()) return false;
  connections_.insert(c);
  return true;
}

void SendCanceller::Unregister(PeerConnection* c) {
  absl::MutexLock lock(&mu_);
  connections_.erase(c);
}

void SendOp::PartWritten() {
  absl::MutexLock lock(&mu_);
  if (--unwritten_ == 0) cv_.SignalAll();
}

void SendOp::WaitWritten() {
  absl::MutexLock lock(&mu_);
  while (unwritten_ != 0) cv_.Wait(&mu_);
}

void SendOp::PartDone(const absl::Status& s, bool written) {
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    if (!written && --unwritten_ == 0) cv_.SignalAll();
    if (!s.ok() && status_.ok()) {
      status_ = absl::Status(s.code(), absl::StrCat("sending ", what_, ": ", s.message()));
      if (!absl::IsCancelled(s)) failed = status_;
    }
    if (--pending_ == 0) {
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      cv_.SignalAll();
    }
  }
  if (!failed.ok() && on_failure_) on_failure_(failed);
}

absl::Status SendOp::Wait() {
  absl::MutexLock lock(&mu_);
  while (pending_ != 0) cv_.Wait(&mu_);
  return status_;
}

bool SendOp::Done() {
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

TensorClient::TensorClient(const std::string& address, const TransportOptions& options, PeerIdentity to)
    : address_(address), options_(options) {
  if (!options_.key) {
    // Where none comes out, each connection's hello says so (Handshake).
    if (absl::StatusOr<WorkerKey> own = WorkerKey::Generate(); own.ok()) {
      options_.key = std::make_shared<const WorkerKey>(*std::move(own));
    }
  }
  for (int i = 0; i < std::max(1, options_.connections); ++i)
    connections_.push_back(std::make_unique<PeerConnection>(address, options_, to));
}

TensorClient::~TensorClient() = default;

void TensorClient::Close() {
  for (auto& c : connections_) c->Close();
}

void TensorClient::OpenSoon() {
  for (auto& c : connections_) c->OpenSoon();
}

void TensorClient::Rearm(std::shared_ptr<SendCanceller> canceller) {
  options_.canceller = canceller;
  for (auto& c : connections_) c->Rearm(canceller);
}

bool EncodedAsWritten(int kind, WireDtype dtype) {
  // A boundary tensor stays unchanged until it is written, as every fp32 tensor does (the schedule
  // reuses its buffer only once the tensor came back as its gradient, or the next stage sent its
  // own): it is encoded off the caller's thread, which is the compute's. Other tensors' buffers
  // are the caller's again once Send returns.
  return dtype != WireDtype::kF32 &&
         (kind == proto::ACTIVATION || kind == proto::GRADIENT || kind == proto::EVAL_ACTIVATION);
}

size_t TensorParts(size_t n, int kind, WireDtype dtype, size_t connections) {
  const size_t pieces = (n + kWirePiece - 1) / kWirePiece, mib = WireBytes(n, dtype) >> 20;
  return std::max<size_t>(1, std::min(pieces, EncodedAsWritten(kind, dtype) ? mib : std::min(connections, mib)));
}

std::shared_ptr<SendOp> TensorClient::Send(proto::TensorHeader header, const float* data, size_t n,
                                           std::function<void(const absl::Status&)> on_failure) {
  auto op = std::make_shared<SendOp>();
  op->on_failure_ = std::move(on_failure);
  const WireDtype dtype = header.dtype() != proto::WIRE_DTYPE_UNSPECIFIED ? static_cast<WireDtype>(header.dtype())
                                                                         : WireDtypeFor(options_.dtype, header.kind());
  op->start_ = std::chrono::steady_clock::now();
  op->what_ = absl::StrFormat("%s to %s", TensorKey{header.kind(), header.iteration(), header.micro_batch(),
                                                    header.from_stage(), header.from_replica(), header.shard()}
                                              .DebugString(),
                              address_);
  header.set_job_id(options_.job_id);
  header.set_protocol_version(kProtocolVersion);
  header.set_dtype(static_cast<proto::WireDtype>(dtype));
  header.set_total_elements(n);
  // Each part is encoded on its own, so a receiver decodes it alone.
  const size_t pieces = (n + kWirePiece - 1) / kWirePiece;
  const size_t parts = TensorParts(n, header.kind(), dtype, connections_.size());
  std::vector<size_t> lo(parts + 1), at(parts + 1, 0);
  for (size_t p = 0; p <= parts; ++p) {
    lo[p] = std::min(n, pieces * p / parts * kWirePiece);
    if (p > 0) at[p] = at[p - 1] + WireBytes(lo[p] - lo[p - 1], dtype);
  }
  const uint8_t* wire = reinterpret_cast<const uint8_t*>(data);
  // A boundary's gradient in a FewLevels dtype rounds stochastically (wire_dtype.h): rounded to
  // the nearest of so few levels, its error leans the same way step after step, which the
  // convergence bench's int4 boundaries pay for (docs/benchmarks.md). Seeded by what the tensor
  // is, so a resend carries the same bits.
  const bool stochastic = header.kind() == proto::GRADIENT && FewLevels(dtype);
  const uint64_t seed = stochastic ? HashCoords({static_cast<uint64_t>(header.iteration()),
                                                 static_cast<uint64_t>(header.micro_batch()),
                                                 static_cast<uint64_t>(header.from_stage()),
                                                 static_cast<uint64_t>(header.from_replica())})
                                   : 0;
  if (dtype != WireDtype::kF32) {
    op->wire_.resize(at[parts]);
    wire = op->wire_.data();
  }
  {
    absl::MutexLock lock(&op->mu_);
    op->pending_ = op->unwritten_ = static_cast<int>(parts);
  }
  const Deadline deadline = op->start_ + options_.timeout;
  for (size_t p = 0; p < parts; ++p) {
    proto::TensorHeader h = header;
    h.set_part_offset(lo[p]);
    h.set_part_elements(lo[p + 1] - lo[p]);
    OutPart part{op, "", wire + at[p], at[p + 1] - at[p], deadline};
    if (dtype != WireDtype::kF32) {
      part.from = data + lo[p];
      part.encode_into = op->wire_.data() + at[p];
      part.count = lo[p + 1] - lo[p];
      part.dtype = dtype;
      if (stochastic) part.rounding = StochasticRounding{seed, lo[p]};
      if (!EncodedAsWritten(header.kind(), dtype)) part.Encode();  // else by the thread that writes it
    }
    PutU32(part.header, static_cast<uint32_t>(h.ByteSizeLong()));
    part.header += h.SerializeAsString();
    connections_[p % connections_.size()]->Enqueue(std::move(part));
  }
  return op;
}

}  // namespace longhaul
