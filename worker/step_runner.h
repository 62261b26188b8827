#pragma once
// The compute backend of one-process training: one optimizer step over a batch of micro-batches,
// a forward-only loss, and the state a checkpoint holds. One implementation per backend (CPU:
// GptStage + AdamW on the host; CUDA: CudaStage with AdamW on the device), so the trainer's loop,
// logging and checkpoints are written once.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "data/micro_batch.h"
#include "model/param_layout.h"

namespace longhaul {

struct StepOutcome {
  double loss = 0;       // mean micro-batch loss
  double grad_norm = 0;  // before clipping
  float lr = 0;
  bool skipped = false;  // fp16 overflow: no update
  float loss_scale = 1;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const ParamLayout& layout() const = 0;
  virtual std::string Describe() const = 0;  // backend, threads or device, precision
  virtual absl::StatusOr<StepOutcome> TrainStep(const std::vector<MicroBatch>& batch, int64_t step) = 0;
  virtual absl::StatusOr<double> Loss(const MicroBatch& mb) = 0;
  // Parameters and AdamW moments, laid out by layout().
  virtual absl::Status GetState(float* params, float* m, float* v) = 0;
  virtual absl::Status SetState(const float* params, const float* m, const float* v) = 0;
};

// The runner train.backend names ("cpu" or "cuda:N"), initialised from train.seed.
absl::StatusOr<std::unique_ptr<StepRunner>> MakeStepRunner(const JobConfig& cfg);

// Implemented in cuda_runner.cc, which only CUDA builds compile.
absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaStepRunner(const JobConfig& cfg, int device);

}  // namespace longhaul
