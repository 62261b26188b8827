// Parity of the CPU model with PyTorch: fixtures from tests/reference/make_fixtures.py hold the
// initial weights, inputs, logits, loss, every gradient and the losses of 10 AdamW steps.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "model/gpt_stage.h"
#include "optim/train_step.h"

namespace longhaul {
namespace {

struct Fixture {
  Safetensors st;
  nlohmann::json cfg;
  const std::vector<float>& T(const std::string& name) const { return st.tensors.at(name).data; }
};

Fixture Load(const std::string& name) {
  auto st = ReadSafetensors(std::string(LONGHAUL_FIXTURES) + "/" + name + ".safetensors");
  EXPECT_TRUE(st.ok()) << st.status();
  Fixture f{*st, nlohmann::json::parse(st->metadata.at("config"))};
  return f;
}

ModelConfig ModelOf(const nlohmann::json& c) {
  ModelConfig m;
  m.vocab_size = c["vocab_size"], m.max_seq_len = c["max_seq_len"], m.n_layer = c["n_layer"];
  m.n_head = c["n_head"], m.d_model = c["d_model"], m.tied_head = c["tied_head"];
  m.attention = c["attention"] == "prefix_lm" ? AttentionMask::kPrefixLm : AttentionMask::kCausal;
  return m;
}

std::vector<MicroBatch> MicroBatchesOf(const Fixture& f) {
  const int M = f.cfg["M"], B = f.cfg["B"], T = f.cfg["T"];
  std::vector<MicroBatch> out(M);
  for (int m = 0; m < M; ++m) {
    MicroBatch& mb = out[m];
    mb.B = B, mb.T = T;
    for (int i = 0; i < B * T; ++i) {
      mb.tokens.push_back(static_cast<int>(f.T("input.tokens")[m * B * T + i]));
      mb.targets.push_back(static_cast<int>(f.T("input.targets")[m * B * T + i]));
      mb.loss_weight.push_back(f.T("input.loss_weight")[m * B * T + i]);
    }
    for (int b = 0; b < B; ++b) mb.prefix_len.push_back(static_cast<int>(f.T("input.prefix_len")[m * B + b]));
  }
  return out;
}

class ParityTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ParityTest, MatchesPyTorch) {
  const auto& [name, recompute] = GetParam();
  Fixture f = Load(name);
  const ModelConfig cfg = ModelOf(f.cfg);
  const int B = f.cfg["B"], T = f.cfg["T"], V = cfg.vocab_size;
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
  const std::vector<float>& logits = f.T("out.logits");
  double max_prob_err = 0;
  for (int n = 0; n < B * T; ++n) {
    const float* l = logits.data() + static_cast<size_t>(n) * V;
    double mx = l[0], sum = 0;
    for (int v = 0; v < V; ++v) mx = std::max<double>(mx, l[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    for (int v = 0; v < V; ++v)
      max_prob_err = std::max(max_prob_err, std::abs(std::exp(l[v] - mx) / sum - s.Probs(*act)[n * V + v]));
  }
  EXPECT_LT(max_prob_err, 2e-6) << "softmax probabilities, fp32 against fp64";

  const double loss = AccumulateGradients(s, *act, mbs);
  EXPECT_NEAR(loss, f.T("out.loss")[0], 2e-5) << "loss in nats; fp32 against fp64";

  // Gradients: relative error in the L2 sense per tensor, plus an elementwise bound scaled by the
  // tensor's largest entry (fp32 accumulation against fp64).
  for (const ParamTensor& t : s.layout().tensors()) {
    const std::vector<float>& ref = f.T("grad." + t.name);
    double num = 0, den = 0, maxref = 0, maxerr = 0;
    for (size_t i = 0; i < t.size; ++i) {
      const double d = s.grads()[t.offset + i] - ref[i];
      num += d * d, den += static_cast<double>(ref[i]) * ref[i];
      maxref = std::max(maxref, std::abs(static_cast<double>(ref[i])));
      maxerr = std::max(maxerr, std::abs(d));
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-4) << "gradient of " << t.name;
    EXPECT_LT(maxerr, 1e-4 * maxref + 1e-7) << "gradient of " << t.name;
  }

  // 10 AdamW steps on the same micro-batches: losses follow PyTorch's.
  for (const ParamTensor& t : s.layout().tensors()) {
    const std::vector<float>& src = f.T(t.name);
    std::copy(src.begin(), src.end(), s.params() + t.offset);
  }
  AdamWConfig ac{f.cfg["beta1"], f.cfg["beta2"], f.cfg["eps"], f.cfg["weight_decay"]};
  AdamW adamw(ac, s.layout());
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
                         ::testing::Combine(::testing::Values("causal_untied", "causal_tied_lossmask", "prefix_untied",
                                                              "prefix_tied_lossmask"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_recompute" : "");
                         });

}  // namespace
}  // namespace longhaul
