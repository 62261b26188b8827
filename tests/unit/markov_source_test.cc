#include "data/markov_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

namespace longhaul {
namespace {

// Plug-in estimate of H(X_t | previous k symbols) from a long sample.
double EmpiricalConditionalEntropy(const std::vector<uint8_t>& s, int k) {
  std::map<std::string, std::map<uint8_t, double>> counts;
  for (size_t i = k; i < s.size(); ++i) counts[std::string(s.begin() + i - k, s.begin() + i)][s[i]] += 1;
  double h = 0, n = static_cast<double>(s.size() - k);
  for (auto& [ctx, next] : counts) {
    double c = 0;
    for (auto& [_, x] : next) c += x;
    for (auto& [_, x] : next) h -= x / n * std::log(x / c);
  }
  return h;
}

TEST(MarkovSource, EntropyRateMatchesASample) {
  MarkovSpec spec{3, 12, 2, 4};
  auto src = MarkovSource::Create(spec);
  ASSERT_TRUE(src.ok()) << src.status();
  const std::vector<uint8_t> s = src->Generate(2'000'000, 0);
  // 144 contexts × 4 successors: the plug-in estimate is within a few thousandths of a nat.
  EXPECT_NEAR(EmpiricalConditionalEntropy(s, 2), src->EntropyRate(), 0.01);
  // Knowing only the last symbol leaves more uncertainty; the source is not first-order.
  EXPECT_GT(EmpiricalConditionalEntropy(s, 1), src->EntropyRate() + 0.1);
  // The short-context floor of the first window position is the order-1 conditional entropy.
  EXPECT_NEAR(src->PositionFloor(0), EmpiricalConditionalEntropy(s, 1), 0.01);
  EXPECT_EQ(src->PositionFloor(1), src->EntropyRate());
}

TEST(MarkovSource, DeterministicPerSeedAndStream) {
  auto a = MarkovSource::Create({5, 24, 2, 4});
  auto b = MarkovSource::Create({5, 24, 2, 4});
  auto c = MarkovSource::Create({6, 24, 2, 4});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->Generate(1000, 0), b->Generate(1000, 0));
  EXPECT_NE(a->Generate(1000, 0), a->Generate(1000, 1));
  EXPECT_NE(a->Generate(1000, 0), c->Generate(1000, 0));
}

TEST(MarkovSource, RejectsBadShapes) {
  EXPECT_FALSE(MarkovSource::Create({1, 100, 2, 4}).ok());
  EXPECT_FALSE(MarkovSource::Create({1, 8, 2, 9}).ok());
  EXPECT_FALSE(MarkovSource::Create({1, 64, 5, 4}).ok());
}

}  // namespace
}  // namespace longhaul
