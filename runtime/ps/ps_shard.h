#pragma once
// One parameter-server shard: the authoritative parameters and AdamW moments of a contiguous run
// of whole tensors of one stage. It sums the job's replicas' gradients in replica order (so every
// run adds them up the same way, a shrunk layout's included: each of its replicas pushes one
// gradient per job replica it stands for), averages, and steps once the global norm is known.
//
// Where the numbers live is the implementation's: HostPsShard keeps them in host memory (a CPU
// worker's shards); a GPU worker's shards keep theirs on its device (cuda/cuda_ps_shard.h). Both
// check what arrives over the network the same way, here.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/param_layout.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/train_step.h"

namespace longhaul {

class PsShard {
 public:
  virtual ~PsShard() = default;

  int stage() const { return stage_; }
  int shard() const { return shard_; }
  int replicas() const { return replicas_; }
  size_t begin() const { return begin_; }  // float offset of the shard in its stage's buffer
  size_t size() const { return layout_.total(); }
  const ParamLayout& layout() const { return layout_; }

  // Gradient of replica `replica`'s copy of the shard; replicas must come in order 0, 1, ... and
  // each gradient must have the shard's size (it came over the network: FailedPrecondition if not).
  absl::Status AddReplicaGradient(int replica, const std::vector<float>& grad);
  // Σ g² of the replica-averaged gradient; FailedPrecondition until every replica is in.
  absl::StatusOr<double> AveragedSquaredNorm();
  // Clips to `grad_clip` by the global norm and applies AdamW at the scheduled rate of step `step`
  // (no update when the norm is not finite); then the next iteration's gradients may come.
  absl::StatusOr<OptimizerStepResult> Step(const LrSchedule& schedule, float grad_clip, int64_t step,
                                           double global_norm);
  // The outer step of local updates (train.local_steps), once every replica's change since the
  // last exchange is in: their average moves the parameters by Nesterov momentum (optim/nesterov.h),
  // whose buffer is AdamW's first moment, so checkpoints carry it. Reports the average's norm.
  absl::StatusOr<OptimizerStepResult> OuterStep(float lr, float momentum);
  // Drops the replicas' gradients of an iteration that will not step (a plan version ended in it).
  void DiscardGradients() { next_replica_ = 0; }

  // The parameters in host memory, valid until the next Step or SetState.
  virtual absl::StatusOr<const float*> Params() = 0;
  // Parameters and AdamW moments (size() each), for checkpoints.
  virtual absl::Status GetState(float* params, float* m, float* v) = 0;
  // Sets them; null moments start from zero (a new run).
  virtual absl::Status SetState(const float* params, const float* m, const float* v) = 0;
  // Sets the parameters alone (size() of them), the moments kept: where the replicas received a
  // rounded change of them, the shard holds what they hold.
  virtual absl::Status SetParams(const float* params) = 0;
  // The second moment alone. The outer step of local updates keeps none: there the slot carries
  // the error-feedback residual of the parameters' change sent to the replicas (worker/ps_host.h),
  // so that checkpoints keep it with the shard.
  virtual absl::Status GetSecondMoment(float* v) = 0;
  virtual absl::Status SetSecondMoment(const float* v) = 0;

 protected:
  PsShard(const ParamLayout& stage_layout, int stage, int shard, int first_tensor, int end_tensor, int replicas);
  // Replica 0's gradient replaces the sum (`first`), the others add to it.
  virtual absl::Status Accumulate(bool first, const std::vector<float>& grad) = 0;
  // Scales the sum by `scale` (1 / replicas) and returns its Σ g².
  virtual absl::StatusOr<double> AverageAndSquaredNorm(float scale) = 0;
  virtual absl::StatusOr<OptimizerStepResult> Apply(const LrSchedule& schedule, float grad_clip, int64_t step,
                                                    double global_norm) = 0;
  // NesterovStep of the averaged sum.
  virtual absl::Status ApplyOuter(float lr, float momentum) = 0;

 private:
  int stage_, shard_, replicas_, next_replica_ = 0;
  size_t begin_;
  ParamLayout layout_;
};

// A shard in host memory.
class HostPsShard final : public PsShard {
 public:
  HostPsShard(const AdamWConfig& cfg, const ParamLayout& stage_layout, int stage, int shard, int first_tensor,
              int end_tensor, int replicas);
  absl::StatusOr<const float*> Params() override { return params_.data(); }
  absl::Status GetState(float* params, float* m, float* v) override;
  absl::Status SetState(const float* params, const float* m, const float* v) override;
  absl::Status SetParams(const float* params) override {
    std::copy(params, params + size(), params_.begin());
    return absl::OkStatus();
  }
  absl::Status GetSecondMoment(float* v) override {
    std::copy(adamw_.v().begin(), adamw_.v().end(), v);
    return absl::OkStatus();
  }
  absl::Status SetSecondMoment(const float* v) override {
    std::copy(v, v + size(), adamw_.v().begin());
    return absl::OkStatus();
  }

 private:
  absl::Status Accumulate(bool first, const std::vector<float>& grad) override;
  absl::StatusOr<double> AverageAndSquaredNorm(float scale) override;
  absl::StatusOr<OptimizerStepResult> Apply(const LrSchedule& schedule, float grad_clip, int64_t step,
                                            double global_norm) override;
  absl::Status ApplyOuter(float lr, float momentum) override;

  std::vector<float> params_, grads_;
  AdamW adamw_;
};

}  // namespace longhaul
