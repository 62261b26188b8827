#include "transport/mailbox.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {

std::string TensorKey::DebugString() const {
  // By proto::TensorKind.
  static const char* kinds[] = {"?",          "activation", "gradient",     "gradient push",
                                "parameters", "link probe", "norm partials", "validation activation"};
  const bool named = kind >= 0 && kind < static_cast<int>(std::size(kinds));
  return absl::StrFormat("%s of iteration %d, micro-batch %d, from stage %d replica %d, shard %d",
                         kinds[named ? kind : 0], iteration, micro_batch, from_stage, from_replica, shard);
}

namespace {
constexpr size_t kMaxPooledFloats = size_t{1} << 30;  // 4 GiB of idle buffers at most
}  // namespace

std::vector<float> Mailbox::Acquire(size_t n) {
  absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  RecycleLocked(std::move(buffer));
}

void Mailbox::RecycleLocked(std::vector<float> buffer) {
  if (buffer.empty() || pooled_floats_ + buffer.size() > kMaxPooledFloats) return;
  pooled_floats_ += buffer.size();
  pool_.emplace(buffer.size(), std::move(buffer));
}

void Mailbox::SetWindow(int64_t lo, int64_t width) {
  absl::MutexLock lock(&mu_);
  windowed_ = true;
  window_lo_ = lo;
  window_width_ = width;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->first.iteration < lo) {
      RecycleLocked(std::move(it->second.data));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

void Mailbox::Reopen(uint64_t plan_version) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, entry] : entries_) RecycleLocked(std::move(entry.data));
  entries_.clear();
  windowed_ = false;
  closed_.clear();
  plan_version_ = plan_version;
}

absl::Status Mailbox::BeginPart(const TensorKey& key, uint64_t plan_version, uint64_t total, uint64_t offset,
                                uint64_t n) {
  if (n == 0 || offset >= total || n > total - offset) {
    return absl::InvalidArgumentError(
        absl::StrFormat("part [%d, +%d) does not fit a tensor of %d elements", offset, n, total));
  }
  absl::MutexLock lock(&mu_);
  if (plan_version_ != 0 && plan_version != plan_version_) {
    return absl::FailedPreconditionError(absl::StrFormat("%s is of plan version %d; this worker runs plan version %d",
                                                         key.DebugString(), plan_version, plan_version_));
  }
  // Unsigned: the window may start at -1 (the initial parameters), and INT64_MAX less that overflows.
  const bool outside = key.iteration < window_lo_ || static_cast<uint64_t>(key.iteration) -
                                                             static_cast<uint64_t>(window_lo_) >=
                                                         static_cast<uint64_t>(window_width_);
  if (windowed_ && outside) {
    return absl::OutOfRangeError(absl::StrFormat("%s is outside the iterations this worker accepts now ([%d, %d])",
                                                 key.DebugString(), window_lo_, window_lo_ + window_width_ - 1));
  }
  Entry& e = entries_[key];
  if (e.total != 0 && e.total != total) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: a part announces %d elements, an earlier one %d",
                                                      key.DebugString(), total, e.total));
  }
  // The parts held are disjoint: only the first at or after `offset` and the one before it can
  // overlap [offset, offset + n), found in log time however many tiny parts a peer sent.
  auto after = e.parts.lower_bound(offset);
  for (auto it : {after, after == e.parts.begin() ? e.parts.end() : std::prev(after)}) {
    if (it == e.parts.end()) continue;
    const auto& [o, p] = *it;
    if (offset < o + p.elements && o < offset + n) {
      return absl::AlreadyExistsError(absl::StrFormat("%s: part [%d, +%d) overlaps part [%d, +%d), already %s",
                                                      key.DebugString(), offset, n, o, p.elements,
                                                      p.arrived ? "received" : "arriving on another stream"));
    }
  }
  e.total = total;
  e.parts[offset] = {n, false, plan_version};
  return absl::OkStatus();
}

absl::Status Mailbox::CompletePart(const TensorKey& key, uint64_t plan_version, uint64_t offset,
                                   std::vector<float> data) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.parts.count(offset) || it->second.parts[offset].arrived ||
      it->second.parts[offset].elements != data.size() || it->second.parts[offset].plan_version != plan_version) {
    RecycleLocked(std::move(data));
    return absl::OutOfRangeError(absl::StrCat(key.DebugString(), " arrived after this worker moved past it"));
  }
  Entry& e = it->second;
  if (offset == 0 && data.size() == e.total) {
    e.data = std::move(data);
  } else {
    if (e.data.empty()) e.data = AcquireLocked(e.total);
    std::memcpy(e.data.data() + offset, data.data(), data.size() * sizeof(float));
    RecycleLocked(std::move(data));
  }
  e.parts[offset].arrived = true;
  e.received += e.parts[offset].elements;
  if (e.ready()) cv_.SignalAll();
  return absl::OkStatus();
}

void Mailbox::AbandonPart(const TensorKey& key, uint64_t plan_version, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  auto part = e.parts.find(offset);
  if (part == e.parts.end() || part->second.arrived || part->second.plan_version != plan_version) return;
  e.parts.erase(part);
  if (e.parts.empty()) {
    RecycleLocked(std::move(e.data));
    entries_.erase(it);
  }
}

void Mailbox::Put(const TensorKey& key, std::vector<float> tensor) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[key];
  RecycleLocked(std::move(e.data));
  const uint64_t n = tensor.size();
  e = Entry{n, std::move(tensor), {}, n, false};
  if (n > 0) e.parts[0] = {n, true};  // an empty part would hide its neighbours from BeginPart
  cv_.SignalAll();
}

bool Mailbox::TakeReady(const TensorKey& key) const {
  auto it = entries_.find(key);
  return !closed_.empty() || (it != entries_.end() && it->second.ready());
}

absl::StatusOr<std::vector<float>> Mailbox::Take(const TensorKey& key, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  // Until ready or past the deadline (a wake-up short of either waits again), then asked once more:
  // a condition variable's wait_for with a predicate.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!TakeReady(key)) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= left.zero()) break;
    cv_.WaitWithTimeout(&mu_, absl::FromChrono(left));
  }
  if (!TakeReady(key)) {
    return absl::DeadlineExceededError(
        absl::StrFormat("no %s after %d s (is that worker alive and reachable? raise transport.timeout_s for slow links)",
                        key.DebugString(), timeout.count() / 1000));
  }
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.ready()) {
    return absl::AbortedError(absl::StrCat("stopped while waiting for ", key.DebugString(), ": ", closed_));
  }
  it->second.taken = true;
  if (!windowed_) {
    std::vector<float> out = std::move(it->second.data);
    entries_.erase(it);  // nothing would ever drop the marker
    return out;
  }
  return std::move(it->second.data);
}

absl::Status Mailbox::Closed() {
  absl::MutexLock lock(&mu_);
  return closed_.empty() ? absl::OkStatus() : absl::AbortedError(absl::StrCat("stopped: ", closed_));
}

void Mailbox::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  closed_ = reason.empty() ? "closed" : reason;
  cv_.SignalAll();
}

size_t Mailbox::HeldFloats() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.data.size();
  return n;
}

}  // namespace longhaul
