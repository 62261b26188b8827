#include "data/batch_sampler.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace longhaul {
namespace {

std::vector<uint16_t> Ramp(size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i % 50000);
  return v;
}

TEST(BatchSampler, DeterministicAndKeyedByEveryCoordinate) {
  const auto tokens = Ramp(10000);
  BatchSampler s({4, 32, 7, AttentionMask::kCausal}, tokens);
  const MicroBatch a = s.Sample(3, 5);
  EXPECT_EQ(a.global_index, 5);
  EXPECT_EQ(a.tokens, s.Sample(3, 5).tokens);
  EXPECT_NE(a.tokens, s.Sample(4, 5).tokens);
  EXPECT_NE(a.tokens, s.Sample(3, 4).tokens);
  BatchSampler other_seed({4, 32, 8, AttentionMask::kCausal}, tokens);
  EXPECT_NE(a.tokens, other_seed.Sample(3, 5).tokens);
  // Targets are the inputs shifted by one; the ramp makes that checkable.
  for (size_t i = 0; i < a.tokens.size(); ++i) EXPECT_EQ(a.targets[i], a.tokens[i] + 1);
  for (float w : a.loss_weight) EXPECT_EQ(w, 1.0f);
  for (int p : a.prefix_len) EXPECT_EQ(p, 0);
}

TEST(BatchSampler, PrefixLmMasksTargetsThePrefixReveals) {
  const auto tokens = Ramp(10000);
  BatchSampler s({16, 20, 1, AttentionMask::kPrefixLm}, tokens);
  const MicroBatch mb = s.Sample(0, 0);
  for (int b = 0; b < 16; ++b) {
    const int p = mb.prefix_len[b];
    ASSERT_GE(p, 1);
    ASSERT_LE(p, 19);
    for (int t = 0; t < 20; ++t) EXPECT_EQ(mb.loss_weight[b * 20 + t], t >= p - 1 ? 1.0f : 0.0f) << b << " " << t;
  }
}

TEST(BatchSampler, TooShortStreamIsAnError) {
  const auto tokens = Ramp(10);
  BatchSampler s({1, 10, 1, AttentionMask::kCausal}, tokens);
  absl::Status st = s.Check("training");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("train.seq_len"), std::string::npos);
}

}  // namespace
}  // namespace longhaul
