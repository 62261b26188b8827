#include "worker/step_runner.h"

#include <omp.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "cpu/blas.h"
#include "model/gpt_stage.h"
#include "optim/adamw.h"
#include "optim/train_step.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

class CpuRunner final : public StepRunner {
 public:
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(const JobConfig& cfg) {
    std::unique_ptr<CpuRunner> r(new CpuRunner(cfg));
    LH_ASSIGN_OR_RETURN(r->stage_, GptStage::Create(cfg.model, StageSpec::Whole(cfg.model), cfg.train.micro_batch_size,
                                                    cfg.train.seq_len, cfg.train.recompute));
    r->stage_->InitParams(cfg.train.seed);
    r->act_ = r->stage_->NewActivations();
    r->adamw_ = std::make_unique<AdamW>(cfg.train.adamw, r->stage_->layout());
    return std::unique_ptr<StepRunner>(std::move(r));
  }

  const ParamLayout& layout() const override { return stage_->layout(); }
  std::string Describe() const override {
    return absl::StrFormat("cpu, %d threads, BLAS kernels %s, fp32", omp_get_max_threads(), cpu::BlasCoreName());
  }
  absl::StatusOr<StepOutcome> TrainStep(const std::vector<MicroBatch>& batch, int64_t step) override {
    StepOutcome o;
    o.loss = AccumulateGradients(*stage_, *act_, batch);
    const OptimizerStepResult r = ApplyOptimizerStep(stage_->params(), stage_->grads(), stage_->num_params(), *adamw_,
                                                     schedule_, cfg_.train.grad_clip, step);
    o.grad_norm = r.grad_norm;
    o.lr = r.lr;
    return o;
  }
  absl::StatusOr<double> Loss(const MicroBatch& mb) override { return stage_->Forward(*act_, mb, nullptr); }
  absl::Status GetState(float* params, float* m, float* v) override {
    std::copy(stage_->params(), stage_->params() + stage_->num_params(), params);
    std::copy(adamw_->m().begin(), adamw_->m().end(), m);
    std::copy(adamw_->v().begin(), adamw_->v().end(), v);
    return absl::OkStatus();
  }
  absl::Status SetState(const float* params, const float* m, const float* v) override {
    std::copy(params, params + stage_->num_params(), stage_->params());
    std::copy(m, m + adamw_->m().size(), adamw_->m().begin());
    std::copy(v, v + adamw_->v().size(), adamw_->v().begin());
    return absl::OkStatus();
  }

 private:
  explicit CpuRunner(const JobConfig& cfg)
      : cfg_(cfg), schedule_{cfg.train.lr, cfg.train.min_lr, cfg.train.warmup_steps, cfg.train.steps} {}
  JobConfig cfg_;
  LrSchedule schedule_;
  std::unique_ptr<GptStage> stage_;
  GptStage::ActivationsPtr act_;
  std::unique_ptr<AdamW> adamw_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepRunner>> MakeStepRunner(const JobConfig& cfg) {
  if (cfg.train.backend_device < 0) return CpuRunner::Create(cfg);
#ifdef LONGHAUL_WITH_CUDA
  return MakeCudaStepRunner(cfg, cfg.train.backend_device);
#else
  return absl::FailedPreconditionError(absl::StrFormat(
      "train.backend = \"cuda:%d\" but this build has no CUDA backend (nvcc was not found when it was configured); "
      "rebuild where /usr/local/cuda/bin/nvcc exists, or use train.backend = \"cpu\"",
      cfg.train.backend_device));
#endif
}

}  // namespace longhaul
