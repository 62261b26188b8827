#pragma once
// The job state a coordinator leaves in the run directory (job_state.pb) for one started after it
// on the same directory, and cluster.json beside it: the plan, every worker it registered, the
// recovery records. What reads a state checks it before anything is indexed by it; what writes it
// keeps the rule that lets a successor go on: at most one published plan version is unwritten.
// Not locked: the coordinator's job (job.h) calls it under its own lock.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "longhaul.pb.h"
#include "util/background_writer.h"

namespace longhaul {

// train.out_dir/job_state.pb.
std::string JobStatePath(const std::string& out_dir);

// The run directory's identity (proto::Plan::run_dir_token), which a worker finds in its own run
// directory only where it shares this one: made once, kept by a coordinator started again.
absl::StatusOr<std::string> RunDirToken(const std::string& out_dir);

// A job state and the config of its plan, which the job goes on under.
struct RestoredJob {
  proto::JobState state;
  JobConfig cfg;
};

// The job state a coordinator before this one left at `path` in `cfg`'s train.out_dir, checked
// before anything is indexed by it: its plan a layout of its own config, each placed worker one it
// recorded, and written in this directory, not one it was copied from. The config keeps `cfg`'s
// train.out_dir, where the state is, however the state names it. DataLoss for a damaged state,
// FailedPrecondition for another job's or directory's, each naming the fix.
absl::StatusOr<RestoredJob> ReadJobState(const std::string& path, const JobConfig& cfg);

// Writes job_state.pb and cluster.json, each aside and renamed so it is whole or the one before, on
// a thread of its own, so that workers hear of a new plan version without waiting for the disk.
// A coordinator killed before a write leaves the state before it, whose successor therefore skips
// a version (it publishes the state's version + 2): so at most one published version may be
// unwritten, and a new version's first post waits for the last version's first post; the first
// version is on disk before Write returns. The later posts of a version (a loss, a spare's join)
// may still be under way when the next version comes out, which need not wait for them.
class JobStateStore {
 public:
  explicit JobStateStore(const std::string& out_dir);

  // Posts `state` (whose plan is the version just published or one posted before) and `cluster`
  // (cluster.json's text). The writer's first failure, if any so far: the caller stops the job
  // before the workers hear of a version left unwritten. Nothing once closed.
  absl::Status Write(const proto::JobState& state, const std::string& cluster);
  // Returns once everything posted is on disk (or failed).
  void Flush() { writer_.Flush(); }
  // The job ended: what was posted is written, then the state file goes for good (a coordinator
  // started on this directory starts anew), and later writes do nothing.
  void Close();

 private:
  const std::string state_path_, cluster_path_;
  BackgroundWriter writer_;
  uint64_t posted_version_ = 0;  // the plan version of the last state posted
  uint64_t version_post_ = 0;    // the post number of that version's first post
  bool closed_ = false;
};

}  // namespace longhaul
