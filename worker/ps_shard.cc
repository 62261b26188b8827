#include "worker/ps_shard.h"

#include <cassert>

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

void PsShard::AddReplicaGradient(int replica, const std::vector<float>& grad) {
  assert(replica == next_replica_ && grad.size() == grads_.size());
  if (replica == 0) {
    grads_ = grad;
  } else {
    for (size_t i = 0; i < grads_.size(); ++i) grads_[i] += grad[i];
  }
  next_replica_ = replica + 1;
}

double PsShard::AveragedSquaredNorm() {
  assert(next_replica_ == replicas_);
  Scale(grads_.data(), grads_.size(), 1.0f / static_cast<float>(replicas_));
  return SquaredNorm(grads_.data(), grads_.size());
}

OptimizerStepResult PsShard::Step(const LrSchedule& schedule, float grad_clip, int64_t step, double global_norm) {
  next_replica_ = 0;
  return ApplyOptimizerStepWithNorm(params_.data(), grads_.data(), grads_.size(), adamw_, schedule, grad_clip, step,
                                    global_norm);
}

}  // namespace longhaul
