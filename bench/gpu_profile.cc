// Measures this GPU for the planner: per-block forward and backward times of GPT-3 XL blocks
// (d_model 2048, 16 heads, seq 2048) at micro-batch 1 to 8 and of its head (final LayerNorm, LM
// head over 50257 tokens, loss), in fp32 and bf16, plus memory size and bandwidth, written in the
// profile format runtime/plan/cost_model.h reads.
//
// A block's time is the difference between stages of 2k and k blocks, divided by k: the boundary
// copies to and from the host, which a pipeline worker pays once per stage, cancel out. The head's
// is a last stage of one block minus a middle stage of one block.
//
//   build/bench/gpu_profile --out runtime/plan/profiles/h100.toml [--steps 5]
#include <cuda_runtime.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_format.h"
#include "cuda/cuda_stage.h"
#include "data/batch_sampler.h"
#include "util/hash.h"
#include "worker/compute_probe.h"

namespace {

using longhaul::CudaStage;
using longhaul::MicroBatch;
using longhaul::ModelConfig;
using longhaul::Precision;
using longhaul::StageSpec;

struct Times {
  double forward_s = -1, backward_s = -1;  // < 0: the stage did not fit or failed
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median forward and backward seconds of one micro-batch through `spec` (worker/compute_probe's
// timing, two warm-up rounds).
Times TimeStage(const ModelConfig& cfg, const StageSpec& spec, int B, int T, Precision p, int steps,
                const MicroBatch& mb, bool recompute = false) {
  CudaStage::Options o;
  o.B = B, o.T = T, o.precision = p, o.seed = 1, o.recompute = recompute;
  auto stage = CudaStage::Create(cfg, spec, o);
  if (!stage.ok()) return {};
  const auto t = longhaul::TimeStage(**stage, mb, cfg.d_model, {.warmups = 2, .rounds = steps});
  if (!t.ok()) return {};
  return {t->forward_s, t->backward_s};
}

// Device-to-device copy rate: what the parameter-server step streams at.
double MemoryBandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const double s = Seconds(t0);
  cudaFree(a), cudaFree(b);
  return 2.0 * bytes * 10 / s;  // each copy reads and writes
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Profile this GPU for the planner (runtime/plan/cost_model.h's profile format)"};
  std::string out;
  int steps = 5;
  app.add_option("--out", out, "profile file to write")->required();
  app.add_option("--steps", steps, "timed repetitions per shape (median)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  std::string why;
  if (longhaul::CudaDeviceCount(&why) == 0) {
    std::cerr << "gpu_profile: " << why << "\n";
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);

  ModelConfig cfg;
  cfg.vocab_size = 50257, cfg.max_seq_len = 2048, cfg.n_layer = 8, cfg.n_head = 16, cfg.d_model = 2048;
  const int T = 2048, k = 2;
  std::vector<uint16_t> tokens(1 << 20);
  longhaul::Rng rng(2);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng.Next() % cfg.vocab_size);

  std::ofstream f(out);
  if (!f) {
    std::cerr << "gpu_profile: cannot write " << out << "\n";
    return 1;
  }
  f << absl::StrFormat("# Written by bench/gpu_profile (median of %d) on %s.\n", steps, prop.name);
  f << absl::StrFormat("device = \"%s\"\nbackend = \"cuda\"\nmemory_gib = %.1f\nmemory_bandwidth_gbs = %.0f\n",
                       prop.name, total_bytes / 1073741824.0, MemoryBandwidth() / 1e9);
  std::cout << absl::StrFormat("%-5s %3s %12s %12s %12s %12s\n", "prec", "mb", "block fwd ms", "block bwd ms",
                               "head fwd ms", "head bwd ms");
  for (Precision p : {Precision::kBf16, Precision::kFp32}) {
    for (int B : {1, 2, 4, 8}) {
      longhaul::BatchSampler sampler({B, T, 1, cfg.attention}, tokens);
      const MicroBatch mb = sampler.Sample(0, 0);
      const Times one = TimeStage(cfg, {0, k, false, false}, B, T, p, steps, mb);
      const Times two = TimeStage(cfg, {0, 2 * k, false, false}, B, T, p, steps, mb);
      const Times single = TimeStage(cfg, {0, 1, false, false}, B, T, p, steps, mb);
      const Times last = TimeStage(cfg, {cfg.n_layer - 1, cfg.n_layer, false, true}, B, T, p, steps, mb);
      if (one.forward_s < 0 || two.forward_s < 0) {
        std::cout << absl::StrFormat("%-5s %3d  does not fit\n", longhaul::PrecisionName(p), B);
        continue;
      }
      const Times block{(two.forward_s - one.forward_s) / k, (two.backward_s - one.backward_s) / k};
      const Times head{last.forward_s - single.forward_s, last.backward_s - single.backward_s};
      std::cout << absl::StrFormat("%-5s %3d %12.3f %12.3f %12.3f %12.3f\n", longhaul::PrecisionName(p), B,
                                   1e3 * block.forward_s, 1e3 * block.backward_s, 1e3 * head.forward_s,
                                   1e3 * head.backward_s);
      f << absl::StrFormat(
          "\n[[block]]\nd_model = %d\nn_head = %d\nseq_len = %d\nmicro_batch = %d\nprecision = \"%s\"\n"
          "forward_ms = %.4f\nbackward_ms = %.4f\n",
          cfg.d_model, cfg.n_head, T, B, longhaul::PrecisionName(p), 1e3 * block.forward_s, 1e3 * block.backward_s);
      // With recompute: the backward reruns each block's forward from its input.
      const Times one_r = TimeStage(cfg, {0, k, false, false}, B, T, p, steps, mb, true);
      const Times two_r = TimeStage(cfg, {0, 2 * k, false, false}, B, T, p, steps, mb, true);
      if (one_r.forward_s >= 0 && two_r.forward_s >= 0) {
        f << absl::StrFormat(
            "\n[[block]]\nd_model = %d\nn_head = %d\nseq_len = %d\nmicro_batch = %d\nprecision = \"%s\"\n"
            "recompute = true\nforward_ms = %.4f\nbackward_ms = %.4f\n",
            cfg.d_model, cfg.n_head, T, B, longhaul::PrecisionName(p), 1e3 * (two_r.forward_s - one_r.forward_s) / k,
            1e3 * (two_r.backward_s - one_r.backward_s) / k);
      }
      if (last.forward_s >= 0 && single.forward_s >= 0) {
        f << absl::StrFormat(
            "\n[[head]]\nd_model = %d\nvocab_size = %d\nseq_len = %d\nmicro_batch = %d\nprecision = \"%s\"\n"
            "forward_ms = %.4f\nbackward_ms = %.4f\n",
            cfg.d_model, cfg.vocab_size, T, B, longhaul::PrecisionName(p), 1e3 * head.forward_s, 1e3 * head.backward_s);
      }
    }
  }
  std::cout << "profile written to " << out << "\n";
  return 0;
}
