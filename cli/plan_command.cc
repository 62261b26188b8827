#include "cli/plan_command.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/job_config.h"
#include "metrics/flops.h"
#include "scenario/scenario.h"
#include "plan/convergence_penalty.h"
#include "plan/layout_search.h"
#include "format/wire_dtype.h"
#include "transport/wire_plan.h"
#include "util/atomic_file.h"

namespace longhaul {
namespace {

// The V100's fp32 efficiency bench/plan_seed001 calibrates on the source experiment's default
// setting (15.16 s for GPT-3 XL on 12 stages): the one measured figure the planner starts from.
constexpr double kSeed001Efficiency = 0.464;

// Without --scenario: the source experiment's default setting, a fast data-center network.
constexpr LinkCost kUniformLink = {0.05e-3, 10e9 / 8, 0};


struct PlanArgs {
  CLI::Option *workers_given = nullptr, *batch_given = nullptr, *batch_max_given = nullptr;
  int workers = 0;
  std::string device = "v100", profile, scenario, links, penalties, write, layout, json;
  bool registration_order = false;
  double efficiency = kSeed001Efficiency;
  int global_batch = 0, global_batch_max = 0;
  int top = 10;
} g;

int Error(const std::string& message) {
  std::cerr << "longhaul: error: " << message << "\n";
  return 2;
}

// "2" where the stages split evenly, else the fewest and most blocks ("1-2"): the cut of the
// coordinator's placement where there is one, else the layout's.
std::string BlocksPerStage(const RankedLayout& c) {
  std::vector<int> blocks;
  if (c.placement) {
    blocks = c.placement->plan.blocks_per_stage;
  } else {
    for (int s = 0; s < c.layout.stages; ++s) {
      const StageSpec spec = c.layout.Spec(s);
      blocks.push_back(spec.end_block - spec.first_block);
    }
  }
  const auto [lo, hi] = std::minmax_element(blocks.begin(), blocks.end());
  return *lo == *hi ? absl::StrCat(*lo) : absl::StrCat(*lo, "-", *hi);
}

// Each replica's micro-batches: "6", or "5-6" where the replicas share the batch unevenly.
std::string MicroBatchesText(const Layout& L) {
  if (L.replica_micro_batches.empty()) return absl::StrCat(L.micro_batches);
  const auto [lo, hi] = std::minmax_element(L.replica_micro_batches.begin(), L.replica_micro_batches.end());
  return absl::StrCat(*lo, "-", *hi);
}

std::string Row(int rank, const RankedLayout& c) {
  const Layout& L = c.layout;
  // A measured profile names no peak to take a fraction of.
  const std::string mfu = c.mfu > 0 ? absl::StrFormat("%5.1f%%", 100 * c.mfu) : "     -";
  return absl::StrFormat("%3d  %6s  %6s  %4s x %-3d %-5s %-4s %-8s %9.2f s %9.0f %9.1f %s %9.0f  %9s (stage %d)", rank,
                         absl::StrCat(L.stages, "x", L.replicas), BlocksPerStage(c), MicroBatchesText(L),
                         L.work.micro_batch, ScheduleName(L.schedule), L.work.recompute ? "yes" : "no",
                         c.central_ps ? "central" : "sharded", c.iteration_s, c.tokens_per_s, c.tflops_per_device, mfu,
                         c.days_per_100b_tokens, FormatBytes(c.peak_memory.total()), c.peak_stage);
}

// What a job's config asks of the search: its model, batch shape, precision, wire and exchange.
void SetJob(const JobConfig& cfg, int global_batch, LayoutSearchRequest& r) {
  r.model = cfg.model;
  r.seq_len = cfg.train.seq_len;
  r.global_batch = global_batch;
  r.precision = cfg.train.precision;
  r.wire = cfg.transport.wire_dtype, r.fast_wire = cfg.FastWire(), r.exchange = cfg.transport.exchange_dtype;
  r.gradient = cfg.transport.gradient_dtype;
  r.boundary_rank_divisor = cfg.transport.boundary_rank_divisor;
  r.gradient_rank_divisor = cfg.transport.gradient_rank_divisor;
  r.shared_directions = cfg.transport.shared_directions;
  r.local_steps = cfg.train.local_steps, r.overlap_outer = cfg.train.overlap_outer;
  r.overlap_steps = cfg.train.overlap_steps;
  r.overlap = cfg.cluster.overlap_exchange;
  r.clip_norm = true;  // longhaul reduces the norm whatever train.grad_clip says (simulator.h)
}

// One setting of the convergence bench applied to the job: the job's config on the compute's own
// wire dtype (the bench's exact path quantizes nothing) with the setting's keys, its global batch
// x the setting's scale; the fastest layout of it that fits, and its tokens/s charged the penalty.
struct SettingPlan {
  const SettingPenalty* setting = nullptr;
  std::vector<std::string> overrides;  // on top of the user's
  int global_batch = 0;
  std::optional<RankedLayout> best;
  double effective = 0;  // tokens/s / (1 + max(penalty, 0))
  std::string why_not;   // where it is not planned
};

// The --set overrides that make a config run `best`'s layout.
std::vector<std::string> LayoutOverrides(const RankedLayout& best) {
  const Layout& L = best.layout;
  return {absl::StrCat("cluster.stages=", L.stages),
          absl::StrCat("cluster.replicas=", L.replicas),
          absl::StrCat("train.micro_batches=", L.micro_batches),
          absl::StrCat("cluster.replica_micro_batches=[", absl::StrJoin(L.replica_micro_batches, ","), "]"),
          absl::StrCat("train.micro_batch_size=", L.work.micro_batch),
          absl::StrCat("cluster.schedule=\"", ScheduleName(L.schedule), "\""),
          absl::StrCat("train.recompute=", L.work.recompute ? "true" : "false"),
          absl::StrCat("cluster.ps=\"", best.central_ps ? "central" : "sharded", "\"")};
}

std::vector<std::string> Joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every setting of `table` applied to the job of `config_path` with `overrides`, searched on
// `base`'s workers, device and network; the plannable ones ranked by effective tokens/s.
absl::StatusOr<std::vector<SettingPlan>> PlanSettings(const std::string& config_path,
                                                      const std::vector<std::string>& overrides,
                                                      const PenaltyTable& table, const LayoutSearchRequest& base,
                                                      int global_batch, int global_batch_max) {
  auto job = LoadJobConfig(config_path, overrides);
  if (!job.ok()) return job.status();
  std::vector<SettingPlan> plans;
  for (const SettingPenalty& p : table.settings) {
    SettingPlan sp;
    sp.setting = &p;
    sp.global_batch = global_batch * p.batch_scale;
    sp.overrides = SettingOverrides(*job, p);
    auto cfg = LoadJobConfig(config_path, Joined(overrides, sp.overrides));
    if (!p.choosable) {
      sp.why_not = absl::StrFormat("never reached the exact path's loss in the bench (final gap %+.4f)", p.final_gap);
    } else if (sp.global_batch > global_batch_max) {
      sp.why_not = absl::StrFormat("a global batch of %d, above --global-batch-max %d", sp.global_batch,
                                   global_batch_max);
    } else if (!cfg.ok()) {
      sp.why_not = std::string(cfg.status().message());
    } else {
      LayoutSearchRequest r = base;
      SetJob(*cfg, sp.global_batch, r);
      r.top = 1;
      // A lossy wire's penalty from runs without a pipeline boundary says nothing of what it does
      // to activations and their gradients: such a setting is planned without one.
      if (BoundaryUnmeasured(p, cfg->transport)) {
        if (r.only_stages > 1) {
          sp.why_not = kBoundaryUnmeasured;
          plans.push_back(std::move(sp));
          continue;
        }
        r.only_stages = 1;
      }
      auto result = SearchLayouts(r);
      if (!result.ok()) return result.status();
      if (result->fitting.empty()) {
        sp.why_not = "no layout of it fits";
      } else {
        sp.best = result->fitting.front();
        sp.effective = sp.best->tokens_per_s / (1 + std::max(0.0, p.penalty));
      }
    }
    plans.push_back(std::move(sp));
  }
  std::stable_sort(plans.begin(), plans.end(), [](const SettingPlan& a, const SettingPlan& b) {
    return a.best.has_value() != b.best.has_value() ? a.best.has_value() : a.effective > b.effective;
  });
  return plans;
}

// The penalties file to charge: --penalties, else the one shipped under the source tree (beside
// the binary's build directory, or under the working directory), else none.
std::optional<std::string> PenaltiesPath() {
  if (g.penalties == "none") return std::nullopt;
  if (!g.penalties.empty()) return g.penalties;
  return ShippedPenaltiesPath();
}

// A host as the scenario names it ("3 (eu-west)"), or by its number alone.
std::string HostName(int host, const std::optional<netem::Scenario>& scenario) {
  if (!scenario || scenario->sites.size() < 2) return absl::StrCat(host);
  const int site = scenario->SiteOf(host);
  return site >= 0 && site < static_cast<int>(scenario->sites.size())
             ? absl::StrCat(host, " (", scenario->sites[static_cast<size_t>(site)], ")")
             : absl::StrCat(host);
}

// What each link of `c` carries, as the coordinator would resolve its wires: one line, then the
// links whose dtype differs from the default, by dtype (the first 24 named).
std::string WiresLines(const RankedLayout& c, const NetworkCost& network,
                       const std::optional<netem::Scenario>& scenario) {
  const Placement placement = c.placement ? c.placement->plan.placement : DefaultPlacement(c.layout, c.central_ps);
  const WirePlan wires = LayoutWires(c.layout, placement, network);
  std::string out = absl::StrCat("  wires: ", DescribeWires(wires), "\n");
  const ModelConfig& m = c.layout.work.model;
  if (c.layout.stages > 1 && m.subspace_divisor > 1) {
    absl::StrAppend(&out, "  boundaries: ", m.residual_width(), " of ", m.d_model,
                    " values a token (a subspace model, model.subspace_divisor = ", m.subspace_divisor, ")\n");
  }
  const Layout& L = c.layout;
  if (L.stages > 1 && (L.boundary_rank_divisor > 1 || L.gradient_rank_divisor > 1)) {
    auto rank = [&](bool gradient) {
      const BoundaryShape b = L.Boundary(gradient);
      return b.low_rank() ? absl::StrCat("rank ", b.rank) : std::string("whole");
    };
    absl::StrAppend(&out, "  boundaries in low rank: activations ", rank(false), ", gradients ", rank(true), " of ",
                    m.residual_width(), " (transport.boundary_rank_divisor = ", L.boundary_rank_divisor,
                    ", transport.gradient_rank_divisor = ", L.gradient_rank_divisor,
                    L.shared_directions ? "; the directions shared by an iteration's micro-batches" : "", ")\n");
  }
  std::map<WireDtype, std::vector<std::string>> by_dtype;
  for (const auto& [pair, dtype] : wires.links) {
    by_dtype[dtype].push_back(absl::StrCat(HostName(pair.first, scenario), " -> ", HostName(pair.second, scenario)));
  }
  for (const auto& [dtype, links] : by_dtype) {
    constexpr size_t kNamed = 24;
    const std::vector<std::string> named(links.begin(), links.begin() + std::min(links.size(), kNamed));
    absl::StrAppend(&out, "    ", WireDtypeName(dtype), " on host links ", absl::StrJoin(named, ", "),
                    links.size() > kNamed ? absl::StrCat(" and ", links.size() - kNamed, " more") : "", "\n");
  }
  return out;
}

// Prints the settings ranked by time to the same loss, and writes the best one's config.
int ReportSettings(const std::string& config_path, const std::vector<std::string>& overrides,
                   const std::string& penalties_path, const PenaltyTable& table,
                   const std::vector<SettingPlan>& plans, double one_gpu_tokens_per_s, const std::string& out_dir,
                   const NetworkCost& network, const std::optional<netem::Scenario>& scenario) {
  std::cout << absl::StrFormat(
      "\nSettings by time to the same loss: effective tokens/s = tokens/s / (1 + penalty), a negative penalty "
      "counted as 0 (the bench's small model may learn faster per token with it; a larger one is not counted on "
      "to); x 1 GPU = effective / the exact path's best on one GPU (%.0f tokens/s). A lossy wire measured on one "
      "stage is planned on one stage: a pipeline boundary in it is charged only as measured.\n"
      "  penalties: %s%s\n",
      one_gpu_tokens_per_s, penalties_path,
      table.measured_on.empty() ? ""
                                : absl::StrFormat(" (%s; %s; measured on %s)", table.model, table.corpus,
                                                  table.measured_on));
  int width = 22;  // the settings' names make a column
  for (const SettingPlan& sp : plans) width = std::max(width, static_cast<int>(sp.setting->name.size()));
  std::cout << absl::StrFormat("  %-*s %-26s %6s  %-26s %9s %10s %10s %8s\n", width, "setting", "penalty (seed range)",
                               "batch", "best layout", "iteration", "tokens/s", "effective", "x 1 GPU");
  for (const SettingPlan& sp : plans) {
    const SettingPenalty& p = *sp.setting;
    const std::string penalty =
        p.choosable ? absl::StrFormat("%+.3f (%+.3f..%+.3f)", p.penalty, p.penalty_min, p.penalty_max) : "-";
    if (!sp.best) {
      std::cout << absl::StrFormat("  %-*s %-26s %6d  not planned: %s\n", width, p.name, penalty, sp.global_batch,
                                   sp.why_not);
      continue;
    }
    const Layout& L = sp.best->layout;
    std::cout << absl::StrFormat("  %-*s %-26s %6d  %-26s %7.2f s %10.0f %10.0f %7.1fx\n", width, p.name, penalty,
                                 sp.global_batch,
                                 absl::StrFormat("%dx%d, %s x %d, %s", L.stages, L.replicas, MicroBatchesText(L),
                                                 L.work.micro_batch, ScheduleName(L.schedule)),
                                 sp.best->iteration_s, sp.best->tokens_per_s, sp.effective,
                                 one_gpu_tokens_per_s > 0 ? sp.effective / one_gpu_tokens_per_s : 0);
  }
  if (plans.empty() || !plans.front().best) {
    std::cout << "No setting of the bench can be planned for this job: see each row's reason.\n";
    return 0;
  }
  const SettingPlan& best = plans.front();
  const std::vector<std::string> keys = Joined(best.overrides, LayoutOverrides(*best.best));
  auto cfg = LoadJobConfig(config_path, Joined(overrides, keys));
  if (!cfg.ok()) return Error(std::string(cfg.status().message()));
  const std::string path = g.write.empty() ? (std::filesystem::path(out_dir) / "planned.toml").string() : g.write;
  std::error_code ec;
  if (std::filesystem::path(path).has_parent_path()) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  }
  const std::string text = absl::StrCat(
      "# `longhaul plan`'s best setting by time to the same loss: ", best.setting->name, ", with\n#   --set ",
      absl::StrJoin(keys, " --set "), "\n# on ", config_path,
      absl::StrFormat("\n# predicted: %.6f s per iteration (%.0f tokens/s, %.0f effective)\n", best.best->iteration_s,
                      best.best->tokens_per_s, best.effective),
      cfg->toml_text, "\n");
  if (absl::Status s = WriteFileAtomically(path, text); !s.ok()) {
    return Error(absl::StrCat(s.message(), ": give --write a file in a directory you can write"));
  }
  std::cout << absl::StrFormat(
      "\nBest by time to the same loss: %s on %d stages x %d replicas: %.0f tokens/s effective, %.1fx one GPU; its "
      "config: %s\n  longhaul local -c %s\n"
      "  (or let the coordinator choose on the links and compute it finds: --set cluster.communication=auto)\n",
      best.setting->name, best.best->layout.stages, best.best->layout.replicas, best.effective,
      one_gpu_tokens_per_s > 0 ? best.effective / one_gpu_tokens_per_s : 0, path, path);
  std::cout << WiresLines(*best.best, network, scenario);
  return 0;
}

// The line under a ranked layout that says where the coordinator would run it.
std::string PlacementLine(const RankedLayout& c, const std::optional<netem::Scenario>& scenario) {
  if (!c.placement) return "";
  const PlacementResult& p = c.placement->plan;
  std::vector<std::string> stages;
  for (size_t s = 0; s < p.placement.worker.size(); ++s) {
    std::vector<std::string> hosts;
    for (int w : p.placement.worker[s]) hosts.push_back(HostName(p.placement.host[static_cast<size_t>(w)], scenario));
    stages.push_back(absl::StrCat("stage ", s, " (", p.blocks_per_stage[s], " blocks): ", absl::StrJoin(hosts, " ")));
  }
  const std::string how =
      c.placement->searched
          ? absl::StrFormat("the coordinator's search: %.2fx faster than registration order (%.2f s)",
                            c.placement->registration_order_s / p.iteration_s, c.placement->registration_order_s)
          : std::string("registration order: the coordinator's search finds no placement 3% faster");
  return absl::StrFormat("       %s\n         %s\n", how, absl::StrJoin(stages, "\n         "));
}

// The ranking and each layout's placement as JSON, for tools.
nlohmann::json RankingJson(const LayoutSearchResult& result) {
  nlohmann::json out = nlohmann::json::array();
  for (const RankedLayout& c : result.fitting) {
    const Layout& L = c.layout;
    nlohmann::json j = {{"stages", L.stages}, {"replicas", L.replicas}, {"micro_batches", L.micro_batches},
                        {"replica_micro_batches", L.replica_micro_batches},
                        {"micro_batch_size", L.work.micro_batch}, {"schedule", ScheduleName(L.schedule)},
                        {"recompute", L.work.recompute}, {"ps", c.central_ps ? "central" : "sharded"},
                        {"iteration_s", c.iteration_s}, {"tokens_per_s", c.tokens_per_s}};
    if (c.placement) {
      const PlacementResult& p = c.placement->plan;
      nlohmann::json hosts = nlohmann::json::array(), shards = nlohmann::json::array();
      for (const std::vector<int>& stage : p.placement.worker) {
        nlohmann::json row = nlohmann::json::array();
        for (int w : stage) row.push_back(p.placement.host[static_cast<size_t>(w)]);
        hosts.push_back(row);
      }
      for (const ShardPlacement& sp : p.placement.shards) {
        shards.push_back({{"stage", sp.stage}, {"params", sp.params},
                          {"host", p.placement.host[static_cast<size_t>(sp.worker)]}});
      }
      j["placement"] = {{"searched", c.placement->searched},
                        {"registration_order_s", c.placement->registration_order_s},
                        {"blocks_per_stage", p.blocks_per_stage},
                        {"hosts", hosts},
                        {"shards", shards}};
    }
    out.push_back(std::move(j));
  }
  return out;
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
  plan->add_option("--penalties", g.penalties,
                   absl::StrCat("the convergence bench's penalties (bench/convergence.sh) the settings are charged; "
                                "default: ", kShippedPenalties, " of the source tree; none: rank layouts only"));
  g.batch_max_given = plan->add_option(
      "--global-batch-max", g.global_batch_max,
      "the largest global batch a setting may train (default: the global batch; a larger one pays its penalty)");
  plan->add_option("--write", g.write,
                   "where to write the best setting's config (default: train.out_dir/planned.toml)");
  plan->add_option("--layout", g.layout, "only layouts of P stages x D replicas, e.g. 4x16, with their placements");
  plan->add_option("--json", g.json, "write the ranking and each layout's placement to this file, for tools");
  plan->add_flag("--registration-order", g.registration_order,
                 "rank on registration order (worker w runs slot w) instead of the coordinator's placement search");
  return plan;
}

int RunPlanCommand(const std::string& config_path, const std::vector<std::string>& overrides) {
  const auto start = std::chrono::steady_clock::now();
  auto cfg = LoadJobConfig(config_path, overrides);
  if (!cfg.ok()) return Error(std::string(cfg.status().message()));
  const int workers = g.workers_given->count() > 0 ? g.workers : cfg->cluster.stages * cfg->cluster.replicas;
  if (workers < 1) return Error(absl::StrCat("--workers ", workers, ": give at least 1 worker"));
  if (g.top < 1) return Error(absl::StrCat("--top ", g.top, ": show at least 1 layout"));
  const int64_t config_batch = static_cast<int64_t>(cfg->train.micro_batch_size) * cfg->GlobalMicroBatches();
  const int64_t global_batch = g.batch_given->count() > 0 ? g.global_batch : config_batch;
  if (global_batch < 1) return Error(absl::StrCat("--global-batch ", global_batch, ": give at least 1 sequence"));

  LayoutSearchRequest r;
  SetJob(*cfg, static_cast<int>(global_batch), r);
  r.workers = workers;
  r.top = g.top;
  r.place = !g.registration_order;
  if (!g.layout.empty()) {
    const std::vector<std::string> pd = absl::StrSplit(g.layout, 'x');
    if (pd.size() != 2 || !absl::SimpleAtoi(pd[0], &r.only_stages) || !absl::SimpleAtoi(pd[1], &r.only_replicas) ||
        r.only_stages < 1 || r.only_replicas < 1) {
      return Error(absl::StrCat("--layout ", g.layout, ": give stages x replicas, e.g. --layout 4x16"));
    }
  }
  auto device = g.profile.empty() ? DeviceCost::Named(g.device, r.precision, g.efficiency)
                                  : DeviceCost::LoadProfile(g.profile);
  if (!device.ok()) return Error(std::string(device.status().message()));
  r.device = *device;
  std::string network = absl::StrFormat("uniform %.2f ms one-way, %.0f Gbit/s (no --scenario)",
                                        kUniformLink.latency_s * 1e3, kUniformLink.bandwidth * 8 / 1e9);
  r.network = NetworkCost::Uniform(kUniformLink);
  std::optional<netem::Scenario> scenario;
  if (!g.scenario.empty()) {
    auto loaded = netem::LoadScenario(g.scenario);
    if (!loaded.ok()) {
      return Error(absl::StrCat(loaded.status().message(), " (--scenario takes a file such as ",
                                "netem/scenarios/source-default.toml)"));
    }
    scenario = *std::move(loaded);
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

  if (r.network.HasCards()) network += "; each host's network card shared by its links";
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
  if (r.device.PricesRecompute(r.precision)) {
    std::cout << "  recompute priced as forward + backward: the profile times no " << PrecisionName(r.precision)
              << " block with recompute\n";
  }
  std::cout << "  network: " << network << "\n";
  std::cout << absl::StrFormat("  %d layouts, %d simulated (the rest cannot beat the %d shown: their busiest stage's "
                               "compute alone is longer), %d of them placed as the coordinator would (%s), in "
                               "%.2f s\n\n",
                               result->candidates, result->simulated, r.top, result->placed,
                               r.place ? "its placement search, kept where it beats registration order by 3%"
                                       : "--registration-order: worker w runs slot w",
                               seconds);

  if (!result->fitting.empty()) {
    std::cout << "Fastest layouts that fit, each with the hosts of its stages' replicas as the coordinator would "
                 "place them:\n"
              << kHeader;
    for (size_t i = 0; i < result->fitting.size(); ++i) {
      std::cout << Row(i + 1, result->fitting[i]) << "\n" << PlacementLine(result->fitting[i], scenario);
    }
  }
  if (!g.json.empty()) {
    if (absl::Status s = WriteFileAtomically(g.json, RankingJson(*result).dump(1) + "\n"); !s.ok()) {
      return Error(absl::StrCat(s.message(), ": give --json a file in a directory you can write"));
    }
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
      "\nBest layout: %d stages x %d replicas, %s micro-batches of %d, %s, recompute %s, %s PS: %.2f s per "
      "iteration, %.1f days per 100B tokens\n",
      L.stages, L.replicas, MicroBatchesText(L), L.work.micro_batch, ScheduleName(L.schedule),
      L.work.recompute ? "on" : "off", best.central_ps ? "central" : "sharded", best.iteration_s,
      best.days_per_100b_tokens);
  std::cout << "  longhaul local -c " << config_path;
  for (const std::string& o : LayoutOverrides(best)) {
    // Quoted for the shell where TOML's quotes or brackets would not survive it.
    std::cout << (o.find_first_of("\"[") == std::string::npos ? " --set " + o : " --set '" + o + "'");
  }
  std::cout << "\n";
  std::cout << WiresLines(best, r.network, scenario);

  const std::optional<std::string> penalties = PenaltiesPath();
  if (!penalties) {
    std::cout << "\nSettings that change the numerics (local updates, compression, a larger batch) are not ranked: "
                 "no penalties file (--penalties; bash bench/convergence.sh measures one)\n";
    return 0;
  }
  auto table = LoadPenaltyTable(*penalties);
  if (!table.ok()) return Error(std::string(table.status().message()));
  const int batch_max = g.batch_max_given->count() > 0 ? g.global_batch_max : static_cast<int>(global_batch);
  auto plans = PlanSettings(config_path, overrides, *table, r, static_cast<int>(global_batch), batch_max);
  if (!plans.ok()) return Error(std::string(plans.status().message()));
  // The baseline: the exact path's best layout on one GPU.
  double one_gpu = 0;
  for (const SettingPlan& sp : *plans) {
    if (sp.setting != &table->settings.front() || !sp.best) continue;
    auto cfg = LoadJobConfig(config_path, Joined(overrides, sp.overrides));
    if (!cfg.ok()) return Error(std::string(cfg.status().message()));
    LayoutSearchRequest one = r;
    SetJob(*cfg, static_cast<int>(global_batch), one);
    one.workers = 1, one.top = 1;
    one.only_stages = one.only_replicas = 0;  // one GPU whatever --layout names
    auto alone = SearchLayouts(one);
    if (alone.ok() && !alone->fitting.empty()) one_gpu = alone->fitting.front().tokens_per_s;
  }
  return ReportSettings(config_path, overrides, *penalties, *table, *plans, one_gpu, cfg->train.out_dir, r.network,
                        scenario);
}

}  // namespace longhaul
