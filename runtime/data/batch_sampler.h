#pragma once
// Deterministic sampling of micro-batches: sample b of global micro-batch g at iteration i is a
// window of the token stream at an offset hashed from (seed, i, g, b), g numbering the job's
// micro-batches replica after replica (JobConfig::FirstMicroBatchOf). Every stage and replica can
// rebuild any micro-batch independently, a resumed run sees the same data, and replicas of any
// shares draw exactly the samples one process draws with all of their micro-batches.
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "model/micro_batch.h"
#include "model/model_config.h"

namespace longhaul {

struct SamplerConfig {
  int B = 1;
  int T = 64;
  uint64_t seed = 1;
  // Prefix-LM draws a prefix length in [1, T-1] per sample and drops the loss on targets that the
  // prefix makes visible (positions before prefix - 1).
  AttentionMask mask = AttentionMask::kCausal;
};

class BatchSampler {
 public:
  BatchSampler(const SamplerConfig& cfg, const std::vector<uint16_t>& tokens) : cfg_(cfg), tokens_(tokens) {}
  // The stream must hold at least one window of T + 1 tokens.
  absl::Status Check(const char* split) const;
  MicroBatch Sample(int64_t iteration, int64_t global_micro) const;

 private:
  SamplerConfig cfg_;
  const std::vector<uint16_t>& tokens_;
};

}  // namespace longhaul
