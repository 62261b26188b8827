#include "data/batch_sampler.h"

#include "absl/strings/str_format.h"
#include "util/hash.h"

namespace longhaul {

absl::Status BatchSampler::Check(const char* split) const {
  if (tokens_.size() < static_cast<size_t>(cfg_.T) + 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s split has %d tokens, fewer than one window of train.seq_len + 1 = %d: use more data or a shorter "
        "train.seq_len",
        split, tokens_.size(), cfg_.T + 1));
  }
  return absl::OkStatus();
}

MicroBatch BatchSampler::Sample(int64_t iteration, int64_t global_micro) const {
  const int B = cfg_.B, T = cfg_.T;
  MicroBatch mb;
  mb.B = B, mb.T = T;
  mb.tokens.resize(static_cast<size_t>(B) * T);
  mb.targets.resize(static_cast<size_t>(B) * T);
  mb.loss_weight.assign(static_cast<size_t>(B) * T, 1.0f);
  mb.prefix_len.assign(B, 0);
  mb.iteration = iteration;
  mb.global_index = global_micro;
  const uint64_t windows = tokens_.size() - T;  // start offsets with T + 1 tokens after them
  for (int b = 0; b < B; ++b) {
    const uint64_t h = HashCoords({cfg_.seed, static_cast<uint64_t>(iteration), static_cast<uint64_t>(global_micro),
                                   static_cast<uint64_t>(b)});
    const size_t start = h % windows;
    for (int t = 0; t < T; ++t) {
      mb.tokens[b * T + t] = tokens_[start + t];
      mb.targets[b * T + t] = tokens_[start + t + 1];
    }
    if (cfg_.mask == AttentionMask::kPrefixLm && T > 1) {
      const int p = 1 + static_cast<int>(SplitMix64(h) % (T - 1));
      mb.prefix_len[b] = p;
      for (int t = 0; t < p - 1; ++t) mb.loss_weight[b * T + t] = 0.0f;
    }
  }
  return mb;
}

}  // namespace longhaul
