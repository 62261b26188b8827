#pragma once
// The Stage interface on a CUDA device: the same model, parameter layout and micro-batch
// semantics as GptStage (runtime/cpu/gpt_stage.h), with cuBLAS matmuls and our own kernels
// (cuda_ops.cuh). Precision: fp32, or bf16/fp16 compute with fp32 master weights, gradients and
// AdamW state; fp16 uses dynamic loss scaling (an overflowing step is skipped and the scale
// halved; it doubles again after kGrowthInterval good steps).
//
// Work is queued on one compute stream; boundary tensors leave through pinned host buffers on a
// second stream, so the device-to-host copy of one micro-batch runs while the next one computes:
// Forward and a non-last stage's Backward return once their work is queued, and Output and
// InputGrad wait for the copy. A boundary in low rank (EncodeLowRank) crosses the bus as its
// factors, put in low rank and multiplied out on the device (cuda/low_rank.cuh). No kernel uses
// atomics, so a run repeats bit for bit.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "model/stage.h"

namespace longhaul {

// Number of CUDA devices (0 when there is no driver or no device); `why` says which.
int CudaDeviceCount(std::string* why);
// Bytes free on cuda:device (cudaMemGetInfo), or why it cannot say.
absl::StatusOr<double> CudaFreeMemory(int device);

class CudaStage : public Stage {
 public:
  static constexpr int kGrowthInterval = 1000;

  struct Options {
    int B = 1, T = 1;  // micro-batch size, sequence length
    Precision precision = Precision::kFp32;
    int device = 0;
    int slots = 1;           // micro-batches held between forward and backward
    bool recompute = false;  // keep each block's input only; rebuild its activations in backward
    // The job's seed (none: a model without a subspace that the caller sets every parameter of),
    // and whether the parameters start from it (InitGpt2Params; else left as allocated, for a
    // caller that sets every one). A subspace model's fixed embedding is drawn from it either way.
    std::optional<uint64_t> seed = 0;
    bool init = true;
    // AttachOptimizer will follow (a trainer, not a pipeline worker whose shards live apart): the
    // check before allocating counts AdamW's moments, so a stage that cannot hold them is refused
    // up front instead of at the moments' cudaMalloc.
    bool optimizer = false;
  };
  static absl::StatusOr<std::unique_ptr<CudaStage>> Create(const ModelConfig& cfg, const StageSpec& spec,
                                                           const Options& options);
};

}  // namespace longhaul
