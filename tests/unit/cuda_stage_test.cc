// The CUDA backend of the Stage interface against the PyTorch fixtures (per precision), against
// the CPU backend on random configs, and against itself: slots, recompute, a pipeline cut and a
// second run give bit-identical results (no kernel uses atomics); a boundary in low rank crosses
// as the host's codec puts it. Needs a GPU: without one every
// test but the last skips, saying why; the last checks the error a user gets when asking for a
// device that is not there.
#include "cuda/cuda_stage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#include "cpu/cpu_stage.h"
#include "cpu/low_rank.h"
#include "data/batch_sampler.h"
#include "model/low_rank_method.h"
#include "model/memory_estimate.h"
#include "tests/support/fixtures.h"

namespace longhaul {
namespace {

bool HaveGpu(std::string* why) { return CudaDeviceCount(why) > 0; }

// Tolerances per precision, against the float64 reference: fp32 differs by summation order; bf16
// keeps 8 significant bits, fp16 11.
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

std::unique_ptr<CudaStage> Make(const ModelConfig& cfg, const StageSpec& spec, CudaStage::Options o) {
  auto s = CudaStage::Create(cfg, spec, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<float> Copy(absl::StatusOr<const float*> p, size_t n) {
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::vector<float>(*p, *p + n) : std::vector<float>();
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
  auto stage = Make(cfg, StageSpec::Whole(cfg), {B, T, precision, 0, 1, false, 0});
  ASSERT_NE(stage, nullptr);
  CudaStage& s = *stage;
  std::vector<float> init(s.num_params());
  for (const ParamTensor& t : s.layout().tensors()) std::copy(f.T(t.name).begin(), f.T(t.name).end(), init.begin() + t.offset);
  ASSERT_TRUE(s.SetParams(0, init.data(), init.size()).ok());
  const std::vector<MicroBatch> mbs = testing::MicroBatchesOf(f);

  ASSERT_TRUE(s.ZeroGrads().ok());
  double loss = 0;
  const float scale = 1.0f / mbs.size();
  for (size_t m = 0; m < mbs.size(); ++m) {
    auto l = s.Forward(0, mbs[m], nullptr);
    ASSERT_TRUE(l.ok()) << l.status();
    if (m == 0) {
      std::vector<float> probs(static_cast<size_t>(B) * T * cfg.vocab_size);
      ASSERT_TRUE(s.DownloadProbs(0, probs.data()).ok());
      EXPECT_LT(testing::MaxProbError(f, probs.data()), tol.prob) << PrecisionName(precision);
    }
    loss += *l * scale;
    ASSERT_TRUE(s.Backward(0, mbs[m], nullptr, scale).ok());
  }
  EXPECT_NEAR(loss, f.T("out.loss")[0], tol.loss);
  const std::vector<float> grads = Copy(s.Grads(), s.num_params());
  for (const ParamTensor& t : s.layout().tensors())
    EXPECT_LT(testing::RelativeError(f, "grad." + t.name, grads.data() + t.offset), tol.grad) << t.name;

  ASSERT_TRUE(s.SetParams(0, init.data(), init.size()).ok());
  const AdamWConfig ac{f.cfg["beta1"], f.cfg["beta2"], f.cfg["eps"], f.cfg["weight_decay"]};
  const LrSchedule sched{f.cfg["lr"], f.cfg["min_lr"], f.cfg["warmup_steps"], f.cfg["steps"]};
  ASSERT_TRUE(s.AttachOptimizer({ac, sched, f.cfg["grad_clip"]}).ok());
  const std::vector<float>& ref_losses = f.T("out.step_losses");
  for (int step = 0; step < static_cast<int>(ref_losses.size()); ++step) {
    ASSERT_TRUE(s.ZeroGrads().ok());
    double l = 0;
    for (const MicroBatch& mb : mbs) {
      l += *s.Forward(0, mb, nullptr) * scale;
      ASSERT_TRUE(s.Backward(0, mb, nullptr, scale).ok());
    }
    EXPECT_NEAR(l, ref_losses[step], tol.step_loss * (1 + step)) << "loss before step " << step;
    auto r = s.Step(step);
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity,
                         ::testing::Combine(::testing::ValuesIn(testing::FixtureNames()),
                                            ::testing::Values(Precision::kFp32, Precision::kBf16, Precision::kFp16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + PrecisionName(std::get<1>(info.param));
                         });

ModelConfig Small(int layers, int d_model, int heads, int T, AttentionMask mask, bool tied) {
  ModelConfig cfg;
  cfg.vocab_size = 300, cfg.max_seq_len = T, cfg.n_layer = layers, cfg.d_model = d_model;
  cfg.n_head = heads, cfg.attention = mask, cfg.tied_head = tied;
  return cfg;
}

std::vector<MicroBatch> Batches(const ModelConfig& cfg, int B, int T, int n) {
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 131 + i / 7) % cfg.vocab_size);
  BatchSampler sampler({B, T, 3, cfg.attention}, tokens);
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < n; ++m) mbs.push_back(sampler.Sample(0, m));
  return mbs;
}

// A subspace model's among them: its held floats' gradients are zero on the device too.
TEST(CudaStage, AgreesWithTheCpuBackendOnRandomConfigs) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "CPU-vs-CUDA agreement needs a GPU: " << why;
  struct Shape {
    int layers, d_model, heads, T, B;
    AttentionMask mask;
    bool tied;
    int subspace_divisor = 1;
  };
  for (const Shape& sh : {Shape{2, 64, 4, 32, 3, AttentionMask::kCausal, false},
                          Shape{3, 96, 3, 70, 2, AttentionMask::kPrefixLm, true},
                          Shape{1, 128, 8, 130, 1, AttentionMask::kCausal, true},
                          Shape{2, 64, 4, 32, 3, AttentionMask::kCausal, true, 4}}) {
    ModelConfig cfg = Small(sh.layers, sh.d_model, sh.heads, sh.T, sh.mask, sh.tied);
    cfg.subspace_divisor = sh.subspace_divisor;
    const MicroBatch mb = Batches(cfg, sh.B, sh.T, 1)[0];
    auto cpu = CpuStage::Create(cfg, StageSpec::Whole(cfg), sh.B, sh.T, false, 1, 9);
    ASSERT_TRUE(cpu.ok());
    auto gpu = Make(cfg, StageSpec::Whole(cfg), {sh.B, sh.T, Precision::kFp32, 0, 1, false, 9});
    ASSERT_NE(gpu, nullptr);
    ASSERT_TRUE((*cpu)->ZeroGrads().ok() && gpu->ZeroGrads().ok());
    const float cpu_loss = *(*cpu)->Forward(0, mb, nullptr);
    ASSERT_TRUE((*cpu)->Backward(0, mb, nullptr, 1.0f).ok());
    auto gpu_loss = gpu->Forward(0, mb, nullptr);
    ASSERT_TRUE(gpu_loss.ok());
    ASSERT_TRUE(gpu->Backward(0, mb, nullptr, 1.0f).ok());
    EXPECT_NEAR(*gpu_loss, cpu_loss, 1e-4);
    const std::vector<float> g = Copy(gpu->Grads(), gpu->num_params()), c = Copy((*cpu)->Grads(), gpu->num_params());
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) num += (g[i] - c[i]) * (g[i] - c[i]), den += c[i] * c[i];
    EXPECT_LT(std::sqrt(num / den), 1e-4) << "d_model " << sh.d_model;
    for (const StridedRun& r : gpu->layout().SubspaceRuns())
      for (size_t i = 0; i < r.rows; ++i)
        for (size_t j = 0; j < r.length; ++j) ASSERT_EQ(g[r.offset + i * r.stride + j], 0.0f);
  }
}

// Losses and per-tensor gradients of micro-batches `mbs` through `stages` (a pipeline cut,
// boundary tensors through the host), micro-batch m in slot m % slots, all forwards first.
struct Result {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> grads;
};
Result RunPipeline(std::vector<std::unique_ptr<CudaStage>>& stages, const std::vector<MicroBatch>& mbs, int C) {
  Result r;
  const int slots = stages[0]->slots();
  const size_t boundary = static_cast<size_t>(mbs[0].B) * mbs[0].T * C;
  for (auto& s : stages) EXPECT_TRUE(s->ZeroGrads().ok());
  // Waves of `slots` micro-batches: their forwards, then their backwards in ascending order, so
  // gradients add up in the same order whatever the slot count.
  for (size_t first = 0; first < mbs.size(); first += slots) {
    const size_t end = std::min(mbs.size(), first + slots);
    for (size_t m = first; m < end; ++m) {
      std::vector<float> x;
      for (size_t i = 0; i < stages.size(); ++i) {
        auto loss = stages[i]->Forward(m % slots, mbs[m], x.empty() ? nullptr : x.data());
        EXPECT_TRUE(loss.ok()) << loss.status();
        if (i + 1 == stages.size()) {
          r.losses.push_back(loss.ok() ? *loss : NAN);
        } else {
          x = Copy(stages[i]->Output(m % slots), boundary);
        }
      }
    }
    for (size_t m = first; m < end; ++m) {
      std::vector<float> g;
      for (size_t i = stages.size(); i-- > 0;) {
        EXPECT_TRUE(stages[i]->Backward(m % slots, mbs[m], g.empty() ? nullptr : g.data(), 0.5f).ok());
        if (i > 0) g = Copy(stages[i]->InputGrad(m % slots), boundary);
      }
    }
  }
  for (auto& s : stages) {
    const std::vector<float> g = Copy(s->Grads(), s->num_params());
    for (const ParamTensor& t : s->layout().tensors())
      r.grads[t.name].assign(g.begin() + t.offset, g.begin() + t.offset + t.size);
  }
  return r;
}

TEST(CudaStage, SlotsRecomputeAPipelineCutAndASecondRunGiveBitIdenticalResults) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "CUDA determinism needs a GPU: " << why;
  const ModelConfig cfg = Small(4, 64, 4, 48, AttentionMask::kPrefixLm, false);
  const int B = 2, T = 48;
  const std::vector<MicroBatch> mbs = Batches(cfg, B, T, 3);
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    auto run = [&](int cut, int slots, bool recompute) {
      std::vector<std::unique_ptr<CudaStage>> stages;
      if (cut == 0) {
        stages.push_back(Make(cfg, StageSpec::Whole(cfg), {B, T, p, 0, slots, recompute, 4}));
        return RunPipeline(stages, mbs, cfg.d_model);
      }
      stages.push_back(Make(cfg, {0, cut, true, false}, {B, T, p, 0, slots, recompute, 4}));
      stages.push_back(Make(cfg, {cut, cfg.n_layer, false, true}, {B, T, p, 0, slots, recompute, 4}));
      // Both halves start from the whole model's initialisation, tensor by tensor.
      auto whole = Make(cfg, StageSpec::Whole(cfg), {B, T, p, 0, 1, false, 4});
      const std::vector<float> init = Copy(whole->Params(), whole->num_params());
      for (auto& s : stages) {
        for (const ParamTensor& t : s->layout().tensors()) {
          for (const ParamTensor& w : whole->layout().tensors()) {
            if (w.name == t.name) {
              EXPECT_TRUE(s->SetParams(t.offset, init.data() + w.offset, t.size).ok());
            }
          }
        }
      }
      return RunPipeline(stages, mbs, cfg.d_model);
    };
    const Result base = run(0, 3, false);
    for (const auto& [what, other] : {std::pair{"a second run", run(0, 3, false)}, std::pair{"one slot", run(0, 1, false)},
                                      std::pair{"recompute", run(0, 2, true)}, std::pair{"a cut after block 1", run(1, 3, false)},
                                      std::pair{"a cut after block 3 with recompute", run(3, 1, true)}}) {
      EXPECT_EQ(base.losses, other.losses) << PrecisionName(p) << ": " << what;
      EXPECT_EQ(base.grads, other.grads) << PrecisionName(p) << ": " << what;
    }
  }
}

// A boundary in low rank (Stage::EncodeLowRank) leaves a GPU stage as its factors and arrives
// multiplied out on the device: a 2-stage cut on the GPU against the same cut on the CPU with the
// host's codec between its stages, the same directions (LowRankSeed), losses and gradients within
// fp32 rounding.
TEST(CudaStage, ABoundaryInLowRankCrossesAsTheHostCodecPutsIt) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "low-rank boundaries on the device need a GPU: " << why;
  const ModelConfig cfg = Small(2, 64, 4, 32, AttentionMask::kCausal, false);
  const int B = 2, T = 32;
  const std::vector<MicroBatch> mbs = Batches(cfg, B, T, 2);
  const size_t N = static_cast<size_t>(B) * T;
  const BoundaryShape acts{N, 64, 64, 16}, grads{N, 64, 64, 8};
  std::vector<std::unique_ptr<Stage>> cpu, gpu;
  for (int s = 0; s < 2; ++s) {
    const StageSpec spec{s, s + 1, s == 0, s == 1};
    auto c = CpuStage::Create(cfg, spec, B, T, false, 1, 9);
    ASSERT_TRUE(c.ok()) << c.status();
    cpu.push_back(std::move(*c));
    gpu.push_back(Make(cfg, spec, {B, T, Precision::kFp32, 0, 1, false, 9}));
    ASSERT_NE(gpu.back(), nullptr);
    ASSERT_TRUE(gpu.back()->EncodeLowRank(acts, grads));
  }
  for (auto* stages : {&cpu, &gpu})
    for (auto& st : *stages) ASSERT_TRUE(st->ZeroGrads().ok());
  cpu::LowRankCodec codec;
  // What the host's codec makes of a tensor of `shape` on its way across.
  auto across = [&](const BoundaryShape& shape, const float* full, uint64_t seed) {
    std::vector<float> factors(shape.sent()), back(shape.floats());
    EXPECT_TRUE(codec.Encode(full, shape.rows, shape.kept, shape.rank, seed, factors.data()).ok());
    EXPECT_TRUE(cpu::LowRankCodec::Decode(factors.data(), shape.rows, shape.kept, shape.rank, back.data()).ok());
    return back;
  };
  for (const MicroBatch& mb : mbs) {
    ASSERT_TRUE(cpu[0]->Forward(0, mb, nullptr).ok());
    const std::vector<float> x = across(acts, *cpu[0]->Output(0), LowRankSeed(mb, false));
    const float cpu_loss = *cpu[1]->Forward(0, mb, x.data());
    ASSERT_TRUE(cpu[1]->Backward(0, mb, nullptr, 1.0f).ok());
    const std::vector<float> g = across(grads, *cpu[1]->InputGrad(0), LowRankSeed(mb, true));
    ASSERT_TRUE(cpu[0]->Backward(0, mb, g.data(), 1.0f).ok());

    ASSERT_TRUE(gpu[0]->Forward(0, mb, nullptr).ok());
    const std::vector<float> factors = Copy(gpu[0]->Output(0), acts.sent());
    const absl::StatusOr<float> gpu_loss = gpu[1]->Forward(0, mb, factors.data());
    ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
    ASSERT_TRUE(gpu[1]->Backward(0, mb, nullptr, 1.0f).ok());
    const std::vector<float> grad_factors = Copy(gpu[1]->InputGrad(0), grads.sent());
    ASSERT_TRUE(gpu[0]->Backward(0, mb, grad_factors.data(), 1.0f).ok());
    EXPECT_NEAR(*gpu_loss, cpu_loss, 1e-4);
  }
  for (int s = 0; s < 2; ++s) {
    const std::vector<float> g = Copy(gpu[s]->Grads(), gpu[s]->num_params()),
                             c = Copy(cpu[s]->Grads(), cpu[s]->num_params());
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) num += (g[i] - c[i]) * (g[i] - c[i]), den += c[i] * c[i];
    EXPECT_LT(std::sqrt(num / den), 1e-3) << "stage " << s;
  }
}

TEST(CudaStage, MissingDeviceIsAClearError) {
  std::string why;
  const int devices = CudaDeviceCount(&why);
  ModelConfig cfg;
  CudaStage::Options o;
  o.B = 1, o.T = 8, o.precision = Precision::kBf16, o.device = devices;  // one past the last
  auto s = CudaStage::Create(cfg, StageSpec::Whole(cfg), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find(absl::StrCat("cuda:", devices)), std::string::npos) << s.status();
}

// What a worker reports for the placement search, and the check before allocating: a stage that
// steps itself is refused with its AdamW moments counted, before any cudaMalloc.
TEST(CudaStage, FreeMemoryIsReportedAndTheCheckCountsTheMomentsOfAStageThatStepsItself) {
  std::string why;
  const int devices = CudaDeviceCount(&why);
  const absl::StatusOr<double> missing = CudaFreeMemory(devices);  // one past the last
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition) << missing.status();
  if (devices == 0) GTEST_SKIP() << "the rest needs a GPU: " << why;
  const absl::StatusOr<double> free_bytes = CudaFreeMemory(0);
  ASSERT_TRUE(free_bytes.ok()) << free_bytes.status();
  EXPECT_GT(*free_bytes, 0);
  std::cout << "cuda:0 free: " << FormatBytes(*free_bytes) << "\n";

  ModelConfig cfg;  // GPT-3 175B's shapes: no GPU of today holds a whole one
  cfg.n_layer = 96, cfg.d_model = 12288, cfg.n_head = 96, cfg.max_seq_len = 2048, cfg.vocab_size = 50257;
  for (bool optimizer : {false, true}) {
    CudaStage::Options o;
    o.B = 1, o.T = 2048, o.precision = Precision::kBf16, o.recompute = true, o.optimizer = optimizer;
    auto s = CudaStage::Create(cfg, StageSpec::Whole(cfg), o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
    EXPECT_EQ(s.status().message().find("AdamW moments") != std::string::npos, optimizer) << s.status();
  }
}

}  // namespace
}  // namespace longhaul
