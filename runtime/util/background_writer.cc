#include "util/background_writer.h"

#include <algorithm>

#include "util/atomic_file.h"

namespace longhaul {

BackgroundWriter::BackgroundWriter() : thread_([this] { Run(); }) {}

BackgroundWriter::~BackgroundWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

uint64_t BackgroundWriter::Post(std::vector<std::pair<std::string, std::string>> files) {
  uint64_t number;
  {
    absl::MutexLock lock(&mu_);
    for (auto& file : files) {
      std::erase_if(pending_, [&](const auto& p) { return p.first == file.first; });
      pending_.push_back(std::move(file));
    }
    number = ++posted_;
  }
  cv_.SignalAll();
  return number;
}

uint64_t BackgroundWriter::written() {
  absl::MutexLock lock(&mu_);
  return written_;
}

void BackgroundWriter::Flush() {
  absl::MutexLock lock(&mu_);
  while (written_ != posted_) cv_.Wait(&mu_);
}

absl::Status BackgroundWriter::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

void BackgroundWriter::Run() {
  for (;;) {
    std::vector<std::pair<std::string, std::string>> files;
    uint64_t up_to;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && pending_.empty()) cv_.Wait(&mu_);
      if (pending_.empty()) return;  // stopping, everything written
      files.swap(pending_);
      up_to = posted_;  // a merged post's files are among these
    }
    absl::Status failed;
    for (const auto& [path, text] : files) {
      if (absl::Status s = WriteFileAtomically(path, text); !s.ok() && failed.ok()) failed = s;
    }
    absl::MutexLock lock(&mu_);
    written_ = up_to;
    if (status_.ok()) status_ = failed;
    cv_.SignalAll();
  }
}

}  // namespace longhaul
