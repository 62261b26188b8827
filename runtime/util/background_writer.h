#pragma once
// Files written atomically (WriteFileAtomically) on a thread of their own, so that a caller
// holding a lock others wait on does not wait for the disk: the coordinator rewrites its job state
// under the lock its plan requests wait on, and a recovery's new plan version would otherwise wait
// for two such files before any worker heard of it.
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace longhaul {

class BackgroundWriter {
 public:
  BackgroundWriter();
  // Writes what was posted, then returns.
  ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Hands over (path, contents) pairs, written in order after everything posted before. Where a
  // later Post arrives before the writing began, only the latest contents of each path are written
  // (in the order of the latest Post): a reader wants the newest, not every one. Returns the post's
  // number (1, 2, ...), which written() reaches once it is written (or failed).
  uint64_t Post(std::vector<std::pair<std::string, std::string>> files) ABSL_LOCKS_EXCLUDED(mu_);
  // The number of the last post written (or failed), and every one before it: 0 before any.
  uint64_t written() ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once everything posted so far is written (or failed).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  // The first write that failed, with its reason; OK while every one succeeded.
  absl::Status status() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The writing thread's loop: takes what is pending, writes it without the lock, until stopped.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when a post arrives, a write ends, or the writer stops
  std::vector<std::pair<std::string, std::string>> pending_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Post numbers: everything is on disk where they are equal.
  uint64_t posted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started by the constructor, joined by the destructor
};

}  // namespace longhaul
