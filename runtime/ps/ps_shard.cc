#include "ps/ps_shard.h"

#include "absl/strings/str_format.h"
#include "optim/grad_clip.h"

namespace longhaul {

PsShard::PsShard(const AdamWConfig& cfg, const ParamLayout& stage_layout, int stage, int shard, int first_tensor,
                 int end_tensor, int replicas)
    : stage_(stage),
      shard_(shard),
      replicas_(replicas),
      begin_(stage_layout.Range(first_tensor, end_tensor).first),
      layout_(stage_layout.Slice(first_tensor, end_tensor)),
      params_(layout_.total()),
      grads_(layout_.total()),
      adamw_(cfg, layout_) {}

absl::Status PsShard::AddReplicaGradient(int replica, const std::vector<float>& grad) {
  if (replica != next_replica_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "parameter server of stage %d shard %d: replica %d's gradient came where replica %d's was due (they are "
        "summed in replica order)",
        stage_, shard_, replica, next_replica_));
  }
  if (grad.size() != grads_.size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "parameter server of stage %d shard %d: replica %d pushed %d gradient values, the shard holds %d: every "
        "process of the job must run the same config and longhaul build",
        stage_, shard_, replica, grad.size(), grads_.size()));
  }
  if (replica == 0) {
    grads_ = grad;
  } else {
    for (size_t i = 0; i < grads_.size(); ++i) grads_[i] += grad[i];
  }
  next_replica_ = replica + 1;
  return absl::OkStatus();
}

absl::StatusOr<double> PsShard::AveragedSquaredNorm() {
  if (next_replica_ != replicas_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "parameter server of stage %d shard %d: the norm needs all %d replicas' gradients, %d are in", stage_, shard_,
        replicas_, next_replica_));
  }
  Scale(grads_.data(), grads_.size(), 1.0f / static_cast<float>(replicas_));
  return SquaredNorm(grads_.data(), grads_.size());
}

OptimizerStepResult PsShard::Step(const LrSchedule& schedule, float grad_clip, int64_t step, double global_norm) {
  next_replica_ = 0;
  return ApplyOptimizerStepWithNorm(params_.data(), grads_.data(), grads_.size(), adamw_, schedule, grad_clip, step,
                                    global_norm);
}

}  // namespace longhaul
