#pragma once
// The built-in corpus: a sparse order-k Markov source over bytes whose entropy is known exactly.
//
// Every context (the previous k symbols) allows `branching` next symbols, chosen at random from a
// pool keyed by the context's last symbol, with one shared set of probabilities permuted over them. Every context therefore has the same
// conditional entropy H, and the entropy rate is H exactly, whatever the stationary distribution.
// A model that learns the source perfectly reaches a loss of H nats per token (after k tokens of
// context); nothing can do better.
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul {

struct MarkovSpec {
  uint64_t seed = 1;
  int alphabet = 24;   // distinct symbols, at most 64; mapped to printable bytes
  int order = 2;       // k: symbols of context
  int branching = 4;   // successors allowed per context
};

// The spec's ranges, checked on their own (a config can be checked before the source is built).
absl::Status ValidateMarkovSpec(const MarkovSpec& spec);

class MarkovSource {
 public:
  static absl::StatusOr<MarkovSource> Create(const MarkovSpec& spec);

  // n bytes of the source, from stream `stream` (different streams are independent samples).
  std::vector<uint8_t> Generate(size_t n, uint64_t stream) const;

  // Entropy rate in nats per token.
  double EntropyRate() const { return entropy_; }
  // Least achievable expected loss (nats) for the target at window position t, where the model has
  // seen t + 1 tokens of the window: H for t + 1 >= order, more before that (from the stationary
  // distribution of contexts).
  double PositionFloor(int t) const;

  const MarkovSpec& spec() const { return spec_; }

 private:
  MarkovSource() = default;
  void ComputeStationary();

  MarkovSpec spec_;
  int num_contexts_ = 0;
  std::vector<double> probs_;          // (branching) shared successor probabilities
  std::vector<uint8_t> successors_;    // (num_contexts, branching) symbol indices
  double entropy_ = 0.0;
  std::vector<double> short_context_;  // [t] conditional entropy with t + 1 < order symbols seen
};

}  // namespace longhaul
