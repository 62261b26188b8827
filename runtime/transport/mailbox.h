#pragma once
// Where received tensors wait until the executor takes them. Parts of one tensor (sent over
// several connections) are assembled here; Take blocks until the whole tensor has arrived, the
// deadline passes, or the mailbox is closed.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul {

struct TensorKey {
  int kind = 0;  // proto::TensorKind
  int64_t iteration = 0;
  int micro_batch = 0;
  int from_stage = 0;
  int from_replica = 0;
  int shard = 0;
  auto tie() const { return std::tie(kind, iteration, micro_batch, from_stage, from_replica, shard); }
  bool operator<(const TensorKey& o) const { return tie() < o.tie(); }
  std::string DebugString() const;
};

class Mailbox {
 public:
  // Copies a part [offset, offset + n) of a tensor of `total` elements. Returns false if that key's
  // tensor is already complete or the part does not fit (a duplicate or a confused peer).
  bool PutPart(const TensorKey& key, size_t total, size_t offset, const float* data, size_t n);
  void Put(const TensorKey& key, std::vector<float> tensor);

  // Waits for the whole tensor; errors name the key and say why (deadline, closed).
  absl::StatusOr<std::vector<float>> Take(const TensorKey& key, std::chrono::milliseconds timeout);

  // Wakes every Take with an error carrying `reason`.
  void Close(const std::string& reason);

  // A buffer of n floats, reused from tensors handed back with Recycle when one of that size is
  // free (contents unspecified). Reuse keeps steady-state transfers off fresh pages, which the
  // kernel would fault in and zero at a cost comparable to the transfer itself.
  std::vector<float> Acquire(size_t n);
  void Recycle(std::vector<float> buffer);

 private:
  std::vector<float> AcquireLocked(size_t n);

  struct Entry {
    std::vector<float> data;
    size_t received = 0;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<TensorKey, Entry> entries_;
  std::string closed_;
  std::multimap<size_t, std::vector<float>> pool_;  // by size
  size_t pooled_floats_ = 0;
};

}  // namespace longhaul
