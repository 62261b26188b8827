#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/param_layout.h"

namespace longhaul {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.vocab_size = 8, c.max_seq_len = 4, c.n_layer = 1, c.n_head = 1, c.d_model = 4;
  return c;
}

TEST(AdamW, OneStepMatchesTheFormulaAndDecaysOnlyMatrices) {
  const ModelConfig cfg = Tiny();
  ParamLayout layout(cfg, StageSpec::Whole(cfg));
  std::vector<float> p(layout.total(), 0.5f), g(layout.total());
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  AdamWConfig ac{0.9f, 0.95f, 1e-8f, 0.1f};
  AdamW opt(ac, layout.DecayFlags());
  const float lr = 0.01f;
  opt.Step(p.data(), g.data(), lr, 1);
  for (const ParamTensor& t : layout.tensors()) {
    const size_t i = t.offset;
    // step 1: m̂ = g, v̂ = g², update = lr·g/(|g| + eps)
    const double gi = g[i];
    const double decayed = t.decay ? 0.5 * (1 - lr * 0.1) : 0.5;
    EXPECT_NEAR(p[i], decayed - lr * gi / (std::abs(gi) + 1e-8), 1e-6) << t.name;
  }
}

TEST(AdamW, ShardsTogetherEqualTheWhole) {
  const ModelConfig cfg = Tiny();
  ParamLayout layout(cfg, StageSpec::Whole(cfg));
  const size_t n = layout.total(), cut = n / 3;  // cuts through the middle of a tensor
  std::vector<float> whole(n, 0.1f), sharded(n, 0.1f), g(n);
  for (size_t i = 0; i < n; ++i) g[i] = std::sin(static_cast<float>(i));
  AdamW full({}, layout.DecayFlags()), a({}, layout.DecayFlags(0, cut)), b({}, layout.DecayFlags(cut, n), cut);
  for (int step = 1; step <= 3; ++step) {
    full.Step(whole.data(), g.data(), 1e-2f, step);
    a.Step(sharded.data(), g.data(), 1e-2f, step);
    b.Step(sharded.data(), g.data(), 1e-2f, step);
  }
  EXPECT_EQ(whole, sharded);
}

}  // namespace
}  // namespace longhaul
