#pragma once
// The Stage interface on the CPU: a GptStage with one Activations object per slot. Its buffers
// already are the flat host buffers, so nothing is copied to hand them over.
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cpu/gpt_stage.h"
#include "model/stage.h"
#include "optim/adamw.h"

namespace longhaul {

class CpuStage final : public Stage {
 public:
  // B = micro-batch size, T = sequence length; with `init`, initialised from `seed`
  // (InitGpt2Params), else left zero for a caller that sets every parameter itself. A subspace
  // model's fixed embedding is drawn from `seed` either way, so it needs one.
  static absl::StatusOr<std::unique_ptr<CpuStage>> Create(const ModelConfig& cfg, const StageSpec& spec, int B, int T,
                                                          bool recompute, int slots, std::optional<uint64_t> seed,
                                                          bool init = true);

  const ParamLayout& layout() const override { return stage_->layout(); }
  const StageSpec& spec() const override { return stage_->spec(); }
  std::string Describe() const override;
  int slots() const override { return static_cast<int>(acts_.size()); }
  bool SetExchangeHooks(const ExchangeHooks* hooks) override {
    stage_->SetExchangeHooks(hooks);
    return true;
  }

  absl::Status ZeroGrads() override;
  absl::StatusOr<float> Forward(int slot, const MicroBatch& mb, const float* input) override;
  absl::StatusOr<const float*> Output(int slot) override;
  absl::Status Backward(int slot, const MicroBatch& mb, const float* grad_out, float scale) override;
  absl::StatusOr<const float*> InputGrad(int slot) override;
  absl::Status DownloadProbs(int slot, float* host) override;
  absl::StatusOr<const float*> Params() override { return stage_->params(); }
  absl::StatusOr<const float*> Grads() override { return stage_->grads(); }
  absl::Status SetParams(size_t begin, const float* values, size_t n) override;
  absl::Status AttachOptimizer(const OptimizerSettings& settings) override;
  absl::StatusOr<OptimizerStepResult> Step(int64_t step) override;
  absl::Status GetOptimizerState(float* m, float* v) override;
  absl::Status SetOptimizerState(const float* m, const float* v) override;

 private:
  CpuStage() = default;
  absl::Status CheckSlot(int slot) const;
  absl::Status CheckOptimizer() const;

  std::unique_ptr<GptStage> stage_;
  std::vector<GptStage::ActivationsPtr> acts_;
  // Per slot: GptStage's input gradient is overwritten by its next backward, a slot's is not.
  std::vector<std::vector<float>> input_grads_;
  OptimizerSettings optimizer_;
  std::unique_ptr<AdamW> adamw_;  // once attached
};

}  // namespace longhaul
