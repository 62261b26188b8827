#pragma once
// Text generation from a whole model on the CPU: each next token is drawn from the model's
// distribution at the last position of the window (the newest max_seq_len tokens, as GPT-2 crops
// its context).
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"

namespace longhaul {

struct SampleOptions {
  int max_new_tokens = 200;
  float temperature = 1.0f;  // 0: greedy (the most likely token, the lowest id among equals)
  int top_k = 0;             // draw among the k most likely tokens only; 0: among all
  uint64_t seed = 1;         // the same seed, model and prompt give the same text
};

// `params` laid out by ParamLayout(cfg, StageSpec::Whole(cfg)); `prompt` holds at least one token
// below cfg.vocab_size. `emit` sees each new token as it is chosen. Returns the new tokens.
absl::StatusOr<std::vector<int>> Generate(const ModelConfig& cfg, const float* params, const std::vector<int>& prompt,
                                          const SampleOptions& opt, const std::function<void(int)>& emit = nullptr);

// The token `probs` (one position's distribution over the vocabulary) yields under `opt`, with
// `uniform` in [0, 1) as the draw.
int ChooseToken(const float* probs, int vocab, const SampleOptions& opt, double uniform);

}  // namespace longhaul
