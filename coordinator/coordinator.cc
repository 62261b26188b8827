#include "coordinator/coordinator.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "config/job_config.h"
#include "config/resume_check.h"
#include "longhaul.grpc.pb.h"
#include "metrics/flops.h"
#include "metrics/metrics_log.h"
#include "metrics/timeline.h"
#include "model/param_layout.h"
#include "transport/tensor_transport.h"
#include "util/status_macros.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop_requested{false};
using Clock = std::chrono::steady_clock;

struct WorkerInfo {
  proto::RegisterRequest reg;
  Clock::time_point last_seen;
  bool done = false;
  std::string timeline;
};

// Per-iteration reports of every worker.
struct IterationRecord {
  std::map<int, proto::IterationReport> reports;  // by worker id
};

class Service final : public proto::Coordinator::Service {
 public:
  Service(const JobConfig& cfg, int64_t start_iteration, std::string resume_name, int64_t stop_at, MetricsLog metrics)
      : cfg_(cfg), expected_(cfg.cluster.stages * cfg.cluster.replicas), start_(start_iteration),
        end_(stop_at > 0 ? std::min(stop_at, cfg.train.steps) : cfg.train.steps), resume_name_(std::move(resume_name)),
        metrics_(std::move(metrics)) {
    for (int s = 0; s < cfg.cluster.stages; ++s) {
      ParamLayout layout(cfg.model, cfg.Stage(s));
      auto cuts = cfg.cluster.central_ps ? std::vector<std::pair<int, int>>{{0, static_cast<int>(layout.tensors().size())}}
                                         : layout.SplitIntoShards(cfg.cluster.replicas);
      int shard = 0;
      for (size_t k = 0; k < cuts.size(); ++k) {
        // A stage with fewer tensors than replicas leaves some cuts empty: no shard, no PS duty.
        if (cuts[k].first == cuts[k].second) continue;
        proto::ShardPlacement sp;
        sp.set_stage(s);
        sp.set_shard(shard++);
        sp.set_owner_replica(cfg.cluster.central_ps ? 0 : static_cast<int>(k));
        sp.set_first_tensor(cuts[k].first);
        sp.set_end_tensor(cuts[k].second);
        shards_.push_back(sp);
      }
    }
    flops_ = ModelFlopsPerIteration(cfg.model,
                                    static_cast<int64_t>(cfg.train.micro_batch_size) * cfg.train.micro_batches *
                                        cfg.cluster.replicas,
                                    cfg.train.seq_len, cfg.train.recompute);
  }

  grpc::Status Register(grpc::ServerContext*, const proto::RegisterRequest* req, proto::RegisterReply* reply) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->protocol_version() != kProtocolVersion) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker speaks protocol version %d, this coordinator %d: run the same longhaul "
                                          "build everywhere",
                                          req->protocol_version(), kProtocolVersion));
    }
    if (!req->job_id().empty() && req->job_id() != cfg_.cluster.job_id) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker wants job '%s' but this coordinator runs job '%s'", req->job_id(),
                                          cfg_.cluster.job_id));
    }
    if (static_cast<int>(workers_.size()) >= expected_) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrFormat("job '%s' already has its %d workers", cfg_.cluster.job_id, expected_));
    }
    const int id = static_cast<int>(workers_.size());
    workers_[id] = WorkerInfo{*req, Clock::now(), false, {}};
    std::cout << absl::StrFormat("coordinator: worker %d registered from %s (%s, pid %d), %d/%d\n", id,
                                 req->address(), req->host(), req->pid(), id + 1, expected_)
              << std::flush;
    reply->set_worker_id(id);
    reply->set_heartbeat_s(cfg_.cluster.heartbeat_s);
    reply->set_dead_after_s(cfg_.cluster.dead_after_s);
    if (static_cast<int>(workers_.size()) == expected_) MakePlan();
    return grpc::Status::OK;
  }

  grpc::Status GetPlan(grpc::ServerContext*, const proto::PlanRequest* req, proto::Plan* plan) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    workers_[req->worker_id()].last_seen = Clock::now();
    if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] { return plan_.version() > 0 || !abort_.empty(); })) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no plan yet: waiting for workers");
    }
    if (!abort_.empty()) return grpc::Status(grpc::StatusCode::ABORTED, abort_);
    *plan = plan_;
    return grpc::Status::OK;
  }

  grpc::Status Ready(grpc::ServerContext*, const proto::ReadyRequest* req, proto::ReadyReply* reply) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    if (req->plan_version() != plan_.version()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrFormat("worker %d is ready for plan version %d; the plan is version %d",
                                          req->worker_id(), req->plan_version(), plan_.version()));
    }
    ready_.insert(req->worker_id());
    cv_.notify_all();
    if (!cv_.wait_for(lock, std::chrono::seconds(5),
                      [&] { return static_cast<int>(ready_.size()) == expected_ || !abort_.empty(); })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "waiting for every worker to install the plan");
    }
    reply->set_abort(!abort_.empty());
    reply->set_reason(abort_);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    workers_[req->worker_id()].last_seen = Clock::now();
    reply->set_abort(!abort_.empty());
    reply->set_reason(abort_);
    return grpc::Status::OK;
  }

  grpc::Status ReportIteration(grpc::ServerContext*, const proto::IterationReport* req, proto::Empty*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckAssigned(req->worker_id(), req->iteration()); !st.ok()) return st;
    const proto::Assignment& a = plan_.assignments(req->worker_id());
    if (req->stage() != a.stage() || req->replica() != a.replica()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("worker %d reports as stage %d replica %d; the plan has it at stage %d "
                                          "replica %d",
                                          req->worker_id(), req->stage(), req->replica(), a.stage(), a.replica()));
    }
    IterationRecord& rec = iterations_[req->iteration()];
    if (!rec.reports.emplace(req->worker_id(), *req).second) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrFormat("worker %d already reported iteration %d", req->worker_id(),
                                          req->iteration() + 1));
    }
    if (static_cast<int>(rec.reports.size()) == expected_) {
      CheckReplicasAgree(req->iteration());
      PrintIteration(req->iteration());
    }
    return grpc::Status::OK;
  }

  grpc::Status ReduceNorm(grpc::ServerContext*, const proto::NormReport* req, proto::NormReply* reply) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status st = CheckAssigned(req->worker_id(), req->iteration()); !st.ok()) return st;
    const proto::Assignment& a = plan_.assignments(req->worker_id());
    for (const proto::ShardNorm& n : req->shards()) {
      if (!HostsShard(a, n.stage(), n.shard())) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrFormat("worker %d reports a norm for shard %d of stage %d, which the plan does "
                                            "not give it",
                                            req->worker_id(), n.shard(), n.stage()));
      }
    }
    auto& got = norms_[req->iteration()];
    for (const proto::ShardNorm& n : req->shards()) got[{n.stage(), n.shard()}] = n.sum_squares();
    cv_.notify_all();
    const bool ready = cv_.wait_for(lock, std::chrono::milliseconds(static_cast<int64_t>(cfg_.transport.timeout_s * 1000)),
                                    [&] { return got.size() == shards_.size() || !abort_.empty(); });
    if (!abort_.empty()) {
      reply->set_abort(true);
      reply->set_reason(abort_);
      return grpc::Status::OK;
    }
    if (!ready) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrFormat("only %d of %d parameter-server shards reported iteration %d", got.size(),
                                          shards_.size(), req->iteration() + 1));
    }
    double sum = 0;
    for (auto& [key, v] : got) sum += v;  // (stage, shard) order
    reply->set_global_norm(std::sqrt(sum));
    return grpc::Status::OK;
  }

  grpc::Status ReportCheckpoint(grpc::ServerContext*, const proto::CheckpointReport* req, proto::Empty*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckAssigned(req->worker_id(), req->step() - 1); !st.ok()) return st;
    if (!HostsShard(plan_.assignments(req->worker_id()), req->stage(), req->shard()) ||
        !checkpointed_[req->step()].insert({req->stage(), req->shard()}).second) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrFormat("worker %d reports a checkpoint of shard %d of stage %d at step %d, which "
                                          "the plan does not give it or which was already reported",
                                          req->worker_id(), req->shard(), req->stage(), req->step()));
    }
    if (checkpointed_[req->step()].size() == shards_.size()) {
      // Every shard is on disk: only now does `latest` move, so a resume never finds half a step.
      const std::string root = (fs::path(cfg_.train.out_dir) / "checkpoints").string();
      if (absl::Status st = SetLatestCheckpoint(root, req->step()); !st.ok()) {
        return grpc::Status(grpc::StatusCode::INTERNAL, std::string(st.message()));
      }
      std::cout << absl::StrFormat("coordinator: checkpoint %s complete (%d shards) in %s\n",
                                   CheckpointName(req->step()), shards_.size(), root)
                << std::flush;
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportDone(grpc::ServerContext*, const proto::DoneReport* req, proto::Empty*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status st = CheckWorker(req->worker_id()); !st.ok()) return st;
    WorkerInfo& w = workers_[req->worker_id()];
    w.done = true;
    w.timeline = req->timeline_file();
    if (!req->ok() && abort_.empty()) Abort(absl::StrCat("worker ", req->worker_id(), " failed: ", req->error()));
    cv_.notify_all();
    return grpc::Status::OK;
  }

  // Runs until every worker is done, or the job fails or is interrupted; then writes the run's
  // records, whatever ended it (metrics.csv is already complete: it grows with every iteration).
  absl::Status Supervise() {
    std::unique_lock<std::mutex> lock(mu_);
    auto last_wait_note = Clock::now();
    while (true) {
      cv_.wait_for(lock, std::chrono::milliseconds(250));
      if (g_stop_requested && abort_.empty()) Abort(absl::StrCat("interrupted; ", ResumeAdvice()));
      const int done = static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](auto& w) { return w.second.done; }));
      if (done == expected_) break;
      if (!abort_.empty() && (done == static_cast<int>(workers_.size()) ||
                              Clock::now() - abort_time_ > std::chrono::seconds(5))) {
        break;  // the workers heard it through their heartbeats; don't wait for a dead one
      }
      // As often as a silent worker would be declared dead, at most every 10 s.
      const double note_every_s = std::min(10.0, cfg_.cluster.dead_after_s);
      if (plan_.version() == 0 &&
          std::chrono::duration<double>(Clock::now() - last_wait_note).count() > note_every_s) {
        std::cout << absl::StrFormat("coordinator: waiting for workers, %d/%d registered; %s\n", workers_.size(),
                                     expected_, UnfilledSlots())
                  << std::flush;
        last_wait_note = Clock::now();
      }
      for (auto& [id, w] : workers_) {
        const double silent = std::chrono::duration<double>(Clock::now() - w.last_seen).count();
        if (!w.done && abort_.empty() && silent > cfg_.cluster.dead_after_s) {
          const std::string where =
              plan_.version() == 0
                  ? absl::StrFormat("registered from %s, waiting for its plan", w.reg.address())
                  : absl::StrFormat("stage %d, replica %d at %s", plan_.assignments(id).stage(),
                                    plan_.assignments(id).replica(), w.reg.address());
          Abort(absl::StrFormat("worker %d (%s) sent no heartbeat for %.0f s: it died or is unreachable; restart it, "
                                "then %s",
                                id, where, silent, ResumeAdvice()));
        }
      }
    }
    const nlohmann::json summary = Summary();
    WriteRecords(summary);
    if (!abort_.empty()) return absl::AbortedError(abort_);
    PrintSummary(summary);
    return absl::OkStatus();
  }

 private:
  // REQUIRES: mu_ held. Worker ids come from the network: only registered ones are served.
  grpc::Status CheckWorker(int id) const {
    if (!workers_.count(id)) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrFormat("no worker %d has registered with job '%s'", id, cfg_.cluster.job_id));
    }
    return grpc::Status::OK;
  }

  // REQUIRES: mu_ held. A registered worker of the plan, reporting an iteration of this run.
  grpc::Status CheckAssigned(int id, int64_t iteration) const {
    if (grpc::Status st = CheckWorker(id); !st.ok()) return st;
    if (plan_.version() == 0) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no plan yet");
    if (iteration < start_ || iteration >= end_) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                          absl::StrFormat("iteration %d is outside this run's [%d, %d)", iteration, start_, end_));
    }
    return grpc::Status::OK;
  }

  // Whether the worker at assignment `a` hosts parameter-server shard `shard` of stage `stage`.
  bool HostsShard(const proto::Assignment& a, int stage, int shard) const {
    for (const proto::ShardPlacement& sp : shards_)
      if (sp.stage() == stage && sp.shard() == shard) return sp.stage() == a.stage() && sp.owner_replica() == a.replica();
    return false;
  }

  // REQUIRES: mu_ held. Every replica of a stage must hold the same parameters after a step; a
  // difference means the replicas train different models, so the job stops.
  void CheckReplicasAgree(int64_t it) {
    std::map<int, const proto::IterationReport*> first_of_stage;
    for (auto& [id, r] : iterations_.at(it).reports) {
      auto [first, inserted] = first_of_stage.emplace(r.stage(), &r);
      if (inserted || first->second->params_crc32c() == r.params_crc32c()) continue;
      if (abort_.empty()) {
        Abort(absl::StrFormat("after iteration %d, replica %d of stage %d holds parameters with CRC-32C %08x and "
                              "replica %d %08x: the replicas no longer train the same model (a bug: please report it "
                              "with the config)",
                              it + 1, first->second->replica(), r.stage(), first->second->params_crc32c(), r.replica(),
                              r.params_crc32c()));
      }
    }
    replica_checks_ += cfg_.cluster.replicas > 1;
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

  void Abort(const std::string& why) {
    abort_ = why;
    abort_time_ = Clock::now();
    std::cout << "coordinator: stopping the job: " << why << "\n" << std::flush;
    cv_.notify_all();
  }

  // REQUIRES: mu_ held. The (stage, replica) slots no worker has registered for yet.
  std::string UnfilledSlots() const {
    std::vector<std::string> slots;
    for (int id = static_cast<int>(workers_.size()); id < expected_; ++id)
      slots.push_back(absl::StrFormat("stage %d replica %d", id % cfg_.cluster.stages, id / cfg_.cluster.stages));
    return absl::StrCat("no worker yet for ", absl::StrJoin(slots, ", "),
                        ": start one with `longhaul worker --coordinator <this host>:<port>`");
  }

  void MakePlan() {
    plan_.set_version(1);
    plan_.set_job_id(cfg_.cluster.job_id);
    plan_.set_config_toml(cfg_.toml_text);
    plan_.set_stages(cfg_.cluster.stages);
    plan_.set_replicas(cfg_.cluster.replicas);
    plan_.set_start_iteration(start_);
    plan_.set_resume_checkpoint(resume_name_);
    plan_.set_stop_iteration(end_);
    nlohmann::json cluster = nlohmann::json::array();
    for (auto& [id, w] : workers_) {
      // Replica-major: the workers of one pipeline registered next to each other.
      proto::Assignment* a = plan_.add_assignments();
      a->set_worker_id(id);
      a->set_stage(id % cfg_.cluster.stages);
      a->set_replica(id / cfg_.cluster.stages);
      a->set_address(w.reg.address());
      const StageSpec spec = cfg_.Stage(a->stage());
      a->set_first_block(spec.first_block);
      a->set_end_block(spec.end_block);
      cluster.push_back({{"worker", id}, {"stage", a->stage()}, {"replica", a->replica()}, {"address", a->address()},
                         {"host", w.reg.host()}, {"pid", w.reg.pid()}, {"blocks", {spec.first_block, spec.end_block}}});
    }
    for (const proto::ShardPlacement& sp : shards_) *plan_.add_shards() = sp;
    std::ofstream(fs::path(cfg_.train.out_dir) / "cluster.json", std::ios::trunc)
        << nlohmann::json{{"job_id", cfg_.cluster.job_id}, {"workers", cluster}}.dump(2) << "\n";
    std::cout << absl::StrFormat("coordinator: plan v1: %d stages x %d replicas, %s schedule, %s parameter servers "
                                 "(%d shards), wire %s\n"
                                 "  iteration time = stage 0 replica 0's; TFLOPs/worker = %s / iteration time / %d "
                                 "workers; floor = entropy of the data (nats/token)\n",
                                 cfg_.cluster.stages, cfg_.cluster.replicas, ScheduleName(cfg_.cluster.schedule),
                                 cfg_.cluster.central_ps ? "central" : "sharded", shards_.size(),
                                 WireDtypeName(cfg_.transport.wire_dtype), FlopsFormulaName(cfg_.train.recompute),
                                 expected_)
              << std::flush;
    start_time_ = Clock::now();
    cv_.notify_all();
  }

  // Iteration time is stage 0 of replica 0's, as in the source experiment.
  double IterationSeconds(int64_t it) const {
    for (auto& [id, r] : iterations_.at(it).reports)
      if (r.stage() == 0 && r.replica() == 0) return r.seconds();
    return 0;
  }

  void PrintIteration(int64_t it) {
    const IterationRecord& rec = iterations_.at(it);
    double loss = 0, floor = 0, norm = 0, lr = 0;
    int last_stages = 0;
    for (auto& [id, r] : rec.reports) {
      if (r.stage() == cfg_.cluster.stages - 1) loss += r.loss(), floor += r.floor(), ++last_stages;
      if (r.lr() > 0) norm = r.grad_norm(), lr = r.lr();
    }
    loss /= last_stages, floor /= last_stages;
    const double sec = IterationSeconds(it);
    if (it > start_) timed_seconds_ += sec, ++timed_;
    const double mean = timed_ > 0 ? timed_seconds_ / timed_ : sec;
    const int64_t step = it + 1, steps = cfg_.train.steps, end = end_;
    const MetricsRow row = {.step = step, .loss = loss, .floor = floor, .lr = lr, .grad_norm = norm, .seconds = sec,
                            .tokens_per_s = cfg_.tokens_per_step() / sec};
    if (absl::Status st = metrics_.Append(row); !st.ok() && abort_.empty()) Abort(std::string(st.message()));
    std::string line = absl::StrFormat("iter %*d/%d | loss %.4f", static_cast<int>(std::to_string(steps).size()), step,
                                       steps, loss);
    if (floor >= 0) absl::StrAppend(&line, absl::StrFormat(" (floor %.4f)", floor));
    absl::StrAppend(&line, absl::StrFormat(" | lr %.2e | norm %.3f | %.3f s/it | %.0f tok/s | %.4f TFLOPs/worker | "
                                           "%.1f days/100B tok | ETA %s",
                                           lr, norm, sec, cfg_.tokens_per_step() / mean,
                                           flops_ / mean / 1e12 / expected_, DaysFor100BTokens(cfg_.tokens_per_step() / mean),
                                           FormatDuration(mean * (end - step))));
    if (step % cfg_.train.log_every == 0 || step == end || it == start_) {
      std::cout << line << "\n" << std::flush;
      metrics_.DrawLossCurve(LossSvg()).IgnoreError();  // redrawn at the end, where a failure is reported
    }
  }

  std::string LossSvg() const { return (fs::path(cfg_.train.out_dir) / "loss.svg").string(); }

  // What is known of the run, finished or not: the mean iteration time and each worker's split of
  // it are over the iterations after this process's first.
  nlohmann::json Summary() const {
    const std::vector<MetricsRow>& rows = metrics_.rows();
    nlohmann::json s = {{"status", abort_.empty() ? "completed" : g_stop_requested ? "interrupted" : "failed"},
                        {"steps", cfg_.train.steps},
                        {"first_step", start_ + 1},
                        {"last_step", rows.empty() ? start_ : rows.back().step},
                        {"final_loss", rows.empty() ? nlohmann::json() : nlohmann::json(rows.back().loss)},
                        {"iteration_seconds", nullptr},
                        {"tokens_per_second", nullptr},
                        {"replica_checks", replica_checks_},
                        {"workers", nlohmann::json::array()}};
    if (!abort_.empty()) s["reason"] = abort_;
    if (timed_ > 0) {
      const double sec = timed_seconds_ / timed_;
      s["iteration_seconds"] = sec;
      s["tokens_per_second"] = cfg_.tokens_per_step() / sec;
    }
    for (auto& [id, w] : workers_) {
      double total = 0, compute = 0, wait = 0;
      int n = 0;
      for (auto& [it, rec] : iterations_) {
        if (it == start_ || !rec.reports.count(id)) continue;
        const proto::IterationReport& r = rec.reports.at(id);
        total += r.seconds(), compute += r.compute_seconds(), wait += r.wait_seconds(), ++n;
      }
      if (n == 0) continue;
      const proto::Assignment& a = plan_.assignments(id);
      s["workers"].push_back({{"worker", id}, {"stage", a.stage()}, {"replica", a.replica()}, {"seconds", total / n},
                              {"compute_seconds", compute / n}, {"wait_seconds", wait / n}});
    }
    return s;
  }

  void WriteRecords(const nlohmann::json& summary) {
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
    std::vector<std::string> traces;
    for (auto& [id, w] : workers_)
      if (!w.timeline.empty() && fs::exists(w.timeline)) traces.push_back(w.timeline);
    if (!traces.empty()) {
      note(absl::StrFormat("timeline.json (%d of %d workers; open in https://ui.perfetto.dev or chrome://tracing)",
                           traces.size(), expected_),
           MergeTraces(traces, (dir / "timeline.json").string()));
    }
    note("summary.json", WriteJson((dir / "summary.json").string(), summary));
    std::cout << "coordinator: records in " << dir.string() << ": " << absl::StrJoin(written, ", ") << "\n"
              << std::flush;
  }

  // Written aside and renamed, so a reader never finds half a file.
  static absl::Status WriteJson(const std::string& path, const nlohmann::json& j) {
    const std::string tmp = path + ".tmp";
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump(2) << "\n";
    if (!f.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ec.message()));
    return absl::OkStatus();
  }

  void PrintSummary(const nlohmann::json& s) const {
    if (timed_ == 0) return;
    const double sec = s["iteration_seconds"], tps = s["tokens_per_second"];
    std::cout << absl::StrFormat(
        "done: %d iterations | final loss %.4f | iteration time %.3f s (stage 0 replica 0, mean after the first) | "
        "%.0f tokens/s | %.4f TFLOPs per worker [%s / time / %d workers] | %.1f days per 100B tokens\n",
        end_ - start_, s["final_loss"].get<double>(), sec, tps, flops_ / sec / 1e12 / expected_,
        FlopsFormulaName(cfg_.train.recompute), expected_, DaysFor100BTokens(tps));
    // Where the time went, per worker, averaged over iterations after the first.
    std::cout << "time per iteration by worker (mean after the first): compute = forward + backward, wait = blocked on "
                 "activations, gradients and parameters, other = the rest (sampling, PS step, sends)\n";
    for (const nlohmann::json& w : s["workers"]) {
      const double total = w["seconds"], compute = w["compute_seconds"], wait = w["wait_seconds"];
      std::cout << absl::StrFormat("  worker %d (stage %d, replica %d): %.3f s = compute %.3f + wait %.3f + other %.3f\n",
                                   w["worker"].get<int>(), w["stage"].get<int>(), w["replica"].get<int>(), total, compute,
                                   wait, total - compute - wait);
    }
    if (replica_checks_ > 0) {
      std::cout << absl::StrFormat("  every stage's %d replicas held bitwise the same parameters after each of %d "
                                   "iterations (CRC-32C compared by the coordinator)\n",
                                   cfg_.cluster.replicas, replica_checks_);
    }
    std::cout << std::flush;
  }

  JobConfig cfg_;
  const int expected_;
  const int64_t start_, end_;
  const std::string resume_name_;
  std::vector<proto::ShardPlacement> shards_;
  double flops_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, WorkerInfo> workers_;
  proto::Plan plan_;
  std::set<int> ready_;  // workers that installed plan_
  std::map<int64_t, IterationRecord> iterations_;
  std::map<int64_t, std::map<std::pair<int, int>, double>> norms_;
  std::map<int64_t, std::set<std::pair<int, int>>> checkpointed_;  // by step: (stage, shard) on disk
  int64_t replica_checks_ = 0;  // iterations whose replicas were checked to agree
  std::string abort_;
  Clock::time_point abort_time_, start_time_;
  MetricsLog metrics_;
  double timed_seconds_ = 0;
  int64_t timed_ = 0;
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
  if (cfg.train.resume) {
    LH_ASSIGN_OR_RETURN(std::string dir, LatestCheckpoint((fs::path(cfg.train.out_dir) / "checkpoints").string()));
    resume_name = fs::path(dir).filename().string();
    LH_ASSIGN_OR_RETURN(start, CheckpointStep(dir));
    const std::string state_dir = CheckpointStateDir(fs::path(dir).parent_path().string(), resume_name);
    LH_RETURN_IF_ERROR(CheckCheckpointResumable(state_dir, cfg));
  }
  const std::string csv = (fs::path(cfg.train.out_dir) / "metrics.csv").string();
  LH_ASSIGN_OR_RETURN(MetricsLog metrics, cfg.train.resume ? MetricsLog::Resume(csv, start) : MetricsLog::Create(csv));
  Service service(cfg, start, resume_name, opt.stop_at, std::move(metrics));
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(opt.listen, grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", opt.listen, " (port in use? choose --listen)"));
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
