#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

namespace longhaul {
namespace {

TEST(LrSchedule, WarmupThenCosineToMin) {
  LrSchedule s{1.0f, 0.1f, 4, 14};
  EXPECT_FLOAT_EQ(s.At(0), 0.25f);
  EXPECT_FLOAT_EQ(s.At(3), 1.0f);
  EXPECT_FLOAT_EQ(s.At(4), 1.0f);                  // cosine starts at the peak
  EXPECT_NEAR(s.At(9), 0.1f + 0.5f * 0.9f, 1e-6);  // half way: the midpoint
  EXPECT_FLOAT_EQ(s.At(14), 0.1f);
  EXPECT_FLOAT_EQ(s.At(100), 0.1f);  // past the end it stays at min_lr
  for (int i = 4; i < 14; ++i) EXPECT_GE(s.At(i), s.At(i + 1));
}

TEST(LrSchedule, NoWarmup) {
  LrSchedule s{2.0f, 0.0f, 0, 10};
  EXPECT_FLOAT_EQ(s.At(0), 2.0f);
  EXPECT_NEAR(s.At(10), 0.0f, 1e-7);
}

}  // namespace
}  // namespace longhaul
