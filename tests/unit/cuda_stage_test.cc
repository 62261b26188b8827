// The CUDA backend against the PyTorch fixtures (per precision) and against the CPU backend on
// random configs. Needs a GPU: without one every test but the last skips, saying why; the last
// checks the error a user gets when asking for a device that is not there.
#include "cuda/cuda_stage.h"

#include <gtest/gtest.h>

#include <cmath>

#include "data/batch_sampler.h"
#include "model/gpt_stage.h"
#include "optim/train_step.h"
#include "tests/support/fixtures.h"

namespace longhaul {
namespace {

bool HaveGpu(std::string* why) { return CudaDeviceCount(why) > 0; }

// Tolerances per precision, against the float64 reference: fp32 differs by summation order (and
// atomics in the embedding and LayerNorm gradients); bf16 keeps 8 significant bits, fp16 11.
struct Tolerance {
  double prob, loss, grad, step_loss;
};
Tolerance For(Precision p) {
  switch (p) {
    case Precision::kFp32: return {1e-5, 1e-4, 1e-3, 1e-3};
    case Precision::kBf16: return {2e-2, 3e-2, 6e-2, 6e-2};
    case Precision::kFp16: return {4e-3, 5e-3, 1e-2, 1e-2};
  }
  return {};
}

class CudaParity : public ::testing::TestWithParam<std::tuple<std::string, Precision>> {};

TEST_P(CudaParity, MatchesPyTorch) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "CUDA parity needs a GPU: " << why;
  const auto& [name, precision] = GetParam();
  const Tolerance tol = For(precision);
  testing::Fixture f = testing::LoadFixture(name);
  const ModelConfig cfg = testing::ModelOf(f.cfg);
  const int B = f.cfg["B"], T = f.cfg["T"];
  auto stage = CudaStage::Create(cfg, StageSpec::Whole(cfg), B, T, precision, 0);
  ASSERT_TRUE(stage.ok()) << stage.status();
  CudaStage& s = **stage;
  std::vector<float> init(s.num_params());
  for (const ParamTensor& t : s.layout().tensors()) std::copy(f.T(t.name).begin(), f.T(t.name).end(), init.begin() + t.offset);
  ASSERT_TRUE(s.UploadParams(init.data()).ok());
  const std::vector<MicroBatch> mbs = testing::MicroBatchesOf(f);

  ASSERT_TRUE(s.ZeroGrads().ok());
  double loss = 0;
  const float scale = 1.0f / mbs.size();
  for (size_t m = 0; m < mbs.size(); ++m) {
    auto l = s.Forward(mbs[m], nullptr, nullptr);
    ASSERT_TRUE(l.ok()) << l.status();
    if (m == 0) {
      std::vector<float> probs(static_cast<size_t>(B) * T * cfg.vocab_size);
      ASSERT_TRUE(s.DownloadProbs(probs.data()).ok());
      EXPECT_LT(testing::MaxProbError(f, probs.data()), tol.prob) << PrecisionName(precision);
    }
    loss += *l * scale;
    ASSERT_TRUE(s.Backward(mbs[m], nullptr, scale, nullptr).ok());
  }
  EXPECT_NEAR(loss, f.T("out.loss")[0], tol.loss);
  std::vector<float> grads(s.num_params());
  ASSERT_TRUE(s.DownloadGrads(grads.data()).ok());
  for (const ParamTensor& t : s.layout().tensors())
    EXPECT_LT(testing::RelativeError(f, "grad." + t.name, grads.data() + t.offset), tol.grad) << t.name;

  ASSERT_TRUE(s.UploadParams(init.data()).ok());
  const AdamWConfig ac{f.cfg["beta1"], f.cfg["beta2"], f.cfg["eps"], f.cfg["weight_decay"]};
  const LrSchedule sched{f.cfg["lr"], f.cfg["min_lr"], f.cfg["warmup_steps"], f.cfg["steps"]};
  const std::vector<float>& ref_losses = f.T("out.step_losses");
  for (int step = 0; step < static_cast<int>(ref_losses.size()); ++step) {
    ASSERT_TRUE(s.ZeroGrads().ok());
    double l = 0;
    for (const MicroBatch& mb : mbs) {
      l += *s.Forward(mb, nullptr, nullptr) * scale;
      ASSERT_TRUE(s.Backward(mb, nullptr, scale, nullptr).ok());
    }
    EXPECT_NEAR(l, ref_losses[step], tol.step_loss * (1 + step)) << "loss before step " << step;
    auto r = s.Step(ac, sched, f.cfg["grad_clip"], step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity,
                         ::testing::Combine(::testing::ValuesIn(testing::FixtureNames()),
                                            ::testing::Values(Precision::kFp32, Precision::kBf16, Precision::kFp16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + PrecisionName(std::get<1>(info.param));
                         });

TEST(CudaStage, AgreesWithTheCpuBackendOnRandomConfigs) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "CPU-vs-CUDA agreement needs a GPU: " << why;
  struct Shape {
    int layers, d_model, heads, T, B;
    AttentionMask mask;
    bool tied;
  };
  for (const Shape& sh : {Shape{2, 64, 4, 32, 3, AttentionMask::kCausal, false},
                          Shape{3, 96, 3, 70, 2, AttentionMask::kPrefixLm, true},
                          Shape{1, 128, 8, 130, 1, AttentionMask::kCausal, true}}) {
    ModelConfig cfg;
    cfg.vocab_size = 300, cfg.max_seq_len = sh.T, cfg.n_layer = sh.layers, cfg.d_model = sh.d_model;
    cfg.n_head = sh.heads, cfg.attention = sh.mask, cfg.tied_head = sh.tied;
    std::vector<uint16_t> tokens(20000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 131 + i / 7) % 300);
    BatchSampler sampler({sh.B, sh.T, 3, sh.mask, 1}, tokens);
    const MicroBatch mb = sampler.Sample(0, 0, 0);
    auto cpu = GptStage::Create(cfg, StageSpec::Whole(cfg), sh.B, sh.T, false);
    auto gpu = CudaStage::Create(cfg, StageSpec::Whole(cfg), sh.B, sh.T, Precision::kFp32, 0);
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    (*cpu)->InitParams(9);
    ASSERT_TRUE((*gpu)->InitParams(9).ok());
    auto act = (*cpu)->NewActivations();
    const double cpu_loss = AccumulateGradients(**cpu, *act, {mb});
    ASSERT_TRUE((*gpu)->ZeroGrads().ok());
    auto gpu_loss = (*gpu)->Forward(mb, nullptr, nullptr);
    ASSERT_TRUE(gpu_loss.ok());
    ASSERT_TRUE((*gpu)->Backward(mb, nullptr, 1.0f, nullptr).ok());
    EXPECT_NEAR(*gpu_loss, cpu_loss, 1e-4);
    std::vector<float> g((*gpu)->num_params());
    ASSERT_TRUE((*gpu)->DownloadGrads(g.data()).ok());
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double d = g[i] - (*cpu)->grads()[i];
      num += d * d, den += static_cast<double>((*cpu)->grads()[i]) * (*cpu)->grads()[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-4) << "d_model " << sh.d_model;
  }
}

TEST(CudaStage, MissingDeviceIsAClearError) {
  std::string why;
  const int devices = CudaDeviceCount(&why);
  ModelConfig cfg;
  auto s = CudaStage::Create(cfg, StageSpec::Whole(cfg), 1, 8, Precision::kBf16, devices);  // one past the last
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find(absl::StrCat("cuda:", devices)), std::string::npos) << s.status();
}

}  // namespace
}  // namespace longhaul
