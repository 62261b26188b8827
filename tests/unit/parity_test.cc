// Parity of the CPU model with PyTorch: fixtures from tests/reference/make_fixtures.py hold the
// initial weights, inputs, logits, loss, every gradient and the losses of 10 AdamW steps.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/gpt_stage.h"
#include "tests/support/fixtures.h"
#include "optim/train_step.h"

namespace longhaul {
namespace {

using testing::Fixture;
using testing::LoadFixture;
using testing::MicroBatchesOf;
using testing::ModelOf;

class ParityTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ParityTest, MatchesPyTorch) {
  const auto& [name, recompute] = GetParam();
  Fixture f = LoadFixture(name);
  const ModelConfig cfg = ModelOf(f.cfg);
  const int B = f.cfg["B"], T = f.cfg["T"];
  auto stage = GptStage::Create(cfg, StageSpec::Whole(cfg), B, T, recompute);
  ASSERT_TRUE(stage.ok()) << stage.status();
  GptStage& s = **stage;
  for (const ParamTensor& t : s.layout().tensors()) {
    const std::vector<float>& src = f.T(t.name);
    ASSERT_EQ(src.size(), t.size) << t.name;
    std::copy(src.begin(), src.end(), s.params() + t.offset);
  }
  const std::vector<MicroBatch> mbs = MicroBatchesOf(f);
  auto act = s.NewActivations();

  // Probabilities of the first micro-batch against the softmax of the reference logits.
  s.Forward(*act, mbs[0], nullptr);
  EXPECT_LT(testing::MaxProbError(f, s.Probs(*act)), 2e-6) << "softmax probabilities, fp32 against fp64";

  const double loss = AccumulateGradients(s, *act, mbs);
  EXPECT_NEAR(loss, f.T("out.loss")[0], 2e-5) << "loss in nats; fp32 against fp64";

  // Gradients: relative error in the L2 sense per tensor, plus an elementwise bound scaled by the
  // tensor's largest entry (fp32 accumulation against fp64).
  for (const ParamTensor& t : s.layout().tensors()) {
    const std::vector<float>& ref = f.T("grad." + t.name);
    double maxref = 0, maxerr = 0;
    for (size_t i = 0; i < t.size; ++i) {
      maxref = std::max(maxref, std::abs(static_cast<double>(ref[i])));
      maxerr = std::max(maxerr, std::abs(s.grads()[t.offset + i] - static_cast<double>(ref[i])));
    }
    EXPECT_LT(testing::RelativeError(f, "grad." + t.name, s.grads() + t.offset), 1e-4) << "gradient of " << t.name;
    EXPECT_LT(maxerr, 1e-4 * maxref + 1e-7) << "gradient of " << t.name;
  }

  // 10 AdamW steps on the same micro-batches: losses follow PyTorch's.
  for (const ParamTensor& t : s.layout().tensors()) {
    const std::vector<float>& src = f.T(t.name);
    std::copy(src.begin(), src.end(), s.params() + t.offset);
  }
  AdamWConfig ac{f.cfg["beta1"], f.cfg["beta2"], f.cfg["eps"], f.cfg["weight_decay"]};
  AdamW adamw(ac, s.layout().DecayFlags());
  LrSchedule sched{f.cfg["lr"], f.cfg["min_lr"], f.cfg["warmup_steps"], f.cfg["steps"]};
  const std::vector<float>& ref_losses = f.T("out.step_losses");
  for (int step = 0; step < static_cast<int>(ref_losses.size()); ++step) {
    const double l = AccumulateGradients(s, *act, mbs);
    // Adam normalises each update, so fp32 rounding grows over steps; 1e-3 nats after 10 steps.
    EXPECT_NEAR(l, ref_losses[step], 1e-4 + 1e-4 * step) << "loss before AdamW step " << step;
    ApplyOptimizerStep(s.params(), s.grads(), s.num_params(), adamw, sched, f.cfg["grad_clip"], step);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParityTest,
                         ::testing::Combine(::testing::ValuesIn(testing::FixtureNames()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_recompute" : "");
                         });

}  // namespace
}  // namespace longhaul
