#pragma once
// What a monitor scrapes from the coordinator (Prometheus's text format, metrics_endpoint.h) and
// what it writes beside metrics.csv as metrics.prom: per worker its last iteration's time, compute,
// wait and tokens/s and the tensor connections it refused; the job's step, loss and tokens/s; per
// link the bytes sent and the round trip known for it (measured at join, or the scenario's); and
// the failures: calls refused at the coordinator's port, workers lost, whether the job failed.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "config/job_config.h"
#include "coordinator/stragglers.h"
#include "longhaul.pb.h"
#include "plan/cost_model.h"

namespace longhaul {

class JobMetrics {
 public:
  explicit JobMetrics(const JobConfig& cfg);
  // The plan's workers: which (stage, replica) each runs, on which host.
  void SetPlan(const proto::Plan& plan, const std::map<int, proto::RegisterRequest>& registrations);
  // The links' round trips, worker w on host w (the scenario's, or what the workers measured).
  void SetLinks(const NetworkCost& network, std::string source);
  // A worker's report of an iteration. Refused (nothing recorded) where it names a peer the plan
  // does not have.
  absl::Status Report(const proto::IterationReport& report);
  // Every worker has reported iteration `it`.
  void Complete(int64_t it, const std::map<int, proto::IterationReport>& reports);
  void WorkerLost() { absl::MutexLock lock(&mu_); ++lost_; }
  // Each worker's slowdown (stragglers.h), as the run measures it.
  void SetSlowdowns(std::map<int, Slowdown> slowdowns) {
    absl::MutexLock lock(&mu_);
    slowdowns_ = std::move(slowdowns);
  }
  void Failed() { absl::MutexLock lock(&mu_); failed_ = true; }
  // Everything above, and `refused_calls` made to the coordinator's port without the job secret.
  std::string Render(int64_t refused_calls) const;

 private:
  struct Worker {
    int stage = 0, replica = 0;
    std::string host, address;
    std::optional<proto::IterationReport> last;
  };
  const JobConfig cfg_;
  // The coordinator's job reports under its own lock; the metrics endpoint renders from its own
  // thread.
  mutable absl::Mutex mu_;
  int stages_ ABSL_GUARDED_BY(mu_);  // the plan's
  std::map<int, Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, int>, int> worker_at_ ABSL_GUARDED_BY(mu_);  // (stage, replica) -> worker id
  std::map<std::pair<int, int>, uint64_t> sent_ ABSL_GUARDED_BY(mu_);  // (from worker, to worker) -> bytes
  std::map<int, Slowdown> slowdowns_ ABSL_GUARDED_BY(mu_);
  std::optional<NetworkCost> network_ ABSL_GUARDED_BY(mu_);
  std::string links_source_ ABSL_GUARDED_BY(mu_);
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  double loss_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_per_s_ ABSL_GUARDED_BY(mu_) = 0;
  int lost_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace longhaul
