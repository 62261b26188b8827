#include "coordinator/job_metrics.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/run_log.h"
#include "metrics/prometheus_text.h"

namespace longhaul {

JobMetrics::JobMetrics(const JobConfig& cfg)
    : cfg_(cfg),
      stages_(cfg.cluster.stages) {}

void JobMetrics::SetPlan(const proto::Plan& plan, const std::map<int, proto::RegisterRequest>& registrations) {
  absl::MutexLock lock(&mu_);
  stages_ = plan.stages();  // a pipeline cut anew has fewer than the job's config
  worker_at_.clear();  // a place a shrunk or re-cut plan no longer has takes no bytes
  for (const proto::Assignment& a : plan.assignments()) {
    Worker& w = workers_[a.worker_id()];
    w.stage = a.stage();
    w.replica = a.replica();
    w.address = a.address();
    if (const auto it = registrations.find(a.worker_id()); it != registrations.end()) w.host = it->second.host();
    worker_at_[{a.stage(), a.replica()}] = a.worker_id();
  }
}

void JobMetrics::SetLinks(const NetworkCost& network, std::string source) {
  absl::MutexLock lock(&mu_);
  network_ = network;
  links_source_ = std::move(source);
}

absl::Status JobMetrics::Report(const proto::IterationReport& report) {
  absl::MutexLock lock(&mu_);
  std::set<std::pair<int, int>> named;
  for (const proto::LinkBytes& l : report.sent()) {
    if (worker_at_.find({l.stage(), l.replica()}) == worker_at_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker %d reports bytes sent to stage %d replica %d, which the plan (%d stages x %d replicas) does not have",
          report.worker_id(), l.stage(), l.replica(), stages_, cfg_.cluster.replicas));
    }
    if (!named.insert({l.stage(), l.replica()}).second) {
      return absl::InvalidArgumentError(absl::StrFormat("worker %d reports bytes sent to stage %d replica %d twice",
                                                        report.worker_id(), l.stage(), l.replica()));
    }
  }
  for (const proto::LinkBytes& l : report.sent()) sent_[{report.worker_id(), worker_at_.at({l.stage(), l.replica()})}] += l.bytes();
  workers_[report.worker_id()].last = report;
  return absl::OkStatus();
}

void JobMetrics::Complete(int64_t it, const std::map<int, proto::IterationReport>& reports) {
  absl::MutexLock lock(&mu_);
  step_ = it + 1;
  double seconds = 0;
  bool last_stage = false;
  for (const auto& [id, r] : reports) {
    last_stage = last_stage || r.stage() == stages_ - 1;
    if (r.stage() == 0 && r.replica() == 0) seconds = r.seconds();  // the iteration time, as RunLog counts it
  }
  if (last_stage) loss_ = MeanOverMicroBatches(cfg_, stages_, reports).loss;
  if (seconds > 0) tokens_per_s_ = static_cast<double>(cfg_.tokens_per_step()) / seconds;
}

std::string JobMetrics::Render(int64_t refused_calls) const {
  absl::MutexLock lock(&mu_);
  PrometheusText t;
  t.Family("longhaul_step", "gauge", "Steps completed by every worker.");
  t.Sample({}, static_cast<double>(step_));
  t.Family("longhaul_loss", "gauge", "Mean training loss of the last step's replicas.");
  t.Sample({}, loss_);
  t.Family("longhaul_tokens_per_second", "gauge", "Tokens per second of the last step, every replica.");
  t.Sample({}, tokens_per_s_);

  auto worker_labels = [](int id, const Worker& w) {
    return PrometheusText::Labels{{"worker", absl::StrCat(id)},
                                  {"stage", absl::StrCat(w.stage)},
                                  {"replica", absl::StrCat(w.replica)},
                                  {"host", w.host}};
  };
  struct PerWorker {
    const char* name;
    const char* help;
    double (*value)(const proto::IterationReport&, double tokens);
  };
  const PerWorker per_worker[] = {
      {"longhaul_worker_iteration_seconds", "Wall time of the worker's last iteration.",
       [](const proto::IterationReport& r, double) { return r.seconds(); }},
      {"longhaul_worker_compute_seconds", "Compute time of the worker's last iteration.",
       [](const proto::IterationReport& r, double) { return r.compute_seconds(); }},
      {"longhaul_worker_wait_seconds", "Time the worker's last iteration waited on the network.",
       [](const proto::IterationReport& r, double) { return r.wait_seconds(); }},
      {"longhaul_worker_tokens_per_second", "Tokens of the worker's replica per second of its last iteration.",
       [](const proto::IterationReport& r, double tokens_per_micro_batch) {
         return r.seconds() > 0 ? r.micro_batches_size() * tokens_per_micro_batch / r.seconds() : 0;
       }},
  };
  // A replica's tokens are those of the micro-batches its report names (its own share of the batch).
  const double tokens_per_micro_batch = static_cast<double>(cfg_.train.micro_batch_size) * cfg_.train.seq_len;
  for (const PerWorker& m : per_worker) {
    t.Family(m.name, "gauge", m.help);
    for (const auto& [id, w] : workers_)
      if (w.last) t.Sample(worker_labels(id, w), m.value(*w.last, tokens_per_micro_batch));
  }
  t.Family("longhaul_worker_slowdown", "gauge",
           "The worker's compute per iteration (median of its last 20) against its own at the start of the run "
           "(against=\"start\") and against its stage's other replicas' (against=\"peers\"); above 1.5 for 20 "
           "iterations in a row it straggles.");
  for (const auto& [id, s] : slowdowns_) {
    if (workers_.count(id) == 0) continue;
    for (auto [against, value] : {std::pair{"start", s.vs_start}, std::pair{"peers", s.vs_peers}}) {
      PrometheusText::Labels labels = worker_labels(id, workers_.at(id));
      labels.emplace_back("against", against);
      t.Sample(labels, value);
    }
  }
  t.Family("longhaul_worker_refused_tensor_total", "counter",
           "Connections and tensor parts the worker's tensor port refused (strangers, wrong secret, bad headers).");
  for (const auto& [id, w] : workers_)
    if (w.last) t.Sample(worker_labels(id, w), w.last->refused());

  t.Family("longhaul_link_sent_bytes_total", "counter", "Tensor bytes sent from one worker to another.");
  for (const auto& [pair, bytes] : sent_) {
    t.Sample({{"from", absl::StrCat(pair.first)}, {"to", absl::StrCat(pair.second)}}, static_cast<double>(bytes));
  }
  t.Family("longhaul_link_round_trip_seconds", "gauge",
           absl::StrCat("Round trip between two workers' hosts (", links_source_.empty() ? "unknown" : links_source_,
                        ")."));
  if (network_) {
    for (const auto& [a, wa] : workers_)
      for (const auto& [b, wb] : workers_)
        if (a != b) {
          t.Sample({{"from", absl::StrCat(a)}, {"to", absl::StrCat(b)}}, 2 * network_->Between(a, b).latency_s);
        }
  }

  t.Family("longhaul_refused_calls_total", "counter", "Calls to the coordinator refused for want of the job secret.");
  t.Sample({}, static_cast<double>(refused_calls));
  t.Family("longhaul_workers_lost_total", "counter", "Workers declared dead (no heartbeat within dead_after_s).");
  t.Sample({}, lost_);
  t.Family("longhaul_job_failed", "gauge", "1 once the job has stopped on an error.");
  t.Sample({}, failed_ ? 1 : 0);
  return t.text();
}

}  // namespace longhaul
