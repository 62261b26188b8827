// Stage slicing: running the model as consecutive stages gives the whole model's loss and
// gradients, and recompute changes nothing; an exchange hook that says stop ends the forward or
// backward there.
#include "cpu/gpt_stage.h"

#include <gtest/gtest.h>

#include <cmath>

#include "data/batch_sampler.h"

namespace longhaul {
namespace {

ModelConfig Cfg() {
  ModelConfig c;
  c.vocab_size = 40, c.max_seq_len = 20, c.n_layer = 5, c.n_head = 2, c.d_model = 16;
  c.attention = AttentionMask::kPrefixLm;
  return c;
}

std::vector<uint16_t> Tokens() {
  std::vector<uint16_t> t(3000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + i / 13) % 40);
  return t;
}

TEST(GptStage, ThreeUnevenStagesEqualTheWholeModel) {
  const ModelConfig cfg = Cfg();
  const int B = 3, T = 18;
  const auto tokens = Tokens();
  BatchSampler sampler({B, T, 5, cfg.attention}, tokens);
  const MicroBatch mb = sampler.Sample(0, 0);

  auto whole = GptStage::Create(cfg, StageSpec::Whole(cfg), B, T, false);
  ASSERT_TRUE(whole.ok());
  (*whole)->InitParams(11);
  auto wa = (*whole)->NewActivations();
  const float loss = (*whole)->Forward(*wa, mb, nullptr);
  (*whole)->ZeroGrads();
  (*whole)->Backward(*wa, mb, nullptr, 1.0f);

  std::vector<std::unique_ptr<GptStage>> stages;
  std::vector<GptStage::ActivationsPtr> acts;
  for (int s = 0; s < 3; ++s) {
    auto st = GptStage::Create(cfg, StageSpec::Even(cfg, s, 3), B, T, s == 1);  // the middle one recomputes
    ASSERT_TRUE(st.ok());
    (*st)->InitParams(11);
    (*st)->ZeroGrads();
    acts.push_back((*st)->NewActivations());
    stages.push_back(std::move(*st));
  }
  const float* x = nullptr;
  float staged_loss = 0;
  for (int s = 0; s < 3; ++s) {
    staged_loss = stages[s]->Forward(*acts[s], mb, x);
    x = s < 2 ? stages[s]->Output(*acts[s]) : nullptr;
  }
  EXPECT_EQ(staged_loss, loss);  // same operations in the same order: bitwise
  const float* g = nullptr;
  for (int s = 2; s >= 0; --s) g = stages[s]->Backward(*acts[s], mb, g, 1.0f);
  EXPECT_EQ(g, nullptr);

  // Concatenated stage buffers are the whole model's, parameter for parameter.
  std::vector<float> params, grads;
  for (auto& st : stages) {
    params.insert(params.end(), st->params(), st->params() + st->num_params());
    grads.insert(grads.end(), st->grads(), st->grads() + st->num_params());
  }
  ASSERT_EQ(params.size(), (*whole)->num_params());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(params[i], (*whole)->params()[i]) << i;
    ASSERT_EQ(grads[i], (*whole)->grads()[i]) << i;
  }
}

TEST(GptStage, RecomputeGivesIdenticalGradients) {
  const ModelConfig cfg = Cfg();
  const auto tokens = Tokens();
  BatchSampler sampler({2, 20, 3, cfg.attention}, tokens);
  std::vector<MicroBatch> mbs = {sampler.Sample(0, 0), sampler.Sample(0, 1)};
  std::vector<std::vector<float>> grads;
  for (bool recompute : {false, true}) {
    auto st = GptStage::Create(cfg, StageSpec::Whole(cfg), 2, 20, recompute);
    ASSERT_TRUE(st.ok());
    (*st)->InitParams(1);
    auto act = (*st)->NewActivations();
    AccumulateGradients(**st, *act, mbs);
    grads.emplace_back((*st)->grads(), (*st)->grads() + (*st)->num_params());
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// The whole model (5 blocks) asks its hooks 12 times per forward (the embeddings, each block and
// again halfway through it, the head) and answers after 12 per backward (the head, each block's MLP
// half and the whole block, the embeddings): a stop is heard within half a block.
TEST(GptStage, AHookThatSaysStopGivesUpTheRestOfTheForwardOrBackward) {
  const ModelConfig cfg = Cfg();
  const auto tokens = Tokens();
  BatchSampler sampler({2, 20, 3, cfg.attention}, tokens);
  const MicroBatch mb = sampler.Sample(0, 0);
  auto st = GptStage::Create(cfg, StageSpec::Whole(cfg), 2, 20, false);
  ASSERT_TRUE(st.ok());
  GptStage& stage = **st;
  stage.InitParams(1);
  auto act = stage.NewActivations();
  int calls = 0, stop_at = 3;
  ExchangeHooks hooks;
  hooks.before_forward = [&](size_t) { return ++calls != stop_at; };
  hooks.after_backward = [&](size_t) { return ++calls != stop_at; };
  stage.SetExchangeHooks(&hooks);
  EXPECT_EQ(stage.Forward(*act, mb, nullptr), 0.0f);
  EXPECT_EQ(calls, 3) << "the first block's MLP half was computed, or a later block asked";
  calls = 0, stop_at = -1;
  EXPECT_GT(stage.Forward(*act, mb, nullptr), 0.0f);
  EXPECT_EQ(calls, 12);
  const BlockTensors& last = stage.layout().block(cfg.n_layer - 1);
  auto grad_norm = [&](int tensor) {
    const ParamTensor& t = stage.layout().tensors()[tensor];
    double s = 0;
    for (size_t i = 0; i < t.size; ++i) s += std::abs(stage.grads()[t.offset + i]);
    return s;
  };
  // Stopped after the head's gradients: no block's are computed.
  stage.ZeroGrads();
  calls = 0, stop_at = 1;
  EXPECT_EQ(stage.Backward(*act, mb, nullptr, 1.0f), nullptr);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(grad_norm(stage.layout().block(0).qkv_w), 0.0);
  EXPECT_EQ(grad_norm(last.fc_w), 0.0);
  // Stopped halfway through the last block: its MLP's gradients are there, its attention's not.
  stage.ZeroGrads();
  calls = 0, stop_at = 2;
  EXPECT_EQ(stage.Backward(*act, mb, nullptr, 1.0f), nullptr);
  EXPECT_EQ(calls, 2);
  EXPECT_GT(grad_norm(last.fc_w), 0.0);
  EXPECT_EQ(grad_norm(last.qkv_w), 0.0);
  stage.ZeroGrads();
  calls = 0, stop_at = -1;
  stage.Backward(*act, mb, nullptr, 1.0f);
  EXPECT_EQ(calls, 12);
  EXPECT_GT(grad_norm(stage.layout().block(0).qkv_w), 0.0);
  stage.SetExchangeHooks(nullptr);
}

TEST(GptStage, InitIsGpt2Style) {
  ModelConfig cfg = Cfg();
  cfg.d_model = 64, cfg.n_layer = 2;
  auto st = GptStage::Create(cfg, StageSpec::Whole(cfg), 1, 4, false);
  ASSERT_TRUE(st.ok());
  (*st)->InitParams(3);
  const ParamLayout& l = (*st)->layout();
  auto stdev = [&](int t) {
    const ParamTensor& p = l.tensors()[t];
    double s = 0;
    for (size_t i = 0; i < p.size; ++i) s += (*st)->params()[p.offset + i] * (*st)->params()[p.offset + i];
    return std::sqrt(s / p.size);
  };
  EXPECT_NEAR(stdev(l.block(0).qkv_w), 0.02, 0.002);
  EXPECT_NEAR(stdev(l.block(1).fc_proj_w), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_EQ((*st)->params()[l.tensors()[l.block(0).ln1_w].offset], 1.0f);
  EXPECT_EQ((*st)->params()[l.tensors()[l.block(0).fc_b].offset], 0.0f);
}

TEST(GptStage, RejectsBadShapes) {
  ModelConfig cfg = Cfg();
  EXPECT_NE(GptStage::Create(cfg, StageSpec::Whole(cfg), 1, 21, false).status().message().find("position table"),
            std::string::npos);
  cfg.n_head = 5;
  EXPECT_FALSE(GptStage::Create(cfg, StageSpec::Whole(cfg), 1, 8, false).ok());
}

}  // namespace
}  // namespace longhaul
