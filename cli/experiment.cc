#include "cli/experiment.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/local_cluster.h"
#include "config/job_config.h"
#include "metrics/metrics_log.h"
#include "plan/cost_model.h"
#include "scenario/scenario.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

// The source experiment's figures (seeds/001, pipeline only, micro-batch 1).
constexpr double kSourceBoundaryBytes = 2048.0 * 2048 * 4;          // one micro-batch's activations, fp32
constexpr double kSourceComputeSeconds = 15.16 / (64 + 12 - 1);     // per micro-batch per stage, GPipe

// The source's stage (2 GPT-3 XL blocks, one sequence of 2048) at `pace`: its compute per
// micro-batch, forward and backward, and how to say so.
absl::StatusOr<std::pair<double, std::string>> PacePerMicro(const ExperimentPace& pace) {
  if (pace.device == "v100") return std::make_pair(kSourceComputeSeconds, std::string("the source's V100s (measured)"));
  const bool file = absl::EndsWith(pace.device, ".toml");
  absl::StatusOr<DeviceCost> device = file ? DeviceCost::LoadProfile(pace.device)
                                           : DeviceCost::Named(pace.device, Precision::kBf16, pace.efficiency);
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--pace ", pace.device, ": ", device.status().message()));
  }
  WorkShape w;
  w.model.n_layer = 24, w.model.d_model = 2048, w.model.n_head = 16, w.model.vocab_size = 50257;
  w.model.max_seq_len = 2048;
  w.seq_len = 2048, w.micro_batch = 1;
  absl::StatusOr<ComputeTimes> block = absl::UnknownError("");
  for (Precision p : {Precision::kBf16, Precision::kFp32}) {
    w.precision = p;
    if ((block = device->Block(w)).ok()) break;
  }
  if (!block.ok()) return absl::InvalidArgumentError(absl::StrCat("--pace ", pace.device, ": ", block.status().message()));
  const std::string how = file ? absl::StrCat(device->name(), "'s profile, ", PrecisionName(w.precision))
                               : absl::StrFormat("%s at %.2f of its bf16 peak", device->name(), pace.efficiency);
  return std::make_pair(2 * (block->forward_s + block->backward_s), how);
}
struct Setting {
  const char* file;
  const char* label;
  double source_seconds;     // DP 1
  double source_dp_seconds;  // DP 4; 0 where the seed has no figure
};
constexpr Setting kSettings[] = {
    {"source-default.toml", "default (0.05 ms, 10 Gbit/s)", 15.16, 16.17},
    {"source-1ms-5gbit.toml", "1 ms, 5 Gbit/s", 15.49, 17.55},
    {"source-5ms-2gbit.toml", "5 ms, 2 Gbit/s", 16.80, 21.99},
    {"source-10ms-1gbit.toml", "10 ms, 1 Gbit/s", 22.90, 33.39},
    {"source-50ms-1gbit.toml", "50 ms, 1 Gbit/s", 29.08, 0},
};

// The source ran GPipe with fp32 activations and a central parameter server, the exchange after
// the last backward of every iteration and before the next forward; longhaul's defaults are the
// job config's own. Communication stays fixed even where the job lets the coordinator choose it, or
// the coordinator would replace the source's wire with its choice.
const std::vector<std::string> kLikeTheSource = {
    "cluster.communication=\"fixed\"",
    "transport.wire_dtype=\"fp32\"",
    "transport.exchange_dtype=\"auto\"",
    "transport.gradient_dtype=\"auto\"",
    "cluster.ps=\"central\"",
    "cluster.overlap_exchange=false",
    "train.local_steps=1",
    "train.overlap_outer=false",
    "model.subspace_divisor=1",
    "transport.boundary_rank_divisor=1",
    "transport.gradient_rank_divisor=0",
    "transport.shared_directions=false"};

// With data parallelism: the source's DP 4 scaled down to 2 replicas (8 workers share this
// machine's cores). Its stage's exchange (2 GPT-3 XL blocks, 403 MB in fp32) weighed 0.375 of
// its 64 micro-batches' activations; one of our blocks (7.1 MB) weighs that against 48
// micro-batches of 384 KiB, so the exchange keeps the source's proportion to the pipeline's
// transfers.
const std::vector<std::string> kWithDataParallelism = {"cluster.replicas=2", "train.micro_batches=48"};

// Runs `local` with its output in `log`; returns the run's summary.json, or null.
nlohmann::json RunQuietly(const std::string& self_exe, const std::string& config_path,
                          std::vector<std::string> overrides, const std::string& out_dir, const std::string& scenario,
                          const std::string& emulation) {
  overrides.push_back("train.out_dir=" + out_dir);
  fs::create_directories(out_dir);
  const int rc = RunLocalClusterLogged((fs::path(out_dir) / "log.txt").string(), self_exe, config_path, overrides,
                                       scenario, emulation);
  std::ifstream f(fs::path(out_dir) / "summary.json");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (rc != 0 || j.is_discarded()) {
    std::cerr << "longhaul experiment: the run in " << out_dir << " failed; see " << out_dir << "/log.txt\n";
    return nullptr;
  }
  // The fields read below, checked: the file is read back from disk. A run over a scenario carries
  // the coordinator's prediction.
  bool complete = j.is_object() && j.contains("iteration_seconds") && j["iteration_seconds"].is_number() &&
                  j.contains("workers") && j["workers"].is_array() &&
                  (scenario.empty() || (j.contains("predicted_iteration_seconds") &&
                                        j["predicted_iteration_seconds"].is_number()));
  for (size_t i = 0; complete && i < j["workers"].size(); ++i) {
    const nlohmann::json& w = j["workers"][i];
    complete = w.is_object() && w.contains("compute_seconds") && w["compute_seconds"].is_number();
  }
  if (!complete) {
    std::cerr << "longhaul experiment: " << out_dir << "/summary.json lacks iteration_seconds, the workers' "
              << "compute_seconds or the predicted_iteration_seconds; run the experiment again\n";
    return nullptr;
  }
  return j;
}

// The setting the coordinator chose for the run in `dir` where its job let it (cluster.communication
// = "auto"), from the run's cluster.json; empty where it chose none.
std::string ChosenCommunication(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "cluster.json");
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("communication")) return "";
  const nlohmann::json& c = j["communication"];
  return c.is_object() && c.contains("chosen") && c["chosen"].is_string() ? c["chosen"].get<std::string>() : "";
}

}  // namespace

int RunExperiment(const std::string& self_exe, const std::string& config_path,
                  const std::vector<std::string>& overrides, const std::string& emulation, bool with_dp,
                  const ExperimentPace& pace) {
  auto cfg = LoadJobConfig(config_path, overrides);
  if (!cfg.ok()) {
    std::cerr << "longhaul: error: " << cfg.status().message() << "\n";
    return 2;
  }
  const int64_t H = cfg->train.local_steps;
  if (H > 1 && cfg->train.steps < 3 * H) {
    std::cerr << absl::StrFormat(
        "longhaul: error: train.steps = %d with train.local_steps = %d: a figure with local updates is the mean over "
        "whole rounds but the first and the last, so the runs need at least 3 rounds: set train.steps to %d or more\n",
        cfg->train.steps, H, 3 * H);
    return 2;
  }
  const absl::StatusOr<std::pair<double, std::string>> paced = PacePerMicro(pace);
  if (!paced.ok()) {
    std::cerr << "longhaul: error: " << paced.status().message() << "\n";
    return 2;
  }
  // Named, not a structured binding: clang lets no lambda capture one, and the scaling below does.
  const double pace_seconds = paced->first;
  const std::string& pace_name = paced->second;
  const bool source_pace = pace.device == "v100";
  const std::string root = cfg->train.out_dir;
  const std::string scenarios = (fs::path(self_exe).parent_path().parent_path() / "netem" / "scenarios").string();
  const std::string scenario_dir = fs::exists(scenarios) ? scenarios : "netem/scenarios";
  // In fp32 whatever the job's wire dtype: the source sent fp32, and the scaled rates must keep its
  // transfer-to-compute proportion, so a narrower wire shows as the gain it is.
  const double boundary = 4.0 * static_cast<double>(cfg->boundary(false).kept_floats());
  std::cout << absl::StrFormat("longhaul experiment: %d stages, micro-batches of %d x %d tokens, d_model %d, %s\n"
                               "  at the pace of %s: %.1f ms per micro-batch per stage of the source's model\n",
                               cfg->cluster.stages, cfg->train.micro_batch_size, cfg->train.seq_len,
                               cfg->model.d_model, ScheduleName(cfg->cluster.schedule), pace_name, pace_seconds * 1e3);
  // Each layout's settings, scaled: (setting, scenario file). The layout is first run on loopback
  // to measure its compute per micro-batch per stage under its own sharing of this machine's cores
  // (8 workers compute slower than 4), then the source's settings are scaled so that delay /
  // compute and transfer / compute stay as there at the pace's compute: delays x k, rates x (our
  // boundary bytes / theirs) / k, with k = our compute / the pace's.
  using Scaled = std::vector<std::pair<const Setting*, std::string>>;
  auto scale = [&](bool dp, const std::vector<std::string>& o) -> std::optional<Scaled> {
    auto layout = LoadJobConfig(config_path, o);
    if (!layout.ok()) {
      std::cerr << "longhaul: error: " << layout.status().message() << "\n";
      return std::nullopt;
    }
    const std::string tag = dp ? "dp2" : "pp";
    std::cout << absl::StrFormat("  %s: %d x %d, %d micro-batches; calibrating on loopback...", tag,
                                 layout->cluster.stages, layout->cluster.replicas, layout->train.micro_batches)
              << std::flush;
    nlohmann::json calib =
        RunQuietly(self_exe, config_path, o, absl::StrCat(root, "/", tag, "/calibration"), "", emulation);
    if (calib.is_null()) return std::nullopt;
    double compute = 0;
    for (auto& w : calib["workers"]) compute = std::max(compute, w["compute_seconds"].get<double>());
    const double per_micro = compute / layout->train.micro_batches;
    const double k = per_micro / pace_seconds;
    const double rate_scale = boundary / kSourceBoundaryBytes / k;
    std::cout << absl::StrFormat(
        "\n    compute per micro-batch per stage: %.1f ms here, %.1f ms at the pace: time scale k = %.3f\n"
        "    activations per micro-batch: %.0f KiB here, 16 MiB there: rates x %.4f, delays x %.3f\n",
        per_micro * 1e3, pace_seconds * 1e3, k, boundary / 1024, rate_scale, k);
    Scaled out;
    for (const Setting& s : kSettings) {
      auto src = netem::LoadScenario((fs::path(scenario_dir) / s.file).string());
      if (!src.ok()) {
        std::cerr << "longhaul: error: " << src.status().message() << "\n";
        return std::nullopt;
      }
      netem::Link l = src->Between(0, 1);
      l.delay_ms *= k;
      l.rate_mbit *= rate_scale;
      const std::string dir = absl::StrCat(root, "/", tag, "/", fs::path(s.file).stem().string());
      fs::create_directories(dir);
      const std::string file = dir + "/scenario.toml";
      std::ofstream(file, std::ios::trunc) << absl::StrFormat(
          "description = \"%s, scaled: delay x %.3f, rate x %.4f\"\ndelays_are = \"one-way\"\nsites = [\"cluster\"]\n"
          "delay_ms = [[%.4f]]\nrate_mbit = [[%.3f]]\n",
          s.label, k, rate_scale, l.delay_ms, l.rate_mbit);
      out.push_back({&s, file});
    }
    return out;
  };

  struct Cell {
    double seconds = 0, predicted = 0;
    std::string chosen;  // the coordinator's choice of communication, if it made one
  };
  // [layout][variant][setting]
  const std::vector<bool> dp_layouts = with_dp ? std::vector<bool>{false, true} : std::vector<bool>{false};
  const char* variants[] = {"like-source", "defaults"};
  std::vector<std::vector<std::vector<Cell>>> cells(2, std::vector<std::vector<Cell>>(2));
  std::vector<Scaled> scaled(2);
  for (bool dp : dp_layouts) {
    std::vector<std::string> layout = overrides;
    if (dp) layout.insert(layout.end(), kWithDataParallelism.begin(), kWithDataParallelism.end());
    std::optional<Scaled> settings = scale(dp, layout);
    if (!settings) return 1;
    scaled[dp] = *std::move(settings);
    for (int v = 0; v < 2; ++v) {
      for (const auto& [s, file] : scaled[dp]) {
        std::vector<std::string> o = layout;
        if (v == 0) o.insert(o.end(), kLikeTheSource.begin(), kLikeTheSource.end());
        const std::string dir = absl::StrCat(fs::path(file).parent_path().string(), "/", variants[v]);
        std::cout << absl::StrFormat("  %-13s %-11s %-28s ...", dp ? "with DP" : "pipeline only", variants[v], s->label)
                  << std::flush;
        nlohmann::json run = RunQuietly(self_exe, config_path, o, dir, file, emulation);
        if (run.is_null()) return 1;
        // The coordinator's prediction from the compute this run measured (plan/measured_prediction.h),
        // not the loopback calibration's: on this 2-core machine the emulation (the namespaces' packet
        // path, the delay daemon) takes CPU from the workers, and the simulator is checked here on the
        // schedule and the links, not on predicting that contention.
        const absl::StatusOr<std::vector<MetricsRow>> rows = ReadMetrics((fs::path(dir) / "metrics.csv").string());
        const std::optional<double> steady =
            rows.ok() ? SteadyStepSeconds(*rows, v == 0 ? 1 : cfg->train.local_steps) : std::nullopt;
        const Cell& cell = cells[dp][v].emplace_back(Cell{steady.value_or(run["iteration_seconds"].get<double>()),
                                                          run["predicted_iteration_seconds"].get<double>(),
                                                          ChosenCommunication(dir)});
        std::cout << absl::StrFormat(" %.3f s per iteration (predicted %.3f s)%s\n", cell.seconds, cell.predicted,
                                     cell.chosen.empty() ? "" : "; the coordinator chose " + cell.chosen);
      }
    }
  }

  for (bool dp : dp_layouts) {
    std::cout << absl::StrFormat(
        "\nIteration time (stage 0 replica 0's wall time per step, median after the first two%s), GPipe, %s; ratio "
        "= to the default setting's in the same column:\n",
        H > 1 ? absl::StrFormat("; longhaul's with %d local steps: the mean over whole rounds but the first and last", H)
              : "",
        dp ? "with data parallelism (the source's DP 4, here 2 replicas of 48 micro-batches)" : "pipeline only");
    std::cout << absl::StrFormat("%-30s %8s %6s %20s %6s %20s %6s %9s %9s %9s\n", "setting", "source", "ratio",
                                 "like the source (s)", "ratio", "longhaul defaults", "ratio", "defaults/", "predicted",
                                 "pred/meas");
    std::cout << absl::StrFormat("%-30s %8s %6s %20s %6s %20s %6s %9s %9s %9s\n", "", "(s)", "", "", "", "(s)", "",
                                 "like src", "(s)", "");
    for (size_t i = 0; i < scaled[dp].size(); ++i) {
      const Setting& s = *scaled[dp][i].first;
      // The source measured at its own pace only.
      const double src = !source_pace ? 0 : dp ? s.source_dp_seconds : s.source_seconds;
      const double src0 = dp ? kSettings[0].source_dp_seconds : kSettings[0].source_seconds;
      const Cell& like = cells[dp][0][i];
      const Cell& ours = cells[dp][1][i];
      std::cout << absl::StrFormat("%-30s %8s %6s %20.3f %6.2f %20.3f %6.2f %9.2f %9.3f %9.3f\n", s.label,
                                   src > 0 ? absl::StrFormat("%.2f", src) : "-",
                                   src > 0 ? absl::StrFormat("%.2f", src / src0) : "-", like.seconds,
                                   like.seconds / cells[dp][0][0].seconds, ours.seconds,
                                   ours.seconds / cells[dp][1][0].seconds, ours.seconds / like.seconds, ours.predicted,
                                   ours.predicted / ours.seconds);
    }
    for (size_t i = 0; i < scaled[dp].size(); ++i) {
      if (!cells[dp][1][i].chosen.empty())
        std::cout << absl::StrFormat("  longhaul at %s: %s (cluster.communication = \"auto\")\n",
                                     scaled[dp][i].first->label, cells[dp][1][i].chosen);
    }
  }
  std::cout << "like the source: fp32 activations, central parameter server, no overlap of the exchange with "
               "compute; longhaul defaults: the config's own ("
            << (cfg->cluster.choose_communication
                    ? "its communication as the coordinator chose it, above"
                    : "transport.wire_dtype \"auto\": int8 on these links")
            << "; sharded parameter servers; the exchange overlapped)\n"
               "predicted: the planner's simulator (runtime/plan/simulator.h) with the run's own compute per "
               "micro-batch per stage and the emulated links, for the defaults' run\n";
  std::cout << "(each run's log, timeline and metrics are under " << root << "/)\n";
  return 0;
}

}  // namespace longhaul
