#pragma once
// One micro-batch as every stage sees it. Sampling is a pure function of (seed, iteration,
// replica, micro-batch), so each stage of a pipeline rebuilds the same MicroBatch locally and
// only boundary activations cross the network.
#include <cstdint>
#include <vector>

namespace longhaul {

struct MicroBatch {
  int B = 0, T = 0;
  // Its iteration, and its index among the iteration's D·M micro-batches (replica·M + micro):
  // what the sampler hashed.
  int64_t iteration = 0, global_index = 0;
  std::vector<int> tokens;         // (B, T) model inputs, read by the first stage
  std::vector<int> targets;        // (B, T) next tokens, read by the last stage
  std::vector<float> loss_weight;  // (B, T) 1 where the position counts in the loss, else 0
  std::vector<int> prefix_len;     // (B) prefix-LM prefix length per sample; 0 = causal
};

}  // namespace longhaul
