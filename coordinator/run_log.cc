#include "coordinator/run_log.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "metrics/flops.h"
#include "metrics/timeline.h"
#include "util/atomic_file.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

}  // namespace

RunLog::RunLog(const JobConfig& cfg, int64_t start, int64_t end, MetricsLog metrics)
    : cfg_(cfg), first_(start), start_(start), end_(end), workers_(cfg.cluster.stages * cfg.cluster.replicas),
      flops_(ModelFlopsPerIteration(cfg.model,
                                    static_cast<int64_t>(cfg.train.micro_batch_size) * cfg.GlobalMicroBatches(),
                                    cfg.train.seq_len, cfg.train.recompute)),
      metrics_(std::move(metrics)) {}

absl::Status RunLog::Rewind(int64_t step) {
  start_ = step;
  // As the audit's: read and rewritten whole only where it records steps to forget.
  if (metrics_.rows().empty() || metrics_.rows().back().step <= step) return absl::OkStatus();
  absl::StatusOr<MetricsLog> rewound = MetricsLog::Resume(metrics_.path(), step);
  if (!rewound.ok()) return rewound.status();
  metrics_ = *std::move(rewound);
  return absl::OkStatus();
}

std::string RunLog::LossSvg() const { return (fs::path(cfg_.train.out_dir) / "loss.svg").string(); }

StepLoss MeanOverMicroBatches(const JobConfig& cfg, int stages, const std::map<int, proto::IterationReport>& reports) {
  StepLoss mean;
  double weight = 0;
  for (const auto& [id, r] : reports) {
    if (r.stage() != stages - 1) continue;
    // A shrunk plan's replicas run equal shares, which any equal weights average.
    const double w = cfg.MicroBatchesOf(r.replica());
    mean.loss += w * r.loss(), mean.floor += w * r.floor(), weight += w;
  }
  if (weight > 0) mean.loss /= weight, mean.floor /= weight;
  return mean;
}

absl::Status RunLog::Record(int64_t it, int stages, const std::map<int, proto::IterationReport>& reports) {
  const auto [loss, floor] = MeanOverMicroBatches(cfg_, stages, reports);
  double norm = 0, lr = 0, sec = 0, val_sum = 0;
  int val_batches = 0;
  for (const auto& [id, r] : reports) {
    val_sum += r.val_loss_sum(), val_batches += r.val_batches();
    if (r.lr() > 0) norm = r.grad_norm(), lr = r.lr();
    if (r.stage() == 0 && r.replica() == 0) sec = r.seconds();
    if (it == start_) continue;
    WorkerTimes& w = times_[id];
    w.stage = r.stage(), w.replica = r.replica(), ++w.iterations;
    w.seconds += r.seconds(), w.compute += r.compute_seconds(), w.wait += r.wait_seconds();
    w.compute_per_micro += r.compute_seconds() / std::max(1, r.micro_batches_size());
    w.step += r.step_seconds();
  }
  if (it > start_) timed_seconds_ += sec, ++timed_;
  const double mean = timed_ > 0 ? timed_seconds_ / timed_ : sec;
  const int64_t step = it + 1, steps = cfg_.train.steps;
  const double val = val_batches > 0 ? val_sum / val_batches : -1;
  const MetricsRow row = {.step = step, .loss = loss, .floor = floor, .val_loss = val, .lr = lr, .grad_norm = norm,
                          .seconds = sec, .tokens_per_s = cfg_.tokens_per_step() / sec};
  const absl::Status appended = metrics_.Append(row);
  last_done_ = std::chrono::steady_clock::now();
  last_done_step_ = step;
  if (first_done_step_ < 0) first_done_ = last_done_, first_done_step_ = step;
  if (step % cfg_.train.log_every == 0 || step == end_ || it == start_) {
    std::string line = absl::StrFormat("iter %*d/%d | loss %.4f", static_cast<int>(std::to_string(steps).size()), step,
                                       steps, loss);
    if (floor >= 0) absl::StrAppend(&line, absl::StrFormat(" (floor %.4f)", floor));
    if (val >= 0) absl::StrAppend(&line, absl::StrFormat(" | val %.4f", val));
    absl::StrAppend(&line, absl::StrFormat(" | lr %.2e | norm %.3f | %.3f s/it | %.0f tok/s | %.4f TFLOPs/worker | "
                                           "%.1f days/100B tok | ETA %s",
                                           lr, norm, sec, cfg_.tokens_per_step() / mean, flops_ / mean / 1e12 / workers_,
                                           DaysFor100BTokens(cfg_.tokens_per_step() / mean),
                                           FormatDuration(mean * (end_ - step))));
    std::cout << line << "\n" << std::flush;
    metrics_.DrawLossCurve(LossSvg()).IgnoreError();  // redrawn at the end, where a failure is reported
  }
  return appended;
}

nlohmann::json RunLog::Summary(const std::string& status, const std::string& reason, int64_t replica_checks) const {
  const std::vector<MetricsRow>& rows = metrics_.rows();
  nlohmann::json s = {{"status", status},
                      {"steps", cfg_.train.steps},
                      {"first_step", first_ + 1},
                      {"last_step", rows.empty() ? first_ : rows.back().step},
                      {"final_loss", rows.empty() ? nlohmann::json() : nlohmann::json(rows.back().loss)},
                      {"iteration_seconds", nullptr},
                      {"predicted_iteration_seconds", predicted_ >= 0 ? nlohmann::json(predicted_) : nlohmann::json()},
                      {"tokens_per_second", nullptr},
                      {"replica_checks", replica_checks},
                      {"placement", placement_},
                      {"stragglers", stragglers_},
                      {"workers", nlohmann::json::array()}};
  if (!reason.empty()) s["reason"] = reason;
  if (predicted_without_cards_ >= 0) s["predicted_without_cards_iteration_seconds"] = predicted_without_cards_;
  if (last_done_step_ > first_done_step_) {
    const double wall = std::chrono::duration<double>(last_done_ - first_done_).count();
    s["wall_seconds_per_step"] = wall / static_cast<double>(last_done_step_ - first_done_step_);
  }
  if (timed_ > 0) {
    const double sec = timed_seconds_ / timed_;
    s["iteration_seconds"] = sec;
    s["tokens_per_second"] = cfg_.tokens_per_step() / sec;
  }
  for (const auto& [id, w] : times_) {
    const double n = w.iterations;
    s["workers"].push_back({{"worker", id}, {"stage", w.stage}, {"replica", w.replica}, {"seconds", w.seconds / n},
                            {"compute_seconds", w.compute / n}, {"wait_seconds", w.wait / n},
                            {"step_seconds", w.step / n}});
  }
  return s;
}

void RunLog::Write(const nlohmann::json& summary, const std::vector<std::string>& traces) const {
  const fs::path dir(cfg_.train.out_dir);
  std::vector<std::string> written = {absl::StrFormat("metrics.csv (%d steps)", metrics_.rows().size())};
  auto note = [&](const std::string& what, const absl::Status& st) {
    if (st.ok()) {
      written.push_back(what);
    } else {
      std::cout << "coordinator: " << st.message() << "\n";
    }
  };
  note("loss.svg", metrics_.DrawLossCurve(LossSvg()));
  if (!traces.empty()) {
    // Spares that ran count too, and lost workers' traces are lost with them: not "of" the layout.
    note(absl::StrFormat("timeline.json (traces of %d workers; open in https://ui.perfetto.dev or chrome://tracing)",
                         traces.size()),
         MergeTraces(traces, (dir / "timeline.json").string()));
  }
  note("summary.json", WriteFileAtomically((dir / "summary.json").string(), summary.dump(2) + "\n"));
  std::cout << "coordinator: records in " << dir.string() << ": " << absl::StrJoin(written, ", ") << "\n" << std::flush;
}

MeasuredCompute RunLog::MeasuredByWorker() const {
  if (static_cast<int>(times_.size()) != workers_) return {};
  MeasuredCompute out{std::vector<double>(workers_, 0), std::vector<double>(workers_, 0)};
  for (const auto& [id, w] : times_) {
    out.per_micro[id] = w.compute_per_micro / w.iterations;
    out.step[id] = w.step / w.iterations;
  }
  return out;
}

void RunLog::PrintSummary(const nlohmann::json& s) const {
  if (timed_ == 0) return;
  const double sec = s["iteration_seconds"], tps = s["tokens_per_second"];
  // A run that went on from a checkpoint counts its steps from the job's start, and says how many
  // this coordinator ran.
  const std::string iterations =
      first_ > 0 ? absl::StrFormat("%d iterations (the last %d here, from step %d)", end_, end_ - first_, first_)
                 : absl::StrFormat("%d iterations", end_);
  std::cout << absl::StrFormat(
      "done: %s | final loss %.4f | iteration time %.3f s (stage 0 replica 0, mean after the first) | "
      "%.0f tokens/s | %.4f TFLOPs per worker [%s / time / %d workers] | %.1f days per 100B tokens\n",
      iterations, s["final_loss"].get<double>(), sec, tps, flops_ / sec / 1e12 / workers_,
      FlopsFormulaName(cfg_.train.recompute), workers_, DaysFor100BTokens(tps));
  if (s["predicted_iteration_seconds"].is_number()) {
    const double predicted = s["predicted_iteration_seconds"];
    std::cout << absl::StrFormat("predicted %.3f s per iteration by the planner's simulator (compute as measured, the "
                                 "links as given or probed): predicted / measured = %.3f\n",
                                 predicted, predicted / sec);
  }
  std::cout << "time per iteration by worker (mean after the first): compute = forward + backward, wait = blocked on "
               "activations, gradients and parameters, other = the rest (sampling, PS step, sends)\n";
  for (const nlohmann::json& w : s["workers"]) {
    const double total = w["seconds"], compute = w["compute_seconds"], wait = w["wait_seconds"];
    std::cout << absl::StrFormat("  worker %d (stage %d, replica %d): %.3f s = compute %.3f + wait %.3f + other %.3f\n",
                                 w["worker"].get<int>(), w["stage"].get<int>(), w["replica"].get<int>(), total, compute,
                                 wait, total - compute - wait);
  }
  const int64_t checks = s["replica_checks"];
  if (checks > 0) {
    std::cout << absl::StrFormat("  every stage's %d replicas held bitwise the same parameters after each of %d "
                                 "iterations (CRC-32C compared by the coordinator)\n",
                                 cfg_.cluster.replicas, checks);
  }
  std::cout << std::flush;
}

}  // namespace longhaul
