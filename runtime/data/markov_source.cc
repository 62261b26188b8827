#include "data/markov_source.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "util/hash.h"

namespace longhaul {
namespace {

constexpr char kSymbols[] = "etaoinshrdlcumwfgypbvkjxqz ETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.";
static_assert(sizeof(kSymbols) - 1 == 64);

double EntropyOf(const std::vector<double>& p) {
  double h = 0.0;
  for (double x : p)
    if (x > 0.0) h -= x * std::log(x);
  return h;
}

}  // namespace

absl::Status ValidateMarkovSpec(const MarkovSpec& spec) {
  if (spec.alphabet < 2 || spec.alphabet > 64) {
    return absl::InvalidArgumentError(absl::StrFormat("data.alphabet = %d: must be in [2, 64]", spec.alphabet));
  }
  if (spec.branching < 1 || spec.branching > spec.alphabet) {
    return absl::InvalidArgumentError(
        absl::StrFormat("data.branching = %d: must be in [1, data.alphabet = %d]", spec.branching, spec.alphabet));
  }
  const double contexts = std::pow(static_cast<double>(spec.alphabet), spec.order);
  if (spec.order < 1 || contexts > (1 << 22)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "data.order = %d: must be at least 1 with data.alphabet^order at most 4194304 contexts", spec.order));
  }
  return absl::OkStatus();
}

absl::StatusOr<MarkovSource> MarkovSource::Create(const MarkovSpec& spec) {
  if (absl::Status st = ValidateMarkovSpec(spec); !st.ok()) return st;
  const double contexts = std::pow(static_cast<double>(spec.alphabet), spec.order);
  MarkovSource s;
  s.spec_ = spec;
  s.num_contexts_ = static_cast<int>(contexts);
  Rng rng(HashCoords({spec.seed, 0x6d61726b6f76ULL}));
  double total = 0.0;
  for (int i = 0; i < spec.branching; ++i) {
    s.probs_.push_back(0.05 + rng.Uniform());
    total += s.probs_.back();
  }
  for (double& p : s.probs_) p /= total;
  s.entropy_ = EntropyOf(s.probs_);
  // Successors of a context come from a pool of 2·branching symbols keyed by its last symbol, so
  // the last symbol alone narrows the next one down and the full context pins it: the loss falls in
  // two visible stages (bigram, then full order) instead of sitting on a plateau.
  const int pool_size = std::min(spec.alphabet, 2 * spec.branching);
  std::vector<std::vector<uint8_t>> pools(spec.alphabet);
  std::vector<uint8_t> perm(spec.alphabet);
  auto draw = [&](int n, int k) {  // first k of a random permutation of 0..n-1 (partial Fisher-Yates)
    for (int i = 0; i < n; ++i) perm[i] = static_cast<uint8_t>(i);
    for (int i = 0; i < k; ++i) std::swap(perm[i], perm[i + static_cast<int>(rng.Next() % (n - i))]);
    return std::vector<uint8_t>(perm.begin(), perm.begin() + k);
  };
  for (int last = 0; last < spec.alphabet; ++last) pools[last] = draw(spec.alphabet, pool_size);
  s.successors_.resize(static_cast<size_t>(s.num_contexts_) * spec.branching);
  for (int c = 0; c < s.num_contexts_; ++c) {
    const std::vector<uint8_t> pick = draw(pool_size, spec.branching);
    for (int i = 0; i < spec.branching; ++i)
      s.successors_[static_cast<size_t>(c) * spec.branching + i] = pools[c % spec.alphabet][pick[i]];
  }
  s.ComputeStationary();
  return s;
}

void MarkovSource::ComputeStationary() {
  const int A = spec_.alphabet, S = spec_.branching, K = spec_.order;
  // Power iteration of the lazy chain (P + I) / 2: same stationary distribution, always aperiodic,
  // started where Generate starts so it finds the class the stream actually lives in.
  std::vector<double> pi(num_contexts_, 0.0), next(num_contexts_);
  pi[0] = 1.0;
  for (int iter = 0; iter < 200000; ++iter) {
    for (int c = 0; c < num_contexts_; ++c) next[c] = 0.5 * pi[c];
    for (int c = 0; c < num_contexts_; ++c) {
      if (pi[c] == 0.0) continue;
      const int shifted = (c * A) % num_contexts_;
      for (int i = 0; i < S; ++i) next[shifted + successors_[static_cast<size_t>(c) * S + i]] += 0.5 * pi[c] * probs_[i];
    }
    double diff = 0.0;
    for (int c = 0; c < num_contexts_; ++c) diff += std::abs(next[c] - pi[c]);
    pi.swap(next);
    if (diff < 1e-15) break;
  }
  // Entropy of the first j symbols of a context (j consecutive symbols of the stream), j = 1..K.
  // The context index is base-A with the oldest symbol most significant.
  std::vector<double> joint_entropy(K + 1, 0.0);
  for (int j = 1; j <= K; ++j) {
    const int div = static_cast<int>(std::pow(A, K - j));
    std::vector<double> marg(static_cast<size_t>(num_contexts_ / div), 0.0);
    for (int c = 0; c < num_contexts_; ++c) marg[c / div] += pi[c];
    joint_entropy[j] = EntropyOf(marg);
  }
  // Target at window position t has t+1 symbols of context: H(X_{t+1} | X_0..X_t).
  for (int t = 0; t + 1 < K; ++t) short_context_.push_back(joint_entropy[t + 2] - joint_entropy[t + 1]);
}

double MarkovSource::PositionFloor(int t) const {
  return t < static_cast<int>(short_context_.size()) ? short_context_[t] : entropy_;
}

std::vector<uint8_t> MarkovSource::Generate(size_t n, uint64_t stream) const {
  const int A = spec_.alphabet, S = spec_.branching;
  std::vector<double> cdf(S);
  double acc = 0.0;
  for (int i = 0; i < S; ++i) cdf[i] = (acc += probs_[i]);
  Rng rng(HashCoords({spec_.seed, stream, 0x73747265616dULL}));
  std::vector<uint8_t> out(n);
  int ctx = 0;
  const size_t burn_in = 4096;
  for (size_t i = 0; i < n + burn_in; ++i) {
    const double u = rng.Uniform();
    int k = 0;
    while (k < S - 1 && u >= cdf[k]) ++k;
    const int sym = successors_[static_cast<size_t>(ctx) * S + k];
    ctx = (ctx * A) % num_contexts_ + sym;
    if (i >= burn_in) out[i - burn_in] = static_cast<uint8_t>(kSymbols[sym]);
  }
  return out;
}

}  // namespace longhaul
