#include "metrics/flops.h"

#include <gtest/gtest.h>

namespace longhaul {
namespace {

TEST(Flops, MegatronFormulaForGpt3XlBatch64) {
  ModelConfig c;
  c.n_layer = 24, c.d_model = 2048, c.vocab_size = 50257, c.n_head = 16, c.max_seq_len = 2048;
  const double B = 64, s = 2048, l = 24, h = 2048, V = 50257;
  EXPECT_DOUBLE_EQ(ModelFlopsPerIteration(c, 64, 2048, false),
                   72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)));
  EXPECT_DOUBLE_EQ(ModelFlopsPerIteration(c, 64, 2048, true),
                   96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)));
  // Cross-check with 6·N·tokens (N = 1.31e9 parameters, 131072 tokens: 1.03e15) plus attention
  // (12·l·h·s per token: 0.16e15): about 1.19e15 FLOPs per iteration of the source experiment.
  EXPECT_NEAR(ModelFlopsPerIteration(c, 64, 2048, false) / 1e15, 1.19, 0.01);
}

TEST(Flops, DaysAndDurations) {
  EXPECT_NEAR(DaysFor100BTokens(100e9 / 86400.0), 1.0, 1e-12);
  EXPECT_EQ(DaysFor100BTokens(0), 0.0);
  EXPECT_EQ(FormatDuration(59.4), "59s");
  EXPECT_EQ(FormatDuration(61), "1m01s");
  EXPECT_EQ(FormatDuration(3723), "1h02m03s");
}

}  // namespace
}  // namespace longhaul
