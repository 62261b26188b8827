// Error feedback over int8 and int4: a gradient too small for its block's step still arrives over
// iterations, and what arrives sums to what was sent up to one rounding; a stream resumed from a
// kept residual goes on as the original.
#include "transport/error_feedback.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace longhaul {
namespace {

std::vector<float> Through(const float* x, size_t n, WireDtype d) {
  std::vector<float> y(x, x + n);
  RoundThroughWire(y.data(), y.data(), n, d);
  return y;
}

TEST(ErrorFeedback, SmallUpdatesArriveAndTheSumsAgreeUpToOneRounding) {
  for (auto [d, q] : {std::pair{WireDtype::kInt8, 127.0}, std::pair{WireDtype::kInt4, 7.0}}) {
    // One large value sets the block's step (1/q); the others are a hundredth of a step.
    const size_t n = 128;
    std::vector<float> g(n, static_cast<float>(1 / q / 100));
    g[0] = 1.0f;
    ErrorFeedback feedback(d);
    std::vector<double> sent(n, 0), plain(n, 0), arrived(n, 0);
    const int iterations = 1000;
    for (int it = 0; it < iterations; ++it) {
      const std::vector<float> with = Through(feedback.Apply(g.data(), n), n, d);
      const std::vector<float> without = Through(g.data(), n, d);
      for (size_t i = 0; i < n; ++i) sent[i] += g[i], arrived[i] += with[i], plain[i] += without[i];
    }
    for (size_t i = 1; i < n; ++i) {
      EXPECT_EQ(plain[i], 0.0) << "plain " << WireDtypeName(d) << " drops a hundredth of a step every time";
      // The difference is the residual left, less than half a step of the last block's scale.
      EXPECT_NEAR(arrived[i], sent[i], 0.5 * (1.0 + 1.0 / q / 100) / q + 1e-6) << WireDtypeName(d) << " " << i;
      EXPECT_NEAR(arrived[i] + feedback.residual()[i], sent[i], 1e-4) << WireDtypeName(d) << " " << i;
    }
    EXPECT_NEAR(arrived[0], sent[0], 1e-3) << WireDtypeName(d);
  }
}

// A stream set to a residual a checkpoint kept goes on bitwise as the stream that kept it.
TEST(ErrorFeedback, AStreamSetToAKeptResidualGoesOnAsTheOriginal) {
  const size_t n = 300;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * static_cast<float>(i)) / (1.0f + static_cast<float>(i % 9));
  ErrorFeedback original(WireDtype::kInt4), resumed(WireDtype::kInt4);
  for (int it = 0; it < 3; ++it) original.Apply(g.data(), n);
  const std::vector<float> kept = original.residual();
  resumed.SetResidual(kept.data(), kept.size());
  for (int it = 0; it < 3; ++it) {
    const float* a = original.Apply(g.data(), n);
    const std::vector<float> want(a, a + n);
    const float* b = resumed.Apply(g.data(), n);
    EXPECT_EQ(std::vector<float>(b, b + n), want) << "iteration " << it;
  }
  EXPECT_EQ(resumed.residual(), original.residual());
}

// The rounded values Apply hands back are exactly what the wire delivers of what it sent.
TEST(ErrorFeedback, TheRoundedCopyIsWhatTheWireDelivers) {
  for (WireDtype d : {WireDtype::kInt8, WireDtype::kInt4, WireDtype::kTopK}) {
    const size_t n = 300;
    std::vector<float> g(n), rounded(n);
    for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * i) * (1 + i % 7);
    ErrorFeedback feedback(d);
    for (int it = 0; it < 3; ++it) {
      const float* sent = feedback.Apply(g.data(), n, rounded.data());
      EXPECT_EQ(rounded, Through(sent, n, d)) << WireDtypeName(d) << ", iteration " << it;
    }
  }
}

TEST(ErrorFeedback, AStreamOfAnotherLengthStartsAfresh) {
  ErrorFeedback feedback(WireDtype::kInt8);
  std::vector<float> a(10, 0.3f), b(20, 0.0f);
  a[0] = 1.0f;
  feedback.Apply(a.data(), a.size());
  const float* out = feedback.Apply(b.data(), b.size());
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(out[i], 0.0f) << i;
}

}  // namespace
}  // namespace longhaul
