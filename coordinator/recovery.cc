#include "coordinator/recovery.h"

#include <chrono>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/planning.h"
#include "coordinator/supervisor.h"
#include "layout/plan_layout.h"
#include "util/bounded_json.h"

namespace longhaul {
namespace {

using Clock = std::chrono::steady_clock;

// Wall-clock time, for records that outside tools line up with their own (bench/recovery.sh times
// each failure from its kill).
double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

PlanRequest FromLatest(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return {job.checkpoints.latest_step(), job.checkpoints.latest_name(), job.progress.end()};
}
PlanRequest FromStart(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return {job.progress.start(), job.progress.resume_name(), job.progress.end()};
}

// How worker `lost.id` was found lost, for people: where it ran, what closed, what confirmed it.
std::string LossSentence(const Job& job, const Membership::Lost& lost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const std::string& address = job.members.registration(lost.id).address();
  const proto::Assignment* a = AssignmentOf(job.plans.current(), lost.id);
  const std::string where =
      job.plans.version() == 0 ? absl::StrFormat("registered from %s, waiting for its plan", address)
      : a == nullptr           ? absl::StrFormat("a spare at %s", address)
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
  return absl::StrFormat("worker %d (%s) %s", lost.id, where, why);
}

// The next version with the blocks cut anew at the workers' paces now, from the last complete
// checkpoint (RebalancePlan).
absl::StatusOr<proto::Plan> Rebalanced(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return RebalancePlan(job.plans.current(), FromLatest(job), job.PacedProfiles(), job.members.registrations());
}

// How `next` cuts the model against the running plan.
std::string CutChange(const Job& job, const proto::Plan& next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return absl::StrFormat("[%s] blocks per stage instead of [%s]", absl::StrJoin(BlocksPerStage(next), ", "),
                         absl::StrJoin(job.cfg.Cut(), ", "));
}

// `next` (RebalancePlan's) moves blocks off straggling worker `id`, or, with `back`, back to it:
// every worker goes back to the last complete checkpoint.
void AdoptRebalance(Job& job, int id, proto::Plan next, bool back) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const int64_t reached = job.Rollback();
  const int64_t start = job.progress.start();
  const proto::Assignment& a = *AssignmentOf(job.plans.current(), id);
  nlohmann::json event = {{"worker", id},
                          {"stage", a.stage()},
                          {"replica", a.replica()},
                          {"straggler", true},
                          {"blocks_per_stage", BlocksPerStage(next)},
                          {"plan_version", job.plans.version()},
                          {"new_plan_version", next.version()},
                          {"rollback_to_step", start},
                          {"redone_iterations", reached - start}};
  if (back) event["fast_again"] = true;
  job.recovery.events.push_back(std::move(event));
  job.Adopt(std::move(next), reached,
            back ? absl::StrFormat("blocks move back to worker %d", id)
                 : absl::StrFormat("blocks move off straggling worker %d", id),
            {});
}

// A move allowed now (cluster.replace_stragglers, the last checkpoint near). A worker whose blocks
// moved off it computes fast again (its straggling passed: a noisy neighbour left): the blocks
// move back, as far as its pace now says, where that is predicted faster.
void MoveBlocksBack(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::set<int>& eased = job.recovery.eased;
  for (auto it = eased.begin(); it != eased.end();) {
    const int id = *it;
    const proto::Assignment* a = AssignmentOf(job.plans.current(), id);
    if (a == nullptr) {
      it = eased.erase(it);
      continue;
    }
    if (!job.stragglers.Quick(id)) {
      ++it;
      continue;
    }
    it = eased.erase(it);
    const std::string what = absl::StrFormat(
        "worker %d (stage %d, replica %d), whose blocks moved off it, computes %.2fx as fast as since they moved", id,
        a->stage(), a->replica(), 1 / job.stragglers.Drift(id));
    absl::StatusOr<proto::Plan> p = Rebalanced(job);
    if (!p.ok()) {
      std::cout << "coordinator: " << what << "; the cut stays: " << p.status().message() << "\n" << std::flush;
      return;
    }
    std::cout << "coordinator: " << what << "; blocks move back, " << CutChange(job, *p) << "\n" << std::flush;
    AdoptRebalance(job, id, *std::move(p), true);
    return;
  }
}

// No spare for every vacant place, and cluster.spare_wait_s has passed: fewer replicas, or a
// shorter pipeline, or the job stops.
void Shrink(Job& job, const std::vector<int>& spares) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const proto::Plan& plan = job.plans.current();
  std::vector<int> lost;
  for (const auto& [id, what] : job.recovery.vacant) lost.push_back(id);
  std::map<int, proto::ComputeProfile> profiles;
  for (const auto& [id, reg] : job.members.registrations())
    if (job.members.HasProfile(id)) profiles[id] = job.members.profile(id);
  absl::StatusOr<proto::Plan> shrunk = ShrinkPlan(plan, lost, spares, job.members.registrations(), FromLatest(job),
                                                  job.network ? &*job.network : nullptr, profiles);
  const double wait_s = job.cfg.cluster.spare_wait_s;
  if (!shrunk.ok()) {
    job.Abort(absl::StrFormat("%s: it died or is unreachable, no spare took its place within cluster.spare_wait_s = "
                              "%g s, and the layout cannot shrink (%s); restart it, then %s",
                              job.recovery.vacant.begin()->second, wait_s, shrunk.status().message(),
                              job.ResumeAdvice()));
    return;
  }
  const std::string change =
      shrunk->stages() != plan.stages()
          ? absl::StrFormat("no spare came within cluster.spare_wait_s = %g s: the model cut anew into %d stages "
                            "instead of %d, one replica of %d micro-batches (the same global batch)",
                            wait_s, shrunk->stages(), plan.stages(), MostMicroBatches(*shrunk, job.cfg))
          : absl::StrFormat("no spare came within cluster.spare_wait_s = %g s: %d replicas of %d micro-batches each "
                            "instead of %d (the same global batch)",
                            wait_s, shrunk->replicas(), MostMicroBatches(*shrunk, job.cfg), plan.replicas());
  const int64_t reached = job.Rollback();
  job.Adopt(*std::move(shrunk), reached, change, {});
}

}  // namespace

void LoseWorker(Job& job, const Membership::Lost& lost) {
  const int id = lost.id;
  const std::string what = LossSentence(job, lost);
  job.metrics.WorkerLost();
  if (job.plans.version() == 0) {
    job.Abort(absl::StrFormat("%s: it died or is unreachable; restart it, then %s", what, job.ResumeAdvice()));
    return;
  }
  const proto::Assignment* a = AssignmentOf(job.plans.current(), id);
  job.members.Lose(id);
  job.WriteState();
  std::cout << "coordinator: " << what
            << (a == nullptr               ? ": one spare fewer\n"
                : !job.Spares().empty()    ? ": its place goes to a spare\n"
                                           : ": no spare waits to take its place\n")
            << std::flush;
  if (a == nullptr) return;
  if (job.recovery.vacant.empty()) job.recovery.vacant_since = Clock::now();
  job.recovery.vacant[id] = what;
  job.recovery.AddPending({{"worker", id},
                           {"stage", a->stage()},
                           {"replica", a->replica()},
                           {"detection_s", lost.silent_s},
                           {"reporter", lost.reporter},
                           {"plan_version", job.plans.version()},
                           {"lost_at_unix_s", UnixSeconds()}},
                          id,
                          Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(lost.silent_s)),
                          absl::StrFormat("worker %d was last heard from (found lost after %.2f s)", id,
                                          lost.silent_s));
}

void FillVacancies(Job& job) {
  RecoveryRecords& r = job.recovery;
  const std::vector<int> spares = job.Spares();
  if (spares.size() < r.vacant.size()) {
    const double waited = std::chrono::duration<double>(Clock::now() - r.vacant_since).count();
    if (waited >= job.cfg.cluster.spare_wait_s) {
      Shrink(job, spares);
    } else if (!r.spare_wait_noted) {
      r.spare_wait_noted = true;
      std::cout << absl::StrFormat("coordinator: waiting up to %g s (cluster.spare_wait_s) for a spare: start one "
                                   "with `longhaul worker --coordinator <this host>:<port>`\n",
                                   job.cfg.cluster.spare_wait_s)
                << std::flush;
    }
    return;
  }
  std::map<int, int> replace;
  auto spare = spares.begin();
  for (const auto& [id, what] : r.vacant) replace[id] = *spare++;
  const int64_t reached = job.Rollback();
  std::vector<std::string> moves;
  for (const auto& [lost, by] : replace) {
    const proto::Assignment& a = *AssignmentOf(job.plans.current(), lost);
    moves.push_back(
        absl::StrFormat("worker %d takes stage %d replica %d from worker %d", by, a.stage(), a.replica(), lost));
  }
  job.Adopt(NextPlan(job.plans.current(), replace, job.members.registrations(), FromStart(job)), reached,
            absl::StrJoin(moves, "; "), replace);
}

void MaybeRestart(Job& job) {
  RecoveryRecords& r = job.recovery;
  if (Clock::now() < r.restart->at + kRestartGrace) return;
  const uint64_t version = job.plans.version();
  const auto heard_since =
      r.restart->at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(job.cfg.cluster.heartbeat_s));
  std::vector<int> dial;
  for (const proto::Assignment& a : job.plans.current().assignments()) {
    const int id = a.worker_id();
    if (!r.restart->answered.count(id) && job.members.last_seen(id) <= heard_since) dial.push_back(id);
  }
  if (!dial.empty()) {
    // One round of dials per report (every worker not heard from then); one left unanswered waits
    // for its heartbeat.
    if (std::exchange(r.restart->dialled, true)) return;
    const std::map<int, PortAnswer> answers = ProbeGone(job, dial);  // a refusal is evidence of a death
    if (!r.restart || job.plans.version() != version || !r.vacant.empty() || !job.abort.empty()) return;
    bool all = true;
    for (int id : dial) {
      const auto answer = answers.find(id);
      if (answer != answers.end() && answer->second == PortAnswer::kListening) {
        r.restart->answered.insert(id);
      } else {
        all = false;
      }
    }
    if (!all) return;
  }
  const RecoveryRecords::Restart restart = *std::exchange(r.restart, std::nullopt);
  if (++r.restarts_in_a_row > kMaxRestarts) {
    job.Abort(absl::StrFormat("plan version %d failed with every worker alive, %d versions in a row with no iteration "
                              "completed in between (worker %d: %s): a link between the workers keeps breaking; check "
                              "the network between them (a firewall, a NAT or proxy closing connections), then %s",
                              job.plans.version(), r.restarts_in_a_row, restart.worker, restart.failure,
                              job.ResumeAdvice()));
    return;
  }
  const int64_t reached = job.Rollback();
  const std::string what = absl::StrFormat("worker %d's plan version %d failed with every worker alive (%s)",
                                           restart.worker, job.plans.version(), restart.failure);
  // Nobody was lost: the event names who reported, not a "worker" with a "lost_at_unix_s" as a
  // loss's does (tools count losses by those).
  const double after = std::chrono::duration<double>(Clock::now() - restart.at).count();
  r.AddPending({{"restart", true},
                {"reporter", restart.worker},
                {"failure", restart.failure},
                {"plan_version", job.plans.version()},
                {"restarted_after_s", after},
                {"failed_at_unix_s", UnixSeconds() - after}},
               -1, restart.at, what);
  std::cout << "coordinator: " << what << "\n" << std::flush;
  job.Adopt(NextPlan(job.plans.current(), {}, job.members.registrations(), FromStart(job)), reached,
            "the same layout again", {});
}

void Grow(Job& job) {
  const proto::Plan& plan = job.plans.current();
  const bool recut = !plan.job_config_toml().empty();
  if (job.finished || !job.abort.empty() || !job.recovery.vacant.empty() ||
      (plan.replicas() >= job.cfg.cluster.replicas && !recut)) {
    return;
  }
  const std::vector<int> spares = job.Spares();
  if (spares.empty() || (!recut && static_cast<int>(spares.size()) < plan.stages())) return;
  absl::StatusOr<proto::Plan> grown = GrowPlan(plan, spares, job.members.registrations(), FromLatest(job),
                                               job.network ? &*job.network : nullptr);
  if (!grown.ok()) return;  // the spares fill no stage or replica more yet
  const int64_t reached = job.Rollback();
  const int64_t start = job.progress.start();
  const int joined = grown->assignments_size() - plan.assignments_size();
  const std::string change =
      recut ? absl::StrFormat("%d spares join: the job's %d stages again instead of %d", joined, grown->stages(),
                              plan.stages())
            : absl::StrFormat("%d spares join: %d replicas of %d micro-batches each instead of %d", joined,
                              grown->replicas(), MostMicroBatches(*grown, job.cfg), plan.replicas());
  nlohmann::json event = {{"grown_to_replicas", grown->replicas()},
                          {"plan_version", plan.version()},
                          {"new_plan_version", grown->version()},
                          {"rollback_to_step", start},
                          {"redone_iterations", reached - start}};
  if (recut) event["grown_to_stages"] = grown->stages();
  job.recovery.events.push_back(std::move(event));
  job.Adopt(*std::move(grown), reached, change, {});
}

void AnswerStragglers(Job& job, int64_t it, const std::map<int, proto::IterationReport>& reports) {
  std::optional<std::pair<int, std::string>> move;       // a straggler a spare replaces, once the report is in
  std::optional<std::pair<int, proto::Plan>> rebalance;  // or the plan that moves blocks off it
  // A move sends every worker back to the last complete checkpoint: worth it only where that
  // redoes fewer iterations than the straggler was watched for.
  const int64_t redo = it + 1 - job.checkpoints.latest_step();
  const bool movable = job.cfg.cluster.replace_stragglers && redo <= StragglerWatch::kWindow;
  const proto::Plan& plan = job.plans.current();
  for (const auto& [id, s] : job.stragglers.Add(reports)) {
    const proto::IterationReport& r = reports.at(id);
    const std::string what = absl::StrCat(
        absl::StrFormat("worker %d (stage %d, replica %d) straggles: its compute per iteration, median of the last %d, "
                        "is %.2fx its own at the start of the run (beyond the other workers' drift)",
                        id, r.stage(), r.replica(), StragglerWatch::kWindow, s.vs_start),
        plan.replicas() > 1 ? absl::StrFormat(" and %.2fx its stage's other replicas'", s.vs_peers) : "");
    const bool may = movable && !move && !rebalance;
    std::string outcome;
    if (may && !job.Spares().empty()) {
      move.emplace(id, what);
      outcome = "a spare takes its place and it waits as a spare";
    } else if (may) {
      absl::StatusOr<proto::Plan> p = Rebalanced(job);
      if (p.ok()) {
        outcome = absl::StrCat("no spare waits: blocks move off it, ", CutChange(job, *p));
        rebalance.emplace(id, *std::move(p));
      } else {
        outcome = absl::StrCat("it keeps its place: ", p.status().message());
      }
    } else {
      outcome = absl::StrFormat(
          "it keeps its place (slow, not dead; it moves to a waiting spare, or blocks move off its stage, where "
          "cluster.replace_stragglers is on and the last complete checkpoint is at most %d iterations back, here %d)",
          StragglerWatch::kWindow, redo);
    }
    std::cout << "coordinator: " << what << "; " << outcome << "\n" << std::flush;
  }
  job.metrics.SetSlowdowns(job.stragglers.Current());
  if (move) {
    const proto::Assignment& a = *AssignmentOf(plan, move->first);
    RecoveryRecords& r = job.recovery;
    r.slow.insert(move->first);
    r.vacant_since = Clock::now();
    r.vacant[move->first] = move->second;
    r.AddPending({{"worker", move->first},
                  {"stage", a.stage()},
                  {"replica", a.replica()},
                  {"straggler", true},
                  {"plan_version", plan.version()}},
                 move->first, Clock::now(), move->second);
    FillVacancies(job);
  }
  if (rebalance) {
    job.recovery.eased.insert(rebalance->first);
    AdoptRebalance(job, rebalance->first, std::move(rebalance->second), false);
  } else if (!move && movable) {
    MoveBlocksBack(job);
  }
}

void RestoreJob(Job& job, const proto::JobState& state) {
  RecoveryRecords& r = job.recovery;
  for (const proto::WorkerRecord& w : state.workers()) job.members.Restore(w, Clock::now());
  job.cluster_record = ParseBoundedJson(state.cluster_json());
  if (!job.cluster_record.is_object()) job.cluster_record = nlohmann::json::object();
  r.events = ParseBoundedJson(state.recoveries_json());
  if (!r.events.is_array()) r.events = nlohmann::json::array();
  job.progress.set_redone(state.redone_iterations());
  const int64_t reached = state.plan().start_iteration();
  proto::Plan next = NextPlan(state.plan(), {}, job.members.registrations(), FromStart(job));
  // The coordinator before may have published the version after the state's and died before its
  // state was written (JobStateStore): workers on that version take this one, which is newer.
  next.set_version(state.plan().version() + 2);
  job.NotePlan(std::move(next));
  for (const proto::Assignment& a : job.plans.current().assignments()) {
    if (!job.members.Check(a.worker_id()).ok()) r.vacant[a.worker_id()] = absl::StrFormat("worker %d", a.worker_id());
  }
  if (!r.vacant.empty()) r.vacant_since = Clock::now();
  const uint64_t version = job.plans.version();
  r.AddPending({{"coordinator_restart", true},
                {"plan_version", state.plan().version()},
                {"new_plan_version", version},
                {"rollback_to_step", job.progress.start()}},
               -1, Clock::now(), "this coordinator started again");
  std::cout << absl::StrFormat("coordinator: resuming job '%s' from its job state (plan v%d, %d workers, that plan "
                               "from step %d): plan v%d sends every worker back to step %d\n",
                               job.cfg.cluster.job_id, state.plan().version(),
                               job.plans.current().assignments_size(), reached, version, job.progress.start())
            << std::flush;
  job.WriteState();
}

}  // namespace longhaul
