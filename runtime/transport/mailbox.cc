#include "transport/mailbox.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {

std::string TensorKey::DebugString() const {
  static const char* kinds[] = {"?", "activation", "gradient", "gradient push", "parameters"};
  return absl::StrFormat("%s of iteration %d, micro-batch %d, from stage %d replica %d, shard %d",
                         kinds[kind >= 0 && kind <= 4 ? kind : 0], iteration, micro_batch, from_stage, from_replica,
                         shard);
}

namespace {
constexpr size_t kMaxPooledFloats = size_t{1} << 30;  // 4 GiB of idle buffers at most
}  // namespace

std::vector<float> Mailbox::Acquire(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  return AcquireLocked(n);
}

std::vector<float> Mailbox::AcquireLocked(size_t n) {
  auto it = pool_.find(n);
  if (it == pool_.end()) return std::vector<float>(n);
  std::vector<float> v = std::move(it->second);
  pool_.erase(it);
  pooled_floats_ -= n;
  return v;
}

void Mailbox::Recycle(std::vector<float> buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (buffer.empty() || pooled_floats_ + buffer.size() > kMaxPooledFloats) return;
  pooled_floats_ += buffer.size();
  pool_.emplace(buffer.size(), std::move(buffer));
}

bool Mailbox::PutPart(const TensorKey& key, size_t total, size_t offset, const float* data, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[key];
  if (e.data.empty()) e.data = AcquireLocked(total);
  if (e.data.size() != total || offset + n > total || e.received + n > total) return false;
  std::memcpy(e.data.data() + offset, data, n * sizeof(float));
  e.received += n;
  if (e.received == total) cv_.notify_all();
  return true;
}

void Mailbox::Put(const TensorKey& key, std::vector<float> tensor) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[key];
  e.received = tensor.size();
  e.data = std::move(tensor);
  cv_.notify_all();
}

absl::StatusOr<std::vector<float>> Mailbox::Take(const TensorKey& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [&] {
    auto it = entries_.find(key);
    return !closed_.empty() || (it != entries_.end() && it->second.received == it->second.data.size());
  };
  if (!cv_.wait_for(lock, timeout, ready)) {
    return absl::DeadlineExceededError(
        absl::StrFormat("no %s after %d s (is that worker alive and reachable? raise transport.timeout_s for slow links)",
                        key.DebugString(), timeout.count() / 1000));
  }
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.received != it->second.data.size()) {
    return absl::AbortedError(absl::StrCat("stopped while waiting for ", key.DebugString(), ": ", closed_));
  }
  std::vector<float> out = std::move(it->second.data);
  entries_.erase(it);
  return out;
}

void Mailbox::Close(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = reason.empty() ? "closed" : reason;
  cv_.notify_all();
}

}  // namespace longhaul
