#include "coordinator/job.h"

#include <algorithm>
#include <iostream>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/run_model.h"
#include "coordinator/planning.h"
#include "layout/plan_layout.h"
#include "metrics/timeline.h"
#include "plan/measured_prediction.h"
#include "util/atomic_file.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

// How long a worker another saw leave mid-run may stay silent before it is lost: five heartbeats
// (a slow worker keeps sending them; a killed one sends none), at least 2 s for a loaded machine's
// scheduling, at most the silence that loses any worker.
double SuspectSilentSeconds(const ClusterConfig& c) { return std::min(c.dead_after_s, std::max(2.0, 5 * c.heartbeat_s)); }

int64_t RunEndOf(const JobStart& s) {
  return s.stop_at > 0 ? std::min(s.stop_at, s.cfg.train.steps) : s.cfg.train.steps;
}

}  // namespace

void RecoveryRecords::AddPending(nlohmann::json event, int worker, Clock::time_point failed_at, std::string what) {
  events.push_back(std::move(event));
  pending.push_back({events.size() - 1, worker, failed_at, std::move(what)});
}

Job::Job(JobStart s)
    : expected(s.cfg.cluster.stages * s.cfg.cluster.replicas),
      probing(expected > 1 && (s.cfg.cluster.link_probe == ClusterConfig::LinkProbe::kOn ||
                               (s.cfg.cluster.link_probe == ClusterConfig::LinkProbe::kAuto && !s.network))),
      penalties(std::move(s.penalties)),
      cfg(s.cfg),
      network(std::move(s.network)),
      links(network ? "the scenario's links" : ""),
      members(s.cfg.cluster.job_id, expected, s.cfg.cluster.spares, s.cfg.cluster.dead_after_s,
              SuspectSilentSeconds(s.cfg.cluster), s.cfg.cluster.lifeline_grace_s),
      plans(expected, std::move(s.run_dir_token)),
      progress(s.start_iteration, s.resume_name, RunEndOf(s)),
      checkpoints((fs::path(s.cfg.train.out_dir) / "checkpoints").string(), s.start_iteration, s.resume_name),
      samples(std::move(s.samples)),
      log(s.cfg, s.start_iteration, RunEndOf(s), std::move(s.metrics)),
      store(s.cfg.train.out_dir),
      metrics(s.cfg),
      refused_calls_(std::move(s.refused_calls)) {}

bool Job::WaitFor(absl::Duration timeout, const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (cv.WaitWithDeadline(&mu, deadline)) return done();
  }
  return true;
}

std::string Job::MetricsText() const { return metrics.Render(refused_calls_ ? refused_calls_() : 0); }

void Job::WriteMetricsFile() const {
  // The figures are for looking at: a full disk must not stop the job (metrics.csv would say so).
  (void)WriteFileAtomically((fs::path(cfg.train.out_dir) / "metrics.prom").string(), MetricsText());
}

RunView Job::View() const {
  return RunView{plans.current(), cfg, progress.start(), progress.end(), progress.completed_through()};
}

void Job::Abort(const std::string& why) {
  if (!g_coordinator_stop_requested) metrics.Failed();
  abort = why;
  abort_time = Clock::now();
  std::cout << "coordinator: stopping the job: " << why << "\n" << std::flush;
  cv.SignalAll();
}

void Job::CheckFinished() {
  if (finished || !last_recorded || checkpoints.latest_step() != progress.end()) return;
  finished = true;
  finished_time = Clock::now();
  cv.SignalAll();
}

int64_t Job::Rollback() { return progress.Rollback(checkpoints.latest_step(), checkpoints.latest_name()); }

void Job::NotePlan(proto::Plan plan) {
  plans.Adopt(std::move(plan));
  metrics.SetPlan(plans.current(), members.registrations());
}

void Job::Adopt(proto::Plan next, int64_t reached, const std::string& change, const std::map<int, int>& replace) {
  // What can fail comes first: a job stopped here keeps the plan its workers run.
  std::optional<JobConfig> recut_cfg;
  if (BlocksPerStage(next) != cfg.Cut()) {  // a pipeline cut anew: the plan's config has its cut
    absl::StatusOr<JobConfig> parsed = ParseJobConfig(next.config_toml(), "the re-cut plan's job config");
    if (!parsed.ok()) {
      Abort(std::string(parsed.status().message()));
      return;
    }
    recut_cfg = *std::move(parsed);
  }
  const int64_t start = progress.start();
  absl::Status rewound = samples.Rewind(start);
  if (rewound.ok()) rewound = log.Rewind(start);
  if (!rewound.ok()) {
    Abort(std::string(rewound.message()));
    return;
  }
  if (recut_cfg) {
    cfg = *std::move(recut_cfg);
    recut = true;
    stragglers.Restart();
  }
  progress.Restart();
  checkpoints.Rewind(start);
  replicas.Rewind(start);
  ready.clear();
  last_recorded = false;
  NotePlan(std::move(next));
  const proto::Plan& plan = plans.current();
  std::cout << absl::StrFormat("coordinator: plan v%d: %s; every worker goes back to step %d (%s) and redoes %d "
                               "iterations\n",
                               plan.version(), change, start,
                               progress.resume_name().empty() ? "the initial parameters" : progress.resume_name(),
                               reached - start)
            << std::flush;
  for (const RecoveryRecords::Pending& p : recovery.pending) {
    nlohmann::json& event = recovery.events[p.event];
    const bool lost = recovery.vacant.count(p.worker) > 0;
    if (event.contains("new_plan_version") || (!lost && !event.contains("restart"))) continue;
    if (replace.count(p.worker)) {
      event["spare"] = replace.at(p.worker);
    } else if (lost) {
      event["shrunk_to_replicas"] = plan.replicas();
      event["blocks_per_stage"] = cfg.Cut();
    }
    event["new_plan_version"] = plan.version();
    event["rollback_to_step"] = start;
    event["redone_iterations"] = reached - start;
  }
  recovery.vacant.clear();
  recovery.spare_wait_noted = false;
  recovery.restart.reset();  // the new version answers whatever failed the old one
  WriteState();
  cv.SignalAll();
}

void Job::WriteState() {
  UpdateClusterRecord();
  proto::JobState state;
  *state.mutable_plan() = plans.current();
  for (proto::WorkerRecord& r : members.Records()) *state.add_workers() = std::move(r);
  state.set_recoveries_json(recovery.events.dump());
  const std::string cluster = cluster_record.dump(2) + "\n";
  state.set_cluster_json(cluster);
  state.set_redone_iterations(progress.redone());
  if (absl::Status st = store.Write(state, cluster); !st.ok() && abort.empty()) {
    Abort(absl::StrCat("cannot keep the job state, which a coordinator started again resumes from: ", st.message(),
                       "; give train.out_dir a writable disk with room, then start the job again"));
  }
}

void Job::UpdateClusterRecord() {
  nlohmann::json workers = nlohmann::json::array(), spares = nlohmann::json::array();
  for (const auto& [id, reg] : members.registrations()) {
    const proto::Assignment* a = AssignmentOf(plans.current(), id);
    if (a == nullptr) {
      spares.push_back({{"worker", id}, {"address", reg.address()}, {"host", reg.host()}, {"pid", reg.pid()}});
      continue;
    }
    workers.push_back({{"worker", id}, {"stage", a->stage()}, {"replica", a->replica()}, {"address", a->address()},
                       {"host", reg.host()}, {"pid", reg.pid()}, {"blocks", {a->first_block(), a->end_block()}}});
  }
  cluster_record["plan_version"] = plans.version();
  cluster_record["workers"] = std::move(workers);
  cluster_record["spares"] = std::move(spares);
}

std::vector<int> Job::Spares() const {
  std::vector<int> fast, slow;
  for (const auto& [id, reg] : members.registrations())
    if (AssignmentOf(plans.current(), id) == nullptr && members.HasProfile(id)) {
      (recovery.slow.count(id) ? slow : fast).push_back(id);
    }
  fast.insert(fast.end(), slow.begin(), slow.end());
  return fast;
}

// Each worker computes its stage's blocks, and the head on the last stage, at its profile's ratio
// of the two. A worker without a pace yet keeps only its memory (RebalancePlan then moves blocks
// for memory alone).
std::map<int, proto::ComputeProfile> Job::PacedProfiles() const {
  const std::map<int, double> paces = stragglers.Paces();
  const proto::Plan& plan = plans.current();
  std::map<int, proto::ComputeProfile> paced;
  for (const proto::Assignment& a : plan.assignments()) {
    if (!members.HasProfile(a.worker_id())) continue;
    proto::ComputeProfile p = members.profile(a.worker_id());
    const auto pace = paces.find(a.worker_id());
    const double block_s = p.block_forward_s() + p.block_backward_s();
    double k = 0;
    if (pace != paces.end() && block_s > 0) {
      const double head = a.stage() == plan.stages() - 1 ? (p.head_forward_s() + p.head_backward_s()) / block_s : 0;
      k = pace->second / (a.end_block() - a.first_block() + head) / block_s;
    }
    p.set_block_forward_s(k * p.block_forward_s());
    p.set_block_backward_s(k * p.block_backward_s());
    p.set_head_forward_s(k * p.head_forward_s());
    p.set_head_backward_s(k * p.head_backward_s());
    paced[a.worker_id()] = std::move(p);
  }
  return paced;
}

bool Job::LayoutRanWhole() const {
  // The measured compute is per worker over the whole run: a shrunk layout or a re-cut changed
  // what some ran.
  return plans.current().replicas() == cfg.cluster.replicas && !recut;
}

// The links are the scenario's or the measured; the coordinator sits beside every host, as an
// emulation's router does.
std::optional<double> Job::Predict(bool without_cards) const {
  // The planner prices the config's layout, not a shrunk one.
  if (!network || !LayoutRanWhole()) return std::nullopt;
  if (without_cards && !network->HasCards()) return std::nullopt;
  const MeasuredCompute compute = log.MeasuredByWorker();
  if (compute.per_micro.empty()) return std::nullopt;
  const absl::StatusOr<double> p =
      PredictFromMeasuredCompute(cfg, compute, without_cards ? network->WithoutCards() : *network,
                                 plans.worker_of_slot(), ShardOwners(plans.current()));
  if (!p.ok()) {
    std::cout << "coordinator: no prediction: " << p.status().message() << "\n";
    return std::nullopt;
  }
  return *p;
}

void Job::WriteMeasuredProfile() const {
  if (!LayoutRanWhole()) return;
  const MeasuredCompute compute = log.MeasuredByWorker();
  if (compute.per_micro.empty()) return;
  const std::map<int, proto::RegisterRequest> regs = members.registrations();
  std::set<Backend> backends;
  std::vector<double> memory;
  for (const proto::Assignment& a : plans.current().assignments()) {
    const auto reg = regs.find(a.worker_id());
    if (reg == regs.end() || !members.HasProfile(a.worker_id())) return;
    backends.insert(MemoryBackend(WorkerBackend(cfg, reg->second)));
    memory.push_back(members.profile(a.worker_id()).memory_bytes());
  }
  if (backends.size() != 1) return;
  const absl::StatusOr<DeviceCost> device =
      MeasuredComputeDevice(cfg, compute, *backends.begin(), LeastMemory(memory), plans.worker_of_slot());
  const absl::StatusOr<std::string> text =
      device.ok() ? device->ProfileToml(absl::StrFormat(
                        "Job %s's compute per micro-batch as its %d workers measured it while they ran (their mean), "
                        "for `longhaul plan --profile`.",
                        cfg.cluster.job_id, compute.per_micro.size()))
                  : device.status();
  const std::string path = (fs::path(cfg.train.out_dir) / "profile.toml").string();
  const absl::Status st = text.ok() ? WriteFileAtomically(path, *text) : text.status();
  std::cout << (st.ok() ? absl::StrCat("coordinator: the compute as the run measured it, for longhaul plan --profile: ",
                                       path, "\n")
                        : absl::StrCat("coordinator: warning: ", path, " not written: ", st.message(), "\n"));
}

std::string Job::ResumeAdvice() const {
  if (LatestCheckpoint(checkpoints.root()).ok()) return "resume from the last checkpoint with --set train.resume=true";
  return absl::StrFormat("start the job again from the beginning: no checkpoint was written yet (set "
                         "train.checkpoint_every, now %d, to keep progress)",
                         cfg.train.checkpoint_every);
}

void Job::NameIntactCheckpoint() {
  const std::string& root = checkpoints.root();
  // Whole files: the worker's message says what else failed.
  if (failed_checkpoint.empty() || VerifyCheckpointStep(root, failed_checkpoint).ok()) return;
  const absl::StatusOr<int64_t> step = CheckpointStep(failed_checkpoint);
  const absl::StatusOr<std::string> intact = step.ok() ? LastIntactCheckpoint(root, *step) : step.status();
  abort += intact.ok() ? absl::StrFormat("; %s is broken, the last intact checkpoint is %s: write %s into %s, then "
                                         "resume with --set train.resume=true",
                                         failed_checkpoint, *intact, *intact, (fs::path(root) / "latest").string())
                       : absl::StrFormat("; %s is broken and no intact checkpoint is older: start the job again "
                                         "without train.resume",
                                         failed_checkpoint);
}

fs::path Job::TimelinePath(int worker) const {
  return fs::path(cfg.train.out_dir) / "timeline" / absl::StrFormat("worker_%d.json", worker);
}

}  // namespace longhaul
