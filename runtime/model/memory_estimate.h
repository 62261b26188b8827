#pragma once
// The memory a stage needs, by part, computed from its shape before anything is allocated, so a
// job that cannot fit is refused with the figures and the fix instead of dying in the allocator
// (and a planner can weigh placements with the same numbers). The counts follow GptStage's (CPU)
// and CudaStage's (device) buffers one by one; memory_estimate_test holds them to what GptStage
// really allocates.
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace longhaul {

enum class Backend { kCpu, kCuda };

struct StageMemoryRequest {
  ModelConfig model;
  StageSpec spec;
  int B = 1, T = 1;         // micro-batch size, sequence length
  bool recompute = false;   // CPU: keep only block outputs between forward and backward
  int activation_slots = 1;  // micro-batches whose activations are held at once (ActivationSlots)
  int threads = 1;          // CPU threads: attention's backward scratch is per thread
  Backend backend = Backend::kCpu;
  Precision precision = Precision::kFp32;  // CUDA compute precision
  // CUDA: the stage steps its own parameters (the one-process trainer attaches AdamW, whose
  // moments then live on the device); a worker's stage leaves that to the parameter servers.
  bool optimizer = false;
};

// Byte counts by part. Doubles: a config can ask for more than 2^63 bytes, and must still get a
// figure rather than an overflow.
class MemoryEstimate {
 public:
  struct Part {
    std::string name;
    double bytes = 0;
  };
  void Add(const std::string& name, double bytes);  // parts of the same name add up
  void Add(const MemoryEstimate& other, double times = 1);
  double total() const;
  const std::vector<Part>& parts() const { return parts_; }
  double bytes(const std::string& part) const;  // 0 when absent
  // "1.2 GiB (parameters 512.0 MiB, gradients 512.0 MiB, ...)", parts of at least 1 MiB.
  std::string ToString() const;

 private:
  std::vector<Part> parts_;
};

std::string FormatBytes(double bytes);  // "12.0 KiB", "3.5 MiB", "1.2 GiB", "80.0 TiB"

// Parameters of a stage (ParamLayout(model, spec).total(), by arithmetic, without building it).
double StageParamCount(const ModelConfig& model, const StageSpec& spec);

// What the stage itself holds on its backend. CPU: parameters, gradients, activations x slots,
// backward scratch. CUDA (device memory): the same plus the compute copy of the weights in
// bf16/fp16, the cuBLAS workspace and, with `optimizer`, the AdamW moments and flags.
MemoryEstimate EstimateStage(const StageMemoryRequest& r);

// Whether CudaStage runs attention in the flash style (cuda/flash_attention.cuh) for this model
// and precision: bf16 or fp16 compute and a head size its tiles take (a multiple of 8, at most
// 128). Otherwise the stage keeps each block's (T, T) attention probabilities.
bool CudaFlashAttention(const ModelConfig& m, Precision p);
// The row stride of CudaStage's logits and their gradient: the vocabulary rounded up to 8 entries,
// so that every row is 16-byte aligned for cuBLAS (for an odd vocabulary like GPT-2's 50257 it
// fell back to a generic kernel, several times slower).
int CudaLogitsStride(const ModelConfig& m);

// Memory this process may still take: /proc/meminfo's MemAvailable, or less where a cgroup (v1 or
// v2, this process's and its ancestors') limits it. `root` prefixes every path (tests give a fake
// tree). Returns bytes and where the figure comes from.
struct MemoryLimit {
  double bytes = 0;
  std::string source;
};
MemoryLimit HostMemoryAvailable(const std::string& root = "");

}  // namespace longhaul
