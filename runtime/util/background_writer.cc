#include "util/background_writer.h"

#include <algorithm>

#include "util/atomic_file.h"

namespace longhaul {

BackgroundWriter::BackgroundWriter() : thread_([this] { Run(); }) {}

BackgroundWriter::~BackgroundWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t BackgroundWriter::Post(std::vector<std::pair<std::string, std::string>> files) {
  uint64_t number;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& file : files) {
      std::erase_if(pending_, [&](const auto& p) { return p.first == file.first; });
      pending_.push_back(std::move(file));
    }
    number = ++posted_;
  }
  cv_.notify_all();
  return number;
}

uint64_t BackgroundWriter::written() {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

void BackgroundWriter::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return written_ == posted_; });
}

absl::Status BackgroundWriter::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void BackgroundWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, everything written
    std::vector<std::pair<std::string, std::string>> files;
    files.swap(pending_);
    const uint64_t up_to = posted_;  // a merged post's files are among these
    lock.unlock();
    absl::Status failed;
    for (const auto& [path, text] : files) {
      if (absl::Status s = WriteFileAtomically(path, text); !s.ok() && failed.ok()) failed = s;
    }
    lock.lock();
    written_ = up_to;
    if (status_.ok()) status_ = failed;
    cv_.notify_all();
  }
}

}  // namespace longhaul
