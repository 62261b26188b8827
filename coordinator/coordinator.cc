#include "coordinator/coordinator.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "util/files.h"
#include "model/param_layout.h"
#include "config/job_config.h"
#include "checkpoint/resume_check.h"
#include "coordinator/job_metrics.h"
#include "coordinator/membership.h"
#include "coordinator/metrics_endpoint.h"
#include "coordinator/planning.h"
#include "coordinator/run_log.h"
#include "coordinator/sample_audit.h"
#include "coordinator/stragglers.h"
#include "layout/plan_layout.h"
#include "scenario/scenario.h"
#include "plan/measured_prediction.h"
#include "longhaul.grpc.pb.h"
#include "metrics/flops.h"
#include "metrics/metrics_log.h"
#include "metrics/timeline.h"
#include "transport/link_connections.h"
#include "transport/mailbox.h"
#include "transport/socket_io.h"
#include "transport/tensor_transport.h"
#include "transport/wire_plan.h"
#include "util/atomic_file.h"
#include "util/background_writer.h"
#include "util/status_macros.h"
#include "util/bounded_json.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop_requested{false};
using Clock = std::chrono::steady_clock;

// The run directory's identity, which a worker finds in its own run directory only where it shares
// this one: made once, kept by a restarted coordinator.
absl::StatusOr<std::string> RunDirToken(const std::string& out_dir) {
  const std::string path = (fs::path(out_dir) / kRunDirIdFile).string();
  if (absl::StatusOr<std::string> kept = ReadWholeFile(path); kept.ok() && kept->size() == 2 * kNonceBytes) return kept;
  LH_ASSIGN_OR_RETURN(const std::string nonce, RandomNonce());
  const std::string token = absl::BytesToHexString(nonce);
  LH_RETURN_IF_ERROR(WriteFileAtomically(path, token));
  return token;
}

std::string JobStatePath(const JobConfig& cfg) { return (fs::path(cfg.train.out_dir) / "job_state.pb").string(); }

// A job state and the config of its plan, which the job goes on under.
struct RestoredJob {
  proto::JobState state;
  JobConfig cfg;
};

// The job state a coordinator before this one left in `cfg`'s train.out_dir, checked before
// anything is indexed by it: its plan a layout of its own config, each placed worker one it
// recorded, and written in this directory, not one it was copied from. The config keeps `cfg`'s
// train.out_dir, where the state is, however the state names it.
absl::StatusOr<RestoredJob> ReadJobState(const std::string& path, const JobConfig& cfg) {
  const absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", bytes.status().message()));
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(path, " is damaged", why, ": remove it to start the job anew, or to resume "
                                            "from the last checkpoint with --set train.resume=true"));
  };
  proto::JobState state;
  if (!state.ParseFromString(*bytes) || state.plan().version() == 0) return damaged("");
  if (state.plan().job_id() != cfg.cluster.job_id) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s holds the state of job '%s', not '%s': give this job another train.out_dir, or remove the file", path,
        state.plan().job_id(), cfg.cluster.job_id));
  }
  // Each restart publishes the version two past it.
  if (state.plan().version() > uint64_t{1} << 62) return damaged(absl::StrCat(" (plan version ", state.plan().version(), ")"));
  absl::StatusOr<JobConfig> run = ParseJobConfig(state.plan().config_toml(), "the job state's plan");
  if (!run.ok()) return damaged(absl::StrCat(" (", run.status().message(), ")"));
  // A relative train.out_dir the state holds may not resolve from this coordinator's directory:
  // only one that resolves elsewhere is another job's directory.
  std::error_code ec;
  if (fs::exists(run->train.out_dir, ec) && !fs::equivalent(run->train.out_dir, cfg.train.out_dir, ec)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is the state of the job whose train.out_dir is %s: a run directory copied or moved elsewhere goes on from "
        "its checkpoints, not from its job state (remove the file and --set train.resume=true)",
        path, run->train.out_dir));
  }
  if (const absl::Status layout = CheckPlanLayout(state.plan(), *run); !layout.ok()) {
    return damaged(absl::StrCat(" (", layout.message(), ")"));
  }
  std::set<int> recorded;
  for (const proto::WorkerRecord& w : state.workers()) {
    if (!recorded.insert(w.id()).second) return damaged(absl::StrFormat(" (worker %d recorded twice)", w.id()));
  }
  for (const proto::Assignment& a : state.plan().assignments()) {
    if (!recorded.count(a.worker_id())) {
      return damaged(absl::StrFormat(" (its plan places worker %d, which it does not record)", a.worker_id()));
    }
  }
  run->train.out_dir = cfg.train.out_dir;
  return RestoredJob{std::move(state), *std::move(run)};
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Wall-clock time, for records that outside tools line up with their own (bench/recovery.sh times
// each failure from its kill).
double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// How long a worker another saw leave mid-run may stay silent before it is lost: five heartbeats
// (a slow worker keeps sending them; a killed one sends none), at least 2 s for a loaded machine's
// scheduling, at most the silence that loses any worker.
double SuspectSilentSeconds(const ClusterConfig& c) { return std::min(c.dead_after_s, std::max(2.0, 5 * c.heartbeat_s)); }

// A worker's timeline is its events of the whole run, some 2 KB per iteration for the demo: a
// gigabyte holds hundreds of thousands of iterations, and nothing of it is held in memory.
constexpr uint64_t kMaxTimelineBytes = uint64_t{1} << 30;

// A part of a file shipped to the coordinator: at most kCheckpointChunkBytes, within the file.
grpc::Status CheckPart(uint64_t file_bytes, uint64_t offset, uint64_t bytes) {
  if (bytes > kCheckpointChunkBytes || offset > file_bytes || bytes > file_bytes - offset) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("a part of %d bytes at %d of a %d-byte file (parts are at most %d bytes, "
                                        "within the file)",
                                        bytes, offset, file_bytes, kCheckpointChunkBytes));
  }
  return grpc::Status::OK;
}

// Appends a checked part (CheckPart) to `path`.part, which holds the parts before it, and renames
// it to `path` with the last one.
grpc::Status ReceivePart(const fs::path& path, uint64_t file_bytes, uint64_t offset, const std::string& data) {
  // One part of a file at a time: two at one offset (a call and its retry) would both find the
  // file that long and both append. Other files' parts, most of them, go on meanwhile.
  static std::array<std::mutex, 64> writing;
  std::lock_guard<std::mutex> lock(writing[std::hash<std::string>{}(path.string()) % writing.size()]);
  const fs::path part = path.string() + ".part";
  std::error_code ec;
  if (offset == 0) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("cannot create ", path.parent_path().string(), ": ", ec.message()));
    }
  }
  const uintmax_t have = offset == 0 ? 0 : fs::file_size(part, ec);
  if (ec || have != offset) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrFormat("a part of %s at byte %d, where %d bytes of it are here: ship the file from "
                                        "its start",
                                        path.string(), offset, ec ? 0 : have));
  }
  {
    std::ofstream f(part, offset == 0 ? std::ios::binary | std::ios::trunc : std::ios::binary | std::ios::app);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f.flush()) return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot write ", part.string()));
  }
  if (offset + data.size() == file_bytes) {
    fs::rename(part, path, ec);
    if (ec) return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot rename ", part.string()));
  }
  return grpc::Status::OK;
}

// Per-iteration reports of every worker.
struct IterationRecord {
  std::map<int, proto::IterationReport> reports;  // by worker id
};

class Service final : public proto::Coordinator::Service {
 public:
  // `restored`: the job state a coordinator before this one left (job_state.pb), whose next plan
  // version this one publishes at once.
  Service(const JobConfig& cfg, int64_t start_iteration, std::string resume_name, int64_t stop_at, MetricsLog metrics,
          SampleAudit samples, std::optional<NetworkCost> network, JobSecret secret,
          const std::optional<proto::JobState>& restored, std::string run_dir_token)
      : verifier_(std::move(secret)),
        run_dir_token_(std::move(run_dir_token)),
        network_(std::move(network)),
        probing_(cfg.cluster.stages * cfg.cluster.replicas > 1 &&
                 (cfg.cluster.link_probe == ClusterConfig::LinkProbe::kOn ||
                  (cfg.cluster.link_probe == ClusterConfig::LinkProbe::kAuto && !network_))),
        links_(network_ ? "the scenario's links" : ""),
        cfg_(cfg), expected_(cfg.cluster.stages * cfg.cluster.replicas), start_(start_iteration),
        end_(stop_at > 0 ? std::min(stop_at, cfg.train.steps) : cfg.train.steps), resume_name_(std::move(resume_name)),
        members_(cfg.cluster.job_id, expected_, cfg.cluster.spares, cfg.cluster.dead_after_s,
                 SuspectSilentSeconds(cfg.cluster), cfg.cluster.lifeline_grace_s),
        latest_step_(start_), latest_name_(resume_name_),
        samples_(std::move(samples)),
        log_(cfg, start_, end_, std::move(metrics)),
        job_metrics_(cfg) {
    if (restored) Restore(*restored);
  }

  // Prometheus's text for the metrics endpoint and metrics.prom (job_metrics.h).
  std::string Metrics() const { return job_metrics_.Render(verifier_.refused()); }

  grpc::Status Register(grpc::ServerContext* ctx, const proto::RegisterRequest* req, proto::RegisterReply* reply) override {
    if (grpc::Status st = verifier_.Check(*ctx, "Register", *req); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    const absl::StatusOr<int> registered = members_.Register(*req, Clock::now());
    if (!registered.ok()) return ToGrpc(registered.status());
    const int id = *registered;
    const bool spare = plan_.version() > 0 || id >= expected_;
    std::cout << (spare ? absl::StrFormat("coordinator: worker %d registered from %s (%s, pid %d) as a spare\n", id,
                                          req->address(), req->host(), req->pid())
                        : absl::StrFormat("coordinator: worker %d registered from %s (%s, pid %d), %d/%d\n", id,
                                          req->address(), req->host(), req->pid(), id + 1, expected_))
              << std::flush;
    reply->set_worker_id(id);
    reply->set_heartbeat_s(cfg_.cluster.heartbeat_s);
    reply->set_dead_after_s(cfg_.cluster.dead_after_s);
    reply->set_config_toml(cfg_.toml_text);
    reply->set_probe_links(probing_ && !spare);
    if (plan_.version() > 0) WriteJobState();
    return grpc::Status::OK;
  }

  grpc::Status ReportProfile(grpc::ServerContext* ctx, const proto::ProfileReport* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ReportProfile", *req); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    if (AssignmentOf(plan_, req->worker_id()) != nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d reports a profile after the plan was made", req->worker_id()));
    }
    members_.Heard(req->worker_id(), Clock::now());
    if (grpc::Status st = ToGrpc(members_.SetProfile(req->worker_id(), req->compute())); !st.ok()) return st;
    if (plan_.version() == 0 && members_.profiled() && !probing_) MakePlan();
    if (plan_.version() > 0) WriteJobState();
    if (!vacant_.empty()) Replan();  // a spare some lost worker's place waited for
    cv_.notify_all();  // GetPeers waits for every profile
    return grpc::Status::OK;
  }

  // Peers are handed out once every worker reported its profile: each has set its tensor
  // server's job id by then, and no compute probe runs beside the link probes.
  grpc::Status GetPeers(grpc::ServerContext* ctx, const proto::PeersRequest* req, proto::Peers* peers) override {
    if (grpc::Status st = verifier_.Check(*ctx, "GetPeers", *req); !st.ok()) return st;
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    members_.Heard(req->worker_id(), Clock::now());
    if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] { return members_.profiled() || !abort_.empty(); })) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "not every worker has registered and reported its profile");
    }
    if (!abort_.empty()) return grpc::Status(grpc::StatusCode::ABORTED, abort_);
    for (const auto& [id, reg] : members_.registrations()) {
      proto::Peer* p = peers->add_peers();
      p->set_worker_id(id);
      p->set_address(reg.address());
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportLinks(grpc::ServerContext* ctx, const proto::LinkReport* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ReportLinks", *req); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    if (!probing_ || plan_.version() > 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d reports links %s", req->worker_id(),
                                          probing_ ? "after the plan was made" : "where the job probes none"));
    }
    members_.Heard(req->worker_id(), Clock::now());
    if (grpc::Status st = ToGrpc(members_.SetLinks(req->worker_id(), *req)); !st.ok()) return st;
    if (members_.profiled() && members_.linked()) {
      // Workers that all share one address measured nothing: the links stay as they were (a
      // scenario's, or unknown, when registration order and the config's cut stand rather than a
      // search steered by the noise between equal workers).
      if (!MeasuredLinksJson().empty()) {
        network_ = MeasuredNetwork();
        links_ = "the links the workers measured";
      }
      MakePlan();
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPlan(grpc::ServerContext* ctx, const proto::PlanRequest* req, proto::Plan* plan) override {
    if (grpc::Status st = verifier_.Check(*ctx, "GetPlan", *req); !st.ok()) return st;
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    members_.Heard(req->worker_id(), Clock::now());
    auto placed = [&] { return plan_.version() > req->known_version() && AssignmentOf(plan_, req->worker_id()); };
    cv_.wait_for(lock, std::chrono::seconds(5), [&] { return placed() || finished_ || !abort_.empty(); });
    if (!abort_.empty()) return grpc::Status(grpc::StatusCode::ABORTED, abort_);
    if (placed()) {
      *plan = PlanToSend();
      return grpc::Status::OK;
    }
    if (finished_) return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "the job finished");
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;  // lost while it waited
    return grpc::Status(grpc::StatusCode::NOT_FOUND, plan_.version() == 0 ? "no plan yet: waiting for workers"
                                                                          : "no place for this worker yet");
  }

  grpc::Status Ready(grpc::ServerContext* ctx, const proto::ReadyRequest* req, proto::ReadyReply* reply) override {
    if (grpc::Status st = verifier_.Check(*ctx, "Ready", *req); !st.ok()) return st;
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    if (req->plan_version() != plan_.version()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d is ready for plan version %d; the plan is version %d",
                                          req->worker_id(), req->plan_version(), plan_.version()));
    }
    // The barrier counts the plan's workers: a spare's word would open it early, or never.
    if (AssignmentOf(plan_, req->worker_id()) == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d has no place in plan version %d to be ready for",
                                          req->worker_id(), plan_.version()));
    }
    ready_.insert(req->worker_id());
    cv_.notify_all();
    const uint64_t version = plan_.version();
    if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] {
          return static_cast<int>(ready_.size()) == plan_.assignments_size() || !abort_.empty() ||
                 plan_.version() != version;
        })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "waiting for every worker to install the plan");
    }
    if (plan_.version() != version) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("plan version %d replaced version %d", plan_.version(), version));
    }
    reply->set_abort(!abort_.empty());
    reply->set_reason(abort_);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    if (grpc::Status st = verifier_.Check(*ctx, "Heartbeat", *req); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    members_.Heard(req->worker_id(), Clock::now());
    reply->set_abort(!abort_.empty());
    reply->set_reason(abort_);
    reply->set_plan_version(plan_.version());
    reply->set_coordinator_boot_id(boot_id_);
    reply->set_coordinator_clock_us(Timeline::NowMicros());
    return grpc::Status::OK;
  }

  grpc::Status ReportIteration(grpc::ServerContext* ctx, const proto::IterationReport* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ReportIteration", *req); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckAssigned(req->worker_id(), req->iteration(), req->plan_version()); !st.ok()) return st;
    const proto::Assignment& a = *AssignmentOf(plan_, req->worker_id());
    if (req->stage() != a.stage() || req->replica() != a.replica()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("worker %d reports as stage %d replica %d; the plan has it at stage %d "
                                          "replica %d",
                                          req->worker_id(), req->stage(), req->replica(), a.stage(), a.replica()));
    }
    if (grpc::Status st = CheckParamsIterations(*req); !st.ok()) return st;
    if (grpc::Status st = CheckParamsOnce(*req); !st.ok()) return st;
    if (grpc::Status st = CheckTimes(*req); !st.ok()) return st;
    if (grpc::Status st = CheckMicroBatches(*req); !st.ok()) return st;
    if (grpc::Status st = CheckValidation(*req); !st.ok()) return st;
    if (req->iteration() <= completed_through_) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("iteration %d is complete: worker %d reported it already",
                                          req->iteration() + 1, req->worker_id()));
    }
    IterationRecord& rec = iterations_[req->iteration()];
    if (rec.reports.count(req->worker_id()) > 0) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("worker %d already reported iteration %d", req->worker_id(),
                                          req->iteration() + 1));
    }
    if (grpc::Status st = ToGrpc(job_metrics_.Report(*req)); !st.ok()) return st;
    CheckReplicasAgree(*req);
    rec.reports.emplace(req->worker_id(), *req);
    if (static_cast<int>(rec.reports.size()) == plan_.assignments_size()) {
      Audit(req->iteration(), rec.reports);
      job_metrics_.Complete(req->iteration(), rec.reports);
      WriteMetricsFile();
      if (absl::Status st = log_.Record(req->iteration(), plan_.stages(), rec.reports); !st.ok() && abort_.empty()) {
        Abort(std::string(st.message()));
      }
      std::optional<std::pair<int, std::string>> move;  // a straggler a spare replaces, once the report is in
      std::optional<std::pair<int, proto::Plan>> rebalance;  // or the plan that moves blocks off it
      // A move sends every worker back to the last complete checkpoint: worth it only where that
      // redoes fewer iterations than the straggler was watched for.
      const int64_t redo = req->iteration() + 1 - latest_step_;
      const bool movable = cfg_.cluster.replace_stragglers && redo <= StragglerWatch::kWindow;
      for (const auto& [id, s] : stragglers_.Add(rec.reports)) {
        const proto::IterationReport& r = rec.reports.at(id);
        const std::string what = absl::StrCat(
            absl::StrFormat("worker %d (stage %d, replica %d) straggles: its compute per iteration, median of the "
                            "last %d, is %.2fx its own at the start of the run (beyond the other workers' drift)",
                            id, r.stage(), r.replica(), StragglerWatch::kWindow, s.vs_start),
            plan_.replicas() > 1 ? absl::StrFormat(" and %.2fx its stage's other replicas'", s.vs_peers) : "");
        const bool may = movable && !move && !rebalance;
        std::string outcome;
        if (may && !Spares().empty()) {
          move.emplace(id, what);
          outcome = "a spare takes its place and it waits as a spare";
        } else if (may) {
          absl::StatusOr<proto::Plan> p = Rebalanced();
          if (p.ok()) {
            outcome = absl::StrCat("no spare waits: blocks move off it, ", CutChange(*p));
            rebalance.emplace(id, *std::move(p));
          } else {
            outcome = absl::StrCat("it keeps its place: ", p.status().message());
          }
        } else {
          outcome = absl::StrFormat(
              "it keeps its place (slow, not dead; it moves to a waiting spare, or blocks move off its stage, "
              "where cluster.replace_stragglers is on and the last complete checkpoint is at most %d iterations "
              "back, here %d)",
              StragglerWatch::kWindow, redo);
        }
        std::cout << "coordinator: " << what << "; " << outcome << "\n" << std::flush;
      }
      // Iterations complete in order (each worker reports its own in order): the record goes once
      // every use above is done, a run's reports not kept for its length.
      completed_through_ = req->iteration();
      iterations_.erase(req->iteration());
      job_metrics_.SetSlowdowns(stragglers_.Current());
      if (req->iteration() == start_ + 2) {
        if (const std::optional<double> p = Predict()) {
          std::cout << absl::StrFormat("coordinator: the planner predicts %.3f s per iteration from the compute "
                                       "measured so far and %s\n",
                                       *p, links_)
                    << std::flush;
        }
      }
      if (move) {
        slow_.insert(move->first);
        vacant_since_ = Clock::now();
        vacant_[move->first] = move->second;
        recoveries_.push_back({{"worker", move->first},
                               {"stage", AssignmentOf(plan_, move->first)->stage()},
                               {"replica", AssignmentOf(plan_, move->first)->replica()},
                               {"straggler", true},
                               {"plan_version", plan_.version()}});
        pending_.push_back({recoveries_.size() - 1, move->first, Clock::now(), move->second});
        Replan();
      }
      if (rebalance) {
        eased_.insert(rebalance->first);
        AdoptRebalance(rebalance->first, std::move(rebalance->second), false);
      } else if (!move && movable) {
        MoveBlocksBack();
      }
    }
    return grpc::Status::OK;
  }

  // REQUIRES: mu_ held, a move allowed now (cluster.replace_stragglers, the last checkpoint near).
  // A worker whose blocks moved off it computes fast again (its straggling passed: a noisy
  // neighbour left): the blocks move back, as far as its pace now says, where that is predicted
  // faster.
  void MoveBlocksBack() {
    for (auto it = eased_.begin(); it != eased_.end();) {
      const int id = *it;
      const proto::Assignment* a = AssignmentOf(plan_, id);
      if (a == nullptr) {
        it = eased_.erase(it);
        continue;
      }
      if (!stragglers_.Quick(id)) {
        ++it;
        continue;
      }
      it = eased_.erase(it);
      const std::string what = absl::StrFormat(
          "worker %d (stage %d, replica %d), whose blocks moved off it, computes %.2fx as fast as since they moved",
          id, a->stage(), a->replica(), 1 / stragglers_.Drift(id));
      absl::StatusOr<proto::Plan> p = Rebalanced();
      if (!p.ok()) {
        std::cout << "coordinator: " << what << "; the cut stays: " << p.status().message() << "\n" << std::flush;
        return;
      }
      std::cout << "coordinator: " << what << "; blocks move back, " << CutChange(*p) << "\n" << std::flush;
      AdoptRebalance(id, *std::move(p), true);
      return;
    }
  }

  // REQUIRES: mu_ held. The next version with the blocks cut anew at the workers' paces now, from
  // the last complete checkpoint (RebalancePlan).
  absl::StatusOr<proto::Plan> Rebalanced() const {
    return RebalancePlan(plan_, {latest_step_, latest_name_, end_}, PacedProfiles(), members_.registrations());
  }

  // REQUIRES: mu_ held. How `next` cuts the model against the running plan.
  std::string CutChange(const proto::Plan& next) const {
    return absl::StrFormat("[%s] blocks per stage instead of [%s]", absl::StrJoin(BlocksPerStage(next), ", "),
                           absl::StrJoin(cfg_.Cut(), ", "));
  }

  // REQUIRES: mu_ held. `next` (RebalancePlan's) moves blocks off straggling worker `id`, or, with
  // `back`, back to it: every worker goes back to the last complete checkpoint.
  void AdoptRebalance(int id, proto::Plan next, bool back) {
    const int64_t reached = Rollback();
    const proto::Assignment& a = *AssignmentOf(plan_, id);
    nlohmann::json event = {{"worker", id},
                            {"stage", a.stage()},
                            {"replica", a.replica()},
                            {"straggler", true},
                            {"blocks_per_stage", BlocksPerStage(next)},
                            {"plan_version", plan_.version()},
                            {"new_plan_version", next.version()},
                            {"rollback_to_step", start_},
                            {"redone_iterations", reached - start_}};
    if (back) event["fast_again"] = true;
    recoveries_.push_back(std::move(event));
    Adopt(std::move(next), reached,
          absl::StrFormat(back ? "blocks move back to worker %d" : "blocks move off straggling worker %d", id), {});
  }

  grpc::Status ReportCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointReport* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ReportCheckpoint", *req); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckAssigned(req->worker_id(), req->step() - 1, req->plan_version()); !st.ok()) return st;
    const proto::Assignment& a = *AssignmentOf(plan_, req->worker_id());
    const std::set<std::pair<int, int>> streams = FeedbackStreams(plan_, cfg_);
    const int job_replica = req->residual_replica() - 1;
    // Residual files count as (stage, -1 - job replica) beside the shards' (stage, shard).
    const bool residuals = req->residual_replica() > 0;
    const CheckpointPieceRoot piece{residuals ? CheckpointPieceRoot::Kind::kResidual : CheckpointPieceRoot::Kind::kShard,
                                    req->stage(), residuals ? job_replica : req->shard()};
    const std::pair<int, int> key = residuals ? std::make_pair(req->stage(), -1 - job_replica)
                                              : std::make_pair(req->stage(), req->shard());
    const std::string what = absl::StrFormat(
        "worker %d reports a checkpoint of %s of stage %d at step %d", req->worker_id(),
        residuals ? absl::StrFormat("replica %d's error-feedback residuals", job_replica)
                  : absl::StrFormat("shard %d", req->shard()),
        req->stage(), req->step());
    if (!Gives(a, piece)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what + ", which the plan does not give it");
    }
    // Checked before the piece is counted: a premature report would make the step's real one a
    // second report.
    const int64_t end = RunEnd(plan_, cfg_);
    if (!cfg_.train.CheckpointsAfter(req->step() - 1, end)) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrFormat("%s, where none is due (train.checkpoint_every = %d, local_steps = %d, this plan ends after "
                          "step %d): does the worker run the job's config?",
                          what, cfg_.train.checkpoint_every, cfg_.train.local_steps, end));
    }
    if (!checkpointed_[req->step()].insert(key).second) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what + ", which was already reported");
    }
    if (checkpointed_[req->step()].size() == plan_.shards_size() + streams.size()) {
      // Every shard is on disk: only now does `latest` move, so a resume never finds half a step.
      const std::string root = (fs::path(cfg_.train.out_dir) / "checkpoints").string();
      if (absl::Status st = SetLatestCheckpoint(root, req->step()); !st.ok()) {
        return grpc::Status(grpc::StatusCode::INTERNAL, std::string(st.message()));
      }
      std::cout << absl::StrFormat("coordinator: checkpoint %s complete (%d shards%s) in %s\n",
                                   CheckpointName(req->step()), plan_.shards_size(),
                                   streams.empty() ? "" : absl::StrFormat(", %d error-feedback residuals", streams.size()),
                                   root)
                << std::flush;
      latest_step_ = req->step();
      latest_name_ = CheckpointName(req->step());
      if (absl::Status st = PruneCheckpoints(root, latest_step_, cfg_.train.keep_checkpoints); !st.ok()) {
        std::cout << "coordinator: warning: " << st.message() << "\n";
      }
      checkpointed_.erase(checkpointed_.begin(), checkpointed_.find(req->step()));
      // No rollback goes before this step: the checks of earlier iterations are only counted now.
      const auto settled = replica_checked_.lower_bound(latest_step_);
      replicas_checked_before_ += std::distance(replica_checked_.begin(), settled);
      replica_checked_.erase(replica_checked_.begin(), settled);
      CheckFinished();
      Grow();
    }
    return grpc::Status::OK;
  }

  // A worker that does not share this run directory ships each checkpoint piece it writes here,
  // file by file in parts, before it reports the piece: a complete checkpoint is then whole here,
  // whichever machines wrote it, and a worker that takes over a lost one's place fetches what it
  // lacks from here (FetchCheckpoint). Every part is checked against the plan before a byte is
  // written: the piece must be one the worker's place writes, the file one a checkpoint has, its
  // size no more than the piece's tensors take, and parts come in order.
  grpc::Status ShipCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointChunk* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ShipCheckpoint", *req); !st.ok()) return st;
    const absl::StatusOr<CheckpointPieceRoot> piece = ParseCheckpointPieceRoot(req->piece());
    if (!piece.ok()) return ToGrpc(piece.status());
    fs::path path;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (grpc::Status st = CheckAssigned(req->worker_id(), req->step() - 1, req->plan_version()); !st.ok()) return st;
      if (!Gives(*AssignmentOf(plan_, req->worker_id()), *piece)) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrFormat("worker %d ships checkpoint piece %s, which plan version %d does not give it",
                                            req->worker_id(), req->piece(), plan_.version()));
      }
      const auto [floats, tensors] = PieceSize(*piece);
      const absl::StatusOr<uint64_t> most =
          MaxCheckpointFileBytes(req->file(), floats, tensors, piece->kind != CheckpointPieceRoot::Kind::kResidual);
      if (!most.ok()) return ToGrpc(most.status());
      if (req->file_bytes() > *most) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrFormat("%s/%s of %d bytes: the plan's piece of %d parameters takes at most %d",
                                            req->piece(), req->file(), req->file_bytes(), floats, *most));
      }
      if (grpc::Status st = CheckPart(req->file_bytes(), req->offset(), req->data().size()); !st.ok()) return st;
      path = fs::path(cfg_.train.out_dir) / "checkpoints" / req->piece() / CheckpointName(req->step()) / req->file();
    }
    return ReceivePart(path, req->file_bytes(), req->offset(), req->data());
  }

  // A worker's timeline, where it does not share this run directory: into timeline/worker_N.json,
  // whose name the coordinator gives; at most kMaxTimelineBytes.
  grpc::Status ShipTimeline(grpc::ServerContext* ctx, const proto::TimelineChunk* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ShipTimeline", *req); !st.ok()) return st;
    fs::path path;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
      path = TimelinePath(req->worker_id());
    }
    if (req->file_bytes() > kMaxTimelineBytes) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrFormat("a timeline of %d bytes; the coordinator takes at most %d",
                                          req->file_bytes(), kMaxTimelineBytes));
    }
    if (grpc::Status st = CheckPart(req->file_bytes(), req->offset(), req->data().size()); !st.ok()) return st;
    return ReceivePart(path, req->file_bytes(), req->offset(), req->data());
  }

  // A part of a file of the checkpoint the asking worker's plan resumes from, for a worker that
  // does not share this run directory and lacks the piece (a spare that took a lost worker's place).
  grpc::Status FetchCheckpoint(grpc::ServerContext* ctx, const proto::CheckpointFetch* req,
                               proto::CheckpointChunk* reply) override {
    if (grpc::Status st = verifier_.Check(*ctx, "FetchCheckpoint", *req); !st.ok()) return st;
    if (grpc::Status st = ToGrpc(ParseCheckpointPieceRoot(req->piece()).status()); !st.ok()) return st;
    if (!IsCheckpointFile(req->file())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("\"%s\" is no file a checkpoint holds", absl::CHexEscape(req->file())));
    }
    fs::path path;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
      if (req->plan_version() != plan_.version() || AssignmentOf(plan_, req->worker_id()) == nullptr ||
          plan_.resume_checkpoint().empty()) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrFormat("worker %d asks for a checkpoint under plan version %d; plan version %d "
                                            "%s",
                                            req->worker_id(), req->plan_version(), plan_.version(),
                                            plan_.resume_checkpoint().empty() ? "resumes from none"
                                                                              : "is the one to fetch under"));
      }
      path = fs::path(cfg_.train.out_dir) / "checkpoints" / req->piece() / plan_.resume_checkpoint() / req->file();
      reply->set_step(*CheckpointStep(plan_.resume_checkpoint()));
    }
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat(path.string(), " is not here"));
    if (req->offset() > size) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                          absl::StrFormat("byte %d of %s, which has %d", req->offset(), path.string(), size));
    }
    std::string data(std::min<uint64_t>(kCheckpointChunkBytes, size - req->offset()), '\0');
    std::ifstream f(path, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(req->offset()));
    if (!f.read(data.data(), static_cast<std::streamsize>(data.size()))) {
      return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot read ", path.string()));
    }
    reply->set_piece(req->piece());
    reply->set_file(req->file());
    reply->set_file_bytes(size);
    reply->set_offset(req->offset());
    reply->set_data(std::move(data));
    return grpc::Status::OK;
  }

  grpc::Status ReportSuspect(grpc::ServerContext* ctx, const proto::SuspectReport* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ReportSuspect", *req); !st.ok()) return st;
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    if (plan_.version() == 0) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no plan yet");
    // The first report of the running version's failure: a loss, once found, answers it; where
    // every worker is heard from after it instead, the layout starts again (Supervise).
    if (!req->failure().empty() && req->plan_version() == plan_.version() && !restart_) {
      restart_ = Restart{req->worker_id(), req->failure().substr(0, 1000), Clock::now(), false, {}};
      cv_.notify_all();
    }
    if (req->plan_version() > plan_.version()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d reports under plan version %d; the plan is version %d",
                                          req->worker_id(), req->plan_version(), plan_.version()));
    }
    // Connections outlive a version, and one whose last tensor was of an earlier version may close
    // after the next began (a peer killed before it sent anything of the new one): the place is
    // that version's, whose worker may hold another place now, or none. A version too old to be
    // kept names nobody to suspect.
    const auto reported = recent_plans_.find(req->plan_version());
    if (reported == recent_plans_.end()) return grpc::Status::OK;
    const int suspect = WorkerAt(reported->second, req->stage(), req->replica());
    if (suspect < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("plan version %d has no stage %d replica %d", req->plan_version(),
                                          req->stage(), req->replica()));
    }
    if (suspect == req->worker_id()) return grpc::Status::OK;
    members_.Suspect(suspect, req->worker_id(), Clock::now());
    cv_.notify_all();  // with its lifeline closed too, it is lost soon (Supervise)
    ProbeGone(lock, {suspect});
    return grpc::Status::OK;
  }

  // REQUIRES: `lock` holds mu_. Evidence came that workers `ids` may be gone: where the
  // coordinator reached a worker's tensor address before, a refusal there now (nothing listens)
  // loses it at once (Membership::Refused). The dials leave mu_ for at most
  // cluster.lifeline_grace_s: a host that vanished answers nothing, and the other rules lose its
  // worker. The ports' answers, of the workers dialled.
  std::map<int, PortAnswer> ProbeGone(std::unique_lock<std::mutex>& lock, const std::vector<int>& ids) {
    std::vector<int> reachable;
    for (int id : ids)
      if (members_.reachable(id)) reachable.push_back(id);
    const std::map<int, PortAnswer> answers =
        DialWorkers(lock, reachable, std::chrono::duration<double>(cfg_.cluster.lifeline_grace_s));
    for (const auto& [id, answer] : answers) {
      if (answer == PortAnswer::kRefused && members_.Check(id).ok()) {
        members_.Refused(id, Clock::now());
        cv_.notify_all();
      }
    }
    return answers;
  }

  // REQUIRES: `lock` holds mu_, which the dials of workers `ids`' tensor addresses (ProbePort)
  // leave for `wait` at most. The dials go out together: over slow links, one after another would
  // cost a round trip each.
  std::map<int, PortAnswer> DialWorkers(std::unique_lock<std::mutex>& lock, const std::vector<int>& ids,
                                        std::chrono::duration<double> wait) {
    std::map<int, PortAnswer> answers;
    if (ids.empty()) return answers;
    std::vector<std::string> addresses;
    for (int id : ids) addresses.push_back(members_.registration(id).address());
    const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(wait);
    lock.unlock();
    std::vector<std::future<PortAnswer>> dialled;  // all but the first, which this thread dials
    for (size_t i = 1; i < ids.size(); ++i)
      dialled.push_back(std::async(std::launch::async, ProbePort, addresses[i], deadline));
    answers[ids[0]] = ProbePort(addresses[0], deadline);
    for (size_t i = 1; i < ids.size(); ++i) answers[ids[i]] = dialled[i - 1].get();
    lock.lock();
    return answers;
  }

  // Held until the worker goes (its process's connection closes: the call is cancelled), the job
  // ends or the worker holds a newer one, carrying each new plan version; a worker of the job
  // whose lifeline closes is cut off (Membership::CutOff). One call per worker: each holds one of
  // the server's threads.
  grpc::Status Lifeline(grpc::ServerContext* ctx, const proto::LifelineRequest* req,
                        grpc::ServerWriter<proto::LifelineNews>* news) override {
    if (grpc::Status st = verifier_.Check(*ctx, "Lifeline", *req); !st.ok()) return st;
    std::unique_lock<std::mutex> lock(mu_);
    const int id = req->worker_id();
    if (grpc::Status st = CheckWorker(id); !st.ok()) return st;
    members_.Reconnected(id);
    // A worker holds its lifeline again at once: the call it replaces may notice its own end only
    // after this one began, and must not cut the worker off then.
    const uint64_t call = ++lifeline_calls_[id];
    cv_.notify_all();  // the call this one replaces ends
    // Whether this coordinator reaches the worker's tensor port at all (ProbeGone).
    if (!members_.reachable(id) && DialWorkers(lock, {id}, std::chrono::seconds(1))[id] == PortAnswer::kListening &&
        members_.Check(id).ok()) {
      members_.Reachable(id);
    }
    uint64_t told = plan_.version();
    std::optional<uint64_t> told_members;  // members_.changes() when last told
    while (!ctx->IsCancelled() && !finished_ && abort_.empty() && members_.Check(id).ok() &&
           lifeline_calls_[id] == call) {
      if (plan_.version() > told || told_members != members_.changes()) {
        const bool new_version = plan_.version() > told;
        told = plan_.version();
        told_members = members_.changes();
        proto::LifelineNews n;
        if (new_version && AssignmentOf(plan_, id) != nullptr) *n.mutable_plan() = PlanToSend();
        n.set_plan_version(told);
        for (const auto& [worker, reg] : members_.registrations()) {
          proto::Peer* p = n.add_members();
          p->set_worker_id(worker);
          p->set_address(reg.address());
        }
        lock.unlock();
        const bool sent = news->Write(n);
        lock.lock();
        if (!sent) break;
        continue;
      }
      // A closed lifeline is noticed here only: its delay is part of every failure's detection.
      cv_.wait_for(lock, kLifelinePoll);
    }
    if (lifeline_calls_[id] != call) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          absl::StrFormat("a newer lifeline of worker %d began: it holds one at a time", id));
    }
    if (ctx->IsCancelled() && members_.Check(id).ok()) {
      members_.CutOff(id, Clock::now());
      cv_.notify_all();
      ProbeGone(lock, {id});
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportDone(grpc::ServerContext* ctx, const proto::DoneReport* req, proto::Empty*) override {
    if (grpc::Status st = verifier_.Check(*ctx, "ReportDone", *req); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    if (req->timeline_bytes() > kMaxTimelineBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("a timeline of %d bytes (at most %d)", req->timeline_bytes(),
                                          kMaxTimelineBytes));
    }
    // A worker done is never lost: one the plan still runs is done only once the job is.
    if (req->ok() && !finished_ && abort_.empty() && AssignmentOf(plan_, req->worker_id()) != nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d says it is done, but plan version %d runs it and the job has "
                                          "not finished",
                                          req->worker_id(), plan_.version()));
    }
    members_.Done(req->worker_id(),
                  {TimelinePath(req->worker_id()).string(), req->timeline_bytes(), req->timeline_crc32c()});
    // Bounded: the reason goes out again in every heartbeat's reply.
    if (!req->ok() && abort_.empty()) {
      Abort(absl::StrCat("worker ", req->worker_id(), " failed: ", req->error().substr(0, 1000)));
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  // Runs until every worker is done, or the job fails or is interrupted; then writes the run's
  // records, whatever ended it (metrics.csv is already complete: it grows with every iteration).
  absl::Status Supervise() {
    std::unique_lock<std::mutex> lock(mu_);
    auto last_wait_note = Clock::now();
    while (true) {
      // Often enough that a lost worker's detection is not this loop's period; a restart is
      // considered as soon as its grace ends.
      const auto wake = Clock::now() + std::chrono::milliseconds(50);
      cv_.wait_until(lock, restart_ && Clock::now() < restart_->at + kRestartGrace
                               ? std::min(wake, restart_->at + kRestartGrace)
                               : wake);
      if (g_stop_requested && abort_.empty()) Abort(absl::StrCat("interrupted; ", ResumeAdvice()));
      const int done = members_.done();
      // The plan's workers and the spares heard that the job finished (GetPlan); one that died
      // since is not waited for.
      if (finished_ && (done == members_.registered() || Clock::now() - finished_time_ > std::chrono::seconds(5))) {
        break;
      }
      if (!abort_.empty() && (done == members_.registered() ||
                              Clock::now() - abort_time_ > std::chrono::seconds(5))) {
        break;  // the workers heard it through their heartbeats; don't wait for a dead one
      }
      // As often as a silent worker would be declared dead, at most every 10 s.
      const double note_every_s = std::min(10.0, cfg_.cluster.dead_after_s);
      if (plan_.version() == 0 &&
          std::chrono::duration<double>(Clock::now() - last_wait_note).count() > note_every_s) {
        std::cout << absl::StrFormat("coordinator: waiting for workers, %d/%d registered; %s\n", members_.registered(),
                                     expected_, UnfilledSlots())
                  << std::flush;
        last_wait_note = Clock::now();
      }
      if (const auto silent = members_.Silent(Clock::now()); silent && abort_.empty() && !finished_) {
        Lose(*silent);
      }
      if (!vacant_.empty() && abort_.empty()) Replan();
      if (restart_ && vacant_.empty() && abort_.empty() && !finished_) MaybeRestart(lock);
    }
    if (const std::optional<double> p = Predict()) log_.SetPrediction(*p);
    nlohmann::json stragglers = nlohmann::json::array();
    for (const auto& [id, s] : stragglers_.worst()) {
      stragglers.push_back({{"worker", id}, {"slowdown_vs_start", s.vs_start}, {"slowdown_vs_peers", s.vs_peers}});
    }
    log_.SetStragglers(std::move(stragglers));
    nlohmann::json summary =
        log_.Summary(abort_.empty() ? "completed" : g_stop_requested ? "interrupted" : "failed", abort_,
                     replicas_checked_before_ + static_cast<int64_t>(replica_checked_.size()));
    summary["audit"] = AuditSummary();
    summary["recoveries"] = recoveries_;
    std::vector<std::string> traces;
    for (const auto& [id, t] : members_.timelines()) {
      if (const absl::Status st = CheckTraceFile(t); st.ok()) {
        traces.push_back(t.path);
      } else {
        std::cout << absl::StrFormat("coordinator: worker %d's timeline is left out of timeline.json (%s: on a disk "
                                     "this machine does not share, it stays there)\n",
                                     id, st.message());
      }
    }
    log_.Write(summary, traces);
    WriteMetricsFile();
    // The job ended here, whatever ended it: a coordinator started on this directory starts anew
    // (or resumes from a checkpoint where train.resume says so).
    std::error_code ec;
    state_closed_ = true;  // a worker registering late must not bring the job state back
    state_writer_.Flush();
    fs::remove(JobStatePath(cfg_), ec);
    if (!abort_.empty()) return absl::AbortedError(abort_);
    log_.PrintSummary(summary);
    return absl::OkStatus();
  }

 private:
  // REQUIRES: mu_ held. The planner's iteration time from the compute measured so far and the
  // links (the scenario's or the measured; the coordinator beside every host, as an emulation's
  // router is), if the links are known.
  std::optional<double> Predict() const {
    // The planner prices the config's layout, not a shrunk one.
    // The measured compute is per worker over the whole run: a re-cut changed what some ran.
    if (!network_ || plan_.replicas() != cfg_.cluster.replicas || recut_) return std::nullopt;
    const std::vector<double> compute = log_.ComputePerMicroByWorker();
    if (compute.empty()) return std::nullopt;
    const absl::StatusOr<double> p =
        PredictFromMeasuredCompute(cfg_, compute, *network_, worker_of_slot_, ShardOwners(plan_));
    if (!p.ok()) {
      std::cout << "coordinator: no prediction: " << p.status().message() << "\n";
      return std::nullopt;
    }
    return *p;
  }

  // REQUIRES: mu_ held, members_.linked(). Worker w is host w; a link's one-way delay is half the
  // round trip its sender measured; workers at one address talk for free.
  NetworkCost MeasuredNetwork() const {
    std::vector<std::vector<LinkCost>> links(expected_, std::vector<LinkCost>(expected_));
    for (int a = 0; a < expected_; ++a)
      for (int b = 0; b < expected_; ++b)
        if (const std::optional<proto::LinkMeasurement> m = members_.link(a, b)) {
          links[a][b] = MeasuredLink(m->round_trip_s(), m->bytes_per_s());
        }
    return NetworkCost::FromMatrix(std::move(links));
  }

  // REQUIRES: mu_ held, members_.linked().
  nlohmann::json MeasuredLinksJson() const {
    nlohmann::json out = nlohmann::json::array();
    for (int a = 0; a < expected_; ++a)
      for (int b = 0; b < expected_; ++b)
        if (const std::optional<proto::LinkMeasurement> m = members_.link(a, b)) {
          out.push_back({{"from", a}, {"to", b}, {"round_trip_ms", 1e3 * m->round_trip_s()},
                         {"mbit_per_s", 8e-6 * m->bytes_per_s()}});
        }
    return out;
  }

  // REQUIRES: mu_ held. Whether the plan has the worker at `a` write checkpoint piece `piece`.
  bool Gives(const proto::Assignment& a, const CheckpointPieceRoot& piece) const {
    switch (piece.kind) {
      case CheckpointPieceRoot::Kind::kShard:
        return HostsShard(plan_, a, piece.stage, piece.index);
      case CheckpointPieceRoot::Kind::kResidual:
        return a.stage() == piece.stage && piece.index / GroupsPerReplica(plan_, cfg_) == a.replica() &&
               FeedbackStreams(plan_, cfg_).count({piece.stage, piece.index}) > 0;
      case CheckpointPieceRoot::Kind::kLocal:
        return cfg_.train.local_steps > 1 && a.stage() == piece.stage && a.replica() == piece.index;
    }
    return false;
  }

  // REQUIRES: mu_ held and Gives(piece). The parameters and tensors of a piece of the plan.
  std::pair<uint64_t, size_t> PieceSize(const CheckpointPieceRoot& piece) const {
    const ParamLayout layout(cfg_.model, cfg_.Stage(piece.stage));
    if (piece.kind != CheckpointPieceRoot::Kind::kShard) return {layout.total(), layout.tensors().size()};
    for (const proto::ShardPlacement& sp : plan_.shards()) {
      if (sp.stage() != piece.stage || sp.shard() != piece.index) continue;
      const auto [begin, end] = layout.Range(sp.first_tensor(), sp.end_tensor());
      return {end - begin, static_cast<size_t>(sp.end_tensor() - sp.first_tensor())};
    }
    return {0, 0};
  }

  // REQUIRES: mu_ held. Worker ids come from the network: only registered ones are served.
  grpc::Status CheckWorker(int id) const { return ToGrpc(members_.Check(id)); }

  // REQUIRES: mu_ held. A registered worker of the plan, reporting an iteration of this run under
  // the plan's version: a report of a replaced plan's iteration must not count for the new one's.
  grpc::Status CheckAssigned(int id, int64_t iteration, uint64_t version) const {
    if (grpc::Status st = CheckWorker(id); !st.ok()) return st;
    if (plan_.version() == 0) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no plan yet");
    if (version != plan_.version()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d reports under plan version %d; the plan is version %d", id,
                                          version, plan_.version()));
    }
    if (AssignmentOf(plan_, id) == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d has no place in plan version %d", id, plan_.version()));
    }
    if (iteration < start_ || iteration >= end_) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                          absl::StrFormat("iteration %d is outside this run's [%d, %d)", iteration, start_, end_));
    }
    // Held until complete: no worker runs further ahead of the others than its mailbox's window,
    // here with room for reports on their way.
    const int64_t ahead = 8 * Mailbox::WindowIterations(cfg_.train.local_steps);
    if (iteration > std::max(completed_through_, start_ - 1) + ahead) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                          absl::StrFormat("iteration %d is more than %d past the last complete one, %d", iteration + 1,
                                          ahead, std::max(completed_through_, start_ - 1) + 1));
    }
    return grpc::Status::OK;
  }

  // A report's parameter CRCs name this iteration or the one before, each at most once.
  static grpc::Status CheckParamsIterations(const proto::IterationReport& r) {
    // At most one of each: a duplicate counted as another worker's would mark a step checked
    // before every replica's parameters were compared.
    if (r.params_size() > 2) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("worker %d's report of iteration %d carries %d parameter checksums; at most "
                                          "this iteration's and the one before's may come",
                                          r.worker_id(), r.iteration() + 1, r.params_size()));
    }
    for (int i = 0; i < r.params_size(); ++i) {
      const proto::ParamsCrc& p = r.params(i);
      if (p.iteration() > r.iteration() || p.iteration() < r.iteration() - 1 ||
          (i > 0 && p.iteration() == r.params(0).iteration())) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrFormat("worker %d's report of iteration %d carries the parameters of iteration "
                                            "%d; only this iteration's or the one before may come",
                                            r.worker_id(), r.iteration() + 1, p.iteration() + 1));
      }
    }
    return grpc::Status::OK;
  }
  // REQUIRES: mu_ held. A worker reports each step's parameters once, in step order: one counted
  // twice would mark a step checked before every replica's were compared.
  grpc::Status CheckParamsOnce(const proto::IterationReport& r) const {
    const auto last = last_crc_.find(r.worker_id());
    for (const proto::ParamsCrc& p : r.params()) {
      if (last != last_crc_.end() && p.iteration() <= last->second) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrFormat("worker %d reports the parameters of iteration %d %s", r.worker_id(),
                                            p.iteration() + 1,
                                            p.iteration() == last->second
                                                ? std::string("again")
                                                : absl::StrFormat("after those of iteration %d", last->second + 1)));
      }
    }
    return grpc::Status::OK;
  }

  // A report's times are durations: what the straggler watch and the metrics divide by.
  static grpc::Status CheckTimes(const proto::IterationReport& r) {
    for (const double t : {r.seconds(), r.compute_seconds(), r.wait_seconds()}) {
      if (!std::isfinite(t) || t < 0 || t > kLongestSeconds) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrFormat("worker %d's report of iteration %d gives a time of %g s", r.worker_id(),
                                            r.iteration() + 1, t));
      }
    }
    return grpc::Status::OK;
  }

  // REQUIRES: mu_ held. Every replica of a stage must hold the same parameters after a step; a
  // difference means the replicas train different models, so the job stops. A report carries the
  // CRC of the steps whose parameters its worker holds complete since its last report (one may
  // come a report late, IterationReport.params): each is compared with the first replica's of the
  // same stage and step, and a step counts as checked once every worker's is in.
  void CheckReplicasAgree(const proto::IterationReport& r) {
    for (const proto::ParamsCrc& p : r.params()) {
      int64_t& last = last_crc_[r.worker_id()];
      last = std::max(last, p.iteration());
      auto [first, inserted] = first_crc_.emplace(std::pair(r.stage(), p.iteration()), std::pair(r.replica(), p.crc32c()));
      if (!inserted && first->second.second != p.crc32c() && abort_.empty()) {
        Abort(absl::StrFormat("after iteration %d, replica %d of stage %d holds parameters with CRC-32C %08x and "
                              "replica %d %08x: the replicas no longer train the same model (a bug: please report it "
                              "with the config)",
                              p.iteration() + 1, first->second.first, r.stage(), first->second.second, r.replica(),
                              p.crc32c()));
      }
      if (++crcs_in_[p.iteration()] == plan_.assignments_size()) {
        if (plan_.replicas() > 1) replica_checked_.insert(p.iteration());
        crcs_in_.erase(p.iteration());
        for (int s = 0; s < cfg_.cluster.stages; ++s) first_crc_.erase({s, p.iteration()});
      }
    }
  }

  // Only the last stage reports validation losses, for the steps train.eval_every names, each
  // replica its whole share of train.eval_batches.
  grpc::Status CheckValidation(const proto::IterationReport& r) const {
    const int owed = r.stage() == plan_.stages() - 1 && cfg_.train.EvaluatesAfter(r.iteration(), RunEnd(plan_, cfg_))
                         ? cfg_.train.EvalShare(plan_.replicas(), r.replica())
                         : 0;
    if (r.val_batches() == owed && (owed > 0 || r.val_loss_sum() == 0)) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("worker %d's report of iteration %d holds %d validation micro-batches; the plan "
                                        "has %d there for stage %d replica %d",
                                        r.worker_id(), r.iteration() + 1, r.val_batches(), owed, r.stage(),
                                        r.replica()));
  }

  // A report's micro-batches are global indices of the iteration, at most the replica's count:
  // what the audit keeps is bounded by the plan.
  grpc::Status CheckMicroBatches(const proto::IterationReport& r) const {
    const int64_t all = static_cast<int64_t>(cfg_.cluster.replicas) * cfg_.train.micro_batches;
    const int per_replica = ReplicaMicroBatches(plan_, cfg_);
    bool ok = r.micro_batches_size() <= per_replica;
    for (int64_t g : r.micro_batches()) ok = ok && g >= 0 && g < all;
    if (ok) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrFormat("worker %d's report of iteration %d names %d micro-batches outside [0, %d) or "
                                        "more than the %d a replica runs",
                                        r.worker_id(), r.iteration() + 1, r.micro_batches_size(), all,
                                        per_replica));
  }

  // REQUIRES: mu_ held. Every worker reported iteration `it`: each stage ran each of the
  // iteration's global micro-batches once. A rollback forgets the iterations it redoes, so what
  // stays is what the final parameters saw.
  void Audit(int64_t it, const std::map<int, proto::IterationReport>& reports) {
    const absl::StatusOr<SampleAudit::Count> c = samples_.Record(it, plan_.stages(), reports);
    if (!c.ok() && abort_.empty()) Abort(std::string(c.status().message()));
    if (c.ok() && (c->lost > 0 || c->repeated > 0) && abort_.empty()) {
      Abort(absl::StrFormat("iteration %d: %d (stage, micro-batch) pairs not run and %d run twice (a bug: please "
                            "report it with the config)",
                            it + 1, c->lost, c->repeated));
    }
    if (it == end_ - 1) last_recorded_ = true;
    restarts_in_a_row_ = 0;
    for (const Pending& p : pending_) {
      const double stall = std::chrono::duration<double>(Clock::now() - p.failed_at).count();
      recoveries_[p.event]["stall_s"] = stall;
      recoveries_[p.event]["recovered_at_unix_s"] = UnixSeconds();
      std::cout << absl::StrFormat("coordinator: recovered: iteration %d completed %.2f s after %s\n", it + 1, stall,
                                   p.what)
                << std::flush;
    }
    if (!pending_.empty()) WriteJobState();  // the stalls outlive this coordinator
    pending_.clear();
    CheckFinished();
  }

  nlohmann::json AuditSummary() const {
    const SampleAudit::Totals t = samples_.totals();
    return {{"file", samples_.path()},
            {"steps", t.steps},
            {"pairs_per_step", cfg_.cluster.stages * cfg_.cluster.replicas * cfg_.train.micro_batches},
            {"lost", t.lost},
            {"repeated", t.repeated},
            {"redone_iterations", redone_}};
  }

  // REQUIRES: mu_ held. The last iteration is in and so is its checkpoint: nothing a lost worker
  // could take with it remains, and the workers may go.
  void CheckFinished() {
    if (finished_ || !last_recorded_ || latest_step_ != end_) return;
    finished_ = true;
    finished_time_ = Clock::now();
    cv_.notify_all();
  }

  // REQUIRES: mu_ held. Worker `lost.id` is dead. A spare's loss costs nothing; a plan worker's
  // place waits for a spare (Replan).
  void Lose(const Membership::Lost& lost) {
    const int id = lost.id;
    const std::string& address = members_.registration(id).address();
    const proto::Assignment* a = AssignmentOf(plan_, id);
    const std::string where =
        plan_.version() == 0 ? absl::StrFormat("registered from %s, waiting for its plan", address)
        : a == nullptr       ? absl::StrFormat("a spare at %s", address)
                             : absl::StrFormat("stage %d, replica %d at %s", a->stage(), a->replica(), address);
    // What closed, then what confirmed it: the tensor port's refusal, or the silence since.
    const bool cut_off = lost.reporter == Membership::kCutOff;
    const std::string closed =
        cut_off ? absl::StrCat("closed its connection to the coordinator",
                               lost.also_reporter >= 0 ? absl::StrFormat(" and one to worker %d", lost.also_reporter) : "")
                : absl::StrFormat("closed its connection to worker %d mid-run", lost.reporter);
    const std::string why =
        lost.refused ? absl::StrFormat("%s %.3f s ago, and its tensor port refuses connections (its process ended)",
                                       closed, lost.silent_s)
        : cut_off && lost.also_reporter >= 0
            ? absl::StrFormat("%s, and sent no heartbeat since (%.3f s ago)", closed, lost.silent_s)
        : lost.reporter < 0 && !cut_off ? absl::StrFormat("sent no heartbeat for %.0f s", lost.silent_s)
                                        : absl::StrFormat("%s and sent no heartbeat for %.1f s since", closed,
                                                          lost.silent_s);
    const std::string what = absl::StrFormat("worker %d (%s) %s", id, where, why);
    job_metrics_.WorkerLost();
    if (plan_.version() == 0) {
      Abort(absl::StrFormat("%s: it died or is unreachable; restart it, then %s", what, ResumeAdvice()));
      return;
    }
    members_.Lose(id);
    WriteJobState();
    std::cout << "coordinator: " << what
              << (a == nullptr           ? ": one spare fewer\n"
                  : !Spares().empty()    ? ": its place goes to a spare\n"
                                         : ": no spare waits to take its place\n")
              << std::flush;
    if (a == nullptr) return;
    if (vacant_.empty()) vacant_since_ = Clock::now();
    vacant_[id] = what;
    nlohmann::json event = {{"worker", id},
                            {"stage", a->stage()},
                            {"replica", a->replica()},
                            {"detection_s", lost.silent_s},
                            {"reporter", lost.reporter},
                            {"plan_version", plan_.version()},
                            {"lost_at_unix_s", UnixSeconds()}};
    recoveries_.push_back(std::move(event));
    pending_.push_back(
        {recoveries_.size() - 1, id,
         Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(lost.silent_s)),
         absl::StrFormat("worker %d was last heard from (found lost after %.2f s)", id, lost.silent_s)});
  }

  // REQUIRES: mu_ held. The workers that may take a place (registered, profiled, in no place), the
  // ones moved off for straggling last.
  std::vector<int> Spares() const {
    std::vector<int> fast, slow;
    for (const auto& [id, reg] : members_.registrations())
      if (AssignmentOf(plan_, id) == nullptr && members_.HasProfile(id)) (slow_.count(id) ? slow : fast).push_back(id);
    fast.insert(fast.end(), slow.begin(), slow.end());
    return fast;
  }

  // REQUIRES: mu_ held. The plan's workers' compute as RebalancePlan weighs it: each one's profile
  // from its join scaled to its pace now (stragglers.h), which computes its stage's blocks, and the
  // head on the last stage, at the profile's ratio of the two. A worker without a pace yet keeps
  // only its memory (RebalancePlan then moves blocks for memory alone).
  std::map<int, proto::ComputeProfile> PacedProfiles() const {
    const std::map<int, double> paces = stragglers_.Paces();
    std::map<int, proto::ComputeProfile> paced;
    for (const proto::Assignment& a : plan_.assignments()) {
      if (!members_.HasProfile(a.worker_id())) continue;
      proto::ComputeProfile p = members_.profile(a.worker_id());
      const auto pace = paces.find(a.worker_id());
      const double block_s = p.block_forward_s() + p.block_backward_s();
      double k = 0;
      if (pace != paces.end() && block_s > 0) {
        const double head =
            a.stage() == plan_.stages() - 1 ? (p.head_forward_s() + p.head_backward_s()) / block_s : 0;
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

  // REQUIRES: mu_ held, vacant_ not empty. Spares (registered, profiled, in no place) take the
  // lost workers' places in the next plan version, which rolls every worker back to the last
  // complete checkpoint (or the run's start); without enough spares for cluster.spare_wait_s the
  // layout shrinks to fewer replicas (ShrinkPlan), or, where none can run, the job stops.
  void Replan() {
    const std::vector<int> spares = Spares();
    if (spares.size() < vacant_.size()) {
      const double waited = std::chrono::duration<double>(Clock::now() - vacant_since_).count();
      if (waited >= cfg_.cluster.spare_wait_s) {
        std::vector<int> lost;
        for (const auto& [id, what] : vacant_) lost.push_back(id);
        std::map<int, proto::ComputeProfile> profiles;
        for (const auto& [id, reg] : members_.registrations())
          if (members_.HasProfile(id)) profiles[id] = members_.profile(id);
        absl::StatusOr<proto::Plan> shrunk =
            ShrinkPlan(plan_, lost, spares, members_.registrations(), {latest_step_, latest_name_, end_},
                       network_ ? &*network_ : nullptr, profiles);
        if (!shrunk.ok()) {
          Abort(absl::StrFormat("%s: it died or is unreachable, no spare took its place within "
                                "cluster.spare_wait_s = %g s, and the layout cannot shrink (%s); restart it, then %s",
                                vacant_.begin()->second, cfg_.cluster.spare_wait_s, shrunk.status().message(),
                                ResumeAdvice()));
          return;
        }
        const std::string change =
            shrunk->stages() != plan_.stages()
                ? absl::StrFormat("no spare came within cluster.spare_wait_s = %g s: the model cut anew into %d "
                                  "stages instead of %d, one replica of %d micro-batches (the same global batch)",
                                  cfg_.cluster.spare_wait_s, shrunk->stages(), plan_.stages(),
                                  ReplicaMicroBatches(*shrunk, cfg_))
                : absl::StrFormat("no spare came within cluster.spare_wait_s = %g s: %d replicas of %d micro-batches "
                                  "each instead of %d (the same global batch)",
                                  cfg_.cluster.spare_wait_s, shrunk->replicas(), ReplicaMicroBatches(*shrunk, cfg_),
                                  plan_.replicas());
        const int64_t reached = Rollback();
        Adopt(*std::move(shrunk), reached, change, {});
      } else if (!spare_wait_noted_) {
        spare_wait_noted_ = true;
        std::cout << absl::StrFormat("coordinator: waiting up to %g s (cluster.spare_wait_s) for a spare: start one "
                                     "with `longhaul worker --coordinator <this host>:<port>`\n",
                                     cfg_.cluster.spare_wait_s)
                  << std::flush;
      }
      return;
    }
    std::map<int, int> replace;
    auto spare = spares.begin();
    for (const auto& [id, what] : vacant_) replace[id] = *spare++;
    const int64_t reached = Rollback();
    std::vector<std::string> moves;
    for (const auto& [lost, by] : replace) {
      const proto::Assignment& a = *AssignmentOf(plan_, lost);
      moves.push_back(absl::StrFormat("worker %d takes stage %d replica %d from worker %d", by, a.stage(), a.replica(),
                                      lost));
    }
    Adopt(NextPlan(plan_, replace, members_.registrations(), {start_, resume_name_, end_}), reached,
          absl::StrJoin(moves, "; "), replace);
  }

  // REQUIRES: `lock` holds mu_, restart_ set and nobody lost. A worker's version failed
  // (SuspectReport's failure); once every worker of the plan has had its tensor port answer this
  // coordinator's dial since (its process lives: the kernel refuses a dead one's), or, where the
  // coordinator does not reach that port or the dial went unanswered, has been heard from a
  // heartbeat period after the report, nobody died: a link broke between live workers (a reset
  // connection, a middlebox's timeout), and the same layout starts again from the last complete
  // checkpoint, as after a loss. Nothing is concluded within kRestartGrace of the report: a
  // killed worker's connections reset as it dies, and the report that death caused can come
  // before its lifeline's end is noticed, before the heartbeat it sent just before, and even
  // before its port refuses (seen in bench/recovery.sh: a dial 0.3 ms after the report answered,
  // the loss was found 4 ms later, two plan versions for one failure). A dead worker is found
  // first (a closed lifeline, a refused port); a silent one answers nothing and is lost after
  // cluster.dead_after_s. A link that keeps breaking stops the job after kMaxRestarts.
  void MaybeRestart(std::unique_lock<std::mutex>& lock) {
    if (Clock::now() < restart_->at + kRestartGrace) return;
    const uint64_t version = plan_.version();
    const auto heard_since = restart_->at + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(cfg_.cluster.heartbeat_s));
    std::vector<int> dial;
    for (const proto::Assignment& a : plan_.assignments()) {
      const int id = a.worker_id();
      if (!restart_->answered.count(id) && members_.last_seen(id) <= heard_since) dial.push_back(id);
    }
    if (!dial.empty()) {
      // One round of dials per report (every worker not heard from then); one left unanswered
      // waits for its heartbeat.
      if (std::exchange(restart_->dialled, true)) return;
      const std::map<int, PortAnswer> answers = ProbeGone(lock, dial);  // a refusal is evidence of a death
      if (!restart_ || plan_.version() != version || !vacant_.empty() || !abort_.empty()) return;
      bool all = true;
      for (int id : dial) {
        const auto answer = answers.find(id);
        if (answer != answers.end() && answer->second == PortAnswer::kListening) {
          restart_->answered.insert(id);
        } else {
          all = false;
        }
      }
      if (!all) return;
    }
    const Restart r = *std::exchange(restart_, std::nullopt);
    if (++restarts_in_a_row_ > kMaxRestarts) {
      Abort(absl::StrFormat("plan version %d failed with every worker alive, %d versions in a row with no iteration "
                            "completed in between (worker %d: %s): a link between the workers keeps breaking; check "
                            "the network between them (a firewall, a NAT or proxy closing connections), then %s",
                            plan_.version(), restarts_in_a_row_, r.worker, r.failure, ResumeAdvice()));
      return;
    }
    const int64_t reached = Rollback();
    const std::string what =
        absl::StrFormat("worker %d's plan version %d failed with every worker alive (%s)", r.worker, plan_.version(),
                        r.failure);
    // Nobody was lost: the event names who reported, not a "worker" with a "lost_at_unix_s" as a
    // loss's does (tools count losses by those).
    const double after = std::chrono::duration<double>(Clock::now() - r.at).count();
    recoveries_.push_back({{"restart", true},
                           {"reporter", r.worker},
                           {"failure", r.failure},
                           {"plan_version", plan_.version()},
                           {"restarted_after_s", after},
                           {"failed_at_unix_s", UnixSeconds() - after}});
    pending_.push_back({recoveries_.size() - 1, -1, r.at, what});
    std::cout << "coordinator: " << what << "\n" << std::flush;
    Adopt(NextPlan(plan_, {}, members_.registrations(), {start_, resume_name_, end_}), reached,
          "the same layout again", {});
  }

  // REQUIRES: mu_ held, a checkpoint just completed. A shrunk layout takes back replicas from the
  // spares that joined since (GrowPlan) at this step: the iterations under way past it are redone.
  void Grow() {
    const bool recut = !plan_.job_config_toml().empty();
    if (finished_ || !abort_.empty() || !vacant_.empty() || (plan_.replicas() >= cfg_.cluster.replicas && !recut)) {
      return;
    }
    const std::vector<int> spares = Spares();
    if (spares.empty() || (!recut && static_cast<int>(spares.size()) < plan_.stages())) return;
    absl::StatusOr<proto::Plan> grown = GrowPlan(plan_, spares, members_.registrations(),
                                                 {latest_step_, latest_name_, end_}, network_ ? &*network_ : nullptr);
    if (!grown.ok()) return;  // the spares fill no stage or replica more yet
    const int64_t reached = Rollback();
    const int joined = grown->assignments_size() - plan_.assignments_size();
    const std::string change =
        recut ? absl::StrFormat("%d spares join: the job's %d stages again instead of %d", joined, grown->stages(),
                                plan_.stages())
              : absl::StrFormat("%d spares join: %d replicas of %d micro-batches each instead of %d", joined,
                                grown->replicas(), ReplicaMicroBatches(*grown, cfg_), plan_.replicas());
    nlohmann::json event = {{"grown_to_replicas", grown->replicas()},
                            {"plan_version", plan_.version()},
                            {"new_plan_version", grown->version()},
                            {"rollback_to_step", start_},
                            {"redone_iterations", reached - start_}};
    if (recut) event["grown_to_stages"] = grown->stages();
    recoveries_.push_back(std::move(event));
    Adopt(*std::move(grown), reached, change, {});
  }

  // REQUIRES: mu_ held. The run goes back to the last complete checkpoint (or its start): the
  // iteration reached before it.
  int64_t Rollback() {
    // What iterations_ holds is past completed_through_ (a report of a completed one is refused).
    const int64_t highest = iterations_.empty() ? completed_through_ : iterations_.rbegin()->first;
    const int64_t reached = std::max(start_, highest + 1);
    redone_ += std::max<int64_t>(0, reached - latest_step_);
    start_ = latest_step_;
    resume_name_ = latest_name_;
    return reached;
  }

  // REQUIRES: mu_ held; plan_ was replaced. The metrics show it, and its places stay known for a
  // while after: a report may name a place of the version before (ReportSuspect).
  void NotePlan() {
    job_metrics_.SetPlan(plan_, members_.registrations());
    recent_plans_[plan_.version()] = plan_;
    while (recent_plans_.size() > kRecentPlans) recent_plans_.erase(recent_plans_.begin());
  }

  // REQUIRES: mu_ held, Rollback() done. `next` replaces the plan for the lost workers of vacant_
  // (`replace`: lost -> the spare in its place), or starts it again (MaybeRestart); `change` says
  // how, for the log. The recoveries it answers record the new version and the rollback.
  void Adopt(proto::Plan next, int64_t reached, const std::string& change, const std::map<int, int>& replace) {
    // What can fail comes first: a job stopped here keeps the plan its workers run.
    std::optional<JobConfig> recut;
    if (BlocksPerStage(next) != cfg_.Cut()) {  // a pipeline cut anew: the plan's config has its cut
      absl::StatusOr<JobConfig> parsed = ParseJobConfig(next.config_toml(), "the re-cut plan's job config");
      if (!parsed.ok()) {
        Abort(std::string(parsed.status().message()));
        return;
      }
      recut = *std::move(parsed);
    }
    absl::Status rewound = samples_.Rewind(start_);
    if (rewound.ok()) rewound = log_.Rewind(start_);
    if (!rewound.ok()) {
      Abort(std::string(rewound.message()));
      return;
    }
    plan_ = std::move(next);
    if (recut) {
      cfg_ = *std::move(recut);
      recut_ = true;
      stragglers_.Restart();
    }
    worker_of_slot_.assign(expected_, -1);
    for (const proto::Assignment& a : plan_.assignments())
      worker_of_slot_[a.replica() * plan_.stages() + a.stage()] = a.worker_id();
    iterations_.erase(iterations_.lower_bound(start_), iterations_.end());
    completed_through_ = std::min(completed_through_, start_ - 1);
    checkpointed_.erase(checkpointed_.upper_bound(start_), checkpointed_.end());
    first_crc_.clear();
    crcs_in_.clear();
    last_crc_.clear();
    replica_checked_.erase(replica_checked_.lower_bound(start_), replica_checked_.end());
    ready_.clear();
    last_recorded_ = false;
    NotePlan();
    std::cout << absl::StrFormat("coordinator: plan v%d: %s; every worker goes back to step %d (%s) and redoes %d "
                                 "iterations\n",
                                 plan_.version(), change, start_,
                                 resume_name_.empty() ? "the initial parameters" : resume_name_,
                                 reached - start_)
              << std::flush;
    for (const Pending& p : pending_) {
      nlohmann::json& event = recoveries_[p.event];
      const bool lost = vacant_.count(p.worker) > 0;
      if (event.contains("new_plan_version") || (!lost && !event.contains("restart"))) continue;
      if (replace.count(p.worker)) {
        event["spare"] = replace.at(p.worker);
      } else if (lost) {
        event["shrunk_to_replicas"] = plan_.replicas();
        event["blocks_per_stage"] = cfg_.Cut();
      }
      event["new_plan_version"] = plan_.version();
      event["rollback_to_step"] = start_;
      event["redone_iterations"] = reached - start_;
    }
    vacant_.clear();
    spare_wait_noted_ = false;
    restart_.reset();  // the new version answers whatever failed the old one
    WriteJobState();
    cv_.notify_all();
  }

  // REQUIRES: mu_ held. The plan as a worker it places receives it (GetPlan, or its lifeline's news).
  proto::Plan PlanToSend() const {
    proto::Plan plan = plan_;
    plan.set_run_dir_token(run_dir_token_);
    return plan;
  }

  // REQUIRES: mu_ held. Where a worker's timeline is in the run directory: written there by a
  // worker that shares it, shipped there by one that does not.
  fs::path TimelinePath(int worker) const {
    return fs::path(cfg_.train.out_dir) / "timeline" / absl::StrFormat("worker_%d.json", worker);
  }

  // REQUIRES: mu_ held. The job state file for a coordinator started after this one, and
  // cluster.json: each written aside and renamed, so it is whole or the previous one, on the
  // writer's thread, so that the workers hear of a new plan version without waiting for the disk.
  // A coordinator killed before the write leaves the state before it, whose successor therefore
  // skips a version (Restore): so at most one published version may be unwritten, and a new
  // version waits for the last one's write; this coordinator's first version is written before
  // any worker sees it. That write is the version's first post: the later ones of a version (a
  // loss, a spare's join) may still be under way as the next version comes out, which need not
  // wait for them. A failed write (of either file: they share the run directory) stops the job
  // before the workers hear of a version it left unwritten, or at the next write.
  void WriteJobState() {
    if (state_closed_) return;
    const bool first = posted_version_ == 0, next = plan_.version() != posted_version_;
    if (next && state_writer_.written() < version_post_) state_writer_.Flush();
    StopIfStateFailed();
    posted_version_ = plan_.version();
    UpdateClusterRecord();
    proto::JobState state;
    *state.mutable_plan() = plan_;
    for (proto::WorkerRecord& r : members_.Records()) *state.add_workers() = std::move(r);
    state.set_recoveries_json(recoveries_.dump());
    const std::string cluster = cluster_record_.dump(2) + "\n";
    state.set_cluster_json(cluster);
    state.set_redone_iterations(redone_);
    std::string bytes;
    state.SerializeToString(&bytes);
    const uint64_t post = state_writer_.Post({{JobStatePath(cfg_), std::move(bytes)},
                                              {(fs::path(cfg_.train.out_dir) / "cluster.json").string(), cluster}});
    if (next) version_post_ = post;
    if (first) {
      state_writer_.Flush();
      StopIfStateFailed();
    }
  }

  // REQUIRES: mu_ held.
  void StopIfStateFailed() {
    if (absl::Status st = state_writer_.status(); !st.ok() && abort_.empty()) {
      Abort(absl::StrCat("cannot keep the job state, which a coordinator started again resumes from: ", st.message(),
                         "; give train.out_dir a writable disk with room, then start the job again"));
    }
  }

  // The job state a coordinator before this one left: its workers and the next version of its
  // plan, from the last complete checkpoint (start_). The workers' heartbeats find this one at the
  // same address and their next GetPlan the new version.
  void Restore(const proto::JobState& state) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const proto::WorkerRecord& r : state.workers()) members_.Restore(r, Clock::now());
    cluster_record_ = ParseBoundedJson(state.cluster_json());
    if (!cluster_record_.is_object()) cluster_record_ = nlohmann::json::object();
    recoveries_ = ParseBoundedJson(state.recoveries_json());
    if (!recoveries_.is_array()) recoveries_ = nlohmann::json::array();
    redone_ = state.redone_iterations();
    const int64_t reached = state.plan().start_iteration();
    plan_ = NextPlan(state.plan(), {}, members_.registrations(), {start_, resume_name_, end_});
    // The coordinator before may have published the version after the state's and died before
    // its state was written (WriteJobState): workers on that version take this one, which is newer.
    plan_.set_version(state.plan().version() + 2);
    worker_of_slot_.assign(expected_, -1);
    for (const proto::Assignment& a : plan_.assignments()) {
      worker_of_slot_[a.replica() * plan_.stages() + a.stage()] = a.worker_id();
      if (!members_.Check(a.worker_id()).ok()) vacant_[a.worker_id()] = absl::StrFormat("worker %d", a.worker_id());
    }
    if (!vacant_.empty()) vacant_since_ = Clock::now();
    NotePlan();
    recoveries_.push_back({{"coordinator_restart", true},
                           {"plan_version", state.plan().version()},
                           {"new_plan_version", plan_.version()},
                           {"rollback_to_step", start_}});
    pending_.push_back({recoveries_.size() - 1, -1, Clock::now(), "this coordinator started again"});
    std::cout << absl::StrFormat("coordinator: resuming job '%s' from its job state (plan v%d, %d workers, that plan "
                                 "from step %d): plan v%d sends every worker back to step %d\n",
                                 cfg_.cluster.job_id, state.plan().version(), plan_.assignments_size(), reached,
                                 plan_.version(), start_)
              << std::flush;
    WriteJobState();
  }

  // What a person should do after the job stopped early.
  std::string ResumeAdvice() const {
    if (LatestCheckpoint((fs::path(cfg_.train.out_dir) / "checkpoints").string()).ok()) {
      return "resume from the last checkpoint with --set train.resume=true";
    }
    return absl::StrFormat("start the job again from the beginning: no checkpoint was written yet (set "
                           "train.checkpoint_every, now %d, to keep progress)",
                           cfg_.train.checkpoint_every);
  }

  void WriteMetricsFile() const {
    // The figures are for looking at: a full disk must not stop the job (metrics.csv would say so).
    (void)WriteFileAtomically((fs::path(cfg_.train.out_dir) / "metrics.prom").string(), Metrics());
  }

  void Abort(const std::string& why) {
    if (!g_stop_requested) job_metrics_.Failed();
    abort_ = why;
    abort_time_ = Clock::now();
    std::cout << "coordinator: stopping the job: " << why << "\n" << std::flush;
    cv_.notify_all();
  }

  // REQUIRES: mu_ held. The workers the first plan places (ids below stages x replicas; any more
  // that registered before it wait as spares).
  std::map<int, proto::RegisterRequest> FirstWorkers() const {
    std::map<int, proto::RegisterRequest> first = members_.registrations();
    first.erase(first.lower_bound(expected_), first.end());
    return first;
  }

  // REQUIRES: mu_ held. The worker ids nobody has registered as yet.
  std::string UnfilledSlots() const {
    return absl::StrCat("not yet worker ids ", absl::StrJoin(members_.Unfilled(), ", "),
                        ": start each with `longhaul worker --coordinator <this host>:<port>`");
  }

  // REQUIRES: mu_ held, every worker registered and profiled. Which worker runs which slot: the
  // placement search where the links are known (the scenario's, worker w on host w, the
  // coordinator beside every host as an emulation's router is), else registration order.
  nlohmann::json Place() {
    worker_of_slot_ = RegistrationOrder(cfg_);
    shard_owner_.clear();
    nlohmann::json record = {{"how", "registration"}};
    std::string why;
    if (!cfg_.cluster.search_placement) {
      why = "cluster.placement = \"registration\"";
    } else if (!network_) {
      why = probing_ ? "every worker is at one address: no link between them to plan with"
                     : "no links known (give the coordinator --scenario, or set cluster.link_probe = \"on\")";
    } else if (!cfg_.cluster.stage_backends.empty()) {
      why = "cluster.stage_backends pins a device to each stage";
    } else {
      std::map<int, proto::ComputeProfile> profiles;
      for (const auto& [id, reg] : FirstWorkers()) profiles[id] = members_.profile(id);
      const Clock::time_point t0 = Clock::now();
      // A cut the config pins, or a checkpoint's (resume keeps the layout), stands.
      const bool keep_cut = !cfg_.cluster.stage_layers.empty() || start_ > 0;
      const absl::StatusOr<SlotSearch> found =
          SearchSlots(cfg_, FirstWorkers(), profiles, *network_, keep_cut);
      if (!found.ok()) {
        why = absl::StrCat("the search failed: ", found.status().message());
      } else {
        worker_of_slot_ = found->worker_of_slot;
        shard_owner_ = found->shard_owner;
        absl::Status cut = absl::OkStatus();
        if (found->blocks_per_stage != cfg_.Cut()) cut = AdoptCut(found->blocks_per_stage);
        if (!cut.ok()) {
          why = absl::StrCat("the search's cut is no valid config: ", cut.message());
          worker_of_slot_ = RegistrationOrder(cfg_);
          shard_owner_.clear();
        }
      }
      if (found.ok() && why.empty()) {
        record = {{"how", "search"},
                  {"predicted_iteration_seconds", found->predicted_s},
                  {"registration_order_predicted_iteration_seconds", found->registration_order_s},
                  {"simulations", found->simulations},
                  {"blocks_per_stage", cfg_.Cut()},
                  {"shard_owner", shard_owner_}};
        std::cout << absl::StrFormat("coordinator: placement by search (%d simulations, %.0f ms): predicted %.3f s per "
                                     "iteration, registration order %.3f s (%.2fx)%s\n",
                                     found->simulations,
                                     1e3 * std::chrono::duration<double>(Clock::now() - t0).count(), found->predicted_s,
                                     found->registration_order_s, found->registration_order_s / found->predicted_s,
                                     found->searched ? ""
                                                     : absl::StrFormat("; registration order and the config's cut "
                                                                       "stand (nothing %.0f%% faster)",
                                                                       100 * kPlacementMinGain));
        if (!found->why_not.empty()) {
          std::cout << "coordinator: warning: no placement fits the memory the workers reported: " << found->why_not
                    << "; their own checks will say what to change\n";
        }
      }
    }
    if (!why.empty()) {
      record["why"] = why;
      std::cout << "coordinator: placement in registration order: " << why << "\n";
    }
    record["worker_of_slot"] = worker_of_slot_;
    return record;
  }

  // REQUIRES: mu_ held. The job's config from now on cuts the model as `cut`: the plan carries
  // it to the workers, whose stages and checkpoints follow it.
  absl::Status AdoptCut(const std::vector<int>& cut) {
    const std::vector<int> was = cfg_.Cut();
    absl::StatusOr<JobConfig> cfg = cfg_.WithCut(cut);
    if (!cfg.ok()) return cfg.status();
    cfg_ = *std::move(cfg);
    std::cout << absl::StrFormat("coordinator: the search cuts the model [%s] blocks per stage, not [%s]\n",
                                 absl::StrJoin(cut, ", "), absl::StrJoin(was, ", "));
    return absl::OkStatus();
  }

  // REQUIRES: mu_ held. cluster.json: how the job was placed and who runs what under the current
  // plan version, and who waits as a spare.
  void UpdateClusterRecord() {
    nlohmann::json workers = nlohmann::json::array(), spares = nlohmann::json::array();
    for (const auto& [id, reg] : members_.registrations()) {
      const proto::Assignment* a = AssignmentOf(plan_, id);
      if (a == nullptr) {
        spares.push_back({{"worker", id}, {"address", reg.address()}, {"host", reg.host()}, {"pid", reg.pid()}});
        continue;
      }
      workers.push_back({{"worker", id}, {"stage", a->stage()}, {"replica", a->replica()}, {"address", a->address()},
                         {"host", reg.host()}, {"pid", reg.pid()}, {"blocks", {a->first_block(), a->end_block()}}});
    }
    cluster_record_["plan_version"] = plan_.version();
    cluster_record_["workers"] = std::move(workers);
    cluster_record_["spares"] = std::move(spares);
  }

  // REQUIRES: mu_ held, every worker registered and profiled.
  void MakePlan() {
    const nlohmann::json placement = Place();
    log_.SetPlacement(placement);
    plan_ = longhaul::MakePlan(cfg_, FirstWorkers(), {start_, resume_name_, end_}, worker_of_slot_,
                               network_ ? &*network_ : nullptr, shard_owner_);
    NotePlan();
    if (network_) job_metrics_.SetLinks(*network_, links_);
    const WirePlan wires = WiresOf(plan_);
    nlohmann::json narrow = nlohmann::json::array();
    for (const auto& [pair, dtype] : wires.links) {
      narrow.push_back({{"from", pair.first}, {"to", pair.second}, {"dtype", WireDtypeName(dtype)}});
    }
    std::string wire = WireDtypeName(wires.default_dtype);
    if (!wires.links.empty()) {
      wire = absl::StrFormat("%s; %s on %d links slower than %.0f Gbit/s; parameters %s", wire,
                             WireDtypeName(wires.links.begin()->second), wires.links.size(), kAutoInt8Below * 8 / 1e9,
                             WireDtypeName(wires.params_dtype));
    }
    // Links split over several connections: their rate × round trip exceeds one connection's window.
    nlohmann::json split = nlohmann::json::array();
    int most = 1;
    for (const auto& [pair, n] : LinkConnectionsOf(plan_)) {
      split.push_back({{"from", pair.first}, {"to", pair.second}, {"connections", n}});
      most = std::max(most, n);
    }
    std::string connections = cfg_.transport.connections > 0
                                  ? absl::StrFormat("%d per link (transport.connections)", cfg_.transport.connections)
                                  : "1 per link";
    if (!split.empty()) {
      connections = absl::StrFormat(
          "up to %d on %d links whose rate x round trip exceeds a connection's window, else 1", most, split.size());
    }
    cluster_record_ = {{"job_id", cfg_.cluster.job_id},
                             {"placement", placement},
                             {"wire", {{"configured", WireDtypeName(cfg_.transport.wire_dtype)},
                                       {"default", WireDtypeName(wires.default_dtype)},
                                       {"params", WireDtypeName(wires.params_dtype)},
                                       {"links", narrow}}},
                             {"connections", {{"configured", cfg_.transport.connections}, {"links", split}}}};
    if (members_.linked()) cluster_record_["links"] = MeasuredLinksJson();
    std::cout << absl::StrFormat("coordinator: plan v1: %d stages x %d replicas, %s schedule, %s parameter servers "
                                 "(%d shards), wire %s, connections %s\n"
                                 "  iteration time = stage 0 replica 0's; TFLOPs/worker = %s / iteration time / %d "
                                 "workers; floor = entropy of the data (nats/token)\n",
                                 cfg_.cluster.stages, cfg_.cluster.replicas, ScheduleName(cfg_.cluster.schedule),
                                 cfg_.cluster.central_ps ? "central" : "sharded", plan_.shards_size(), wire,
                                 connections,
                                 FlopsFormulaName(cfg_.train.recompute),
                                 expected_)
              << std::flush;
    WriteJobState();
    cv_.notify_all();
  }

  RpcVerifier verifier_;
  const std::string run_dir_token_;     // train.out_dir/.run_dir_id's (proto::Plan::run_dir_token)
  std::optional<NetworkCost> network_;  // the scenario's, or the measured once every worker reported
  const bool probing_;                  // workers measure their links before the plan
  std::string links_;                   // where network_ came from, for people
  JobConfig cfg_;
  const std::string boot_id_ = BootId();  // heartbeats give it (HeartbeatReply)
  const int expected_;
  int64_t start_;  // the plan's first iteration: the run's, or where a replan went back to
  const int64_t end_;
  std::string resume_name_;

  BackgroundWriter state_writer_;  // job_state.pb and cluster.json (WriteJobState)
  uint64_t posted_version_ = 0;    // the plan version of the last state posted to it
  uint64_t version_post_ = 0;      // the number of that version's first post (WriteJobState)
  bool state_closed_ = false;      // the job ended: its state file is gone for good
  std::mutex mu_;
  std::condition_variable cv_;
  Membership members_;
  proto::Plan plan_;
  // The newest plans by version, plan_ among them (NotePlan): a worker's connection made under one
  // version may close, and be reported, after the next began.
  static constexpr size_t kRecentPlans = 4;
  std::map<uint64_t, proto::Plan> recent_plans_;
  std::vector<int> worker_of_slot_;  // slot k = replica * stages + stage runs worker worker_of_slot_[k]
  std::vector<std::vector<int>> shard_owner_;  // the placement search's, for MakePlan (empty: shard k on replica k)
  std::set<int> ready_;  // workers that installed plan_
  std::map<int64_t, IterationRecord> iterations_;  // reported, not yet complete
  int64_t completed_through_ = -1;                  // every iteration up to it is complete
  std::map<int, uint64_t> lifeline_calls_;  // by worker: Lifeline calls begun, the newest is the one held
  // By step: (stage, shard) on disk, and (stage, -1 - job replica) of error-feedback residuals.
  std::map<int64_t, std::set<std::pair<int, int>>> checkpointed_;
  std::set<int64_t> replica_checked_;  // iterations whose replicas were checked to agree
  int64_t replicas_checked_before_ = 0;  // how many of them before the last complete checkpoint
  // By (stage, iteration): the first replica's parameters CRC reported; by iteration: how many
  // workers' are in. A step leaves both once every worker's is.
  std::map<std::pair<int, int64_t>, std::pair<int, uint32_t>> first_crc_;
  std::map<int64_t, int> crcs_in_;
  std::map<int, int64_t> last_crc_;  // by worker: the last step whose parameters it reported
  StragglerWatch stragglers_;
  std::set<int> eased_;  // workers blocks moved off for straggling, until they move back
  // The last step whose every shard is on disk: where a lost worker sends every worker back to.
  int64_t latest_step_;
  std::string latest_name_;
  // Lost workers of the plan whose places wait for spares (by id: what happened), since when.
  std::map<int, std::string> vacant_;
  std::set<int> slow_;  // workers moved off their place for straggling
  Clock::time_point vacant_since_;
  bool spare_wait_noted_ = false;
  bool recut_ = false;  // a plan version cut the model anew: cfg_ is that plan's config
  SampleAudit samples_;
  int64_t redone_ = 0;  // iterations begun and then rolled back
  nlohmann::json recoveries_ = nlohmann::json::array();
  // Failures not recovered from yet (no iteration completed since): their events in recoveries_,
  // the lost worker (-1: this coordinator's own restart), when it was last heard from, and what
  // happened, for people.
  struct Pending {
    size_t event;
    int worker;
    Clock::time_point failed_at;
    std::string what;
  };
  std::vector<Pending> pending_;
  // A worker's report that the running version failed (SuspectReport.failure), not yet answered.
  struct Restart {
    int worker;
    std::string failure;
    Clock::time_point at;
    bool dialled = false;    // the workers not heard from were dialled since
    std::set<int> answered;  // of them, those whose tensor port answered
  };
  std::optional<Restart> restart_;
  int restarts_in_a_row_ = 0;  // versions started again since an iteration last completed
  static constexpr int kMaxRestarts = 3;
  // How often a lifeline's handler looks whether its call ended (a closed lifeline's detection).
  static constexpr std::chrono::milliseconds kLifelinePoll{10};
  // A failure report's wait before the coordinator dials to decide that nobody died: a dying
  // worker's lifeline end noticed (two polls, gRPC's threads on loaded cores among them).
  static constexpr std::chrono::milliseconds kRestartGrace = 2 * kLifelinePoll;
  nlohmann::json cluster_record_ = nlohmann::json::object();  // cluster.json
  bool last_recorded_ = false;   // every worker reported the run's last iteration
  bool finished_ = false;        // ... and its checkpoint is complete
  Clock::time_point finished_time_;
  std::string abort_;
  Clock::time_point abort_time_;
  RunLog log_;
  JobMetrics job_metrics_;
};

}  // namespace

void RequestCoordinatorStop() { g_stop_requested = true; }

absl::Status RunCoordinator(const CoordinatorOptions& opt) {
  LH_ASSIGN_OR_RETURN(JobConfig cfg, LoadJobConfig(opt.config_path, opt.overrides));
  std::error_code ec;
  fs::create_directories(fs::path(cfg.train.out_dir) / "checkpoints", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create train.out_dir ", cfg.train.out_dir, ": ", ec.message()));
  int64_t start = 0;
  std::string resume_name;
  // A coordinator before this one ran the job from here and did not end it: it goes on under the
  // config of that job's plan (the placement search's cut included), from its last checkpoint.
  std::optional<proto::JobState> restored;
  if (fs::exists(JobStatePath(cfg))) {
    LH_ASSIGN_OR_RETURN(RestoredJob job, ReadJobState(JobStatePath(cfg), cfg));
    restored = std::move(job.state);
    cfg = std::move(job.cfg);
    // The state's config holds (the placement search's cut, a re-cut): said, not ignored silently.
    std::vector<std::string> changes;
    for (const std::string& o : opt.overrides)
      if (!absl::StartsWith(o, "train.out_dir=")) changes.push_back(o);
    absl::StatusOr<JobConfig> with = cfg;
    if (!changes.empty()) with = ParseJobConfig(cfg.toml_text, "the job state's plan", changes);
    if (!with.ok() || with->as_json != cfg.as_json) {
      std::cout << "coordinator: warning: --set " << absl::StrJoin(changes, " --set ")
                << " is not applied: a job resumed from its job state runs on under its plan's config; to change it, "
                   "stop the job, remove job_state.pb and resume from the last checkpoint with --set "
                   "train.resume=true\n";
    }
    const fs::path checkpoints = fs::path(cfg.train.out_dir) / "checkpoints";
    const absl::StatusOr<std::string> dir = LatestCheckpoint(checkpoints.string());
    if (dir.ok()) {
      resume_name = fs::path(*dir).filename().string();
      LH_ASSIGN_OR_RETURN(start, CheckpointStep(*dir));
      if (start > cfg.train.steps || !fs::is_directory(CheckpointStateDir(checkpoints.string(), resume_name))) {
        return absl::DataLossError(absl::StrFormat(
            "%s names %s, %s: write the name of the newest complete step_* directory into it",
            (checkpoints / "latest").string(), resume_name,
            start > cfg.train.steps ? absl::StrFormat("beyond the job's %d steps", cfg.train.steps)
                                    : std::string("which is not there")));
      }
    } else if (!absl::IsNotFound(dir.status())) {
      return dir.status();
    } else if (restored->plan().start_iteration() > 0) {
      // Starting over would rewrite the run's records from step 0.
      return absl::DataLossError(absl::StrFormat(
          "%s is missing, yet the job state's plan went on from step %d: write the name of the newest complete "
          "step_* directory into it",
          (checkpoints / "latest").string(), restored->plan().start_iteration()));
    }
  } else if (cfg.train.resume) {
    LH_ASSIGN_OR_RETURN(std::string dir, LatestCheckpoint((fs::path(cfg.train.out_dir) / "checkpoints").string()));
    resume_name = fs::path(dir).filename().string();
    LH_ASSIGN_OR_RETURN(start, CheckpointStep(dir));
    const std::string state_dir = CheckpointStateDir(fs::path(dir).parent_path().string(), resume_name);
    LH_ASSIGN_OR_RETURN(cfg, WithCheckpointCut(state_dir, std::move(cfg)));
    LH_RETURN_IF_ERROR(CheckCheckpointResumable(state_dir, cfg));
  }
  const std::string csv = (fs::path(cfg.train.out_dir) / "metrics.csv").string();
  const bool goes_on = cfg.train.resume || restored;
  LH_ASSIGN_OR_RETURN(MetricsLog metrics, goes_on ? MetricsLog::Resume(csv, start) : MetricsLog::Create(csv));
  LH_ASSIGN_OR_RETURN(SampleAudit samples,
                      SampleAudit::Open((fs::path(cfg.train.out_dir) / "samples.csv").string(),
                                        cfg.cluster.replicas * cfg.train.micro_batches, goes_on ? start : 0));
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
  Service service(cfg, start, resume_name, opt.stop_at, std::move(metrics), std::move(samples), std::move(network),
                  std::move(secret), restored, std::move(run_dir_token));
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(opt.listen, credentials, &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", opt.listen, " (port in use? choose --listen)"));
  }
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  if (!opt.metrics_listen.empty()) {
    LH_ASSIGN_OR_RETURN(metrics_endpoint, MetricsEndpoint::Start(opt.metrics_listen, [&] { return service.Metrics(); }));
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
  absl::Status st = service.Supervise();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return st;
}

}  // namespace longhaul
