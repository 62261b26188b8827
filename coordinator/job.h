#pragma once
// What the coordinator knows of its job, under one mutex: the config, who is in the job, the plan
// versions, how far the run has come, the checkpoint index, the records of failures and their
// recoveries, the run's records, and how the job ends. Every part is guarded by `mu`; the rooms
// that change it hold it: the gRPC handlers (service.h) through joining.h and reports.h, the
// recovery transitions (recovery.h) and the supervisor (supervisor.h). The methods here are the
// transitions those rooms share: a new plan version, a rollback, the job's stop and its end.
//
// Waiters (a plan request, the start barrier, a lifeline, the supervisor) wait on `cv`, which every
// change they may wait for signals.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "config/job_config.h"
#include "coordinator/checkpoint_index.h"
#include "coordinator/job_metrics.h"
#include "coordinator/job_state_store.h"
#include "coordinator/membership.h"
#include "coordinator/plan_versions.h"
#include "coordinator/progress.h"
#include "coordinator/replica_agreement.h"
#include "coordinator/report_checks.h"
#include "coordinator/run_log.h"
#include "coordinator/sample_audit.h"
#include "coordinator/stragglers.h"
#include "longhaul.pb.h"
#include "metrics/metrics_log.h"
#include "plan/convergence_penalty.h"
#include "plan/cost_model.h"

namespace longhaul {

// Set from a signal handler (RequestCoordinatorStop): the job stops and the coordinator exits.
// An atomic, read without the job's lock.
inline std::atomic<bool> g_coordinator_stop_requested{false};

// The failures of the job and what answered them.
struct RecoveryRecords {
  using Clock = std::chrono::steady_clock;
  // Every failure and change of layout, as summary.json's "recoveries" lists them.
  nlohmann::json events = nlohmann::json::array();
  // Failures not recovered from yet (no iteration completed since): their event in `events`, the
  // lost worker (-1: none, a restart or this coordinator's own), when it failed, and what happened,
  // for people.
  struct Pending {
    size_t event;
    int worker;
    Clock::time_point failed_at;
    std::string what;
  };
  std::vector<Pending> pending;
  // Lost workers of the plan whose places wait for spares (by id: what happened), since when.
  std::map<int, std::string> vacant;
  Clock::time_point vacant_since;
  bool spare_wait_noted = false;  // the wait for a spare was said
  // A worker's report that the running version failed (SuspectReport.failure), not yet answered.
  struct Restart {
    int worker;
    std::string failure;
    Clock::time_point at;
    bool dialled = false;    // the workers not heard from were dialled since
    std::set<int> answered{};  // of them, those whose tensor port answered
  };
  std::optional<Restart> restart;
  int restarts_in_a_row = 0;  // versions started again since an iteration last completed
  std::set<int> slow;         // workers moved off their place for straggling
  std::set<int> eased;        // workers blocks moved off for straggling, until they move back

  // Adds `event` to `events`, and to `pending` as `worker`'s failure at `failed_at`.
  void AddPending(nlohmann::json event, int worker, Clock::time_point failed_at, std::string what);
};

// What a job starts from.
struct JobStart {
  JobConfig cfg;
  int64_t start_iteration = 0;  // > 0 when resuming
  std::string resume_name;      // the checkpoint resumed from, empty: none
  int64_t stop_at = 0;          // stop and checkpoint after this step (0: train.steps)
  MetricsLog metrics;
  SampleAudit samples;
  std::optional<NetworkCost> network;  // the scenario's links, if known
  std::string run_dir_token;           // RunDirToken's
  // Calls refused at the coordinator's port so far (RpcVerifier::refused), for the metrics.
  std::function<int64_t()> refused_calls;
  // What cluster.communication = "auto" charges, where the job's first plan is to choose.
  std::optional<PenaltyTable> penalties;
};

class Job {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Job(JobStart start);
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  absl::Mutex mu;
  absl::CondVar cv;

  // Fixed for the job's life.
  const int expected;  // the config's stages x replicas: the first plan's workers
  const bool probing;  // workers measure their links before the first plan
  const std::string boot_id = BootId();  // heartbeats give it (HeartbeatReply)
  const std::optional<PenaltyTable> penalties;  // JobStart's

  JobConfig cfg ABSL_GUARDED_BY(mu);  // the plan's, once one cut the model anew
  bool recut ABSL_GUARDED_BY(mu) = false;  // a plan version cut the model anew
  // The scenario's links, or the measured once every worker reported, and where they came from.
  std::optional<NetworkCost> network ABSL_GUARDED_BY(mu);
  std::string links ABSL_GUARDED_BY(mu);
  Membership members ABSL_GUARDED_BY(mu);
  PlanVersions plans ABSL_GUARDED_BY(mu);
  Progress progress ABSL_GUARDED_BY(mu);
  ReplicaAgreement replicas ABSL_GUARDED_BY(mu);
  CheckpointIndex checkpoints ABSL_GUARDED_BY(mu);
  RecoveryRecords recovery ABSL_GUARDED_BY(mu);
  StragglerWatch stragglers ABSL_GUARDED_BY(mu);
  SampleAudit samples ABSL_GUARDED_BY(mu);
  RunLog log ABSL_GUARDED_BY(mu);
  JobStateStore store ABSL_GUARDED_BY(mu);
  nlohmann::json cluster_record ABSL_GUARDED_BY(mu) = nlohmann::json::object();  // cluster.json
  std::set<int> ready ABSL_GUARDED_BY(mu);  // workers that installed the running plan
  // By worker: Lifeline calls begun; the newest is the one held.
  std::map<int, uint64_t> lifeline_calls ABSL_GUARDED_BY(mu);
  bool last_recorded ABSL_GUARDED_BY(mu) = false;  // every worker reported the run's last iteration
  bool finished ABSL_GUARDED_BY(mu) = false;       // ... and its checkpoint is complete
  Clock::time_point finished_time ABSL_GUARDED_BY(mu);
  std::string abort ABSL_GUARDED_BY(mu);  // why the job stops; empty while it runs
  Clock::time_point abort_time ABSL_GUARDED_BY(mu);
  // The checkpoint the running plan resumes from, where a worker's failure to bring it in stopped
  // the job (DoneReport.resumed_checkpoint); empty otherwise.
  std::string failed_checkpoint ABSL_GUARDED_BY(mu);
  // Locked on its own: the metrics endpoint reads it without the job's lock.
  JobMetrics metrics;

  // Waits on `cv` (which releases `mu` meanwhile) until `done()` holds or `timeout` passed;
  // whether done() holds. `done` reads the job with `mu` held.
  bool WaitFor(absl::Duration timeout, const std::function<bool()>& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Prometheus's text for the metrics endpoint and metrics.prom (job_metrics.h).
  std::string MetricsText() const;
  // metrics.prom in the run directory.
  void WriteMetricsFile() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The running plan and how far the run has come, as the report checks see them.
  RunView View() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The job stops: every worker hears `why` with its next heartbeat.
  void Abort(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The last iteration is in and so is its checkpoint: nothing a lost worker could take with it
  // remains, and the workers may go.
  void CheckFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The run goes back to the last complete checkpoint (or its start): the iteration reached before.
  int64_t Rollback() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // `plan` replaces the running one; the metrics show it.
  void NotePlan(proto::Plan plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // After Rollback: `next` replaces the plan for the lost workers of recovery.vacant (`replace`:
  // lost -> the spare in its place), or starts it again, or changes the layout; `change` says how,
  // for the log. The recoveries it answers record the new version and the rollback.
  void Adopt(proto::Plan next, int64_t reached, const std::string& change, const std::map<int, int>& replace)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Posts the job state and cluster.json (JobStateStore); a failure stops the job.
  void WriteState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The workers that may take a place (registered, profiled, in no place), the ones moved off for
  // straggling last.
  std::vector<int> Spares() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The plan's workers' compute as RebalancePlan weighs it: each one's profile from its join scaled
  // to its pace now (stragglers.h).
  std::map<int, proto::ComputeProfile> PacedProfiles() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The planner's iteration time from the compute measured so far and the links, if they are known.
  // `without_cards`: with the hosts' network cards left out, where the network has any (else none).
  std::optional<double> Predict(bool without_cards = false) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Whether the config's layout ran whole (no shrunk replicas, no re-cut): the measured compute
  // per worker then describes it.
  bool LayoutRanWhole() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The compute as the run measured it (its mean worker), as train.out_dir/profile.toml for
  // `longhaul plan --profile`: where the layout ran whole and every worker on one backend.
  void WriteMeasuredProfile() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What a person should do after the job stopped early.
  std::string ResumeAdvice() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Where the job stopped for failed_checkpoint and that checkpoint is broken (VerifyCheckpointStep),
  // the stop reason goes on to name the last intact checkpoint before it and how to resume from it,
  // or that there is none. It reads every file of the steps it checks: called once the job ended.
  void NameIntactCheckpoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Where a worker's timeline is in the run directory: written there by a worker that shares it,
  // shipped there by one that does not.
  std::filesystem::path TimelinePath(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  // cluster.json's workers and spares under the running plan.
  void UpdateClusterRecord() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const std::function<int64_t()> refused_calls_;
};

}  // namespace longhaul
