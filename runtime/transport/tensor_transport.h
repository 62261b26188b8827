#pragma once
// Worker-to-worker tensor transport: a framed TCP data plane of longhaul's own (gRPC stays the
// control plane). gRPC carried tensors until its HTTP/2 flow control showed up on long links: a
// 64 KiB tensor took 30-45 ms more than the link's delay after some idle gaps at 80-135 ms one-way
// (window updates in flight), and about a round trip more with BDP probing off; plain TCP took the
// link's delay to the millisecond (see README, "The data plane").
//
// A connection opens with a hello in which each side proves that it holds the job secret and
// which worker of the job it is, before a byte of tensor moves:
//   1. sender:   the magic "LHT1", the protocol version (u32), the job id (u32 length, then its
//                bytes; integers little-endian), the sender's nonce (32 random bytes), its worker
//                id (i32) and its Ed25519 public key (32 bytes, transport/identity.h).
//   2. receiver: one acknowledgement frame (u32 length, then a serialized proto::TensorAck) and,
//                on a stranger (another job or protocol version), closes; else its own nonce (32),
//                its proof of the job secret (HMAC-SHA256 over the job id and both nonces,
//                job_secret.h; 32), its worker id (i32), its public key (32) and its signature
//                (64) over the job id, both nonces and both worker ids (SignHello).
//   3. sender:   checks the proof, that the receiver is the worker it meant to reach (its id and
//                the key the plan or the coordinator's news gives it; a tool that means nobody in
//                particular checks the signature alone) and the signature, then sends its own
//                proof of the secret (32) and its signature (64) over the same.
//   4. receiver: checks the proof, the signature, that the job's membership gives the sender's
//                worker id that key (TensorAdmission::Member: a member it has yet to hear of is
//                waited for a moment, a lost one is refused), and the sender's share of
//                connections (TensorServer); then acknowledges once more, or refuses with the
//                reason and closes.
// A peer without the secret learns nothing and sends nothing; a recorded handshake fails against
// the receiver's next nonce; each signature is bound to both ends and labelled by its side, so it
// cannot be replayed to another receiver nor stand for the other side's. Then each tensor part is:
// u32 header length (at most 4 KiB), a serialized proto::TensorHeader, the part's bytes in the
// wire dtype, and the CRC-32C of those bytes (u32); the receiver answers each part with an
// acknowledgement in order, so parts pipeline on one connection (the first follows step 3 at
// once). A tensor may be split over several connections to one peer (transport.connections), one
// part each, to fill a fat, long link.
//
// The receiver reads nothing but the hello until the sender proved the secret and who it is;
// then, per part, it asks its TensorAdmission whether the plan lets that worker send that tensor
// now (the place the header names, from stage and from replica, must be that worker's in the plan
// version it names) and how many elements it must have, and reserves the part in the Mailbox, all
// before allocating anything for it (the buffer is taken when the first payload byte arrives): a
// part claiming another worker's place is refused before it can reserve that place's stream. Any
// refusal is acknowledged with its reason and closes that connection only; bytes that are not a
// hello close their own connection and touch nothing else.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "format/wire_dtype.h"
#include "longhaul.pb.h"
#include "transport/identity.h"
#include "transport/job_secret.h"
#include "transport/mailbox.h"
#include "transport/socket_io.h"

namespace longhaul {

inline constexpr uint32_t kProtocolVersion = 12;
inline constexpr char kTensorMagic[4] = {'L', 'H', 'T', '1'};
inline constexpr size_t kMaxTensorHeaderBytes = 4096;
// Connections one server serves at once: a peer cannot make it spawn threads without end.
inline constexpr int kMaxTensorConnections = 512;
// Who a side of the hello says it is: its worker id (i32) and its public key.
inline constexpr size_t kHelloIdentityBytes = 4 + kPublicKeyBytes;
// Each side's proof of the job secret in a tensor port's handshake, over the job id and both
// nonces; labelled apart (JobSecret::Proof), so that neither proof can stand for the other.
std::string ReceiverProof(const JobSecret& secret, const std::string& job, const std::string& sender_nonce,
                          const std::string& receiver_nonce);
std::string SenderProof(const JobSecret& secret, const std::string& job, const std::string& sender_nonce,
                        const std::string& receiver_nonce);
// What each side of a tensor port's hello signs with its worker key: the job id, both nonces and
// both worker ids. Each side's signature carries a label of its own (HelloSide).
struct HelloTranscript {
  std::string job, sender_nonce, receiver_nonce;
  int sender = -1, receiver = -1;
};
enum class HelloSide { kSender, kReceiver };
std::string SignHello(const WorkerKey& key, HelloSide side, const HelloTranscript& t);
bool HelloSignatureValid(absl::string_view public_key, absl::string_view signature, HelloSide side,
                         const HelloTranscript& t);

// Whom a connection must reach: the worker id and public key the job's membership gives it. A
// tool without membership names nobody (worker_id -1): any receiver that holds the job's secret.
struct PeerIdentity {
  int worker_id = -1;
  std::string public_key;
};

class PeerConnection;
struct OutPart;

// Stops every send in flight through the clients that share it, and every later one until a
// client is rearmed with another (TensorClient::Rearm), with a reason: a stopped job must not wait
// out transport.timeout_s on a peer that is gone.
class SendCanceller {
 public:
  // Cancels every registered connection under the lock (PeerConnection::Cancel takes the
  // connection's own: this one is always taken first).
  void Cancel(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Empty until Cancel.
  std::string reason() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class PeerConnection;
  // False (and nothing registered) once cancelled.
  bool Register(PeerConnection* c) ABSL_LOCKS_EXCLUDED(mu_);
  void Unregister(PeerConnection* c) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::set<PeerConnection*> connections_ ABSL_GUARDED_BY(mu_);
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

struct TransportOptions {
  std::string job_id = "longhaul";
  JobSecret secret;  // proved to every receiver, and every receiver's proof checked
  // Who this process is, proved to every receiver: its worker id and key. A client without a key
  // makes one of its own (a tool's: only a receiver without membership, AnyTensorUpTo, admits it).
  int worker_id = -1;
  std::shared_ptr<const WorkerKey> key;
  WireDtype dtype = WireDtype::kF32;
  size_t chunk_bytes = 2u << 20;  // checksummed and written at a time
  int connections = 1;  // TCP connections per peer; a tensor is split evenly over them
  // Of the sending side of each connection (transport.congestion_control); empty: the system's.
  std::string congestion_control = "cubic";
  std::chrono::milliseconds timeout{120000};
  std::shared_ptr<SendCanceller> canceller;  // optional
};

// Who may connect to this process, and what the plan lets each peer send it at this moment. The
// hello asks whether the sender is a member; the receiver asks with the header alone, before it
// allocates anything for the tensor, whether the plan lets that proven worker send it.
class TensorAdmission {
 public:
  virtual ~TensorAdmission() = default;
  // OK where the job's membership gives worker `worker` the key `public_key`; else why that worker
  // may not connect: Unavailable for a worker this process has not heard of (it is asked again for
  // a moment: news of a new member may come a moment after the member), PermissionDenied for one
  // the job no longer has (lost) or for another key.
  virtual absl::Status Member(int worker, absl::string_view public_key) const = 0;
  // What a member may hold of this receiver's connections: how many at once, and whether the plan
  // places it now (a placed worker's, within that many, are never pushed out for another's).
  struct Share {
    int connections = 0;
    bool placed = false;
  };
  virtual Share ShareOf(int worker) const = 0;
  // The element count the whole tensor must have, or why the header is refused; `sender` is the
  // worker the connection's hello proved.
  virtual absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& header, int sender) const = 0;
  // The header, whose part has waited `waited` so far, is of a plan this process is yet to install
  // and still expects: its sender set it up sooner. The server asks Admit once it is not, or at
  // the part timeout.
  virtual bool Ahead(const proto::TensorHeader&, std::chrono::steady_clock::duration /*waited*/) const { return false; }
  // The header is of a plan version this process has left or heard is being replaced: its part is
  // read and dropped (TensorAck.dropped), and the connection stays for the next version's tensors.
  virtual bool Stale(const proto::TensorHeader&) const { return false; }
};

// Admits any worker (it has no membership: any key that signs its hello) with any number of
// connections, and any tensor of at most `max_elements` in any wire dtype: for tools and tests
// without a plan.
class AnyTensorUpTo : public TensorAdmission {
 public:
  explicit AnyTensorUpTo(uint64_t max_elements) : max_(max_elements) {}
  absl::Status Member(int, absl::string_view) const override { return absl::OkStatus(); }
  Share ShareOf(int) const override { return {kMaxTensorConnections, true}; }
  absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& header, int sender) const override;

 private:
  uint64_t max_;
};

// Receives tensors into a Mailbox: one thread accepts, one thread serves each connection,
// kMaxTensorConnections at most. A proven worker holds at most its share of them
// (TensorAdmission::ShareOf: a few per link of its clients to this worker), a connection beyond
// that refused in its hello. When all are taken, a new connection takes the place of, in this
// order: one refused already, waiting for its peer to read why; one still in its hello (the
// oldest of an address holding more than half of them in their hellos, else the oldest); the
// oldest proven one of a worker the plan does not place now (a spare's, a lost worker's); the
// oldest of a placed worker holding more than its share (a new plan gave its link fewer
// connections). A placed worker within its share is never pushed out, so strangers, spares and
// members together cannot crowd the plan's links out, and what the server holds stays bounded by
// the plan.
class TensorServer {
 public:
  // Listens on `address` (port 0 picks a free one). `mailbox` and `admission` must outlive the
  // server. Only senders that prove they hold `secret`, and that they are members of the job
  // (`admission`), get past the hello. The server proves to each that it holds `secret` and `key`,
  // this worker's (SetWorkerId); without a key it makes one of its own (a tool's).
  static absl::StatusOr<std::unique_ptr<TensorServer>> Start(const std::string& address, const std::string& job_id,
                                                             Mailbox* mailbox, const TensorAdmission* admission,
                                                             JobSecret secret = JobSecret(),
                                                             std::shared_ptr<const WorkerKey> key = nullptr);
  ~TensorServer();
  // host:port actually bound.
  const std::string& address() const { return address_; }
  // The job whose peers are accepted; a worker learns it from the plan after it started listening.
  void SetJobId(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  std::string job_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // The worker id this server proves it is (-1 until set): the coordinator gives it at
  // registration, after the server started listening.
  void SetWorkerId(int worker_id) ABSL_LOCKS_EXCLUDED(mu_);
  int worker_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // How long a hello waits for news of a sender this worker has not heard of (TensorAdmission::
  // Member): longer than a lifeline to the coordinator takes to come back after a reconnect.
  static constexpr std::chrono::seconds kUnheardMemberPatience{3};
  // How long a tensor part may take from its header to its checksum (transport.timeout_s; 120 s
  // until set). Waits between parts have no limit: a quiet peer is a peer between iterations.
  void SetPartTimeout(std::chrono::milliseconds timeout) ABSL_LOCKS_EXCLUDED(mu_);
  std::chrono::milliseconds part_timeout() const ABSL_LOCKS_EXCLUDED(mu_);
  // Who sent a connection's last admitted part, as its header said: its place under its plan version.
  struct Sender {
    int stage = 0, replica = 0;
    uint64_t plan_version = 0;
  };
  // Called, from the connection's thread, when a sender whose tensors this server admitted closes
  // its connection or the connection breaks (not at Shutdown). A killed process's connections
  // close at once, so this is the first evidence of its death.
  void SetSenderLeftObserver(std::function<void(const Sender&)> observer) ABSL_LOCKS_EXCLUDED(mu_);
  // Connections and parts refused so far (stranger, garbage, identity, bad header, checksum, a
  // connection pushed out for a newer one), and the last reason.
  int refused() const { return refused_.load(); }
  std::string last_refusal() const ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the port and every connection (a part half received is abandoned) and joins them.
  void Shutdown() ABSL_LOCKS_EXCLUDED(conns_mu_);

 private:
  // Shared by the acceptor and the connection's own thread: fd and peer_ip are set before the
  // thread starts and not changed after, done, hello and worker are atomic, and the thread is
  // joined by the acceptor (ReapFinished, once done) or Shutdown, under conns_mu_.
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
    // Where the connection stands: in its hello, proved (serving parts), ended (its refusal said
    // and the peer given time to read it), or pushed out for a newer one. The thread's end of the
    // hello, or of a proved connection, and an eviction (AcceptLoop) race for it.
    enum HelloState { kInHello, kProved, kEnded, kEvicted };
    std::atomic<int> hello{kInHello};
    // An eviction shuts the socket down under it, and the thread closes the socket under it (End),
    // so a socket is never shut down after its number was closed (and maybe reused).
    absl::Mutex fd_mu;
    bool closed ABSL_GUARDED_BY(fd_mu) = false;
    uint32_t peer_ip = 0;  // the peer's IPv4 address, in network order
    // The worker the hello proved, counted in proven_ (Claim) until the thread ends; -1 before.
    std::atomic<int> worker{-1};
  };
  TensorServer(std::string job_id, Mailbox* mailbox, const TensorAdmission* admission, JobSecret secret,
               std::shared_ptr<const WorkerKey> key);
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(conns_mu_);
  // The hello, then parts until the peer closes or a part is refused.
  void Serve(Connection* c) ABSL_LOCKS_EXCLUDED(mu_);
  // The hello and both sides' proofs of the secret and of who they are, checked within
  // kHelloTimeout: the worker the sender proved it is.
  absl::StatusOr<int> ServeHello(int fd) ABSL_LOCKS_EXCLUDED(mu_);
  // Counts `c`, proved to be `worker`'s, against that worker's share of connections: why not,
  // where the worker holds its share already.
  absl::Status Claim(Connection* c, int worker) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes a claimed connection out of the count (once).
  void Release(Connection* c) ABSL_LOCKS_EXCLUDED(mu_);
  // Closes the connection's socket and marks it done for the acceptor to reap.
  void End(Connection* c);
  // `sender` becomes the place and plan version of an admitted tensor's header; `from` is the
  // worker the hello proved.
  absl::Status ServePart(int fd, uint32_t header_bytes, int from, std::optional<Sender>* sender);
  // A link probe the admission let in: read, checked and dropped, never held.
  absl::Status ServeProbe(int fd, const proto::TensorHeader& h, Deadline deadline);
  // Reads a stale part's bytes (TensorAdmission::Stale) into a small buffer and acknowledges it
  // as dropped.
  absl::Status DropPart(int fd, const proto::TensorHeader& h, Deadline deadline);
  // Tells the sender its part of `h`'s version, which this worker left, was dropped (TensorAck's
  // `dropped`: the connection stays).
  absl::Status AckDropped(int fd, const proto::TensorHeader& h);
  // Reads a part's `bytes` through `scratch` and its checksum, keeping nothing: whether they agree.
  absl::StatusOr<bool> ReadAndDiscard(int fd, uint64_t bytes, uint8_t* scratch, size_t scratch_bytes,
                                      Deadline deadline);
  void Refuse(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Shuts down one connection to make room for a newer one, by the rule of the class comment: the
  // refusal that makes (empty where the connection was refused already), or none where no
  // connection may give way.
  std::optional<std::string> EvictOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(conns_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Shuts `c` down where it is in `state` and open: whether it was.
  static bool Evict(Connection& c, int state);
  // Shuts down a connection still in its hello, the oldest of an address holding more than half
  // of kMaxTensorConnections in their hellos, else the oldest: whether there was one.
  bool EvictOneInHello() ABSL_EXCLUSIVE_LOCKS_REQUIRED(conns_mu_);
  // Shuts down the oldest connection still in its hello, of peer address `from` where given.
  bool EvictOldestInHello(std::optional<uint32_t> from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(conns_mu_);
  // Shuts down the oldest proven connection of a worker the plan does not place now, else of a
  // placed one holding more than its share: why, or empty where there is none.
  std::string EvictOneProven() ABSL_EXCLUSIVE_LOCKS_REQUIRED(conns_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  void ReapFinished() ABSL_LOCKS_EXCLUDED(conns_mu_);

  // Set before the acceptor starts (Start), read-only after.
  std::string address_;
  const JobSecret secret_;
  std::shared_ptr<const WorkerKey> key_;
  Mailbox* mailbox_;
  const TensorAdmission* admission_;
  int listen_fd_ = -1;
  WakeFd stop_;           // an eventfd: Shutdown wakes every thread's waits with it
  std::thread acceptor_;  // started by Start, joined by Shutdown
  // Taken before mu_ (AcceptLoop refuses and counts proven connections under it) and before a
  // Connection's fd_mu.
  absl::Mutex conns_mu_;
  std::list<Connection> conns_ ABSL_GUARDED_BY(conns_mu_);
  std::atomic<int> refused_{0};  // counted without a lock
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  int worker_id_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<int, int> proven_ ABSL_GUARDED_BY(mu_);  // proven connections not ended, by worker
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds part_timeout_ ABSL_GUARDED_BY(mu_) = std::chrono::milliseconds(120000);
  std::function<void(const Sender&)> sender_left_ ABSL_GUARDED_BY(mu_);
};

// One send in flight: its bytes are written (the caller's buffer is free again) before the
// receiver acknowledges them a round trip later.
class SendOp {
 public:
  // Until every part was acknowledged or failed.
  absl::Status Wait() ABSL_LOCKS_EXCLUDED(mu_);
  // Until every part's bytes are in the kernel's socket buffers (or the part failed): from then on
  // the caller may change the data it sent from.
  void WaitWritten() ABSL_LOCKS_EXCLUDED(mu_);
  bool Done() ABSL_LOCKS_EXCLUDED(mu_);
  // From start to the last acknowledgement.
  double seconds() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return seconds_;
  }
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  friend class TensorClient;
  friend class PeerConnection;
  friend struct OutPart;
  void PartWritten() ABSL_LOCKS_EXCLUDED(mu_);
  // Acknowledged or failed; `written` says whether PartWritten came first.
  void PartDone(const absl::Status& s, bool written) ABSL_LOCKS_EXCLUDED(mu_);

  // Set by TensorClient::Send before the op's parts are queued, read-only after:
  std::vector<uint8_t> wire_;  // the encoded tensor, until every part is done
  std::chrono::steady_clock::time_point start_;
  std::string what_;
  std::function<void(const absl::Status&)> on_failure_;  // TensorClient::Send's

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when the last part is written, and when the last is done
  int pending_ ABSL_GUARDED_BY(mu_) = 0;    // parts not yet acknowledged or failed
  int unwritten_ ABSL_GUARDED_BY(mu_) = 0;  // parts not yet in the socket buffers (or failed)
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  double seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

// Whether a tensor of `kind` in `dtype` is encoded by the thread that writes each part (a boundary
// tensor in a format other than fp32) rather than before TensorClient::Send returns.
bool EncodedAsWritten(int kind, WireDtype dtype);
// The parts TensorClient::Send cuts n values of `kind` in `dtype` into over `connections`: equal,
// at multiples of kWirePiece values, one per connection and MiB on the wire (a tiny tensor goes
// whole); a tensor encoded as it is written, one per MiB whatever the connections, dealt to them
// in turn, so that the thread encodes a part while the kernel sends the one before.
size_t TensorParts(size_t n, int kind, WireDtype dtype, size_t connections);

// Sends tensors to one peer over transport.connections connections, each with its own thread
// that connects (waiting for a peer still starting up, until the send's deadline), writes parts in
// order and reads their acknowledgements; where that thread sleeps (between tensors or waiting for
// acknowledgements) and the socket takes it at once, a part of at most 16 KiB is written by the
// caller itself and the thread only reads its acknowledgement. Wait for every
// SendOp before destroying the client.

class TensorClient {
 public:
  // To the worker `to` at `address` (dialled there: an emulated link's proxy may stand between):
  // each connection checks, before it sends anything, that the receiver proves it is that worker.
  TensorClient(const std::string& address, const TransportOptions& options, PeerIdentity to = {});
  // Closes the connections and waits for their threads.
  ~TensorClient();
  const std::string& address() const { return address_; }

  // Sends n floats in the header's dtype, or where it names none in the options' (WireDtypeFor);
  // job id, protocol version, sizes and checksum are filled in here, the rest of `header` (kind,
  // iteration, ...) by the caller. With the fp32 wire dtype the bytes are sent from `data` itself,
  // which must stay unchanged until the SendOp is done. Another dtype is encoded into the op's own
  // buffer: a boundary tensor's (an activation or its gradient) by the thread that writes each
  // part, just before it does, so `data` must stay unchanged until the op is written, as the
  // schedule keeps it; any other tensor's here, before Send returns. `on_failure`, where given, is called
  // once as the op fails other than by a cancellation, from whichever thread saw it fail: a caller
  // that waits only at its next Flush hears of a reset connection or a refusal at once.
  std::shared_ptr<SendOp> Send(proto::TensorHeader header, const float* data, size_t n,
                               std::function<void(const absl::Status&)> on_failure = {});
  // Opens every connection now, each on its own thread, so the first tensor does not pay for the
  // connection and the hello (round trips on a long link); returns at once. A connection that
  // cannot open now opens at its first send, which reports the error.
  void OpenSoon();
  // Serves sends under `canceller` from now on (a new plan version's). The connections its last
  // canceller found between tensors are still open; the others connect again at their next part.
  // REQUIRES: every SendOp of this client is done.
  void Rearm(std::shared_ptr<SendCanceller> canceller);
  // Fails every send in flight and closes the connections, without waiting for their threads to
  // end (the destructor does): no more sends.
  void Close();

 private:
  std::string address_;
  TransportOptions options_;
  std::vector<std::unique_ptr<PeerConnection>> connections_;
};

}  // namespace longhaul
