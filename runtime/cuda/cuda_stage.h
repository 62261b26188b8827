#pragma once
// One pipeline stage of the GPT model on a CUDA device: the same model, parameter layout and
// micro-batch semantics as GptStage (runtime/model/gpt_stage.h), with cuBLAS matmuls and our own
// kernels (cuda_ops.cuh). Precision: fp32, or bf16/fp16 compute with fp32 master weights,
// gradients and AdamW state; fp16 uses dynamic loss scaling (an overflowing step is skipped and
// the scale halved; it doubles again after kGrowthInterval good steps).
//
// Boundary tensors cross to and from the host as fp32, which is what the transport sends; the
// optimizer step runs on the device.
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "data/micro_batch.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace longhaul {

// Number of CUDA devices (0 when there is no driver or no device); `why` says which.
int CudaDeviceCount(std::string* why);

struct CudaStepResult {
  double grad_norm = 0;  // unscaled, before clipping
  float lr = 0;
  bool skipped = false;  // fp16 overflow: no update this step
  float loss_scale = 1;  // after this step
};

class CudaStage {
 public:
  static constexpr int kGrowthInterval = 1000;

  static absl::StatusOr<std::unique_ptr<CudaStage>> Create(const ModelConfig& cfg, const StageSpec& spec, int B, int T,
                                                           Precision precision, int device);
  virtual ~CudaStage() = default;

  virtual const ParamLayout& layout() const = 0;
  virtual size_t num_params() const = 0;
  virtual Precision precision() const = 0;

  virtual absl::Status InitParams(uint64_t seed) = 0;
  virtual absl::Status UploadParams(const float* host) = 0;
  virtual absl::Status DownloadParams(float* host) = 0;
  virtual absl::Status DownloadGrads(float* host) = 0;  // unscaled (divided by the loss scale)
  virtual absl::Status DownloadProbs(float* host) = 0;  // (B, T, V) softmax of the last forward
  virtual absl::Status ZeroGrads() = 0;
  // AdamW moments (for checkpoints), laid out by layout().
  virtual absl::Status DownloadOptimizerState(float* m, float* v) = 0;
  virtual absl::Status UploadOptimizerState(const float* m, const float* v) = 0;

  // Forward of one micro-batch; host_input (B, T, C) for a non-first stage. Returns the weighted
  // mean loss on the last stage, else 0; host_output (B, T, C) receives a non-last stage's output.
  virtual absl::StatusOr<float> Forward(const MicroBatch& mb, const float* host_input, float* host_output) = 0;
  // Backward of the micro-batch last forwarded; host_grad_out (B, T, C) for a non-last stage;
  // host_grad_in (B, T, C) receives the input gradient of a non-first stage.
  virtual absl::Status Backward(const MicroBatch& mb, const float* host_grad_out, float loss_scale,
                                float* host_grad_in) = 0;
  // Global-norm clipping and AdamW on the device, at the scheduled rate of step `step` (0-based).
  virtual absl::StatusOr<CudaStepResult> Step(const AdamWConfig& adamw, const LrSchedule& schedule, float grad_clip,
                                              int64_t step) = 0;
};

}  // namespace longhaul
