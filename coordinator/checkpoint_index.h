#pragma once
// The coordinator's index of the run's checkpoints: which pieces of each step's checkpoint the
// workers reported on disk, and the last step whose every piece is (where a failure sends every
// worker back to; `latest` moves only then, so a resume never finds half a step). Beside it, the
// pieces themselves where a worker does not share the run directory: a piece of the plan's a
// worker ships here in parts, and one a worker that took a lost one's place fetches from here.
// CheckpointIndex is not locked: the coordinator's job (job.h) calls it under its own lock.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.h"
#include "config/job_config.h"
#include "longhaul.pb.h"

namespace longhaul {

class CheckpointIndex {
 public:
  // Checkpoints under `root` (train.out_dir/checkpoints), the last complete one step `latest_step`
  // named `latest_name` (0 and empty: none yet).
  CheckpointIndex(std::string root, int64_t latest_step, std::string latest_name);

  const std::string& root() const { return root_; }
  int64_t latest_step() const { return latest_step_; }
  const std::string& latest_name() const { return latest_name_; }

  // Counts `piece` of step `step`'s checkpoint, whose `pieces` pieces are all there once it is
  // complete; whether it is now. AlreadyExists where the piece was reported already.
  absl::StatusOr<bool> Add(int64_t step, const CheckpointPieceRoot& piece, size_t pieces);
  // Step `step`'s checkpoint is complete: `latest` names it, the steps older than the `keep`
  // newest go, and the counts of earlier steps. Once `latest` moved, a failure to prune is only a
  // warning for people: returned as text (empty: none).
  absl::StatusOr<std::string> Complete(int64_t step, int keep);
  // A new plan version runs from step `start`: the counts of later steps, which it writes again,
  // go.
  void Rewind(int64_t start);

 private:
  const std::string root_;
  int64_t latest_step_;
  std::string latest_name_;
  // By step: the pieces reported, as (kind, stage, index).
  std::map<int64_t, std::set<std::tuple<int, int, int>>> reported_;
};

// Whether `plan` has the worker at `a` write checkpoint piece `piece` of a job of `cfg`.
bool PlanGives(const proto::Plan& plan, const JobConfig& cfg, const proto::Assignment& a,
               const CheckpointPieceRoot& piece);
// The parameters and tensors of a piece `plan` gives (PlanGives).
std::pair<uint64_t, size_t> PieceSize(const proto::Plan& plan, const JobConfig& cfg, const CheckpointPieceRoot& piece);

// A part of a file shipped to the coordinator: at most kCheckpointChunkBytes, within the file.
// InvalidArgument otherwise.
absl::Status CheckPart(uint64_t file_bytes, uint64_t offset, uint64_t bytes);
// Appends a checked part (CheckPart) of a file of `file_bytes` to `path`.part, which holds the
// parts before it, and renames it to `path` with the last one. FailedPrecondition for a part out
// of order (ship the file from its start).
absl::Status ReceivePart(const std::string& path, uint64_t file_bytes, uint64_t offset, const std::string& data);
// The part of the file at `path` from `offset`, at most kCheckpointChunkBytes, and the file's size:
// NotFound where there is no file, OutOfRange for an offset past its end.
struct FilePart {
  uint64_t file_bytes = 0;
  std::string data;
};
absl::StatusOr<FilePart> ReadPart(const std::string& path, uint64_t offset);

}  // namespace longhaul
