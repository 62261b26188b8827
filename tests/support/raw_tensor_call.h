#pragma once
// Test helper: one call on the tensor method with whatever messages a test crafts, as a hostile or
// broken peer could send them (TensorClient always fills in sizes that fit).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "longhaul.pb.h"
#include "transport/crc32c.h"
#include "transport/tensor_transport.h"

namespace longhaul::testing {

class RawTensorCall : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Writes each of `messages` in order, then half-closes unless `hold_open`.
  RawTensorCall(grpc::GenericStub& stub, const std::string& job, std::vector<std::string> messages, bool hold_open)
      : messages_(std::move(messages)), hold_open_(hold_open) {
    ctx_.AddMetadata("lh-job", job);
    ctx_.AddMetadata("lh-protocol", std::to_string(kProtocolVersion));
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stub.PrepareBidiStreamingCall(&ctx_, kTensorMethod, grpc::StubOptions(), this);
    StartRead(&in_);
    WriteNext();
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnReadDone(bool) override {}
  void OnDone(const grpc::Status& s) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_all();
  }

  // The call's final status; waits up to `timeout`, then reports DEADLINE_EXCEEDED locally.
  grpc::Status Await(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "still open");
    }
    return status_;
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void Cancel() { ctx_.TryCancel(); }

 private:
  void WriteNext() {
    if (next_ < messages_.size()) {
      grpc::Slice s(messages_[next_].data(), messages_[next_].size());
      out_ = grpc::ByteBuffer(&s, 1);
      ++next_;
      StartWrite(&out_);
    } else if (!hold_open_ && !closed_) {
      closed_ = true;
      StartWritesDone();
    }
  }

  grpc::ClientContext ctx_;
  std::vector<std::string> messages_;
  size_t next_ = 0;
  bool hold_open_, closed_ = false;
  grpc::ByteBuffer out_, in_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
};

// A stub on its own connection to `address`.
inline std::unique_ptr<grpc::GenericStub> RawStub(const std::string& address) {
  return std::make_unique<grpc::GenericStub>(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// The messages of a well-formed part: header, the fp32 bytes of `values` in 1 MiB chunks, trailer.
inline std::vector<std::string> PartMessages(const proto::TensorHeader& header, const std::vector<float>& values) {
  const char* bytes = reinterpret_cast<const char*>(values.data());
  const size_t size = values.size() * sizeof(float);
  std::vector<std::string> messages = {header.SerializeAsString()};
  for (size_t at = 0; at < size; at += 1 << 20) messages.emplace_back(bytes + at, std::min<size_t>(1 << 20, size - at));
  proto::TensorTrailer trailer;
  trailer.set_crc32c(Crc32c(0, bytes, size));
  messages.push_back(trailer.SerializeAsString());
  return messages;
}

}  // namespace longhaul::testing
