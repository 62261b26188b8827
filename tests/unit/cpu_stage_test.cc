// The CPU backend of the Stage interface: slots keep micro-batches apart between forward and
// backward (two in flight give what one after the other gives), and out-of-range slots and
// parameter ranges are errors, not writes; an attached optimizer steps as a parameter server does.
#include "cpu/cpu_stage.h"

#include <gtest/gtest.h>

#include "data/batch_sampler.h"
#include "optim/train_step.h"

namespace longhaul {
namespace {

ModelConfig Cfg() {
  ModelConfig c;
  c.vocab_size = 30, c.max_seq_len = 10, c.n_layer = 2, c.n_head = 2, c.d_model = 8;
  return c;
}

TEST(CpuStage, TwoMicroBatchesInFlightGiveWhatOneAfterTheOtherGives) {
  std::vector<uint16_t> tokens(800);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 11) % 30);
  BatchSampler sampler({2, 10, 3, AttentionMask::kCausal}, tokens);
  const MicroBatch a = sampler.Sample(0, 0), b = sampler.Sample(0, 1);
  auto one = CpuStage::Create(Cfg(), StageSpec::Whole(Cfg()), 2, 10, false, 1, 5);
  auto two = CpuStage::Create(Cfg(), StageSpec::Whole(Cfg()), 2, 10, false, 2, 5);
  ASSERT_TRUE(one.ok() && two.ok());
  ASSERT_TRUE((*one)->ZeroGrads().ok() && (*two)->ZeroGrads().ok());
  const float la = *(*one)->Forward(0, a, nullptr);
  ASSERT_TRUE((*one)->Backward(0, a, nullptr, 0.5f).ok());
  const float lb = *(*one)->Forward(0, b, nullptr);
  ASSERT_TRUE((*one)->Backward(0, b, nullptr, 0.5f).ok());
  EXPECT_EQ(*(*two)->Forward(0, a, nullptr), la);
  EXPECT_EQ(*(*two)->Forward(1, b, nullptr), lb);
  ASSERT_TRUE((*two)->Backward(0, a, nullptr, 0.5f).ok());
  ASSERT_TRUE((*two)->Backward(1, b, nullptr, 0.5f).ok());
  const size_t n = (*one)->num_params();
  EXPECT_TRUE(std::equal(*(*one)->Grads(), *(*one)->Grads() + n, *(*two)->Grads()));
}

TEST(CpuStage, OutOfRangeSlotsAndParameterRangesAreErrors) {
  auto s = CpuStage::Create(Cfg(), StageSpec::Whole(Cfg()), 2, 10, false, 2, 5);
  ASSERT_TRUE(s.ok());
  MicroBatch mb;
  EXPECT_EQ((*s)->Forward(2, mb, nullptr).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*s)->Output(-1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*s)->Backward(5, mb, nullptr, 1).code(), absl::StatusCode::kOutOfRange);
  const size_t n = (*s)->num_params();
  const std::vector<float> x(4, 1.0f);
  EXPECT_EQ((*s)->SetParams(n - 2, x.data(), 4).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*s)->SetParams(SIZE_MAX - 1, x.data(), 4).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE((*s)->SetParams(n - 4, x.data(), 4).ok());
  EXPECT_EQ((*(*s)->Params())[n - 1], 1.0f);
  EXPECT_EQ(CpuStage::Create(Cfg(), StageSpec::Whole(Cfg()), 2, 10, false, 0, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A subspace model's backward leaves its held floats' gradients zero (and the rest not), and
// parameters set there read as it holds them: zero, or the fixed embedding's initial values.
TEST(CpuStage, ASubspaceModelKeepsItsZeros) {
  ModelConfig c = Cfg();
  c.subspace_divisor = 2;
  std::vector<uint16_t> tokens(800);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 11) % 30);
  BatchSampler sampler({2, 10, 3, AttentionMask::kCausal}, tokens);
  const MicroBatch mb = sampler.Sample(0, 0);
  auto s = CpuStage::Create(c, StageSpec::Whole(c), 2, 10, false, 1, 5);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->ZeroGrads().ok());
  ASSERT_TRUE((*s)->Forward(0, mb, nullptr).ok());
  ASSERT_TRUE((*s)->Backward(0, mb, nullptr, 1.0f).ok());
  const size_t n = (*s)->num_params();
  std::vector<int> held(n, 0);
  for (const StridedRun& r : (*s)->layout().SubspaceRuns())
    for (size_t i = 0; i < r.rows; ++i) std::fill_n(held.begin() + r.offset + i * r.stride, r.length, 1);
  const float* g = *(*s)->Grads();
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    if (held[i]) {
      ASSERT_EQ(g[i], 0.0f) << i;
    }
    nonzero += !held[i] && g[i] != 0.0f;
  }
  EXPECT_GT(nonzero, n / 3);
  const std::vector<float> initial(*(*s)->Params(), *(*s)->Params() + n);
  const std::vector<float> ones(n, 1.0f);
  ASSERT_TRUE((*s)->SetParams(0, ones.data(), n).ok());
  const float* p = *(*s)->Params();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], held[i] ? initial[i] : 1.0f) << i;
  EXPECT_EQ(CpuStage::Create(c, StageSpec::Whole(c), 2, 10, false, 1, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument) << "no seed to draw the fixed embedding from";
}

TEST(CpuStage, AnAttachedOptimizerStepsAsTheParameterServerWould) {
  std::vector<uint16_t> tokens(800);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 11) % 30);
  BatchSampler sampler({2, 10, 3, AttentionMask::kCausal}, tokens);
  const MicroBatch mb = sampler.Sample(0, 0);
  auto s = CpuStage::Create(Cfg(), StageSpec::Whole(Cfg()), 2, 10, false, 1, 5);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Step(0).status().code(), absl::StatusCode::kFailedPrecondition);
  const OptimizerSettings settings{AdamWConfig{}, LrSchedule{1e-2f, 1e-3f, 0, 10}, 0.5f};
  ASSERT_TRUE((*s)->AttachOptimizer(settings).ok());
  ASSERT_TRUE((*s)->ZeroGrads().ok());
  ASSERT_TRUE((*s)->Forward(0, mb, nullptr).ok());
  ASSERT_TRUE((*s)->Backward(0, mb, nullptr, 1.0f).ok());
  const size_t n = (*s)->num_params();
  std::vector<float> params(*(*s)->Params(), *(*s)->Params() + n), grads(*(*s)->Grads(), *(*s)->Grads() + n);
  AdamW adamw(settings.adamw, (*s)->layout().DecayFlags());
  const OptimizerStepResult want =
      ApplyOptimizerStep(params.data(), grads.data(), n, adamw, settings.schedule, settings.grad_clip, 0);
  auto got = (*s)->Step(0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->grad_norm, want.grad_norm);
  EXPECT_EQ(got->lr, want.lr);
  EXPECT_TRUE(std::equal(params.begin(), params.end(), *(*s)->Params()));
  std::vector<float> m(n), v(n);
  ASSERT_TRUE((*s)->GetOptimizerState(m.data(), v.data()).ok());
  EXPECT_EQ(m, adamw.m());
  EXPECT_EQ(v, adamw.v());
  ASSERT_TRUE((*s)->SetOptimizerState(v.data(), m.data()).ok());
  std::vector<float> m2(n), v2(n);
  ASSERT_TRUE((*s)->GetOptimizerState(m2.data(), v2.data()).ok());
  EXPECT_EQ(m2, v);
  EXPECT_EQ(v2, m);
}

}  // namespace
}  // namespace longhaul
