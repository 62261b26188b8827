#pragma once
// Text generation from a whole model on any backend: each next token is drawn from the model's
// distribution at the last position of the window (the newest tokens, at most max_seq_len, as
// GPT-2 crops its context).
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "model/stage.h"

namespace longhaul {

struct SampleOptions {
  int max_new_tokens = 200;
  float temperature = 1.0f;  // 0: greedy (the most likely token, the lowest id among equals)
  int top_k = 0;             // draw among the k most likely tokens only; 0: among all
  uint64_t seed = 1;         // the same seed, model and prompt give the same text
};

// The window a generation of `opt.max_new_tokens` after `prompt_tokens` needs: the sequence
// length of the stage Generate runs on.
int SampleWindow(const ModelConfig& cfg, size_t prompt_tokens, const SampleOptions& opt);

// `stage` is the whole model of `cfg` (embeddings to head, its parameters set) for micro-batches of
// one sequence of SampleWindow tokens; `prompt` holds at least one token below cfg.vocab_size.
// `emit` sees each new token as it is chosen. Returns the new tokens.
absl::StatusOr<std::vector<int>> Generate(Stage& stage, const ModelConfig& cfg, const std::vector<int>& prompt,
                                          const SampleOptions& opt, const std::function<void(int)>& emit = nullptr);

// The token `probs` (one position's distribution over the vocabulary) yields under `opt`, with
// `uniform` in [0, 1) as the draw.
int ChooseToken(const float* probs, int vocab, const SampleOptions& opt, double uniform);

}  // namespace longhaul
