#pragma once
// What the coordinator records of a run: once every worker has reported an iteration, one
// metrics.csv row and (every train.log_every steps) a progress line; each worker's split of its
// time; and at the end summary.json, the loss curve, the workers' merged timeline and the summary
// lines. Iteration time is stage 0 of replica 0's, as in the source experiment; means are over
// the iterations after this process's first.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "config/job_config.h"
#include "longhaul.pb.h"
#include "metrics/metrics_log.h"
#include "plan/measured_prediction.h"

namespace longhaul {

// An iteration's training loss and its floor from its reports: the last stage's replicas' means,
// each weighted by the micro-batches it ran (JobConfig::MicroBatchesOf), which is the mean over
// every micro-batch of the step however the replicas share them.
struct StepLoss {
  double loss = 0, floor = 0;
};
StepLoss MeanOverMicroBatches(const JobConfig& cfg, int stages, const std::map<int, proto::IterationReport>& reports);

class RunLog {
 public:
  // A run of iterations [start, end) of `cfg`'s job, appending to `metrics`.
  RunLog(const JobConfig& cfg, int64_t start, int64_t end, MetricsLog metrics);

  // Every worker's report of iteration `it` under a plan of `stages` stages (its last has the
  // loss), by worker id: appends its metrics row (the error is the file's) and prints the
  // progress line when one is due.
  absl::Status Record(int64_t it, int stages, const std::map<int, proto::IterationReport>& reports);

  // A replan sent every worker back to step `step`: metrics.csv forgets the rows after it, and the
  // next iteration, which waits for the new plan's setup, is not timed.
  absl::Status Rewind(int64_t step);

  // What is known of the run, finished or not. `status`: "completed", "interrupted" or "failed",
  // with `reason` unless completed; `replica_checks`: iterations whose replicas were compared.
  nlohmann::json Summary(const std::string& status, const std::string& reason, int64_t replica_checks) const;
  // metrics.csv is complete already; writes the loss curve, the timeline merged from `traces` (the
  // workers' own, where they exist) and summary.json, and says what it wrote.
  void Write(const nlohmann::json& summary, const std::vector<std::string>& traces) const;
  // The closing lines: throughput, the prediction against it, and where each worker's time went.
  void PrintSummary(const nlohmann::json& summary) const;

  // Each worker's mean compute seconds per micro-batch and own step's seconds per iteration over
  // the timed iterations (by worker id), or empty until every worker has a timed iteration.
  MeasuredCompute MeasuredByWorker() const;
  // The planner's iteration time for this run, which Summary records beside the measured one.
  void SetPrediction(double seconds) { predicted_ = seconds; }
  // The same with the hosts' network cards left out, where the network has any: how far off a
  // model without them would have been.
  void SetPredictionWithoutCards(double seconds) { predicted_without_cards_ = seconds; }
  // How the plan placed the workers (the coordinator's record), which Summary carries.
  void SetPlacement(nlohmann::json placement) { placement_ = std::move(placement); }
  // The workers that were ever stragglers (stragglers.h), which Summary carries.
  void SetStragglers(nlohmann::json stragglers) { stragglers_ = std::move(stragglers); }

 private:
  struct WorkerTimes {
    int stage = 0, replica = 0, iterations = 0;
    // compute_per_micro: each iteration's compute over the micro-batches its report names (a
    // shrunk plan's replica runs those of several).
    double seconds = 0, compute = 0, compute_per_micro = 0, wait = 0, step = 0;
  };
  std::string LossSvg() const;

  const JobConfig cfg_;
  const int64_t first_;  // the run's first iteration
  int64_t start_;        // the current plan's
  const int64_t end_;
  const int workers_;
  const double flops_;  // per iteration, every replica
  MetricsLog metrics_;
  double timed_seconds_ = 0;
  int64_t timed_ = 0;
  std::map<int, WorkerTimes> times_;  // by worker id, iterations after the first
  // When the first and the latest iteration of this run completed, and the latter's step: wall
  // time per committed step, whatever was redone between.
  std::chrono::steady_clock::time_point first_done_, last_done_;
  int64_t first_done_step_ = -1, last_done_step_ = -1;
  double predicted_ = -1, predicted_without_cards_ = -1;
  nlohmann::json placement_;
  nlohmann::json stragglers_ = nlohmann::json::array();
};

}  // namespace longhaul
