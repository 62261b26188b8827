#pragma once
// The Stage a backend name asks for ("cpu" or "cuda:N"): one place that knows which backends this
// build has, so the trainer, the worker and the benchmarks never do.
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "model/stage.h"
#include "ps/ps_shard.h"

namespace longhaul {

struct StageRequest {
  ModelConfig model;
  StageSpec spec;
  int B = 1, T = 1;  // micro-batch size, sequence length
  int device = -1;   // -1: the CPU; N: cuda:N
  Precision precision = Precision::kFp32;
  bool recompute = false;
  int slots = 1;
  // The job's train.seed, and whether the parameters start from it (InitGpt2Params): not where the
  // caller sets every one (a resumed plan version's). A subspace model's fixed embedding is drawn
  // from it either way.
  uint64_t seed = 0;
  bool init = true;
  std::string init_from;  // train.init_from: parameters from this GPT-2 checkpoint, not the seed's
  bool optimizer = false;  // the stage steps itself (AttachOptimizer): its memory check counts the moments
};

// Stage `stage` of the job on `device` (BackendName), holding `slots` micro-batches.
StageRequest StageRequestFor(const JobConfig& cfg, int stage, int device, int slots);

absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const StageRequest& r);

// What a stage on `device` may use, as the worker reports it for the placement search to cut
// stages that fit: the host's available memory for the CPU (-1), the GPU's free memory for cuda:N;
// 0 (unknown, nothing checked) where it cannot say.
double DeviceMemoryAvailable(int device);

// A parameter-server shard of tensors [first_tensor, end_tensor) of `stage_layout`, kept where the
// hosting worker computes: host memory for the CPU (-1), cuda:N's memory for a GPU worker.
absl::StatusOr<std::unique_ptr<PsShard>> MakePsShard(int device, const AdamWConfig& adamw,
                                                     const ParamLayout& stage_layout, int stage, int shard,
                                                     int first_tensor, int end_tensor, int replicas);

}  // namespace longhaul
