// One training step on a GPU: longhaul's CUDA backend against PyTorch on the same GPU, same
// shapes, measured in the same run: eager (scaled_dot_product_attention, fused AdamW) and, on the
// cases --compile names, torch.compile. Shapes from the source experiment (seeds/001): a GPT-3 XL
// stage (2 layers, d_model 2048, 16 heads, seq 2048; boundary activations cross to and from the
// host as in a pipeline worker) at micro-batch 1 to 8, and the whole 24-layer GPT-3 XL at
// micro-batch 1 to 4.
// Each row is printed as soon as it is measured, with each side's peak device memory, and with
// --json written to FILE too (deploy/gpu_targets.py checks the rows against the GPU targets).
//
//   build/bench/cuda_step_bench [--precisions bf16[,fp16,fp32]] [--cases stage1,stage2,stage4,stage8,xl1,xl2,xl4]
//                               [--steps 5] [--compile xl2,...] [--no-torch] [--torch-timeout 600]
//                               [--peak-tflops-bf16 989.4] [--json FILE]
//
// PyTorch is $LONGHAUL_PYTHON, else /usr/bin/python3 (bench/baseline_script.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "bench/baseline_script.h"
#include "cuda/cuda_stage.h"
#include "data/batch_sampler.h"
#include "metrics/flops.h"
#include "util/hash.h"

namespace {

struct Case {
  const char* key;   // for --cases
  const char* name;
  int layers;  // blocks in this stage
  bool whole;  // embeddings and head too (the full model)
  int B;
};

// PyTorch's tokens/s and peak GiB for the same case, or tokens/s < 0 with `why`.
struct Torch {
  double tps = -1, gib = 0;
  std::string why;

  // Its tokens/s and peak GiB, or why it did not run.
  nlohmann::json Json() const {
    return tps > 0 ? nlohmann::json{{"tokens_per_s", tps}, {"gib", gib}} : nlohmann::json{{"why", why}};
  }
};
Torch RunTorch(const std::string& args, int timeout_s) {
  const longhaul::bench::ScriptOutput out = longhaul::bench::RunBaselineScript("torch_cuda_step.py", args, timeout_s);
  const auto tps = longhaul::bench::PrintedValue(out.text, "torch_tokens_per_s");
  const auto gib = longhaul::bench::PrintedValue(out.text, "torch_peak_gib");
  if (out.ok && tps && gib) return {*tps, *gib, ""};
  Torch r;
  r.why = out.timed_out      ? absl::StrFormat("over the %d s limit (--torch-timeout)", timeout_s)
          : out.text.empty() ? "cannot run " + out.interpreter
                             : out.text.substr(out.text.size() > 300 ? out.text.size() - 300 : 0);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU training step: longhaul CUDA backend vs PyTorch eager and torch.compile"};
  std::vector<std::string> precisions = {"bf16"}, keys = {"stage1", "stage2", "stage4", "stage8", "xl1", "xl2", "xl4"};
  std::vector<std::string> compile_keys;
  std::string json_path;
  int steps = 5, torch_timeout = 600;
  bool no_torch = false;
  double peak_bf16 = 989.4, peak_fp32 = 66.9;  // H100 SXM dense: bf16 tensor cores, fp32 without TF32
  app.add_option("--precisions", precisions, "bf16, fp16, fp32")->delimiter(',')->capture_default_str();
  app.add_option("--cases", keys, "which cases")->delimiter(',')->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--compile", compile_keys, "cases to time torch.compile on too (minutes of compilation each)")
      ->delimiter(',');
  app.add_flag("--no-torch", no_torch, "longhaul alone (under a profiler, say)");
  app.add_option("--torch-timeout", torch_timeout, "seconds each PyTorch run may take")->capture_default_str();
  app.add_option("--peak-tflops-bf16", peak_bf16)->capture_default_str();
  app.add_option("--peak-tflops-fp32", peak_fp32)->capture_default_str();
  app.add_option("--json", json_path, "also write the rows to this file");
  CLI11_PARSE(app, argc, argv);

  const std::vector<Case> all = {{"stage1", "stage 2 layers, mb 1", 2, false, 1},
                                 {"stage2", "stage 2 layers, mb 2", 2, false, 2},
                                 {"stage4", "stage 2 layers, mb 4", 2, false, 4},
                                 {"stage8", "stage 2 layers, mb 8", 2, false, 8},
                                 {"xl1", "GPT-3 XL 24 layers, mb 1", 24, true, 1},
                                 {"xl2", "GPT-3 XL 24 layers, mb 2", 24, true, 2},
                                 {"xl4", "GPT-3 XL 24 layers, mb 4", 24, true, 4}};
  std::vector<Case> cases;
  for (const std::string& k : keys) {
    auto it = std::find_if(all.begin(), all.end(), [&](const Case& c) { return k == c.key; });
    if (it == all.end()) {
      std::cerr << "cuda_step_bench: no case \"" << k << "\" (stage1, stage2, stage4, stage8, xl1, xl2, xl4)\n";
      return 2;
    }
    cases.push_back(*it);
  }
  for (const std::string& k : compile_keys) {
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      std::cerr << "cuda_step_bench: --compile names \"" << k << "\", which --cases does not run: add it to --cases\n";
      return 2;
    }
  }
  std::string why;
  if (longhaul::CudaDeviceCount(&why) == 0) {
    std::cout << "cuda_step_bench: skipped: " << why << "\n";
    return 0;
  }
  std::cout << "GPU training step (forward, backward, clip, AdamW), GPT-3 XL shapes: d_model 2048, 16 heads, seq 2048, "
               "vocab 50257; median of "
            << steps << " steps after 2 warm-up\nTFLOPs = " << longhaul::FlopsFormulaName(false)
            << " / step time; MFU = TFLOPs / peak (bf16/fp16 " << peak_bf16 << ", fp32 " << peak_fp32
            << "); GiB = peak device memory (longhaul: free memory taken; PyTorch: max allocated)\n";
  std::cout << absl::StrFormat("%-26s %5s %9s %7s %6s %5s | %9s %5s %6s | %9s %5s %6s\n", "case", "prec",
                               "longhaul", "TFLOPs", "MFU", "GiB", "eager", "GiB", "ratio", "compile", "GiB", "ratio")
            << std::flush;
  nlohmann::json rows = nlohmann::json::array();
  // Rewritten after each row, so a case that brings the process down leaves the ones before it.
  auto add_row = [&](nlohmann::json row) {
    rows.push_back(std::move(row));
    if (!json_path.empty()) std::ofstream(json_path, std::ios::trunc) << rows.dump(1) << "\n";
  };
  for (const std::string& prec_name : precisions) {
    auto precision = longhaul::ParsePrecision(prec_name);
    if (!precision.ok()) {
      std::cerr << "cuda_step_bench: " << precision.status().message() << "\n";
      return 2;
    }
    for (const Case& c : cases) {
      longhaul::ModelConfig cfg;
      cfg.vocab_size = 50257, cfg.max_seq_len = 2048, cfg.n_layer = c.layers, cfg.n_head = 16, cfg.d_model = 2048;
      const int T = 2048;
      const longhaul::StageSpec spec = c.whole ? longhaul::StageSpec::Whole(cfg) : longhaul::StageSpec{0, c.layers, false, false};
      longhaul::CudaStage::Options o;
      o.B = c.B, o.T = T, o.precision = *precision, o.device = 0, o.seed = 1, o.optimizer = true;
      const double free_before = longhaul::CudaFreeMemory(0).value_or(0);
      const auto created = std::chrono::steady_clock::now();
      auto stage = longhaul::CudaStage::Create(cfg, spec, o);
      if (!stage.ok()) {
        std::cout << absl::StrFormat("%-26s %5s  %s\n", c.name, prec_name, std::string(stage.status().message()))
                  << std::flush;
        add_row({{"case", c.key}, {"precision", prec_name}, {"error", std::string(stage.status().message())}});
        continue;
      }
      longhaul::CudaStage& s = **stage;
      std::vector<uint16_t> tokens(1 << 20);
      longhaul::Rng rng(2);
      for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng.Next() % 50257);
      longhaul::BatchSampler sampler({c.B, T, 1, cfg.attention}, tokens);
      const longhaul::MicroBatch mb = sampler.Sample(0, 0);
      std::vector<float> boundary(static_cast<size_t>(c.B) * T * cfg.d_model, 0.01f), grad_out(boundary.size(), 1e-4f);
      if (!s.AttachOptimizer({longhaul::AdamWConfig{}, longhaul::LrSchedule{1e-4f, 1e-5f, 0, 1000}, 1.0f}).ok()) return 1;
      // Per step: the whole step, then forward (with the output's copy to the host), backward (with
      // the input gradient's) and the optimizer step, each ending where the stage waits anyway.
      std::vector<double> times, fwd, bwd, opt;
      double first_step = 0;
      bool failed = false;
      auto since = [](auto t) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(); };
      for (int i = 0; i < steps + 2 && !failed; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        failed |= !s.ZeroGrads().ok();
        failed |= !s.Forward(0, mb, c.whole ? nullptr : boundary.data()).ok();
        if (!c.whole) failed |= !s.Output(0).ok();
        const double f = since(t0);
        failed |= !s.Backward(0, mb, c.whole ? nullptr : grad_out.data(), 1.0f).ok();
        if (!c.whole) failed |= !s.InputGrad(0).ok();
        const double b = since(t0);
        failed |= !s.Step(i).ok();
        const double all = since(t0);
        if (i == 0) first_step = since(created);
        if (i >= 2) times.push_back(all), fwd.push_back(f), bwd.push_back(b - f), opt.push_back(all - b);
      }
      if (failed) {
        std::cout << absl::StrFormat("%-26s %5s  failed (out of memory?)\n", c.name, prec_name) << std::flush;
        add_row({{"case", c.key}, {"precision", prec_name}, {"error", "a step failed (out of memory?)"}});
        continue;
      }
      const double gib = (free_before - longhaul::CudaFreeMemory(0).value_or(free_before)) / (1 << 30);
      stage->reset();
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double sec = median(times), tps = c.B * T / sec;
      // The stage has no embedding or head: count only its blocks (V = 0).
      longhaul::ModelConfig fc = cfg;
      if (!c.whole) fc.vocab_size = 0;
      const double tflops = longhaul::ModelFlopsPerIteration(fc, c.B, T, false) / sec / 1e12;
      const double peak = *precision == longhaul::Precision::kFp32 ? peak_fp32 : peak_bf16;
      const std::string args = absl::StrFormat("--layers %d --batch %d --precision %s --steps %d %s", c.layers, c.B,
                                               prec_name, steps, c.whole ? "--whole" : "");
      const Torch eager = no_torch ? Torch{-1, 0, "not asked (--no-torch)"} : RunTorch(args, torch_timeout);
      const bool compile = std::find(compile_keys.begin(), compile_keys.end(), c.key) != compile_keys.end();
      const Torch compiled = compile ? RunTorch(args + " --compile", torch_timeout) : Torch{-1, 0, "not asked (--compile)"};
      auto side = [&](const Torch& t) {
        return t.tps > 0 ? absl::StrFormat("%9.0f %5.1f %5.2fx", t.tps, t.gib, tps / t.tps)
                         : absl::StrFormat("%9s %5s %6s", "-", "-", "-");
      };
      std::cout << absl::StrFormat("%-26s %5s %9.0f %7.1f %5.1f%% %5.1f | %s | %s\n", c.name, prec_name, tps, tflops,
                                   100 * tflops / peak, gib, side(eager), side(compiled))
                << absl::StrFormat("    longhaul step %.1f ms: forward %.1f, backward %.1f, optimizer %.1f; first step "
                                   "%.1f s after Create\n",
                                   1e3 * sec, 1e3 * median(fwd), 1e3 * median(bwd), 1e3 * median(opt), first_step);
      if (!no_torch && eager.tps <= 0) std::cout << "    PyTorch eager: " << eager.why << "\n";
      if (compile && compiled.tps <= 0) std::cout << "    torch.compile: " << compiled.why << "\n";
      std::cout << std::flush;
      add_row({{"case", c.key},
               {"precision", prec_name},
               {"tokens_per_s", tps},
               {"mfu", tflops / peak},
               {"gib", gib},
               {"eager", no_torch ? nullptr : eager.Json()},
               {"compile", compile ? compiled.Json() : nullptr}});
    }
  }
  return 0;
}
