#include "cli/convergence.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "cli/local_cluster.h"
#include "config/job_config.h"
#include "metrics/loss_curve.h"
#include "metrics/metrics_log.h"
#include "model/memory_estimate.h"
#include "plan/convergence_penalty.h"
#include "plan/cost_model.h"
#include "plan/job_problem.h"
#include "plan/simulator.h"
#include "scenario/scenario.h"
#include "util/status_macros.h"
#include "worker/job_setup.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

// A setting is the exact path's config changed by `overrides`, and its global batch multiplied by
// `batch_scale` at the same tokens (plan/convergence_penalty.h's BatchScaleOverrides).
struct BenchSetting {
  std::string name;
  std::vector<std::string> overrides;
  int batch_scale = 1;
  bool quick = false;  // in --quick's subset
};

// What the planner may choose, the exact path first; each later setting (a compression of the
// outer gradients, a pipeline boundary's format) is one more row.
const std::vector<BenchSetting>& Settings() {
  static const std::vector<BenchSetting> settings = {
      {"exact (sync fp32)", {}, 1, true},
      {"int8 wire", {"transport.wire_dtype=\"int8\""}, 1, true},
      {"int4 wire", {"transport.wire_dtype=\"int4\""}, 1, true},
      {"local_steps 4", {"train.local_steps=4"}, 1, true},
      {"local_steps 16", {"train.local_steps=16"}, 1, false},
      {"local_steps 16 int4", {"train.local_steps=16", "transport.wire_dtype=\"int4\""}, 1, false},
      {"local_steps 16 topk", {"train.local_steps=16", "transport.exchange_dtype=\"topk\""}, 1, false},
      {"local_steps 16 int2 exchange", {"train.local_steps=16", "transport.exchange_dtype=\"int2\""}, 1, false},
      {"local_steps 16 int2h exchange overlapped",
       {"train.local_steps=16", "transport.exchange_dtype=\"int2h\"", "train.overlap_outer=true"}, 1, false},
      // A pipeline boundary (2 stages x the exact path's replicas) whose activations and their
      // gradients travel quantized, as do the pushes. int8, int3 and int2 there, their rotated
      // int3h and int2h, and narrower gradients under int4 activations, are measured with --try
      // (the shipped penalties say how): int8 costs what it costs on the pushes alone, int3 and
      // int3h activations more than int4, int2 or int2h ones ruin the run, and the whole table
      // must fit its hour.
      {"int4 boundaries", {"cluster.stages=2", "transport.wire_dtype=\"int4\""}, 1, false},
      {"int4 boundaries, int3h gradients",
       {"cluster.stages=2", "transport.wire_dtype=\"int4\"", "transport.gradient_dtype=\"int3h\""}, 1, false},
      // The same boundary of a subspace model (model.subspace_divisor): a quarter of each token's
      // values cross it, losslessly, and the penalty is the constraint's on the model.
      {"subspace /4, int4 boundaries, int3h gradients",
       {"model.subspace_divisor=4", "cluster.stages=2", "transport.wire_dtype=\"int4\"",
        "transport.gradient_dtype=\"int3h\""},
       1, false},
      // And in low rank: an eighth of the width as the activations' rank
      // (transport.boundary_rank_divisor) and a quarter as their gradients'
      // (transport.gradient_rank_divisor: they lose more in low rank), the factors in int8; other
      // ranks, fp32, int4 and int3h factors are shipped measurements of --try.
      {"low rank /8 activations, /4 gradients, int8",
       {"cluster.stages=2", "transport.boundary_rank_divisor=8", "transport.gradient_rank_divisor=4",
        "transport.wire_dtype=\"int8\""},
       1, false},
      {"batch x2", {}, 2, true},
      {"batch x4", {}, 4, false},
  };
  return settings;
}

// --quick: its subset on an eighth of the tokens.
constexpr int kQuickDivisor = 8;
// `longhaul plan`'s default efficiency (seed 001's V100 fp32 calibration).
constexpr double kDefaultEfficiency = 0.464;

struct Options {
  bool quick = false;
  int seeds = 2;
  std::string device = "h100";
  double efficiency = kDefaultEfficiency;
  std::string scenario = "netem/scenarios/source-10ms-1gbit.toml";
  std::string penalties;
  std::vector<std::string> tries;
  std::vector<std::string> only;
} g;

int Error(const std::string& message) {
  std::cerr << "longhaul: error: " << message << "\n";
  return 2;
}

// "NAME: KEY=VALUE; KEY=VALUE" (--try) as a setting.
absl::StatusOr<BenchSetting> ParseTry(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  if (parts.size() != 2 || absl::StripAsciiWhitespace(parts[0]).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--try \"", text,
                     "\": give NAME: KEY=VALUE[; KEY=VALUE...], e.g. --try \"lr/10: train.lr=1e-4\""));
  }
  BenchSetting s{std::string(absl::StripAsciiWhitespace(parts[0])), {}, 1, true};
  for (absl::string_view o : absl::StrSplit(parts[1], ';', absl::SkipWhitespace())) {
    s.overrides.emplace_back(absl::StripAsciiWhitespace(o));
  }
  return s;
}

// `divisor` must divide the steps and the evaluation interval of `cfg`: a bench that rounds them
// would compare runs of different tokens.
absl::Status CheckDivides(const JobConfig& cfg, int divisor, const std::string& why) {
  const TrainConfig& t = cfg.train;
  if (t.steps % divisor != 0 || t.eval_every % divisor != 0 || t.eval_every == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s divides train.steps (%d) and train.eval_every (%d) by %d: give multiples of %d (eval_every above 0)", why,
        t.steps, t.eval_every, divisor, divisor));
  }
  return absl::OkStatus();
}

// The overrides of one run of `s`, on top of `base` (the user's and --quick's).
absl::StatusOr<std::vector<std::string>> SettingOverrides(const std::string& config_path,
                                                          const std::vector<std::string>& base,
                                                          const BenchSetting& s) {
  std::vector<std::string> o = base;
  o.insert(o.end(), s.overrides.begin(), s.overrides.end());
  if (s.batch_scale == 1) return o;
  auto cfg = LoadJobConfig(config_path, o);
  if (!cfg.ok()) return cfg.status();
  LH_RETURN_IF_ERROR(CheckDivides(*cfg, s.batch_scale, absl::StrCat("the setting '", s.name, "'")));
  const std::vector<std::string> scaled = BatchScaleOverrides(*cfg, s.batch_scale);
  o.insert(o.end(), scaled.begin(), scaled.end());
  return o;
}

// The simulator's iteration time of the run's layout, as the planner prices it: every worker on
// the named device computing in bf16, worker w on host w of the scenario.
absl::StatusOr<double> EmulatedIterationSeconds(const JobConfig& cfg, const DeviceCost& device,
                                                const NetworkCost& network) {
  Simulation sim;
  sim.layout = JobLayout(cfg);
  sim.layout.work.precision = Precision::kBf16;
  sim.placement = DefaultPlacement(sim.layout, cfg.cluster.central_ps);
  sim.devices = {device};
  sim.network = network;
  auto report = Simulate(sim);
  if (!report.ok()) return report.status();
  return report->iteration_s;
}

// How many times fewer bytes than fp32 a micro-batch's pipeline boundary sends, its activations
// and their gradients together, as its wire dtypes and ranks have it (shared directions counted
// as their share of the iteration's micro-batches); "-" without a boundary.
std::string BoundaryShrink(const JobConfig& cfg) {
  if (cfg.cluster.stages < 2) return "-";
  const WireDtype act = cfg.transport.wire_dtype == WireDtype::kAuto ? cfg.FastWire() : cfg.transport.wire_dtype;
  const WireDtype grad = cfg.transport.gradient_dtype == WireDtype::kAuto ? act : cfg.transport.gradient_dtype;
  const BoundaryShape a = cfg.boundary(false), g = cfg.boundary(true);
  const double fp32 = 2.0 * 4 * static_cast<double>(a.floats());
  const double directions = static_cast<double>(WireBytes(a.directions(), act)) / cfg.train.micro_batches;
  return absl::StrFormat("%.1fx", fp32 / (static_cast<double>(WireBytes(a.sent(), act) + WireBytes(g.sent(), grad)) +
                                          directions));
}

// One run of a setting: its validation curve (x: tokens) and its config.
struct Run {
  std::vector<LossPoint> val;
  double tokens_per_step = 0;
};

struct SettingRuns {
  BenchSetting setting;
  std::vector<std::string> overrides;  // every key its runs set but the seed and the run directory
  JobConfig cfg;                       // with them
  double iteration_s = 0;              // emulated
  std::vector<Run> runs;               // per seed
};

// The settings to run, each checked and priced before anything trains, and the line that says
// how the emulated wall-clock is priced.
struct Bench {
  std::vector<SettingRuns> settings;
  std::string pricing;
};

std::string Slug(const std::string& name) {
  std::string s;
  for (char c : name) {
    if (absl::ascii_isalnum(c)) s += absl::ascii_tolower(c);
    else if (!s.empty() && s.back() != '-') s += '-';
  }
  return std::string(absl::StripSuffix(s, "-"));
}

// Trains one setting with one seed; its checkpoints go once its curve is read.
absl::StatusOr<Run> TrainOnce(const std::string& self_exe, const std::string& config_path,
                              std::vector<std::string> overrides, const std::string& dir, uint64_t seed) {
  overrides.push_back(absl::StrCat("train.seed=", seed));
  overrides.push_back(absl::StrCat("train.out_dir=\"", dir, "\""));
  auto cfg = LoadJobConfig(config_path, overrides);
  if (!cfg.ok()) return cfg.status();
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string log = (fs::path(dir) / "log.txt").string();
  if (RunLocalClusterLogged(log, self_exe, config_path, overrides) != 0) {
    return absl::InternalError(absl::StrCat("the run in ", dir, " failed: see ", log));
  }
  auto rows = ReadMetrics((fs::path(dir) / "metrics.csv").string());
  if (!rows.ok()) return rows.status();
  Run r;
  r.tokens_per_step = static_cast<double>(cfg->tokens_per_step());
  for (const MetricsRow& row : *rows) {
    if (row.val_loss >= 0) r.val.push_back({static_cast<double>(row.step) * r.tokens_per_step, row.val_loss});
  }
  if (r.val.empty()) return absl::InternalError(absl::StrCat("the run in ", dir, " has no validation loss"));
  fs::remove_all(fs::path(dir) / "checkpoints", ec);
  return r;
}

// The loss of `curve` at x, linear between its points; nullopt outside them.
std::optional<double> LossAt(const std::vector<LossPoint>& curve, double x) {
  for (size_t i = 1; i < curve.size(); ++i) {
    const LossPoint &a = curve[i - 1], &b = curve[i];
    if (x >= a.step && x <= b.step) return a.loss + (b.loss - a.loss) * (x - a.step) / (b.step - a.step);
  }
  if (!curve.empty() && std::abs(x - curve.back().step) < 1e-9) return curve.back().loss;
  return std::nullopt;
}

std::vector<LossPoint> InTime(const std::vector<LossPoint>& val, double tokens_per_step, double iteration_s) {
  std::vector<LossPoint> t;
  for (const LossPoint& p : val) t.push_back({p.step / tokens_per_step * iteration_s, p.loss});
  return t;
}

// A row of losses at the given x, each the mean over seeds of the curves made by `curve`.
template <typename CurveOf>
std::string LossRow(const SettingRuns& s, const std::vector<double>& xs, CurveOf curve) {
  std::string row;
  for (double x : xs) {
    double sum = 0;
    int n = 0;
    for (const Run& r : s.runs) {
      if (auto l = LossAt(curve(r), x)) sum += *l, ++n;
    }
    absl::StrAppend(&row, n == static_cast<int>(s.runs.size()) ? absl::StrFormat(" %7.4f", sum / n)
                                                               : absl::StrFormat(" %7s", "-"));
  }
  return row;
}

std::string Compact(double tokens) {
  return tokens >= 1e6 ? absl::StrFormat("%.2fM", tokens / 1e6) : absl::StrFormat("%.0fk", tokens / 1e3);
}

std::string MachineLine() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      model = std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      break;
    }
  }
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return absl::StrFormat("%s, %d cores, %s", model, std::thread::hardware_concurrency(), date);
}

void PrintTables(const std::vector<SettingRuns>& all, const std::vector<SettingPenalty>& penalties, double tokens,
                 const std::string& device_line) {
  const SettingRuns& exact = all.front();
  // Validation loss against tokens, at eighths of the run.
  std::vector<double> xs;
  for (int i = 1; i <= 8; ++i) xs.push_back(tokens * i / 8);
  std::cout << "\nValidation loss (nats/byte, mean over seeds) against tokens:\n" << absl::StrFormat("%-20s", "tokens");
  for (double x : xs) std::cout << absl::StrFormat(" %7s", Compact(x));
  std::cout << "\n";
  for (const SettingRuns& s : all) {
    std::cout << absl::StrFormat("%-20s", s.setting.name)
              << LossRow(s, xs, [](const Run& r) { return r.val; }) << "\n";
  }
  // Against emulated wall-clock, at eighths of the slowest setting's run.
  double end = 0;
  for (const SettingRuns& s : all) {
    end = std::max(end, s.runs[0].val.back().step / s.runs[0].tokens_per_step * s.iteration_s);
  }
  std::vector<double> ts;
  for (int i = 1; i <= 8; ++i) ts.push_back(end * i / 8);
  std::cout << "\nValidation loss against emulated wall-clock (" << device_line << "):\n"
            << absl::StrFormat("%-20s", "seconds");
  for (double t : ts) std::cout << absl::StrFormat(" %7.2f", t);
  std::cout << "\n";
  for (const SettingRuns& s : all) {
    std::cout << absl::StrFormat("%-20s", s.setting.name) << LossRow(s, ts, [&](const Run& r) {
      return InTime(r.val, r.tokens_per_step, s.iteration_s);
    }) << "\n";
  }

  const SettingPenalty& ex = penalties.front();
  const double exact_time = tokens / exact.runs[0].tokens_per_step * exact.iteration_s;
  std::cout << absl::StrFormat(
      "\nPenalty = tokens to reach the exact path's final validation loss of the same seed / %s - 1 (linear between "
      "evaluations; mean over seeds, range in brackets); a seed that ends short of it: %s / the exact path's tokens to "
      "its final loss - 1; one above the exact path's first evaluation: the final gap, not choosable.\n"
      "Time to target = those tokens' steps x the emulated s/it; x exact = that / the exact path's whole run "
      "(%.2f s). Boundary: how many times fewer bytes than fp32 a pipeline boundary sends (activations and "
      "gradients).\n",
      Compact(tokens), Compact(tokens), exact_time);
  std::cout << absl::StrFormat("%-20s %-17s %7s %-28s %9s %10s %8s %9s\n", "setting", "final val loss", "spread",
                               "penalty (range)", "emul s/it", "to target", "x exact", "boundary");
  for (size_t i = 0; i < all.size(); ++i) {
    const SettingPenalty& p = penalties[i];
    std::vector<std::string> finals;
    for (double l : p.final_loss) finals.push_back(absl::StrFormat("%.4f", l));
    std::string penalty, time = "-", ratio = "-";
    if (p.choosable) {
      penalty = absl::StrFormat("%+.3f (%+.3f..%+.3f)", p.penalty, p.penalty_min, p.penalty_max);
      const double t = tokens * (1 + p.penalty) / all[i].runs[0].tokens_per_step * p.iteration_s;
      time = absl::StrFormat("%.2f s", t), ratio = absl::StrFormat("%.2f", t / exact_time);
    } else {
      penalty = absl::StrFormat("final gap %+.4f: none", p.final_gap);
    }
    std::cout << absl::StrFormat("%-20s %-17s %7.4f %-28s %9.4f %10s %8s %9s\n", p.name, absl::StrJoin(finals, " "),
                                 p.final_spread, penalty, p.iteration_s, time, ratio, BoundaryShrink(all[i].cfg));
  }
  // Each seed has validation windows of its own, so the seeds' final losses differ by more than
  // any setting moves them; a penalty compares each seed with the exact path's run of that seed,
  // and the range beside it is the seed-to-seed spread of that comparison.
  std::cout << absl::StrFormat(
      "The exact path's seeds end %.4f apart (each seed validates on windows of its own); each penalty compares a "
      "seed with the exact path's run of the same seed, and its range in brackets is their spread.\n",
      ex.final_spread);
}

absl::Status WriteSvg(const std::string& path, const std::vector<SettingRuns>& all, double target, double tokens) {
  static const char* kColors[] = {"#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                  "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};
  CurvePanel by_tokens, by_time;
  by_tokens.title =
      "validation loss (nats/byte) against tokens; dashed: seed 2+, gray: the exact path's mean final loss";
  by_tokens.x_label = "tokens";
  by_time.title = "the same against emulated wall-clock";
  by_time.x_label = "emulated seconds";
  double top = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t s = 0; s < all[i].runs.size(); ++s) {
      const Run& r = all[i].runs[s];
      const std::string label = s == 0 ? all[i].setting.name : "";
      by_tokens.series.push_back({label, kColors[i % 10], s > 0, r.val});
      by_time.series.push_back({label, kColors[i % 10], s > 0, InTime(r.val, r.tokens_per_step, all[i].iteration_s)});
      for (const LossPoint& p : r.val) {
        if (p.step >= tokens / 4) top = std::max(top, p.loss);
      }
    }
  }
  by_tokens.reference = by_time.reference = target;
  by_tokens.y_top = by_time.y_top = top;
  return WriteCurvesSvg(path, {by_tokens, by_time});
}

absl::StatusOr<Bench> Prepare(const std::string& config_path, const std::vector<std::string>& overrides) {
  auto base_cfg = LoadJobConfig(config_path, overrides);
  if (!base_cfg.ok()) return base_cfg.status();
  std::vector<std::string> base = overrides;
  if (g.quick) {
    LH_RETURN_IF_ERROR(CheckDivides(*base_cfg, kQuickDivisor, "--quick"));
    const std::vector<std::string> quick = ScheduleDividedOverrides(*base_cfg, kQuickDivisor);
    base.insert(base.end(), quick.begin(), quick.end());
  }
  std::vector<BenchSetting> settings;
  for (const std::string& name : g.only) {
    if (std::none_of(Settings().begin(), Settings().end(), [&](const BenchSetting& s) { return s.name == name; })) {
      std::vector<std::string> known;
      for (const BenchSetting& s : Settings()) known.push_back(absl::StrCat("\"", s.name, "\""));
      return absl::InvalidArgumentError(
          absl::StrCat("--only \"", name, "\": no such setting; the bench's are ", absl::StrJoin(known, ", ")));
    }
  }
  for (const BenchSetting& s : Settings()) {
    const bool named = std::find(g.only.begin(), g.only.end(), s.name) != g.only.end();
    const bool exact = &s == &Settings().front();
    if (g.only.empty() ? !g.quick || s.quick : exact || named) settings.push_back(s);
  }
  for (const std::string& t : g.tries) {
    auto s = ParseTry(t);
    if (!s.ok()) return s.status();
    settings.push_back(*s);
  }
  auto device = DeviceCost::Named(g.device, Precision::kBf16, g.efficiency);
  if (!device.ok()) return device.status();
  auto scenario = netem::LoadScenario(g.scenario);
  if (!scenario.ok()) return scenario.status();
  const NetworkCost network = NetworkCost::FromScenario(*scenario);
  Bench b;
  b.pricing = absl::StrFormat(
      "emulated seconds = steps x the simulator's iteration time of the setting's layout on %s (bf16 at %.3f of peak) "
      "over %s",
      g.device, g.efficiency, scenario->name);
  for (const BenchSetting& s : settings) {
    auto o = SettingOverrides(config_path, base, s);
    if (!o.ok()) return o.status();
    auto cfg = LoadJobConfig(config_path, *o);
    const std::string in = absl::StrCat("the setting '", s.name, "': ");
    if (!cfg.ok()) return absl::InvalidArgumentError(absl::StrCat(in, cfg.status().message()));
    auto it = EmulatedIterationSeconds(*cfg, *device, network);
    if (!it.ok()) return absl::InvalidArgumentError(absl::StrCat(in, it.status().message()));
    b.settings.push_back({s, *o, *cfg, *it, {}});
  }
  return b;
}

// Every setting with every seed, one line each.
absl::Status TrainAll(const std::string& self_exe, const std::string& config_path, std::vector<SettingRuns>& all,
                      double tokens) {
  const std::string root = all.front().cfg.train.out_dir;
  int done = 0;
  for (SettingRuns& s : all) {
    for (int seed = 1; seed <= g.seeds; ++seed) {
      const auto t0 = std::chrono::steady_clock::now();
      std::cout << absl::StrFormat("  [%d/%d] %s, seed %d ...", ++done, all.size() * g.seeds, s.setting.name, seed)
                << std::flush;
      auto run = TrainOnce(self_exe, config_path, s.overrides,
                           absl::StrCat(root, "/", Slug(s.setting.name), "/seed", seed), seed);
      if (!run.ok()) {
        std::cout << "\n";
        return run.status();
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cout << absl::StrFormat(" final val %.4f (%.0f s with start-up, %.0f tokens/s)\n", run->val.back().loss,
                                   seconds, tokens / seconds);
      s.runs.push_back(*std::move(run));
    }
  }
  return absl::OkStatus();
}

PenaltyTable Tabulate(const std::vector<SettingRuns>& all, double tokens) {
  PenaltyTable table;
  table.tokens = tokens;
  std::vector<std::vector<LossPoint>> exact;
  for (const Run& r : all.front().runs) {
    exact.push_back(r.val);
    table.exact_final_loss.push_back(r.val.back().loss);
  }
  for (int seed = 1; seed <= g.seeds; ++seed) table.seeds.push_back(seed);
  for (const SettingRuns& s : all) {
    std::vector<std::vector<LossPoint>> curves;
    for (const Run& r : s.runs) curves.push_back(r.val);
    SettingPenalty p = MeasurePenalty(curves, exact, tokens);
    p.name = s.setting.name;
    p.overrides = s.setting.overrides;
    p.batch_scale = s.setting.batch_scale;
    p.stages = s.cfg.cluster.stages;
    p.iteration_s = s.iteration_s;
    table.settings.push_back(std::move(p));
  }
  return table;
}

}  // namespace

CLI::App* AddConvergenceCommand(CLI::App& app) {
  CLI::App* c = app.add_subcommand(
      "convergence", "the convergence bench: every numerics-changing setting trained on the same tokens, its "
                     "penalty against the exact path, curves as SVG, penalties for the planner");
  c->add_flag("--quick", g.quick, "a subset of the settings on an eighth of the tokens (the test suite's check)");
  c->add_option("--seeds", g.seeds, "seeds per setting (train.seed 1..N)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  c->add_option("--device", g.device, "the device whose pace the emulated wall-clock is at (as `longhaul plan`)")
      ->capture_default_str();
  c->add_option("--efficiency", g.efficiency, "fraction of the device's peak a block reaches")->capture_default_str();
  c->add_option("--scenario", g.scenario, "the network of the emulated wall-clock (worker w on host w)")
      ->capture_default_str();
  c->add_option("--penalties", g.penalties,
                "where to write the penalties file (default: train.out_dir/penalties.toml)");
  c->add_option("--try", g.tries, "one more setting, \"NAME: KEY=VALUE[; KEY=VALUE...]\" (repeatable)");
  c->add_option("--only", g.only,
                "run only these of the bench's settings (by name, repeatable) beside the exact path and any --try");
  return c;
}

int RunConvergenceCommand(const std::string& self_exe, const std::string& config_path,
                          const std::vector<std::string>& overrides, const std::string& command_line) {
  const auto start = std::chrono::steady_clock::now();
  auto bench = Prepare(config_path, overrides);
  if (!bench.ok()) return Error(std::string(bench.status().message()));
  std::vector<SettingRuns>& all = bench->settings;
  const JobConfig& exact = all.front().cfg;
  const double tokens = static_cast<double>(exact.train.steps) * static_cast<double>(exact.tokens_per_step());
  const ModelConfig& m = exact.model;
  auto data = LoadDataset(exact);
  if (!data.ok()) return Error(std::string(data.status().message()));
  const std::string model = absl::StrFormat(
      "GPT %d layers, d_model %d, %d heads, vocab %d, seq %d (%.1fM parameters)", m.n_layer, m.d_model, m.n_head,
      m.vocab_size, exact.train.seq_len, StageParamCount(m, StageSpec::Whole(m)) / 1e6);
  std::cout << absl::StrFormat(
      "longhaul convergence: %s\n  on %s\n  %d settings x %d seeds (train.seed: initial parameters, data order, "
      "validation windows), %s tokens each (%d steps of %d x %d x %d replicas x %d tokens for the exact path), "
      "%d stage x %d replicas over loopback\n",
      model, data->description(), all.size(), g.seeds, Compact(tokens), exact.train.steps, exact.train.micro_batches,
      exact.train.micro_batch_size, exact.cluster.replicas, exact.train.seq_len, exact.cluster.stages,
      exact.cluster.replicas);
  if (absl::Status s = TrainAll(self_exe, config_path, all, tokens); !s.ok()) {
    std::cerr << "longhaul: error: " << s.message() << "\n";
    return 1;
  }
  PenaltyTable table = Tabulate(all, tokens);
  table.model = model, table.corpus = data->description(), table.measured_on = MachineLine();
  table.command = command_line;
  PrintTables(all, table.settings, tokens, bench->pricing);

  double target = 0;
  for (double l : table.exact_final_loss) target += l / static_cast<double>(table.exact_final_loss.size());
  const std::string root = exact.train.out_dir;
  const std::string svg = (fs::path(root) / "convergence.svg").string();
  const std::string penalties = g.penalties.empty() ? (fs::path(root) / "penalties.toml").string() : g.penalties;
  if (absl::Status s = WriteSvg(svg, all, target, tokens); !s.ok()) return Error(std::string(s.message()));
  std::error_code ec;
  if (fs::path(penalties).has_parent_path()) fs::create_directories(fs::path(penalties).parent_path(), ec);
  if (absl::Status s = WritePenaltyTable(penalties, table); !s.ok()) return Error(std::string(s.message()));
  std::cout << absl::StrFormat("\ncurves: %s; penalties: %s; runs under %s/; %.0f s in all on %s\n", svg, penalties,
                               root, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                               table.measured_on);
  return 0;
}

}  // namespace longhaul
