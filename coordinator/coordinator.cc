#include "coordinator/coordinator.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/checkpoint.h"
#include "config/job_config.h"
#include "checkpoint/resume_check.h"
#include "plan/convergence_penalty.h"
#include "coordinator/job.h"
#include "coordinator/job_state_store.h"
#include "coordinator/metrics_endpoint.h"
#include "coordinator/recovery.h"
#include "coordinator/service.h"
#include "coordinator/supervisor.h"
#include "scenario/scenario.h"
#include "transport/socket_io.h"
#include "util/atomic_file.h"
#include "util/status_macros.h"

namespace longhaul {
namespace fs = std::filesystem;

void RequestCoordinatorStop() { g_coordinator_stop_requested = true; }

namespace {

// Where a job starts: its config, the step and checkpoint it goes on from, and the job state a
// coordinator before this one left, if any.
struct JobOrigin {
  JobConfig cfg;
  int64_t start = 0;
  std::string resume_name{};
  std::optional<proto::JobState> restored{};
  bool goes_on = false;  // the run's records so far are kept (a resume, a restored job)
};

// A coordinator before this one ran the job from here and did not end it (`job`, the state it
// left): it goes on under the config of that job's plan (the placement search's cut included),
// from its last checkpoint. Where some worker of it may still run, --set changes nothing, and a
// --set that would is said not to apply; where none does (`dead`), the job is taken over as a
// resume would, under that config with the --set changes applied.
absl::StatusOr<JobOrigin> FromJobState(RestoredJob job, const std::vector<std::string>& overrides, bool dead) {
  JobOrigin origin{std::move(job.cfg), 0, "", std::move(job.state), true};
  std::vector<std::string> changes;
  for (const std::string& o : overrides)
    if (!absl::StartsWith(o, "train.out_dir=")) changes.push_back(o);
  absl::StatusOr<JobConfig> with = origin.cfg;
  if (!changes.empty()) with = ParseJobConfig(origin.cfg.toml_text, "the job state's plan", changes);
  if (dead) {
    if (!with.ok()) return with.status();
    with->train.out_dir = origin.cfg.train.out_dir;
    origin.cfg = *std::move(with);
  } else if (!with.ok() || with->as_json != origin.cfg.as_json) {
    std::cout << "coordinator: warning: --set " << absl::StrJoin(changes, " --set ")
              << " is not applied: a job resumed from its job state runs on under its plan's config; to change it, "
                 "stop the job, remove job_state.pb and resume from the last checkpoint with --set "
                 "train.resume=true\n";
  }
  const fs::path checkpoints = fs::path(origin.cfg.train.out_dir) / "checkpoints";
  const absl::StatusOr<std::string> dir = LatestCheckpoint(checkpoints.string());
  const int64_t steps = origin.cfg.train.steps;
  if (dir.ok()) {
    origin.resume_name = fs::path(*dir).filename().string();
    LH_ASSIGN_OR_RETURN(origin.start, CheckpointStep(*dir));
    if (origin.start > steps || !fs::is_directory(CheckpointStateDir(checkpoints.string(), origin.resume_name))) {
      return absl::DataLossError(absl::StrFormat(
          "%s names %s, %s: write the name of the newest complete step_* directory into it",
          (checkpoints / "latest").string(), origin.resume_name,
          origin.start > steps ? absl::StrFormat("beyond the job's %d steps", steps) : std::string("which is not there")));
    }
  } else if (!absl::IsNotFound(dir.status())) {
    return dir.status();
  } else if (origin.restored->plan().start_iteration() > 0) {
    // Starting over would rewrite the run's records from step 0.
    return absl::DataLossError(absl::StrFormat(
        "%s is missing, yet the job state's plan went on from step %d: write the name of the newest complete step_* "
        "directory into it",
        (checkpoints / "latest").string(), origin.restored->plan().start_iteration()));
  }
  return origin;
}

// The penalties cluster.communication = "auto" charges: cluster.penalties, else the shipped file.
absl::StatusOr<PenaltyTable> CommunicationPenalties(const JobConfig& cfg) {
  std::optional<std::string> path = cfg.cluster.penalties;
  if (path->empty()) path = ShippedPenaltiesPath();
  if (!path) {
    return absl::NotFoundError(absl::StrCat(
        "cluster.communication = \"auto\" charges a penalties file, and ", kShippedPenalties,
        " is neither beside the binary's build directory nor under the working directory: set cluster.penalties to "
        "one (bash bench/convergence.sh measures one), or cluster.communication = \"fixed\""));
  }
  absl::StatusOr<PenaltyTable> table = LoadPenaltyTable(*path);
  if (!table.ok()) {
    return absl::Status(table.status().code(),
                        absl::StrCat("cluster.communication = \"auto\": ", table.status().message()));
  }
  return table;
}

// train.resume: the job goes on from its last complete checkpoint, under that checkpoint's cut.
absl::StatusOr<JobOrigin> FromCheckpoint(JobConfig cfg) {
  LH_ASSIGN_OR_RETURN(std::string dir, LatestCheckpoint((fs::path(cfg.train.out_dir) / "checkpoints").string()));
  JobOrigin origin{std::move(cfg), 0, fs::path(dir).filename().string(), std::nullopt, true};
  LH_ASSIGN_OR_RETURN(origin.start, CheckpointStep(dir));
  const std::string state_dir = CheckpointStateDir(fs::path(dir).parent_path().string(), origin.resume_name);
  LH_ASSIGN_OR_RETURN(origin.cfg, WithCheckpointCut(state_dir, std::move(origin.cfg)));
  LH_ASSIGN_OR_RETURN(origin.cfg, WithCheckpointCommunication(state_dir, std::move(origin.cfg)));
  LH_RETURN_IF_ERROR(CheckCheckpointResumable(state_dir, origin.cfg));
  return origin;
}

// Whether every worker the job state's plan places is gone: its tensor port refuses connections,
// which a host's kernel says of a process that ended (a forced stop killed every process of the
// job, or all of them crashed). One that does not answer within `wait_s` may be alive behind a
// slow or broken route: then the job is not taken for dead.
bool EveryWorkerGone(const proto::JobState& state, double wait_s) {
  std::map<int, std::string> address;
  for (const proto::WorkerRecord& w : state.workers()) address[w.id()] = w.registration().address();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(wait_s));
  std::vector<std::future<PortAnswer>> answers;
  for (const proto::Assignment& a : state.plan().assignments())
    answers.push_back(std::async(std::launch::async, ProbePort, address[a.worker_id()], deadline));
  bool gone = !answers.empty();
  for (std::future<PortAnswer>& answer : answers) gone = answer.get() == PortAnswer::kRefused && gone;
  return gone;
}

}  // namespace

absl::Status RunCoordinator(const CoordinatorOptions& opt) {
  LH_ASSIGN_OR_RETURN(JobConfig cfg, LoadJobConfig(opt.config_path, opt.overrides));
  std::error_code ec;
  fs::create_directories(fs::path(cfg.train.out_dir) / "checkpoints", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create train.out_dir ", cfg.train.out_dir, ": ", ec.message()));
  JobOrigin origin{cfg};
  if (fs::exists(JobStatePath(cfg.train.out_dir))) {
    LH_ASSIGN_OR_RETURN(RestoredJob job, ReadJobState(JobStatePath(cfg.train.out_dir), cfg));
    const bool dead = EveryWorkerGone(job.state, cfg.cluster.lifeline_grace_s);
    LH_ASSIGN_OR_RETURN(origin, FromJobState(std::move(job), opt.overrides, dead));
    if (dead) {
      // The job did not end, and nothing of it runs: it goes on from its last checkpoint (or its
      // start) with the workers that join this coordinator.
      const bool checkpointed = !origin.resume_name.empty();
      std::cout << absl::StrFormat("coordinator: %s is the state of a job none of whose %d workers runs any more (every "
                                   "process was stopped, or crashed): it goes on from %s with the workers that join "
                                   "now\n",
                                   JobStatePath(cfg.train.out_dir), origin.restored->plan().assignments_size(),
                                   checkpointed ? origin.resume_name : std::string("its start"))
                << std::flush;
      fs::remove(JobStatePath(cfg.train.out_dir), ec);
      if (checkpointed) {
        LH_ASSIGN_OR_RETURN(origin, FromCheckpoint(std::move(origin.cfg)));
      } else {
        origin = JobOrigin{std::move(origin.cfg)};
      }
    }
  } else if (cfg.train.resume) {
    LH_ASSIGN_OR_RETURN(origin, FromCheckpoint(std::move(cfg)));
  }
  cfg = std::move(origin.cfg);
  const int64_t start = origin.start;
  // A run whose last checkpoint is its last step has nothing left to do: said, and a success (its
  // records are those of the run that wrote the checkpoint).
  if (const int64_t end = opt.stop_at > 0 ? std::min(opt.stop_at, cfg.train.steps) : cfg.train.steps; start >= end) {
    std::cout << absl::StrFormat("coordinator: nothing to run: the last checkpoint, %s, is step %d, where this run ends "
                                 "(train.steps = %d%s); to train further, raise train.steps\n",
                                 origin.resume_name, start, cfg.train.steps,
                                 opt.stop_at > 0 ? absl::StrFormat(", --stop-at %d", opt.stop_at) : "")
              << std::flush;
    if (origin.restored) fs::remove(JobStatePath(cfg.train.out_dir), ec);  // that job ended
    return absl::OkStatus();
  }
  const std::string csv = (fs::path(cfg.train.out_dir) / "metrics.csv").string();
  const bool goes_on = origin.goes_on;
  LH_ASSIGN_OR_RETURN(MetricsLog metrics, goes_on ? MetricsLog::Resume(csv, start) : MetricsLog::Create(csv));
  LH_ASSIGN_OR_RETURN(SampleAudit samples,
                      SampleAudit::Open((fs::path(cfg.train.out_dir) / "samples.csv").string(),
                                        static_cast<int>(cfg.GlobalMicroBatches()), goes_on ? start : 0));
  std::optional<NetworkCost> network;
  if (!opt.scenario.empty()) {
    LH_ASSIGN_OR_RETURN(netem::Scenario scenario, netem::LoadScenario(opt.scenario));
    network = NetworkCost::FromScenario(std::move(scenario));
  }
  LH_ASSIGN_OR_RETURN(JobSecret secret, JobSecret::FromFlagOrEnv(opt.secret_file));
  LH_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, CoordinatorCredentials(opt.tls));
  if (!secret.set()) {
    std::cout << "coordinator: warning: no job secret (--secret-file or $LONGHAUL_SECRET_FILE): any process that can "
                 "reach this port and the workers' can join or feed this job. `longhaul secret FILE` makes one.\n";
  }
  LH_ASSIGN_OR_RETURN(std::string run_dir_token, RunDirToken(cfg.train.out_dir));
  std::optional<PenaltyTable> penalties;
  if (cfg.cluster.choose_communication && !origin.restored && start == 0) {
    LH_ASSIGN_OR_RETURN(penalties, CommunicationPenalties(cfg));
  }
  RpcVerifier verifier(std::move(secret));
  Job job({cfg, start, origin.resume_name, opt.stop_at, std::move(metrics), std::move(samples), std::move(network),
           std::move(run_dir_token), [&verifier] { return verifier.refused(); }, std::move(penalties)});
  if (origin.restored) {
    absl::MutexLock lock(&job.mu);
    RestoreJob(job, *origin.restored);
  }
  Service service(verifier, job);
  LH_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server,
                      CoordinatorServer::Start(opt.listen, verifier.secret(), credentials, &service));
  const int port = server->port();
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  if (!opt.metrics_listen.empty()) {
    LH_ASSIGN_OR_RETURN(metrics_endpoint, MetricsEndpoint::Start(opt.metrics_listen, [&job] { return job.MetricsText(); }));
    std::cout << "coordinator: Prometheus metrics at http://" << metrics_endpoint->address() << "/metrics\n";
    LH_RETURN_IF_ERROR(WriteFileAtomically((fs::path(cfg.train.out_dir) / ".metrics_address").string(),
                                           metrics_endpoint->address() + "\n"));
  }
  if (!opt.port_file.empty()) {
    std::ofstream(opt.port_file + ".tmp") << port << "\n";
    fs::rename(opt.port_file + ".tmp", opt.port_file, ec);
  }
  std::cout << absl::StrFormat("coordinator: job '%s' listening on port %d, waiting for %d workers (%d stages x %d "
                               "replicas)%s\n",
                               cfg.cluster.job_id, port, cfg.cluster.stages * cfg.cluster.replicas, cfg.cluster.stages,
                               cfg.cluster.replicas, start > 0 ? absl::StrCat(", resuming at step ", start) : "")
            << std::flush;
  absl::Status st = Supervise(job);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return st;
}

}  // namespace longhaul
