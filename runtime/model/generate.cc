#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace longhaul {

int ChooseToken(const float* probs, int vocab, const SampleOptions& opt, double uniform) {
  if (opt.temperature <= 0) return static_cast<int>(std::max_element(probs, probs + vocab) - probs);
  std::vector<int> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int k = opt.top_k > 0 ? std::min(opt.top_k, vocab) : vocab;
  // Ties keep the lower id first, so a draw is a function of the distribution alone.
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
  // p^(1/T), renormalised: softmax(logits / T). In doubles, relative to the largest, so a low
  // temperature cannot underflow every weight.
  std::vector<double> w(static_cast<size_t>(k));
  const double top = probs[order[0]];
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    w[i] = top > 0 ? std::pow(static_cast<double>(probs[order[i]]) / top, 1.0 / opt.temperature) : 1.0;
    sum += w[i];
  }
  double at = uniform * sum;
  for (int i = 0; i < k; ++i) {
    if (at < w[i]) return order[i];
    at -= w[i];
  }
  return order[k - 1];
}

int SampleWindow(const ModelConfig& cfg, size_t prompt_tokens, const SampleOptions& opt) {
  return static_cast<int>(std::min<int64_t>(cfg.max_seq_len, static_cast<int64_t>(prompt_tokens) + opt.max_new_tokens));
}

absl::StatusOr<std::vector<int>> Generate(Stage& stage, const ModelConfig& cfg, const std::vector<int>& prompt,
                                          const SampleOptions& opt, const std::function<void(int)>& emit) {
  if (prompt.empty()) return absl::InvalidArgumentError("an empty prompt: give at least one token");
  for (int t : prompt) {
    if (t < 0 || t >= cfg.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("prompt token %d is outside the model's vocabulary of %d", t, cfg.vocab_size));
    }
  }
  if (opt.max_new_tokens < 0 || opt.top_k < 0 || !(opt.temperature >= 0)) {
    return absl::InvalidArgumentError("tokens, top-k and temperature must not be negative");
  }
  if (!stage.spec().has_embedding || !stage.spec().has_head) {
    return absl::InvalidArgumentError("generation needs the whole model in one stage");
  }
  const int T = SampleWindow(cfg, prompt.size(), opt);
  std::vector<float> probs(static_cast<size_t>(T) * cfg.vocab_size);
  MicroBatch mb;
  mb.B = 1, mb.T = T;
  mb.targets.assign(static_cast<size_t>(T), 0);
  mb.loss_weight.assign(static_cast<size_t>(T), 1.0f);
  mb.prefix_len.assign(1, 0);
  Rng rng(opt.seed);
  std::vector<int> text = prompt, out;
  for (int n = 0; n < opt.max_new_tokens; ++n) {
    // Positions past the text hold token 0; causal attention keeps them from the last one.
    const int len = std::min<int>(T, static_cast<int>(text.size()));
    mb.tokens.assign(text.end() - len, text.end());
    mb.tokens.resize(static_cast<size_t>(T), 0);
    LH_RETURN_IF_ERROR(stage.Forward(0, mb, nullptr).status());
    LH_RETURN_IF_ERROR(stage.DownloadProbs(0, probs.data()));
    const int next =
        ChooseToken(probs.data() + static_cast<size_t>(len - 1) * cfg.vocab_size, cfg.vocab_size, opt, rng.Uniform());
    text.push_back(next);
    out.push_back(next);
    if (emit) emit(next);
  }
  return out;
}

}  // namespace longhaul
