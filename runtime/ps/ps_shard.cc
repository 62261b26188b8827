#include "ps/ps_shard.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "optim/grad_clip.h"
#include "optim/nesterov.h"

namespace longhaul {

PsShard::PsShard(const ParamLayout& stage_layout, int stage, int shard, int first_tensor, int end_tensor,
                 int replicas)
    : stage_(stage),
      shard_(shard),
      replicas_(replicas),
      begin_(stage_layout.Range(first_tensor, end_tensor).first),
      layout_(stage_layout.Slice(first_tensor, end_tensor)) {}

absl::Status PsShard::AddReplicaGradient(int replica, const std::vector<float>& grad) {
  if (replica != next_replica_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "parameter server of stage %d shard %d: replica %d's gradient came where replica %d's was due (they are "
        "summed in replica order)",
        stage_, shard_, replica, next_replica_));
  }
  if (grad.size() != size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "parameter server of stage %d shard %d: replica %d pushed %d gradient values, the shard holds %d: every "
        "process of the job must run the same config and longhaul build",
        stage_, shard_, replica, grad.size(), size()));
  }
  if (absl::Status s = Accumulate(replica == 0, grad); !s.ok()) return s;
  next_replica_ = replica + 1;
  return absl::OkStatus();
}

absl::StatusOr<double> PsShard::AveragedSquaredNorm() {
  if (next_replica_ != replicas_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "parameter server of stage %d shard %d: the norm needs all %d replicas' gradients, %d are in", stage_, shard_,
        replicas_, next_replica_));
  }
  return AverageAndSquaredNorm(1.0f / static_cast<float>(replicas_));
}

absl::StatusOr<OptimizerStepResult> PsShard::Step(const LrSchedule& schedule, float grad_clip, int64_t step,
                                                  double global_norm) {
  next_replica_ = 0;
  return Apply(schedule, grad_clip, step, global_norm);
}

absl::StatusOr<OptimizerStepResult> PsShard::OuterStep(float lr, float momentum) {
  absl::StatusOr<double> sum_squares = AveragedSquaredNorm();
  if (!sum_squares.ok()) return sum_squares.status();
  next_replica_ = 0;
  if (absl::Status s = ApplyOuter(lr, momentum); !s.ok()) return s;
  OptimizerStepResult r;
  r.grad_norm = std::sqrt(*sum_squares);
  r.lr = lr;
  return r;
}

HostPsShard::HostPsShard(const AdamWConfig& cfg, const ParamLayout& stage_layout, int stage, int shard,
                         int first_tensor, int end_tensor, int replicas)
    : PsShard(stage_layout, stage, shard, first_tensor, end_tensor, replicas),
      params_(size()),
      grads_(size()),
      adamw_(cfg, layout().DecayFlags()) {}

absl::Status HostPsShard::GetState(float* params, float* m, float* v) {
  std::copy(params_.begin(), params_.end(), params);
  std::copy(adamw_.m().begin(), adamw_.m().end(), m);
  std::copy(adamw_.v().begin(), adamw_.v().end(), v);
  return absl::OkStatus();
}

absl::Status HostPsShard::SetState(const float* params, const float* m, const float* v) {
  std::copy(params, params + size(), params_.begin());
  auto set = [&](const float* from, std::vector<float>& to) {
    if (from == nullptr) {
      std::fill(to.begin(), to.end(), 0.0f);
    } else {
      std::copy(from, from + size(), to.begin());
    }
  };
  set(m, adamw_.m());
  set(v, adamw_.v());
  return absl::OkStatus();
}

absl::Status HostPsShard::Accumulate(bool first, const std::vector<float>& grad) {
  if (first) {
    grads_ = grad;
  } else {
    for (size_t i = 0; i < grads_.size(); ++i) grads_[i] += grad[i];
  }
  return absl::OkStatus();
}

absl::StatusOr<double> HostPsShard::AverageAndSquaredNorm(float scale) {
  Scale(grads_.data(), grads_.size(), scale);
  return SquaredNorm(grads_.data(), grads_.size());
}

absl::StatusOr<OptimizerStepResult> HostPsShard::Apply(const LrSchedule& schedule, float grad_clip, int64_t step,
                                                       double global_norm) {
  return ApplyOptimizerStepWithNorm(params_.data(), grads_.data(), grads_.size(), adamw_, schedule, grad_clip, step,
                                    global_norm);
}

absl::Status HostPsShard::ApplyOuter(float lr, float momentum) {
  NesterovStep(params_.data(), grads_.data(), adamw_.m().data(), params_.size(), lr, momentum);
  return absl::OkStatus();
}

}  // namespace longhaul
