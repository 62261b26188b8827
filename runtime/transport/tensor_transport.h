#pragma once
// Worker-to-worker tensor transport over gRPC.
//
// A tensor is sent as one or more parts (one per connection, so a fat, long link can be filled by
// several TCP connections); each part is a bidi-streaming call on "/longhaul.Tensors/Send": a
// serialized proto::TensorHeader, then the part's bytes as raw chunks of transport.chunk_mib,
// each a grpc::Slice over the sender's buffer (no protobuf, no copy), then one proto::TensorAck
// back. The receiver checks the caller's job id and protocol version before reading anything and
// refuses a stranger with a message naming both. It then asks its TensorAdmission whether the plan
// lets that peer send that tensor now and how many elements it must have, and reserves the part in
// the Mailbox, all before allocating anything for it; a bad header, size or checksum fails that
// call only. Bytes that are not HTTP/2 close their own connection inside gRPC and touch nothing
// else.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "longhaul.pb.h"
#include "transport/mailbox.h"
#include "transport/wire_dtype.h"

namespace longhaul {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr char kTensorMethod[] = "/longhaul.Tensors/Send";

class PartCall;

// Stops every send in flight through the clients that share it, and every later one, with a
// reason: a stopped job must not wait out transport.timeout_s on a peer that is gone.
class SendCanceller {
 public:
  void Cancel(const std::string& reason);
  // Empty until Cancel.
  std::string reason();

 private:
  friend class PartCall;
  // False (and nothing registered) once cancelled.
  bool Register(PartCall* call);
  void Unregister(PartCall* call);

  // Recursive: gRPC may run a cancelled call's OnDone, which unregisters it, inside TryCancel.
  std::recursive_mutex mu_;
  std::set<PartCall*> calls_;
  std::string reason_;
};

struct TransportOptions {
  std::string job_id = "longhaul";
  WireDtype dtype = WireDtype::kF32;
  size_t chunk_bytes = 2u << 20;
  int connections = 1;  // TCP connections per peer; a tensor is split evenly over them
  std::chrono::milliseconds timeout{120000};
  std::shared_ptr<SendCanceller> canceller;  // optional
};

// What the plan lets a peer send this process at this moment. The receiver asks with the header
// alone, before it allocates anything for the tensor.
class TensorAdmission {
 public:
  virtual ~TensorAdmission() = default;
  // The element count the whole tensor must have, or why the header is refused.
  virtual absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& header) const = 0;
};

// Admits any tensor of at most `max_elements` in any wire dtype: for tools and tests without a plan.
class AnyTensorUpTo : public TensorAdmission {
 public:
  explicit AnyTensorUpTo(uint64_t max_elements) : max_(max_elements) {}
  absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& header) const override;

 private:
  uint64_t max_;
};

// Receives tensors into a Mailbox.
class TensorServer {
 public:
  // Listens on `address` (port 0 picks a free one) and serves `extra` typed services beside the
  // tensor method. `mailbox` and `admission` must outlive the server.
  static absl::StatusOr<std::unique_ptr<TensorServer>> Start(const std::string& address, const std::string& job_id,
                                                             Mailbox* mailbox, const TensorAdmission* admission,
                                                             std::vector<grpc::Service*> extra = {});
  ~TensorServer();
  // host:port actually bound.
  const std::string& address() const { return address_; }
  // The job whose peers are accepted; a worker learns it from the plan after it started listening.
  void SetJobId(const std::string& job_id);
  std::string job_id() const;
  // Calls refused so far (stranger, bad header, checksum), and the last reason.
  int refused() const { return refused_.load(); }
  std::string last_refusal() const;
  void Shutdown();

 private:
  class Generic;
  class Receiver;
  TensorServer(std::string job_id, Mailbox* mailbox, const TensorAdmission* admission);
  void Refuse(const std::string& why);

  std::string job_id_, address_;
  Mailbox* mailbox_;
  const TensorAdmission* admission_;
  std::unique_ptr<Generic> generic_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<int> refused_{0};
  mutable std::mutex mu_;
  std::string last_refusal_;
};

// One send in flight; Wait() returns when every part was acknowledged or failed.
class SendOp {
 public:
  absl::Status Wait();
  bool Done();
  double seconds() const { return seconds_; }  // from start to the last acknowledgement

 private:
  friend class TensorClient;
  friend class PartCall;
  void PartDone(const absl::Status& s);

  std::vector<uint8_t> wire_;  // the encoded tensor; slices point into it until every part is done
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  absl::Status status_;
  std::chrono::steady_clock::time_point start_;
  double seconds_ = 0;
  std::string what_;
};

// Sends tensors to one peer over transport.connections connections. Wait for every SendOp before
// destroying the client.
class TensorClient {
 public:
  TensorClient(const std::string& address, const TransportOptions& options);
  ~TensorClient();
  const std::string& address() const { return address_; }

  // Sends n floats in the wire dtype; job id, protocol version, dtype, sizes and checksum are
  // filled in here, the rest of `header` (kind, iteration, ...) by the caller. With the fp32 wire
  // dtype the chunks are slices over `data` itself, which must stay unchanged until the SendOp is
  // done; fp16 and bf16 encode into the op's own buffer first.
  std::shared_ptr<SendOp> Send(proto::TensorHeader header, const float* data, size_t n);

 private:
  std::string address_;
  TransportOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
};

}  // namespace longhaul
