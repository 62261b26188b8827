#include "cpu/cpu_stage.h"

#include <omp.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "cpu/blas.h"
#include "optim/train_step.h"
#include "util/status_macros.h"

namespace longhaul {

absl::StatusOr<std::unique_ptr<CpuStage>> CpuStage::Create(const ModelConfig& cfg, const StageSpec& spec, int B, int T,
                                                           bool recompute, int slots, std::optional<uint64_t> seed,
                                                           bool init) {
  if (slots < 1) return absl::InvalidArgumentError(absl::StrFormat("a stage needs at least one slot, not %d", slots));
  if (cfg.subspace_divisor > 1 && !seed) {
    return absl::InvalidArgumentError("a subspace model's stage needs the seed its fixed embedding is drawn from");
  }
  std::unique_ptr<CpuStage> s(new CpuStage());
  LH_ASSIGN_OR_RETURN(s->stage_, GptStage::Create(cfg, spec, B, T, recompute));
  if (seed && init) s->stage_->InitParams(*seed);
  if (seed && !init) s->stage_->DrawFixedEmbedding(*seed);
  for (int i = 0; i < slots; ++i) s->acts_.push_back(s->stage_->NewActivations());
  if (!spec.has_embedding) {
    s->input_grads_.assign(slots, std::vector<float>(static_cast<size_t>(B) * T * cfg.d_model));
  }
  return s;
}

std::string CpuStage::Describe() const {
  return absl::StrFormat("cpu, %d threads, BLAS kernels %s, fp32", omp_get_max_threads(), cpu::BlasCoreName());
}

absl::Status CpuStage::CheckSlot(int slot) const {
  if (slot < 0 || slot >= slots()) {
    return absl::OutOfRangeError(absl::StrFormat("activation slot %d of a stage with %d", slot, slots()));
  }
  return absl::OkStatus();
}

absl::Status CpuStage::ZeroGrads() {
  stage_->ZeroGrads();
  return absl::OkStatus();
}

absl::StatusOr<float> CpuStage::Forward(int slot, const MicroBatch& mb, const float* input) {
  LH_RETURN_IF_ERROR(CheckSlot(slot));
  return stage_->Forward(*acts_[slot], mb, input);
}

absl::StatusOr<const float*> CpuStage::Output(int slot) {
  LH_RETURN_IF_ERROR(CheckSlot(slot));
  return stage_->Output(*acts_[slot]);
}

absl::Status CpuStage::DownloadProbs(int slot, float* host) {
  LH_RETURN_IF_ERROR(CheckSlot(slot));
  if (!spec().has_head) return absl::FailedPreconditionError("only the last stage computes probabilities");
  const float* probs = stage_->Probs(*acts_[slot]);
  std::copy(probs, probs + static_cast<size_t>(stage_->B()) * stage_->T() * stage_->config().vocab_size, host);
  return absl::OkStatus();
}

absl::Status CpuStage::Backward(int slot, const MicroBatch& mb, const float* grad_out, float scale) {
  LH_RETURN_IF_ERROR(CheckSlot(slot));
  const float* g = stage_->Backward(*acts_[slot], mb, grad_out, scale);
  if (g != nullptr) input_grads_[slot].assign(g, g + input_grads_[slot].size());
  return absl::OkStatus();
}

absl::StatusOr<const float*> CpuStage::InputGrad(int slot) {
  LH_RETURN_IF_ERROR(CheckSlot(slot));
  if (spec().has_embedding) return absl::FailedPreconditionError("the first stage has no input gradient");
  return input_grads_[slot].data();
}

absl::Status CpuStage::SetParams(size_t begin, const float* values, size_t n) {
  if (begin > num_params() || n > num_params() - begin) {
    return absl::OutOfRangeError(
        absl::StrFormat("parameters [%d, +%d) of a stage of %d", begin, n, num_params()));
  }
  std::copy(values, values + n, stage_->params() + begin);
  // A lossy wire or a checkpoint may carry other values where a subspace model holds its own.
  ZeroRuns(ClipRuns(layout().SubspaceZeroRuns(), begin, begin + n), stage_->params());
  stage_->fixed_embedding().WriteInto(layout(), stage_->params(), begin, begin + n);
  return absl::OkStatus();
}

absl::Status CpuStage::AttachOptimizer(const OptimizerSettings& settings) {
  optimizer_ = settings;
  adamw_ = std::make_unique<AdamW>(settings.adamw, layout().DecayFlags());
  return absl::OkStatus();
}

absl::Status CpuStage::CheckOptimizer() const {
  if (adamw_ == nullptr) return absl::FailedPreconditionError("the stage has no optimizer: call AttachOptimizer first");
  return absl::OkStatus();
}

absl::StatusOr<OptimizerStepResult> CpuStage::Step(int64_t step) {
  LH_RETURN_IF_ERROR(CheckOptimizer());
  return ApplyOptimizerStep(stage_->params(), stage_->grads(), num_params(), *adamw_, optimizer_.schedule,
                            optimizer_.grad_clip, step);
}

absl::Status CpuStage::GetOptimizerState(float* m, float* v) {
  LH_RETURN_IF_ERROR(CheckOptimizer());
  std::copy(adamw_->m().begin(), adamw_->m().end(), m);
  std::copy(adamw_->v().begin(), adamw_->v().end(), v);
  return absl::OkStatus();
}

absl::Status CpuStage::SetOptimizerState(const float* m, const float* v) {
  LH_RETURN_IF_ERROR(CheckOptimizer());
  std::copy(m, m + adamw_->m().size(), adamw_->m().begin());
  std::copy(v, v + adamw_->v().size(), adamw_->v().begin());
  return absl::OkStatus();
}

}  // namespace longhaul
