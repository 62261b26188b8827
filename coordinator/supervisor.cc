#include "coordinator/supervisor.h"

#include <algorithm>
#include <future>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coordinator/joining.h"
#include "coordinator/recovery.h"
#include "layout/plan_layout.h"

namespace longhaul {
namespace {

using Clock = std::chrono::steady_clock;

// Dials workers `ids`' tensor addresses (ProbePort) together, leaving the lock for `wait` at most.
std::map<int, PortAnswer> DialWorkers(Job& job, const std::vector<int>& ids, std::chrono::duration<double> wait)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::map<int, PortAnswer> answers;
  if (ids.empty()) return answers;
  std::vector<std::string> addresses;
  for (int id : ids) addresses.push_back(job.members.registration(id).address());
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(wait);
  job.mu.Unlock();
  std::vector<std::future<PortAnswer>> dialled;  // all but the first, which this thread dials
  for (size_t i = 1; i < ids.size(); ++i) dialled.push_back(std::async(std::launch::async, ProbePort, addresses[i], deadline));
  answers[ids[0]] = ProbePort(addresses[0], deadline);
  for (size_t i = 1; i < ids.size(); ++i) answers[ids[i]] = dialled[i - 1].get();
  job.mu.Lock();
  return answers;
}

// The run's records once the job ended, whatever ended it; the job state goes.
absl::Status WriteRecords(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  job.NameIntactCheckpoint();
  if (const std::optional<double> p = job.Predict()) job.log.SetPrediction(*p);
  if (const std::optional<double> p = job.Predict(/*without_cards=*/true)) job.log.SetPredictionWithoutCards(*p);
  job.WriteMeasuredProfile();
  nlohmann::json stragglers = nlohmann::json::array();
  for (const auto& [id, s] : job.stragglers.worst()) {
    stragglers.push_back({{"worker", id}, {"slowdown_vs_start", s.vs_start}, {"slowdown_vs_peers", s.vs_peers}});
  }
  job.log.SetStragglers(std::move(stragglers));
  nlohmann::json summary = job.log.Summary(
      job.abort.empty() ? "completed" : g_coordinator_stop_requested ? "interrupted" : "failed", job.abort,
      job.replicas.checked());
  const SampleAudit::Totals t = job.samples.totals();
  summary["audit"] = {{"file", job.samples.path()},
                      {"steps", t.steps},
                      {"pairs_per_step", job.cfg.cluster.stages * job.cfg.GlobalMicroBatches()},
                      {"lost", t.lost},
                      {"repeated", t.repeated},
                      {"redone_iterations", job.progress.redone()}};
  summary["recoveries"] = job.recovery.events;
  std::vector<std::string> traces;
  for (const auto& [id, trace] : job.members.timelines()) {
    if (const absl::Status st = CheckTraceFile(trace); st.ok()) {
      traces.push_back(trace.path);
    } else {
      std::cout << absl::StrFormat("coordinator: worker %d's timeline is left out of timeline.json (%s: on a disk this "
                                   "machine does not share, it stays there)\n",
                                   id, st.message());
    }
  }
  job.log.Write(summary, traces);
  job.WriteMetricsFile();
  // The job ended here: a coordinator started on this directory starts anew (or resumes from a
  // checkpoint where train.resume says so), and a worker registering late must not bring the job
  // state back.
  job.store.Close();
  if (!job.abort.empty()) return absl::AbortedError(job.abort);
  job.log.PrintSummary(summary);
  return absl::OkStatus();
}

}  // namespace

absl::Status Supervise(Job& job) {
  absl::MutexLock lock(&job.mu);
  auto last_wait_note = Clock::now();
  while (true) {
    // Often enough that a lost worker's detection is not this loop's period; a restart is
    // considered as soon as its grace ends.
    Clock::time_point wake = Clock::now() + std::chrono::milliseconds(50);
    const std::optional<RecoveryRecords::Restart>& restart = job.recovery.restart;
    if (restart && Clock::now() < restart->at + kRestartGrace) wake = std::min(wake, restart->at + kRestartGrace);
    job.cv.WaitWithTimeout(&job.mu, absl::FromChrono(wake - Clock::now()));
    if (g_coordinator_stop_requested && job.abort.empty()) {
      job.Abort(absl::StrCat("interrupted; ", job.ResumeAdvice()));
    }
    const int done = job.members.done();
    const bool all_done = done == job.members.registered();
    // The plan's workers and the spares heard that the job finished (PlanFor); one that died since
    // is not waited for.
    if (job.finished && (all_done || Clock::now() - job.finished_time > std::chrono::seconds(5))) break;
    // The workers heard of a stop through their heartbeats; a dead one is not waited for.
    if (!job.abort.empty() && (all_done || Clock::now() - job.abort_time > std::chrono::seconds(5))) break;
    // As often as a silent worker would be declared dead, at most every 10 s.
    const double note_every_s = std::min(10.0, job.cfg.cluster.dead_after_s);
    if (job.plans.version() == 0 &&
        std::chrono::duration<double>(Clock::now() - last_wait_note).count() > note_every_s) {
      std::cout << absl::StrFormat("coordinator: waiting for workers, %d/%d registered; %s\n",
                                   job.members.registered(), job.expected, UnfilledSlots(job))
                << std::flush;
      last_wait_note = Clock::now();
    }
    if (const auto silent = job.members.Silent(Clock::now()); silent && job.abort.empty() && !job.finished) {
      LoseWorker(job, *silent);
    }
    if (!job.recovery.vacant.empty() && job.abort.empty()) FillVacancies(job);
    if (job.recovery.restart && job.recovery.vacant.empty() && job.abort.empty() && !job.finished) MaybeRestart(job);
  }
  return WriteRecords(job);
}

absl::Status ServeLifeline(Job& job, int id, const std::function<bool()>& cancelled,
                           const std::function<bool(const proto::LifelineNews&)>& write) {
  if (absl::Status st = job.members.Check(id); !st.ok()) return st;
  job.members.Reconnected(id);
  // A worker holds its lifeline again at once: the call it replaces may notice its own end only
  // after this one began, and must not cut the worker off then.
  const uint64_t call = ++job.lifeline_calls[id];
  job.cv.SignalAll();  // the call this one replaces ends
  // Whether this coordinator reaches the worker's tensor port at all (ProbeGone).
  if (!job.members.reachable(id) && DialWorkers(job, {id}, std::chrono::seconds(1))[id] == PortAnswer::kListening &&
      job.members.Check(id).ok()) {
    job.members.Reachable(id);
  }
  uint64_t told = job.plans.version();
  std::optional<uint64_t> told_members;  // members.changes() when last told
  while (!cancelled() && !job.finished && job.abort.empty() && job.members.Check(id).ok() &&
         job.lifeline_calls[id] == call) {
    if (job.plans.version() > told || told_members != job.members.changes()) {
      const bool new_version = job.plans.version() > told;
      told = job.plans.version();
      told_members = job.members.changes();
      proto::LifelineNews n;
      if (new_version && AssignmentOf(job.plans.current(), id) != nullptr) *n.mutable_plan() = job.plans.ToSend();
      n.set_plan_version(told);
      for (const auto& [worker, reg] : job.members.registrations()) {
        proto::Peer* p = n.add_members();
        p->set_worker_id(worker);
        p->set_address(reg.address());
        p->set_public_key(reg.public_key());
      }
      job.mu.Unlock();
      const bool sent = write(n);
      job.mu.Lock();
      if (!sent) break;
      continue;
    }
    // A closed lifeline is noticed here only: its delay is part of every failure's detection.
    job.cv.WaitWithTimeout(&job.mu, absl::FromChrono(kLifelinePoll));
  }
  if (job.lifeline_calls[id] != call) {
    return absl::AbortedError(
        absl::StrFormat("a newer lifeline of worker %d began: it holds one at a time", id));
  }
  if (cancelled() && job.members.Check(id).ok()) {
    job.members.CutOff(id, Clock::now());
    job.cv.SignalAll();
    ProbeGone(job, {id});
  }
  return absl::OkStatus();
}

absl::Status TakeSuspect(Job& job, const proto::SuspectReport& req) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  const uint64_t version = job.plans.version();
  if (version == 0) return absl::FailedPreconditionError("no plan yet");
  if (req.plan_version() > version) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d reports under plan version %d; the plan is version %d", req.worker_id(), req.plan_version(),
        version));
  }
  // Connections outlive a version, and one whose last tensor was of an earlier version may close
  // after the next began (a peer killed before it sent anything of the new one): the place is that
  // version's, whose worker may hold another place now, or none. A version too old to be kept
  // names nobody to suspect.
  const proto::Plan* reported = job.plans.Find(req.plan_version());
  if (reported == nullptr) return absl::OkStatus();
  // Only a worker of that version had connections of it to see close.
  if (AssignmentOf(*reported, req.worker_id()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d has no place in plan version %d: only its workers report its peers", req.worker_id(),
        req.plan_version()));
  }
  // The first report of the running version's failure: a loss, once found, answers it; where every
  // worker is heard from after it instead, the layout starts again (MaybeRestart).
  if (!req.failure().empty() && req.plan_version() == version && !job.recovery.restart) {
    job.recovery.restart = RecoveryRecords::Restart{req.worker_id(), req.failure().substr(0, 1000), Clock::now()};
    job.cv.SignalAll();
  }
  const int suspect = WorkerAt(*reported, req.stage(), req.replica());
  if (suspect < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("plan version %d has no stage %d replica %d",
                                                      req.plan_version(), req.stage(), req.replica()));
  }
  if (suspect == req.worker_id()) return absl::OkStatus();
  job.members.Suspect(suspect, req.worker_id(), Clock::now());
  job.cv.SignalAll();  // with its lifeline closed too, it is lost soon (Supervise)
  ProbeGone(job, {suspect});
  return absl::OkStatus();
}

std::map<int, PortAnswer> ProbeGone(Job& job, const std::vector<int>& ids) {
  std::vector<int> reachable;
  for (int id : ids)
    if (job.members.reachable(id)) reachable.push_back(id);
  const std::map<int, PortAnswer> answers =
      DialWorkers(job, reachable, std::chrono::duration<double>(job.cfg.cluster.lifeline_grace_s));
  for (const auto& [id, answer] : answers) {
    if (answer == PortAnswer::kRefused && job.members.Check(id).ok()) {
      job.members.Refused(id, Clock::now());
      job.cv.SignalAll();
    }
  }
  return answers;
}

}  // namespace longhaul
