#pragma once
// Checkpoint pieces between a worker and the coordinator's run directory, for a worker that writes
// to a disk of its own (another machine without a filesystem shared with the coordinator's). Each
// piece it writes (a shard's, its residuals', its own AdamW state's) goes to the coordinator before
// it is reported, so a checkpoint the coordinator calls complete is whole there; a worker that
// resumes lacking a piece (a spare in a lost worker's place, a survivor given other blocks) fetches
// it from there. Without this, the shards of a dead machine died with its disk. Its timeline goes
// there too, at the end, in parts as the pieces' files do.
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "metrics/timeline.h"

namespace longhaul {

class CoordinatorClient;

// Ships pieces on a thread of its own, in the order given, each followed by what comes after it
// (its report to the coordinator): the iterations pay a checkpoint's writing to the local disk,
// not its trip over the coordinator's link (a shard of GPT-3 XL is about 1.3 GB).
// Thread-safe: the worker's thread gives and waits, the shipper's own thread ships; mu_ guards
// the queue and its state, and dropping_, an atomic, is read between a piece's parts without it.
class CheckpointShipper {
 public:
  explicit CheckpointShipper(CoordinatorClient& client);
  ~CheckpointShipper() ABSL_LOCKS_EXCLUDED(mu_);  // drops what waits
  CheckpointShipper(const CheckpointShipper&) = delete;

  // Step directory `step_dir` of `step` under plan `version`, then `then` once it is shipped
  // (empty `step_dir`: `then` alone, in its turn).
  void Ship(std::string step_dir, int64_t step, uint64_t version, std::function<absl::Status()> then)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until everything given is shipped; the first failure since the last Drop, or OK.
  absl::Status Flush() ABSL_LOCKS_EXCLUDED(mu_);
  // The first failure since the last Drop, or OK; does not wait.
  absl::Status Error() ABSL_LOCKS_EXCLUDED(mu_);
  // Drops what waits and ends the piece under way (its plan version was replaced).
  void Drop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::string step_dir;
    int64_t step;
    uint64_t version;
    std::function<absl::Status()> then;
  };
  // The shipper's thread: takes each job in turn, ships it without mu_ held.
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  CoordinatorClient& client_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled where a wait may end: a job given, a job done, the stop
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a job is under way, taken from jobs_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> dropping_{false};  // Drop waits for the job under way: its shipping gives up
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Ships the timeline file `trace` (as its writer wrote it) in parts, into the coordinator's run
// directory (timeline/worker_N.json): a worker that writes to a disk of its own sends it there too.
absl::Status ShipTimelineFile(CoordinatorClient& client, const TraceFile& trace);

// Ships step directory `step_dir` (checkpoints/<piece>/step_N) of `step` under plan `version`, file
// by file in parts, state.json last; Cancelled once `cancelled` says so between parts.
absl::Status ShipCheckpointPiece(CoordinatorClient& client, const std::string& step_dir, int64_t step,
                                 uint64_t version, const std::function<bool()>& cancelled = {});

// Fetches step directory `step_dir` of the checkpoint plan `version` resumes from (with
// `state_only`, its state.json alone): written aside and renamed into place once whole. NotFound
// where the coordinator has no such piece. No file may exceed `max_file_bytes` (what the job's
// whole model takes), checked before it is written.
absl::Status FetchCheckpointPiece(CoordinatorClient& client, const std::string& step_dir, uint64_t version,
                                  uint64_t max_file_bytes, bool state_only = false);

}  // namespace longhaul
