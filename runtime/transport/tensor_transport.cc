#include "transport/tensor_transport.h"

#include <grpcpp/generic/async_generic_service.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/crc32c.h"

namespace longhaul {
namespace {

// The largest chunk (transport.chunk_mib <= 16) and some room: gRPC refuses bigger messages before
// buffering them.
constexpr int kMaxMessageBytes = (16 << 20) + 4096;

// HTTP/2 settings for bulk tensors, on both ends of a connection. Measured on loopback
// (bench/transport_bench): gRPC's defaults (16 KiB frames, 64 KiB stream lookahead, 8 KiB reads)
// cap a stream at a fraction of what the socket carries.
std::vector<std::pair<const char*, int>> BulkTransferArgs() {
  return {{GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20},
          {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20},
          {GRPC_ARG_TCP_READ_CHUNK_SIZE, 1 << 20},
          {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 4 << 20}};
}

grpc::ByteBuffer SerializeToBuffer(const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());  // small: copied
  return grpc::ByteBuffer(&slice, 1);
}

bool ParseFromBuffer(const grpc::ByteBuffer& buf, google::protobuf::Message& m) {
  std::vector<grpc::Slice> slices;
  if (!buf.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return m.ParseFromString(bytes);
}

std::string MetadataValue(const std::multimap<grpc::string_ref, grpc::string_ref>& md, const char* key) {
  auto it = md.find(key);
  return it == md.end() ? std::string("<none>") : std::string(it->second.data(), it->second.size());
}

}  // namespace

// ---- receiving --------------------------------------------------------------------------------

absl::StatusOr<uint64_t> AnyTensorUpTo::Admit(const proto::TensorHeader& h) const {
  if (h.total_elements() == 0 || h.total_elements() > max_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("a tensor of %d elements; this receiver takes 1 to %d", h.total_elements(), max_));
  }
  return h.total_elements();
}

class TensorServer::Receiver : public grpc::ServerGenericBidiReactor {
 public:
  Receiver(grpc::GenericCallbackServerContext* ctx, TensorServer* server) : server_(server) {
    if (ctx->method() != kTensorMethod) {
      Fail(absl::UnimplementedError(absl::StrCat("unknown method ", ctx->method(), ": not a longhaul peer")));
      return;
    }
    const std::string job = MetadataValue(ctx->client_metadata(), "lh-job");
    const std::string proto = MetadataValue(ctx->client_metadata(), "lh-protocol");
    if (job != server_->job_id() || proto != std::to_string(kProtocolVersion)) {
      Fail(absl::FailedPreconditionError(
          absl::StrFormat("refused: the peer runs job '%s' with protocol version %s, this worker runs job '%s' with "
                          "protocol version %d; start every process of a job from the same config and build",
                          job, proto, server_->job_id(), kProtocolVersion)));
      return;
    }
    StartRead(&buf_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Complete();  // the sender half-closed: the part is complete, or the call broke
    if (!reserved_) {
      if (absl::Status s = AcceptHeader(); !s.ok()) return Fail(s);
    } else if (received_ == expected_ && !have_trailer_) {
      if (!ParseFromBuffer(buf_, trailer_)) return Fail(absl::InvalidArgumentError("unparseable trailer"));
      have_trailer_ = true;
    } else {
      std::vector<grpc::Slice> slices;
      if (have_trailer_ || !buf_.Dump(&slices).ok()) {
        return Fail(absl::InvalidArgumentError("message after the trailer"));
      }
      // Allocated on the first chunk, so a stream that stops after its header holds no memory.
      if (values_.empty()) {
        values_ = server_->mailbox_->Acquire(header_.part_elements());
        if (header_.dtype() != proto::F32) wire_.resize(expected_);
      }
      uint8_t* dst = header_.dtype() == proto::F32 ? reinterpret_cast<uint8_t*>(values_.data()) : wire_.data();
      for (const grpc::Slice& s : slices) {
        if (s.size() > expected_ - received_) {
          return Fail(absl::InvalidArgumentError(absl::StrFormat("more bytes than the header announced (%d)", expected_)));
        }
        std::memcpy(dst + received_, s.begin(), s.size());
        crc_ = Crc32c(crc_, dst + received_, s.size());  // the bytes are still in cache
        received_ += s.size();
      }
    }
    StartRead(&buf_);
  }

  void OnDone() override {
    if (reserved_ && !delivered_) server_->mailbox_->AbandonPart(key_, header_.part_offset());
    server_->mailbox_->Recycle(std::move(values_));
    delete this;
  }

 private:
  // Every size in the header is checked against what the admission allows, overflow-safe, and the
  // part is reserved in the mailbox before any buffer exists.
  absl::Status AcceptHeader() {
    if (buf_.Length() > kMaxHeaderBytes) {
      return absl::InvalidArgumentError(absl::StrFormat("a tensor header of %d bytes (at most %d)", buf_.Length(),
                                                        kMaxHeaderBytes));
    }
    if (!ParseFromBuffer(buf_, header_)) return absl::InvalidArgumentError("unparseable tensor header");
    if (header_.job_id() != server_->job_id() || header_.protocol_version() != kProtocolVersion) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "tensor header of job '%s', protocol %d; this worker runs job '%s', protocol %d", header_.job_id(),
          header_.protocol_version(), server_->job_id(), kProtocolVersion));
    }
    if (header_.dtype() < proto::F32 || header_.dtype() > proto::BF16) {
      return absl::InvalidArgumentError(absl::StrFormat("unknown wire dtype %d", header_.dtype()));
    }
    key_ = {header_.kind(), header_.iteration(), header_.micro_batch(), header_.from_stage(), header_.from_replica(),
            header_.shard()};
    absl::StatusOr<uint64_t> allowed = server_->admission_->Admit(header_);
    if (!allowed.ok()) return absl::Status(allowed.status().code(), absl::StrCat("refused: ", allowed.status().message()));
    if (header_.total_elements() != *allowed) {
      return absl::InvalidArgumentError(absl::StrFormat("refused: %s announces %d elements; the plan has %d",
                                                        key_.DebugString(), header_.total_elements(), *allowed));
    }
    if (absl::Status s = server_->mailbox_->BeginPart(key_, header_.total_elements(), header_.part_offset(),
                                                      header_.part_elements());
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("refused: ", s.message()));
    }
    reserved_ = true;
    expected_ = header_.part_elements() * (header_.dtype() == proto::F32 ? 4 : 2);
    return absl::OkStatus();
  }

  void Complete() {
    if (!reserved_ || received_ != expected_ || !have_trailer_) {
      return Fail(absl::DataLossError(absl::StrFormat("tensor part ended after %d of %d bytes", received_, expected_)));
    }
    if (crc_ != trailer_.crc32c()) {
      return Fail(absl::DataLossError(absl::StrFormat(
          "tensor part checksum %08x, sender says %08x: corrupted in transit", crc_, trailer_.crc32c())));
    }
    if (header_.dtype() != proto::F32) {
      DecodeWire(wire_.data(), values_.size(), static_cast<WireDtype>(header_.dtype()), values_.data());
      wire_ = {};
    }
    if (absl::Status s = server_->mailbox_->CompletePart(key_, header_.part_offset(), std::move(values_)); !s.ok()) {
      return Fail(s);
    }
    delivered_ = true;
    proto::TensorAck ack;
    ack.set_ok(true);
    ack_ = SerializeToBuffer(ack);
    StartWriteAndFinish(&ack_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void Fail(const absl::Status& why) {
    server_->Refuse(std::string(why.message()));
    Finish(grpc::Status(static_cast<grpc::StatusCode>(why.code()), std::string(why.message())));
  }

  static constexpr size_t kMaxHeaderBytes = 4096;
  TensorServer* server_;
  grpc::ByteBuffer buf_, ack_;
  proto::TensorHeader header_;
  proto::TensorTrailer trailer_;
  TensorKey key_;
  bool reserved_ = false, have_trailer_ = false, delivered_ = false;
  std::vector<float> values_;
  std::vector<uint8_t> wire_;
  size_t received_ = 0, expected_ = 0;
  uint32_t crc_ = 0;
};

class TensorServer::Generic : public grpc::CallbackGenericService {
 public:
  explicit Generic(TensorServer* server) : server_(server) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new Receiver(ctx, server_);
  }

 private:
  TensorServer* server_;
};

TensorServer::TensorServer(std::string job_id, Mailbox* mailbox, const TensorAdmission* admission)
    : job_id_(std::move(job_id)), mailbox_(mailbox), admission_(admission) {}

TensorServer::~TensorServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<TensorServer>> TensorServer::Start(const std::string& address, const std::string& job_id,
                                                                  Mailbox* mailbox, const TensorAdmission* admission,
                                                                  std::vector<grpc::Service*> extra) {
  std::unique_ptr<TensorServer> s(new TensorServer(job_id, mailbox, admission));
  s->generic_ = std::make_unique<Generic>(s.get());
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  b.SetMaxReceiveMessageSize(kMaxMessageBytes);
  for (auto [k, v] : BulkTransferArgs()) b.AddChannelArgument(k, v);
  b.RegisterCallbackGenericService(s->generic_.get());
  for (grpc::Service* svc : extra) b.RegisterService(svc);
  s->server_ = b.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " (in use, or not an address of this host?)"));
  }
  s->address_ = address.substr(0, address.rfind(':')) + ":" + std::to_string(port);
  return s;
}

void TensorServer::SetJobId(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  job_id_ = job_id;
}

std::string TensorServer::job_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_id_;
}

void TensorServer::Refuse(const std::string& why) {
  ++refused_;
  std::lock_guard<std::mutex> lock(mu_);
  last_refusal_ = why;
}

std::string TensorServer::last_refusal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_refusal_;
}

void TensorServer::Shutdown() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
}

// ---- sending ----------------------------------------------------------------------------------

class PartCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PartCall(grpc::GenericStub* stub, const TransportOptions& opt, std::shared_ptr<SendOp> op,
           const proto::TensorHeader& header, const uint8_t* data, size_t bytes)
      : op_(std::move(op)), canceller_(opt.canceller), data_(data), bytes_(bytes), chunk_(opt.chunk_bytes) {
    // A cancelled context cancels the call as soon as it starts.
    if (canceller_ && !canceller_->Register(this)) ctx_.TryCancel();
    ctx_.AddMetadata("lh-job", opt.job_id);
    ctx_.AddMetadata("lh-protocol", std::to_string(kProtocolVersion));
    ctx_.set_wait_for_ready(true);  // a peer still starting up is waited for, up to the deadline
    ctx_.set_deadline(std::chrono::system_clock::now() + opt.timeout);
    header_ = SerializeToBuffer(header);
    stub->PrepareBidiStreamingCall(&ctx_, kTensorMethod, grpc::StubOptions(), this);
    StartRead(&ack_buf_);
    StartWrite(&header_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the call failed; OnDone says why
    if (sent_ < bytes_) {
      const size_t n = std::min(chunk_, bytes_ - sent_);
      // Checksummed while gRPC still writes the previous chunk.
      crc_ = Crc32c(crc_, data_ + sent_, n);
      grpc::Slice s(data_ + sent_, n, grpc::Slice::STATIC_SLICE);  // the caller keeps the bytes alive
      chunk_buf_ = grpc::ByteBuffer(&s, 1);
      sent_ += n;
      StartWrite(&chunk_buf_);
    } else if (!trailer_sent_) {
      proto::TensorTrailer trailer;
      trailer.set_crc32c(crc_);
      chunk_buf_ = SerializeToBuffer(trailer);
      trailer_sent_ = true;
      StartWrite(&chunk_buf_);
    } else {
      StartWritesDone();
    }
  }

  void OnReadDone(bool ok) override { got_ack_ = ok && ParseFromBuffer(ack_buf_, ack_); }

  void OnDone(const grpc::Status& s) override {
    std::string cancelled;
    if (canceller_) {
      canceller_->Unregister(this);
      cancelled = canceller_->reason();
    }
    absl::Status st;
    if (s.error_code() == grpc::StatusCode::CANCELLED && !cancelled.empty()) {
      st = absl::CancelledError(cancelled);
    } else if (!s.ok()) {
      st = absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    } else if (!got_ack_ || !ack_.ok()) {
      st = absl::DataLossError(got_ack_ ? ack_.error() : "no acknowledgement");
    }
    // Release the call before waking the waiter, who may destroy the channel right away.
    std::shared_ptr<SendOp> op = std::move(op_);
    delete this;
    op->PartDone(st);
  }

 private:
  friend class SendCanceller;
  std::shared_ptr<SendOp> op_;
  std::shared_ptr<SendCanceller> canceller_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer header_, chunk_buf_, ack_buf_;
  proto::TensorAck ack_;
  bool got_ack_ = false;
  const uint8_t* data_;
  size_t bytes_, sent_ = 0, chunk_;
  uint32_t crc_ = 0;
  bool trailer_sent_ = false;
};

void SendCanceller::Cancel(const std::string& reason) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!reason_.empty()) return;
  reason_ = reason.empty() ? "cancelled" : reason;
  // A call's OnDone may run inside TryCancel and unregister (and delete) calls: cancel only those
  // still registered.
  const std::set<PartCall*> calls = calls_;
  for (PartCall* c : calls)
    if (calls_.count(c)) c->ctx_.TryCancel();
}

std::string SendCanceller::reason() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return reason_;
}

bool SendCanceller::Register(PartCall* call) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!reason_.empty()) return false;
  calls_.insert(call);
  return true;
}

void SendCanceller::Unregister(PartCall* call) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  calls_.erase(call);
}

void SendOp::PartDone(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!s.ok() && status_.ok()) {
    status_ = absl::Status(s.code(), absl::StrCat("sending ", what_, ": ", s.message()));
  }
  if (--pending_ == 0) {
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    cv_.notify_all();
  }
}

absl::Status SendOp::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  return status_;
}

bool SendOp::Done() {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_ == 0;
}

TensorClient::TensorClient(const std::string& address, const TransportOptions& options)
    : address_(address), options_(options) {
  for (int i = 0; i < std::max(1, options.connections); ++i) {
    grpc::ChannelArguments args;
    // A private subchannel pool and a distinct argument per channel: one TCP connection each.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("longhaul.connection_index", i);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    for (auto [k, v] : BulkTransferArgs()) args.SetInt(k, v);
    channels_.push_back(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    stubs_.push_back(std::make_unique<grpc::GenericStub>(channels_.back()));
  }
}

TensorClient::~TensorClient() = default;

std::shared_ptr<SendOp> TensorClient::Send(proto::TensorHeader header, const float* data, size_t n) {
  auto op = std::make_shared<SendOp>();
  const size_t bpe = WireBytesPerElement(options_.dtype);
  const uint8_t* wire = reinterpret_cast<const uint8_t*>(data);
  if (options_.dtype != WireDtype::kF32) {
    op->wire_.resize(n * bpe);
    EncodeWire(data, n, options_.dtype, op->wire_.data());
    wire = op->wire_.data();
  }
  op->start_ = std::chrono::steady_clock::now();
  op->what_ = absl::StrFormat("%s to %s", TensorKey{header.kind(), header.iteration(), header.micro_batch(),
                                                    header.from_stage(), header.from_replica(), header.shard()}
                                              .DebugString(),
                              address_);
  header.set_job_id(options_.job_id);
  header.set_protocol_version(kProtocolVersion);
  header.set_dtype(static_cast<proto::WireDtype>(options_.dtype));
  header.set_total_elements(n);
  // Split into equal parts, one per connection; tiny tensors go on one.
  const size_t parts = std::max<size_t>(1, std::min<size_t>(stubs_.size(), n * bpe / (1u << 20)));
  op->pending_ = static_cast<int>(parts);
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t p = 0; p < parts; ++p) ranges.emplace_back(n * p / parts, n * (p + 1) / parts);
  for (size_t p = 0; p < parts; ++p) {
    auto [lo, hi] = ranges[p];
    proto::TensorHeader h = header;
    h.set_part_offset(lo);
    h.set_part_elements(hi - lo);
    new PartCall(stubs_[p].get(), options_, op, h, wire + lo * bpe, (hi - lo) * bpe);
  }
  return op;
}

}  // namespace longhaul
