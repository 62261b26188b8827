#include "cli/plan_command.h"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "config/job_config.h"
#include "metrics/flops.h"
#include "scenario/scenario.h"
#include "plan/layout_search.h"
#include "format/wire_dtype.h"
#include "transport/wire_plan.h"

namespace longhaul {
namespace {

// The V100's fp32 efficiency bench/plan_seed001 calibrates on the source experiment's default
// setting (15.16 s for GPT-3 XL on 12 stages): the one measured figure the planner starts from.
constexpr double kSeed001Efficiency = 0.464;

// Without --scenario: the source experiment's default setting, a fast data-center network.
constexpr LinkCost kUniformLink = {0.05e-3, 10e9 / 8, 0};

struct PlanArgs {
  CLI::Option *workers_given = nullptr, *batch_given = nullptr;
  int workers = 0;
  std::string device = "v100", profile, scenario, links;
  double efficiency = kSeed001Efficiency;
  int global_batch = 0;
  int top = 10;
} g;

int Error(const std::string& message) {
  std::cerr << "longhaul: error: " << message << "\n";
  return 2;
}

// "2" where the stages split evenly, else the fewest and most blocks ("1-2").
std::string BlocksPerStage(const Layout& L) {
  int lo = L.work.model.n_layer, hi = 0;
  for (int s = 0; s < L.stages; ++s) {
    const StageSpec spec = L.Spec(s);
    lo = std::min(lo, spec.end_block - spec.first_block), hi = std::max(hi, spec.end_block - spec.first_block);
  }
  return lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "-", hi);
}

std::string Row(int rank, const RankedLayout& c) {
  const Layout& L = c.layout;
  // A measured profile names no peak to take a fraction of.
  const std::string mfu = c.mfu > 0 ? absl::StrFormat("%5.1f%%", 100 * c.mfu) : "     -";
  return absl::StrFormat("%3d  %6s  %6s  %4d x %-3d %-5s %-4s %-8s %9.2f s %9.0f %9.1f %s %9.0f  %9s (stage %d)", rank,
                         absl::StrCat(L.stages, "x", L.replicas), BlocksPerStage(L), L.micro_batches,
                         L.work.micro_batch, ScheduleName(L.schedule), L.work.recompute ? "yes" : "no",
                         c.central_ps ? "central" : "sharded", c.iteration_s, c.tokens_per_s, c.tflops_per_device, mfu,
                         c.days_per_100b_tokens, FormatBytes(c.peak_memory.total()), c.peak_stage);
}

constexpr char kHeader[] =
    "  #  PxD     blocks  micro-batches  sched recomp ps       iteration  tokens/s  TFLOP/s   MFU  days/100B  "
    "memory/GPU (largest)\n"
    "                     count x size                                           per GPU\n";

}  // namespace

CLI::App* AddPlanCommand(CLI::App& app) {
  CLI::App* plan = app.add_subcommand(
      "plan", "rank layouts (stages x replicas, micro-batches, schedule, recompute, PS) of a job by simulated time");
  g.workers_given = plan->add_option("--workers", g.workers, "devices available (default: the config's stages x replicas)");
  CLI::Option* device =
      plan->add_option("--device", g.device, "v100 (16 GB), v100-32gb, a100, h100 or cpu:GFLOPS")->capture_default_str();
  plan->add_option("--profile", g.profile, "a measured device profile (plan/cost_model.h) instead of --device")
      ->excludes(device);
  plan->add_option("--efficiency", g.efficiency,
                   "fraction of the named device's peak a block reaches (default: seed 001's V100 fp32 calibration)")
      ->capture_default_str();
  CLI::Option* scenario = plan->add_option(
      "--scenario", g.scenario, "network scenario (netem/scenarios/*.toml); default: uniform 0.05 ms one-way, 10 Gbit/s");
  plan->add_option("--links", g.links,
                   "a run's cluster.json: the links its workers probed at join (worker w is host w; --workers "
                   "defaults to theirs) instead of a scenario")
      ->excludes(scenario);
  g.batch_given = plan->add_option("--global-batch", g.global_batch,
                   "sequences per step over all replicas (default: the config's micro_batch_size x micro_batches x "
                   "replicas)");
  plan->add_option("--top", g.top, "fitting layouts to show")->capture_default_str();
  return plan;
}

int RunPlanCommand(const std::string& config_path, const std::vector<std::string>& overrides) {
  const auto start = std::chrono::steady_clock::now();
  auto cfg = LoadJobConfig(config_path, overrides);
  if (!cfg.ok()) return Error(std::string(cfg.status().message()));
  const int workers = g.workers_given->count() > 0 ? g.workers : cfg->cluster.stages * cfg->cluster.replicas;
  if (workers < 1) return Error(absl::StrCat("--workers ", workers, ": give at least 1 worker"));
  if (g.top < 1) return Error(absl::StrCat("--top ", g.top, ": show at least 1 layout"));
  const int64_t config_batch =
      static_cast<int64_t>(cfg->train.micro_batch_size) * cfg->train.micro_batches * cfg->cluster.replicas;
  const int64_t global_batch = g.batch_given->count() > 0 ? g.global_batch : config_batch;
  if (global_batch < 1) return Error(absl::StrCat("--global-batch ", global_batch, ": give at least 1 sequence"));

  LayoutSearchRequest r;
  r.model = cfg->model;
  r.seq_len = cfg->train.seq_len;
  r.global_batch = static_cast<int>(global_batch);
  r.precision = cfg->train.precision;
  r.wire = cfg->transport.wire_dtype, r.fast_wire = cfg->FastWire();
  r.local_steps = cfg->train.local_steps;
  r.overlap = cfg->cluster.overlap_exchange;
  r.clip_norm = true;  // longhaul reduces the norm whatever train.grad_clip says (simulator.h)
  r.workers = workers;
  r.top = g.top;
  auto device = g.profile.empty() ? DeviceCost::Named(g.device, r.precision, g.efficiency)
                                  : DeviceCost::LoadProfile(g.profile);
  if (!device.ok()) return Error(std::string(device.status().message()));
  r.device = *device;
  std::string network = absl::StrFormat("uniform %.2f ms one-way, %.0f Gbit/s (no --scenario)",
                                        kUniformLink.latency_s * 1e3, kUniformLink.bandwidth * 8 / 1e9);
  r.network = NetworkCost::Uniform(kUniformLink);
  if (!g.scenario.empty()) {
    auto scenario = netem::LoadScenario(g.scenario);
    if (!scenario.ok()) {
      return Error(absl::StrCat(scenario.status().message(), " (--scenario takes a file such as ",
                                "netem/scenarios/source-default.toml)"));
    }
    network = absl::StrCat(scenario->name, ": ", scenario->description);
    r.network = NetworkCost::FromScenario(*scenario);
  }
  if (!g.links.empty()) {
    int hosts = 0;
    auto measured = NetworkCost::LoadMeasured(g.links, &hosts);
    if (!measured.ok()) return Error(std::string(measured.status().message()));
    network = absl::StrFormat("the links %d workers measured at join (%s)", hosts, g.links);
    r.network = *std::move(measured);
    if (g.workers_given->count() == 0) r.workers = hosts;  // the run's own workers
  }

  auto result = SearchLayouts(r);
  if (!result.ok()) return Error(std::string(result.status().message()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const ModelConfig& m = r.model;
  const double peak = r.device.peak_flops_per_second();
  std::cout << absl::StrFormat(
      "longhaul plan: GPT %d layers, d_model %d, %d heads, vocab %d (%.2fB parameters); global batch %d x %d tokens, "
      "%s, wire %s, %s\n",
      m.n_layer, m.d_model, m.n_head, m.vocab_size, StageParamCount(m, StageSpec::Whole(m)) / 1e9, r.global_batch,
      r.seq_len, PrecisionName(r.precision),
      cfg->transport.wire_dtype == WireDtype::kAuto
          ? absl::StrFormat("auto (int8 on links under %.0f Gbit/s, %s on faster ones)", kAutoInt8Below * 8 / 1e9,
                            WireDtypeName(cfg->FastWire()))
          : std::string(WireDtypeName(cfg->transport.wire_dtype)),
      cfg->train.grad_clip > 0 ? "global-norm clipping" : "no clipping (the norm is reduced all the same)");
  std::cout << "  " << workers << " workers of " << r.device.name();
  if (peak > 0) {
    std::cout << absl::StrFormat(" (%.1f TFLOP/s peak x %.3f = %.2f TFLOP/s per block", peak / 1e12, g.efficiency,
                                 r.device.flops_per_second() / 1e12);
  } else {
    std::cout << " (measured profile";
  }
  std::cout << ", memory "
            << (r.device.memory_bytes() > 0 ? FormatBytes(r.device.memory_bytes()) : std::string("unchecked")) << ")\n";
  std::cout << "  network: " << network << "\n";
  std::cout << absl::StrFormat("  %d layouts, %d simulated (the rest cannot beat the %d shown: their busiest stage's "
                               "compute alone is longer), in %.2f s\n\n",
                               result->candidates, result->simulated, r.top, seconds);

  if (!result->fitting.empty()) {
    std::cout << "Fastest layouts that fit:\n" << kHeader;
    for (size_t i = 0; i < result->fitting.size(); ++i) std::cout << Row(i + 1, result->fitting[i]) << "\n";
  }
  if (!result->unfit.empty()) {
    std::cout << "\nFastest layouts that do not fit (simulated as if they did):\n" << kHeader;
    for (size_t i = 0; i < result->unfit.size(); ++i) {
      std::cout << Row(i + 1, result->unfit[i]) << "\n       does not fit: " << result->unfit[i].why_not << "\n";
    }
  }
  std::cout << absl::StrFormat(
      "\nTFLOP/s per GPU = %s (%s with recompute) x global batch / (iteration time x GPUs); MFU = the same without "
      "recompute / (time x GPUs x peak), - for a measured profile, which names no peak; days/100B = 1e11 / "
      "(tokens/s) / 86400.\n",
      FlopsFormulaName(false), FlopsFormulaName(true));
  if (result->fitting.empty()) {
    std::cerr << "longhaul: error: no layout of " << workers << " workers fits in " << FormatBytes(r.device.memory_bytes())
              << " per device: give more --workers, a device with more memory, or a smaller --global-batch\n";
    return 1;
  }
  const RankedLayout& best = result->fitting.front();
  const Layout& L = best.layout;
  std::cout << absl::StrFormat(
      "\nBest layout: %d stages x %d replicas, %d micro-batches of %d, %s, recompute %s, %s PS: %.2f s per "
      "iteration, %.1f days per 100B tokens\n",
      L.stages, L.replicas, L.micro_batches, L.work.micro_batch, ScheduleName(L.schedule),
      L.work.recompute ? "on" : "off", best.central_ps ? "central" : "sharded", best.iteration_s,
      best.days_per_100b_tokens);
  std::cout << absl::StrFormat(
      "  longhaul local -c %s --set cluster.stages=%d --set cluster.replicas=%d --set train.micro_batches=%d "
      "--set train.micro_batch_size=%d --set cluster.schedule=%s --set train.recompute=%s --set cluster.ps=%s\n",
      config_path, L.stages, L.replicas, L.micro_batches, L.work.micro_batch, ScheduleName(L.schedule),
      L.work.recompute ? "true" : "false", best.central_ps ? "central" : "sharded");
  return 0;
}

}  // namespace longhaul
