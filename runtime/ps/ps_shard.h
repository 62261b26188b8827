#pragma once
// One parameter-server shard: the authoritative parameters and AdamW moments of a contiguous run
// of whole tensors of one stage. It sums the replicas' gradients in replica order (so every run
// adds them up the same way), averages, and steps once the global norm is known.
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "model/param_layout.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/train_step.h"

namespace longhaul {

class PsShard {
 public:
  PsShard(const AdamWConfig& cfg, const ParamLayout& stage_layout, int stage, int shard, int first_tensor,
          int end_tensor, int replicas);

  int stage() const { return stage_; }
  int shard() const { return shard_; }
  size_t begin() const { return begin_; }  // float offset of the shard in its stage's buffer
  size_t size() const { return layout_.total(); }
  const ParamLayout& layout() const { return layout_; }
  std::vector<float>& params() { return params_; }
  AdamW& adamw() { return adamw_; }

  // Gradient of replica `replica`'s copy of the shard; replicas must come in order 0, 1, ... and
  // each gradient must have the shard's size (it came over the network: FailedPrecondition if not).
  absl::Status AddReplicaGradient(int replica, const std::vector<float>& grad);
  // Σ g² of the replica-averaged gradient; FailedPrecondition until every replica is in.
  absl::StatusOr<double> AveragedSquaredNorm();
  OptimizerStepResult Step(const LrSchedule& schedule, float grad_clip, int64_t step, double global_norm);

 private:
  int stage_, shard_, replicas_, next_replica_ = 0;
  size_t begin_;
  ParamLayout layout_;
  std::vector<float> params_, grads_;
  AdamW adamw_;
};

}  // namespace longhaul
