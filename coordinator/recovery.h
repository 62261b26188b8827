#pragma once
// The recovery transitions: what the coordinator does when a worker is lost, when a running
// version fails with every worker alive, when a worker straggles, when spares come back after the
// layout shrank, and when it starts again on a job state a coordinator before it left. Each ends,
// where it changes anything, in a new plan version from the last complete checkpoint (Job::Adopt),
// which every worker rolls back to: samples are a function of (seed, iteration, global
// micro-batch) and gradients sum in a fixed order, so the run ends bitwise equal to one without
// failures. Each function runs with the job's lock held.
#include <chrono>
#include <map>

#include "coordinator/job.h"
#include "coordinator/membership.h"
#include "coordinator/supervisor.h"
#include "longhaul.pb.h"

namespace longhaul {

// Worker `lost.id` is dead. A spare's loss costs nothing; a plan worker's place waits for a spare
// (FillVacancies). Before the first plan, the job stops.
void LoseWorker(Job& job, const Membership::Lost& lost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// Places wait (job.recovery.vacant): spares (registered, profiled, in no place) take the lost
// workers' places in the next plan version; without enough spares for cluster.spare_wait_s the
// layout shrinks to fewer replicas, or a shorter pipeline (ShrinkPlan), or, where none can run, the
// job stops.
void FillVacancies(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// A worker reported that the running version failed (job.recovery.restart) and nobody is lost:
// once every worker of the plan has had its tensor port answer the coordinator's dial since (its
// process lives: the kernel refuses a dead one's), or, where the coordinator does not reach that
// port or the dial went unanswered, has been heard from a heartbeat period after the report,
// nobody died: a link broke between live workers (a reset connection, a middlebox's timeout), and
// the same layout starts again from the last complete checkpoint, as after a loss. Nothing is
// concluded within kRestartGrace of the report: a killed worker's connections reset as it dies,
// and the report that death caused can come before its lifeline's end is noticed, before the
// heartbeat it sent just before, and even before its port refuses. A dead worker is found first (a
// closed lifeline, a refused port); a silent one answers nothing and is lost after
// cluster.dead_after_s. A link that keeps breaking stops the job after kMaxRestarts. The dials
// leave the lock (supervisor.h ProbeGone).
void MaybeRestart(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// A failure report's wait before the coordinator dials to decide that nobody died: a dying worker's
// lifeline end noticed (two of the lifeline's polls, gRPC's threads on loaded cores among them).
inline constexpr std::chrono::milliseconds kRestartGrace = 2 * kLifelinePoll;
inline constexpr int kMaxRestarts = 3;

// A checkpoint just completed: a shrunk layout takes back replicas (or its stages) from the spares
// that joined since (GrowPlan) at this step; the iterations under way past it are redone.
void Grow(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// Every worker reported iteration `it` (`reports`, by worker): the straggler watch takes them; a
// straggler moves to a waiting spare, or blocks move off its stage, where cluster.replace_stragglers
// allows it and the last complete checkpoint is near; a worker whose blocks moved off it and that
// computes fast again gets them back.
void AnswerStragglers(Job& job, int64_t it, const std::map<int, proto::IterationReport>& reports)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

// The job state a coordinator before this one left: its workers and the next version of its plan,
// from the last complete checkpoint. The workers' heartbeats find this coordinator at the same
// address and their next plan request the new version.
void RestoreJob(Job& job, const proto::JobState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

}  // namespace longhaul
