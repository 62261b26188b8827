#pragma once
// The stage a worker runs, across plan versions. A version that leaves it as it was (same stage,
// device, slots and job config) keeps it: building one (allocating, initialising its parameters)
// is a large part of a set-up, which every survivor would pay. A spare builds, while it waits, the
// stages of the places it may be given (AddWarm); the version that places it takes the one it
// needs, and the others go. The parameters the stage pulled for the newest checkpoint step it took
// part in stay in memory (Snapshot): a version that resumes from that step sets them back
// (Restore) rather than reading, or fetching, the checkpoint's files.
//
// Used by the worker's thread alone; warm stages freed on a thread of their own are no longer
// the keeper's.
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/stage.h"
#include "worker/stage_factory.h"

namespace longhaul {

class StageKeeper {
 public:
  // What a stage is built for: its index, device and slots, and the job config's text.
  static std::string Key(int stage, int device, int slots, const std::string& config_toml);

  // A spare's stage, built for `key` and run once so that its memory is touched and its kernels
  // loaded, for a later Take.
  void AddWarm(const std::string& key, std::unique_ptr<Stage> stage);
  size_t warm_stages() const { return warm_.size(); }

  // The stage for `key`, true where it is the one held, kept. With `reuse` (the version sets
  // every parameter from a checkpoint, and the stage does not step itself) that is the held one
  // where it was built for `key`, else a warm one built for `key`; otherwise, or where there is
  // none, one made from `request`. A stage not kept holds no snapshot, and the warm stages not
  // taken go: at once, or with `free_in_background` (where they live in host memory) on a thread
  // of their own, so that nothing of the new version waits for it; a GPU's go before the version
  // allocates its shards there.
  absl::StatusOr<bool> Take(const std::string& key, bool reuse, const StageRequest& request, bool free_in_background);
  // The stage the last Take gave; null before, or after a Take that failed to make one.
  Stage* stage() const { return stage_.get(); }

  // The stage's parameters, `params`, as pulled for checkpoint step `step`.
  void Snapshot(int64_t step, const float* params);
  // Sets the parameters snapshot for step `step` back into the stage: false where the snapshot
  // is of another step, or there is none.
  absl::StatusOr<bool> Restore(int64_t step);

 private:
  void RetireWarm(bool free_in_background);

  std::unique_ptr<Stage> stage_;
  std::string key_;  // what stage_ was built for
  std::vector<float> snapshot_;
  int64_t snapshot_step_ = -1;  // the step snapshot_ holds; -1: none
  std::map<std::string, std::unique_ptr<Stage>> warm_;  // a spare's, by Key
  std::future<void> freeing_;  // RetireWarm's thread (its destructor waits for it)
};

}  // namespace longhaul
