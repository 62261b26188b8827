#pragma once
// Deterministic sampling of micro-batches: sample b of micro-batch m of replica r at iteration i
// is a window of the token stream at an offset hashed from (seed, i, r·M + m, b), M being the
// micro-batches per replica. Every stage and replica can rebuild any micro-batch independently, a
// resumed run sees the same data, and D replicas of M micro-batches draw exactly the samples one
// process draws with D·M micro-batches.
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
  int micro_batches = 1;  // M, per replica
};

class BatchSampler {
 public:
  BatchSampler(const SamplerConfig& cfg, const std::vector<uint16_t>& tokens) : cfg_(cfg), tokens_(tokens) {}
  // The stream must hold at least one window of T + 1 tokens.
  absl::Status Check(const char* split) const;
  MicroBatch Sample(int64_t iteration, int replica, int micro) const;

 private:
  SamplerConfig cfg_;
  const std::vector<uint16_t>& tokens_;
};

}  // namespace longhaul
