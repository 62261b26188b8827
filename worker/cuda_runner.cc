#include <memory>

#include "absl/strings/str_format.h"
#include "cuda/cuda_stage.h"
#include "util/status_macros.h"
#include "worker/step_runner.h"

namespace longhaul {
namespace {

class CudaRunner final : public StepRunner {
 public:
  CudaRunner(const JobConfig& cfg, std::unique_ptr<CudaStage> stage, int device)
      : cfg_(cfg), schedule_{cfg.train.lr, cfg.train.min_lr, cfg.train.warmup_steps, cfg.train.steps},
        stage_(std::move(stage)), device_(device) {}

  const ParamLayout& layout() const override { return stage_->layout(); }
  std::string Describe() const override {
    return absl::StrFormat("cuda:%d, %s", device_, PrecisionName(stage_->precision()));
  }
  absl::StatusOr<StepOutcome> TrainStep(const std::vector<MicroBatch>& batch, int64_t step) override {
    StepOutcome o;
    LH_RETURN_IF_ERROR(stage_->ZeroGrads());
    const float scale = 1.0f / static_cast<float>(batch.size());
    for (const MicroBatch& mb : batch) {
      LH_ASSIGN_OR_RETURN(float loss, stage_->Forward(mb, nullptr, nullptr));
      o.loss += loss * scale;
      LH_RETURN_IF_ERROR(stage_->Backward(mb, nullptr, scale, nullptr));
    }
    LH_ASSIGN_OR_RETURN(CudaStepResult r, stage_->Step(cfg_.train.adamw, schedule_, cfg_.train.grad_clip, step));
    o.grad_norm = r.grad_norm, o.lr = r.lr, o.skipped = r.skipped, o.loss_scale = r.loss_scale;
    return o;
  }
  absl::StatusOr<double> Loss(const MicroBatch& mb) override {
    LH_ASSIGN_OR_RETURN(float loss, stage_->Forward(mb, nullptr, nullptr));
    return loss;
  }
  absl::Status GetState(float* params, float* m, float* v) override {
    LH_RETURN_IF_ERROR(stage_->DownloadParams(params));
    return stage_->DownloadOptimizerState(m, v);
  }
  absl::Status SetState(const float* params, const float* m, const float* v) override {
    LH_RETURN_IF_ERROR(stage_->UploadParams(params));
    return stage_->UploadOptimizerState(m, v);
  }

 private:
  JobConfig cfg_;
  LrSchedule schedule_;
  std::unique_ptr<CudaStage> stage_;
  int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaStepRunner(const JobConfig& cfg, int device) {
  if (cfg.train.recompute) {
    return absl::UnimplementedError("train.recompute is not implemented on the CUDA backend yet: set it to false");
  }
  LH_ASSIGN_OR_RETURN(std::unique_ptr<CudaStage> stage,
                      CudaStage::Create(cfg.model, StageSpec::Whole(cfg.model), cfg.train.micro_batch_size,
                                        cfg.train.seq_len, cfg.train.precision, device));
  LH_RETURN_IF_ERROR(stage->InitParams(cfg.train.seed));
  return std::unique_ptr<StepRunner>(new CudaRunner(cfg, std::move(stage), device));
}

}  // namespace longhaul
