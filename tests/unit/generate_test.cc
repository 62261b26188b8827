// Text generation: greedy, temperature and top-k draws from one position's distribution, and the
// model's continuation of a prompt, checked against PyTorch's logits for the hf_gpt2 fixture.
#include "model/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "checkpoint/hf_gpt2.h"
#include "checkpoint/safetensors.h"
#include "cpu/cpu_stage.h"
#include "model/param_layout.h"

namespace longhaul {
namespace {

const std::string kFixture = std::string(LONGHAUL_FIXTURES) + "/hf_gpt2";

TEST(ChooseToken, GreedyTopKAndTemperatureDrawAsTheyShould) {
  const std::vector<float> p = {0.1f, 0.4f, 0.1f, 0.4f, 0.0f};
  SampleOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(ChooseToken(p.data(), 5, greedy, 0.99), 1) << "the lowest id among the most likely";
  // Draws over an even grid of uniforms land in proportion to p^(1/T) among the top k.
  auto shares = [&](float temperature, int top_k) {
    SampleOptions o;
    o.temperature = temperature, o.top_k = top_k;
    std::map<int, double> n;
    const int draws = 10000;
    for (int i = 0; i < draws; ++i) n[ChooseToken(p.data(), 5, o, (i + 0.5) / draws)] += 1.0 / draws;
    return n;
  };
  std::map<int, double> s = shares(1.0f, 0);
  EXPECT_NEAR(s[0], 0.1, 1e-3);
  EXPECT_NEAR(s[1], 0.4, 1e-3);
  EXPECT_NEAR(s[3], 0.4, 1e-3);
  EXPECT_EQ(s.count(4), 0u) << "a token of probability 0 is never drawn";
  s = shares(1.0f, 2);
  EXPECT_NEAR(s[1], 0.5, 1e-3);
  EXPECT_NEAR(s[3], 0.5, 1e-3);
  EXPECT_EQ(s.size(), 2u);
  s = shares(0.5f, 0);  // weights 0.01, 0.16, 0.01, 0.16
  EXPECT_NEAR(s[0], 0.01 / 0.34, 1e-3);
  EXPECT_NEAR(s[1], 0.16 / 0.34, 1e-3);
}

TEST(Generate, GreedyFollowsPyTorchsMostLikelyTokenAndDrawsRepeatWithTheSeed) {
  const ModelConfig cfg = *ReadHfGpt2Config(kFixture);
  std::vector<float> params(ParamLayout(cfg, StageSpec::Whole(cfg)).total());
  ASSERT_TRUE(ImportHfGpt2(kFixture, cfg, ParamLayout(cfg, StageSpec::Whole(cfg)), params.data()).ok());
  // The whole model for a window of `T` tokens, through the Stage interface every backend has.
  auto model = [&](int T) {
    auto stage = CpuStage::Create(cfg, StageSpec::Whole(cfg), 1, T, false, 1, 0);
    EXPECT_TRUE(stage.ok()) << stage.status();
    EXPECT_TRUE((*stage)->SetParams(0, params.data(), params.size()).ok());
    return std::move(*stage);
  };
  const Safetensors ref = *ReadSafetensors(kFixture + "/reference.safetensors");
  std::vector<int> prompt;
  for (float t : ref.tensors.at("tokens").data) prompt.push_back(static_cast<int>(t));
  const std::vector<float>& logits = ref.tensors.at("logits").data;
  const float* last = &logits[(prompt.size() - 1) * cfg.vocab_size];
  const int expected = static_cast<int>(std::max_element(last, last + cfg.vocab_size) - last);
  SampleOptions opt;
  opt.temperature = 0, opt.max_new_tokens = 1;
  EXPECT_EQ(*Generate(*model(SampleWindow(cfg, prompt.size(), opt)), cfg, prompt, opt), std::vector<int>{expected});

  // Past max_seq_len (24) the window crops to the newest tokens.
  opt.temperature = 0.8f, opt.top_k = 10, opt.max_new_tokens = 30, opt.seed = 4;
  EXPECT_EQ(SampleWindow(cfg, prompt.size(), opt), cfg.max_seq_len);
  auto stage = model(cfg.max_seq_len);
  std::vector<int> seen;
  const absl::StatusOr<std::vector<int>> a = Generate(*stage, cfg, prompt, opt, [&](int t) { seen.push_back(t); });
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size(), 30u);
  EXPECT_EQ(seen, *a);
  for (int t : *a) EXPECT_TRUE(t >= 0 && t < cfg.vocab_size);
  EXPECT_EQ(*Generate(*stage, cfg, prompt, opt), *a);
  opt.seed = 5;
  EXPECT_NE(*Generate(*stage, cfg, prompt, opt), *a);

  EXPECT_EQ(Generate(*stage, cfg, {}, opt).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status s = Generate(*stage, cfg, {1, 64}, opt).status();
  EXPECT_NE(s.message().find("outside the model's vocabulary of 64"), std::string::npos) << s;
}

}  // namespace
}  // namespace longhaul
