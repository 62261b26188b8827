#include "worker/ps_host.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "util/status_macros.h"

namespace longhaul {

PsHost::PsHost(int worker_id, int stage, int replicas, int groups, LrSchedule schedule, float grad_clip,
               OuterOptimizer outer, PsLinks links)
    : worker_id_(worker_id), stage_(stage), replicas_(replicas), groups_(groups), schedule_(schedule),
      grad_clip_(grad_clip), outer_(outer), links_(std::move(links)) {}

absl::Status PsHost::Send(int64_t it, PsShard& shard) {
  LH_ASSIGN_OR_RETURN(const float* params, shard.Params());
  for (int r = 0; r < replicas_; ++r) links_.send_params(it, r, shard.shard(), params, shard.size(), WireDtype::kAuto);
  return absl::OkStatus();
}

absl::Status PsHost::SendChange(int64_t it, PsShard& shard) {
  LH_ASSIGN_OR_RETURN(const float* after, shard.Params());
  const size_t n = shard.size();
  change_.resize(n);
  for (size_t i = 0; i < n; ++i) change_[i] = after[i] - before_[i];
  rounded_.resize(n);
  LH_RETURN_IF_ERROR(shard.GetSecondMoment(rounded_.data()));
  change_feedback_ = ErrorFeedback(outer_.change_dtype);
  change_feedback_.SetResidual(rounded_.data(), n);
  const float* send = change_feedback_.Apply(change_.data(), n, rounded_.data());
  for (size_t i = 0; i < n; ++i) before_[i] += rounded_[i];
  LH_RETURN_IF_ERROR(shard.SetParams(before_.data()));
  LH_RETURN_IF_ERROR(shard.SetSecondMoment(change_feedback_.residual().data()));
  for (int r = 0; r < replicas_; ++r) links_.send_params(it, r, shard.shard(), send, n, outer_.change_dtype);
  return absl::OkStatus();
}

absl::Status PsHost::MakePending() {
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (shards_[k]) continue;
    LH_ASSIGN_OR_RETURN(shards_[k], pending_[k]());
    pending_[k] = nullptr;
  }
  return absl::OkStatus();
}

absl::Status PsHost::Broadcast(int64_t it) {
  LH_RETURN_IF_ERROR(MakePending());
  for (auto& shard : shards_) LH_RETURN_IF_ERROR(Send(it, *shard));
  return absl::OkStatus();
}

absl::Status PsHost::ReduceNorm(int64_t it) {
  if (shards_.empty()) return absl::OkStatus();
  LH_RETURN_IF_ERROR(MakePending());
  std::vector<ShardSquares> squares;
  for (auto& shard : shards_) {
    for (int r = 0; r < replicas_; ++r)
      for (int group = 0; group < groups_; ++group) {
        LH_ASSIGN_OR_RETURN(std::vector<float> g, links_.take_push(it, r, group, shard->shard()));
        LH_RETURN_IF_ERROR(shard->AddReplicaGradient(r * groups_ + group, g));
        links_.recycle(std::move(g));
      }
    if (outer_.local_updates) continue;
    LH_ASSIGN_OR_RETURN(const double sum_squares, shard->AveragedSquaredNorm());
    squares.push_back({stage_, shard->shard(), sum_squares});
  }
  if (outer_.local_updates) {
    norm_iteration_ = it;
    return absl::OkStatus();
  }
  LH_ASSIGN_OR_RETURN(global_norm_, links_.reduce_norm(it, squares));
  if (!std::isfinite(global_norm_)) {
    return absl::InternalError(absl::StrFormat(
        "iteration %d: gradient norm %g is not finite: lower train.lr or set train.grad_clip", it + 1, global_norm_));
  }
  norm_iteration_ = it;
  return absl::OkStatus();
}

absl::StatusOr<OptimizerStepResult> PsHost::Step(int64_t it) {
  OptimizerStepResult result;
  if (shards_.empty()) return result;
  LH_RETURN_IF_ERROR(MakePending());
  if (norm_iteration_ != it) {
    return absl::FailedPreconditionError(
        absl::StrFormat("iteration %d steps before its gradient norm was reduced (schedule out of order)", it + 1));
  }
  const bool as_change = outer_.local_updates && outer_.change_dtype != WireDtype::kAuto && !outer_.whole(it);
  for (size_t k = 0; k < shards_.size(); ++k) {
    PsShard& shard = *shards_[k];
    stepped_[k] = -1;  // until the step is whole
    if (as_change) {
      LH_ASSIGN_OR_RETURN(const float* p, shard.Params());
      before_.assign(p, p + shard.size());
    }
    if (outer_.local_updates) {
      LH_ASSIGN_OR_RETURN(result, shard.OuterStep(outer_.lr, outer_.momentum));
    } else {
      LH_ASSIGN_OR_RETURN(result, shard.Step(schedule_, grad_clip_, it, global_norm_));
    }
    LH_RETURN_IF_ERROR(as_change ? SendChange(it, shard) : Send(it, shard));
    stepped_[k] = it;
  }
  return result;
}

std::vector<PsHost::Hosted> PsHost::Release() {
  std::vector<Hosted> out;
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (!shards_[k]) continue;
    shards_[k]->DiscardGradients();
    out.push_back({std::move(shards_[k]), stepped_[k]});
  }
  shards_.clear();
  pending_.clear();
  stepped_.clear();
  return out;
}

absl::Status PsHost::Checkpoint(int64_t step, const std::string& checkpoints_root, const nlohmann::json& run_config,
                                const std::function<absl::Status(const proto::CheckpointReport&)>& report) {
  LH_RETURN_IF_ERROR(MakePending());
  for (auto& shard : shards_) {
    const std::string root = ShardCheckpointRoot(checkpoints_root, stage_, shard->shard());
    const size_t n = shard->size();
    checkpoint_state_.resize(3 * n);
    float* params = checkpoint_state_.data();
    LH_RETURN_IF_ERROR(shard->GetState(params, params + n, params + 2 * n));
    LH_RETURN_IF_ERROR(SaveCheckpoint(root, {step, run_config}, shard->layout(), params, params + n, params + 2 * n));
    proto::CheckpointReport rep;
    rep.set_worker_id(worker_id_);
    rep.set_stage(stage_);
    rep.set_shard(shard->shard());
    rep.set_step(step);
    rep.set_directory(root);
    LH_RETURN_IF_ERROR(report(rep));
  }
  return absl::OkStatus();
}

}  // namespace longhaul
