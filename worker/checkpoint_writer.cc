#include "worker/checkpoint_writer.h"

#include <utility>

namespace longhaul {

CheckpointWriter::CheckpointWriter() : thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !pending_ && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return pending_.has_value() || stop_; });
    if (!pending_) return;
    std::function<absl::Status()> job = *std::move(pending_);
    const uint64_t generation = pending_generation_;
    pending_.reset();
    busy_ = true;
    lock.unlock();
    absl::Status s = job();
    lock.lock();
    busy_ = false;
    if (!s.ok() && error_.ok() && generation == generation_) error_ = std::move(s);
    cv_.notify_all();
  }
}

absl::Status CheckpointWriter::Submit(std::function<absl::Status()> job) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !pending_ && !busy_; });
  if (!error_.ok()) return std::exchange(error_, absl::OkStatus());
  pending_ = std::move(job);
  pending_generation_ = generation_;
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !pending_ && !busy_; });
  return std::exchange(error_, absl::OkStatus());
}

void CheckpointWriter::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  error_ = absl::OkStatus();
}

}  // namespace longhaul
