#pragma once
// Writes a worker's checkpoints on a thread of its own while the next iterations run: writing a
// d_model 512 shard's 14 MB state files (and its moments) every step held its host's next iteration
// back, 1.07-1.10x the calm run's time. One job at a time: a job submitted while the one before is
// still being written waits for it, so at most one copy of the state is held beside the live one.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"

namespace longhaul {

class CheckpointWriter {
 public:
  CheckpointWriter();
  // Waits for the job under way, then ends the thread.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Hands `job` to the thread once the one before is done; that job's failure, where it failed
  // and Forget did not come between, is returned instead (and `job` is not run).
  absl::Status Submit(std::function<absl::Status()> job);
  // Until every job submitted is done: the first failure among them since the last Submit, Wait or
  // Forget.
  absl::Status Wait();
  // The jobs submitted so far still run, but their failures are no one's: a plan version that
  // ended leaves its checkpoint behind, whose report the coordinator may refuse.
  void Forget();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::function<absl::Status()>> pending_;
  uint64_t pending_generation_ = 0;
  bool busy_ = false, stop_ = false;
  uint64_t generation_ = 0;  // Forget's count: a job's failure counts where its generation is current
  absl::Status error_;
  std::thread thread_;
};

}  // namespace longhaul
