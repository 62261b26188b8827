// One training step (forward + backward + clipping + AdamW) of longhaul's CPU backend against
// PyTorch's CPU training step of the same model, same shapes and thread count, in one run.
//
//   build/bench/train_step_bench [--d_model 256 --n_layer 4 --n_head 4 --seq 256 --batch 8
//                                 --threads 2 --steps 5]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_format.h"
#include "bench/baseline_script.h"
#include "data/batch_sampler.h"
#include "cpu/gpt_stage.h"
#include "optim/train_step.h"
#include "util/hash.h"
#include "util/median.h"

namespace {

using longhaul::Median;

// Runs the PyTorch baseline script; returns its tokens/s, or a negative value with `why` set.
double TorchTokensPerSecond(const std::string& args, std::string& why, std::string& version) {
  const longhaul::bench::ScriptOutput out = longhaul::bench::RunBaselineScript("torch_train_step.py", args, 600);
  const auto tps = longhaul::bench::PrintedValue(out.text, "torch_tokens_per_s");
  if (!out.ok || !tps) {
    why = out.text.find("No module named 'torch'") != std::string::npos
              ? "PyTorch is not installed for " + out.interpreter + " (bash deploy/setup.sh --with-torch)"
              : "the PyTorch script failed: " + out.text.substr(0, 300);
    return -1;
  }
  const size_t v = out.text.find("torch_version=");
  if (v != std::string::npos) version = out.text.substr(v + 14, out.text.find_first_of(" \n", v) - v - 14);
  return *tps;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"longhaul CPU training step vs PyTorch"};
  int d_model = 256, n_layer = 4, n_head = 4, seq = 256, batch = 8, threads = 2, steps = 5, warmup = 2;
  app.add_option("--d_model", d_model);
  app.add_option("--n_layer", n_layer);
  app.add_option("--n_head", n_head);
  app.add_option("--seq", seq);
  app.add_option("--batch", batch);
  app.add_option("--threads", threads);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);

  longhaul::ModelConfig cfg;
  cfg.vocab_size = 256, cfg.max_seq_len = seq, cfg.n_layer = n_layer, cfg.n_head = n_head, cfg.d_model = d_model;
  auto stage = longhaul::GptStage::Create(cfg, longhaul::StageSpec::Whole(cfg), batch, seq, false);
  if (!stage.ok()) {
    std::cerr << stage.status().message() << "\n";
    return 2;
  }
  longhaul::GptStage& s = **stage;
  s.InitParams(0);
  auto act = s.NewActivations();
  longhaul::AdamW adamw({}, s.layout().DecayFlags());
  longhaul::LrSchedule sched{1e-4f, 1e-4f, 0, 1000};
  std::vector<uint16_t> tokens(1 << 20);
  longhaul::Rng rng(1);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng.Next() % 256);
  longhaul::BatchSampler sampler({batch, seq, 1, cfg.attention}, tokens);
  const std::vector<longhaul::MicroBatch> mbs = {sampler.Sample(0, 0)};

  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    longhaul::AccumulateGradients(s, *act, mbs);
    longhaul::ApplyOptimizerStep(s.params(), s.grads(), s.num_params(), adamw, sched, 1.0f, i);
    if (i >= warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double ours_s = Median(times), ours_tps = batch * seq / ours_s;

  const std::string args = absl::StrFormat("--d_model %d --n_layer %d --n_head %d --seq %d --batch %d --threads %d "
                                           "--steps %d --warmup %d",
                                           d_model, n_layer, n_head, seq, batch, threads, steps, warmup);
  std::string why, version = "?";
  const double torch_tps = TorchTokensPerSecond(args, why, version);

  std::cout << absl::StrFormat(
      "train step, CPU, fp32: d_model %d, %d layers, %d heads, seq %d, batch %d, vocab 256, %d threads; median of %d "
      "steps after %d warm-up\n",
      d_model, n_layer, n_head, seq, batch, threads, steps, warmup);
  std::cout << absl::StrFormat("  longhaul : %9.1f tokens/s  (%.3f s/step)\n", ours_tps, ours_s);
  if (torch_tps > 0) {
    std::cout << absl::StrFormat("  PyTorch  : %9.1f tokens/s  (%.3f s/step, torch %s)\n", torch_tps,
                                 batch * seq / torch_tps, version);
    std::cout << absl::StrFormat("  ratio longhaul / PyTorch: %.2fx\n", ours_tps / torch_tps);
  } else {
    std::cout << "  PyTorch  : skipped: " << why << "\n";
  }
  return 0;
}
