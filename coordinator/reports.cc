#include "coordinator/reports.h"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "coordinator/checkpoint_index.h"
#include "coordinator/recovery.h"
#include "coordinator/report_checks.h"
#include "layout/plan_layout.h"
#include "transport/wire_plan.h"

namespace longhaul {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Wall-clock time, for records that outside tools line up with their own.
double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Every worker reported iteration `it`: each stage ran each of the iteration's global micro-batches
// once. A rollback forgets the iterations it redoes, so what stays is what the final parameters
// saw. The failures pending are recovered from.
void Audit(Job& job, int64_t it, const std::map<int, proto::IterationReport>& reports)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  const absl::StatusOr<SampleAudit::Count> c = job.samples.Record(it, job.plans.current().stages(), reports);
  if (!c.ok() && job.abort.empty()) job.Abort(std::string(c.status().message()));
  if (c.ok() && (c->lost > 0 || c->repeated > 0) && job.abort.empty()) {
    job.Abort(absl::StrFormat("iteration %d: %d (stage, micro-batch) pairs not run and %d run twice (a bug: please "
                              "report it with the config)",
                              it + 1, c->lost, c->repeated));
  }
  if (it == job.progress.end() - 1) job.last_recorded = true;
  RecoveryRecords& r = job.recovery;
  r.restarts_in_a_row = 0;
  for (const RecoveryRecords::Pending& p : r.pending) {
    const double stall = std::chrono::duration<double>(Clock::now() - p.failed_at).count();
    r.events[p.event]["stall_s"] = stall;
    r.events[p.event]["recovered_at_unix_s"] = UnixSeconds();
    std::cout << absl::StrFormat("coordinator: recovered: iteration %d completed %.2f s after %s\n", it + 1, stall,
                                 p.what)
              << std::flush;
  }
  if (!r.pending.empty()) job.WriteState();  // the stalls outlive this coordinator
  r.pending.clear();
  job.CheckFinished();
}

}  // namespace

absl::Status TakeIterationReport(Job& job, const proto::IterationReport& req) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  if (absl::Status st = CheckIterationReport(req, job.replicas.LastReported(req.worker_id()), job.View()); !st.ok()) {
    return st;
  }
  if (absl::Status st = job.progress.CheckNew(req.worker_id(), req.iteration()); !st.ok()) return st;
  if (absl::Status st = job.metrics.Report(req); !st.ok()) return st;
  const proto::Plan& plan = job.plans.current();
  const std::optional<std::string> disagreement =
      job.replicas.Add(req, job.cfg.cluster.stages, plan.replicas(), plan.assignments_size());
  if (disagreement && job.abort.empty()) job.Abort(*disagreement);
  const absl::StatusOr<bool> complete = job.progress.Add(req, plan.assignments_size());
  if (!complete.ok() || !*complete) return complete.status();
  const int64_t it = req.iteration();
  const std::map<int, proto::IterationReport> reports = job.progress.Complete(it);
  Audit(job, it, reports);
  job.metrics.Complete(it, reports);
  job.WriteMetricsFile();
  if (absl::Status st = job.log.Record(it, plan.stages(), reports); !st.ok() && job.abort.empty()) {
    job.Abort(std::string(st.message()));
  }
  if (it == job.progress.start() + 2) {
    if (const std::optional<double> p = job.Predict()) {
      std::cout << absl::StrFormat("coordinator: the planner predicts %.3f s per iteration from the compute measured "
                                   "so far and %s\n",
                                   *p, job.links)
                << std::flush;
    }
  }
  AnswerStragglers(job, it, reports);
  return absl::OkStatus();
}

absl::Status TakeCheckpointReport(Job& job, const proto::CheckpointReport& req) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  if (absl::Status st = CheckCheckpointReport(req, job.View()); !st.ok()) return st;
  const proto::Plan& plan = job.plans.current();
  const size_t streams = FeedbackStreams(plan, job.cfg).size();
  const absl::StatusOr<bool> complete =
      job.checkpoints.Add(req.step(), ReportedPiece(req), plan.shards_size() + streams);
  if (!complete.ok()) return absl::InvalidArgumentError(DescribeCheckpointReport(req) + ", which was already reported");
  if (!*complete) return absl::OkStatus();
  // Every piece is on disk: only now does `latest` move, so a resume never finds half a step.
  const absl::StatusOr<std::string> warning = job.checkpoints.Complete(req.step(), job.cfg.train.keep_checkpoints);
  if (!warning.ok()) return absl::InternalError(warning.status().message());
  std::cout << absl::StrFormat("coordinator: checkpoint %s complete (%d shards%s) in %s\n", job.checkpoints.latest_name(),
                               plan.shards_size(),
                               streams == 0 ? "" : absl::StrFormat(", %d error-feedback residuals", streams),
                               job.checkpoints.root())
            << std::flush;
  if (!warning->empty()) std::cout << "coordinator: warning: " << *warning << "\n";
  // No rollback goes before this step: the checks of earlier iterations are only counted now.
  job.replicas.Settle(job.checkpoints.latest_step());
  job.CheckFinished();
  Grow(job);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ShippedPartPath(Job& job, const proto::CheckpointChunk& req) {
  const absl::StatusOr<CheckpointPieceRoot> piece = ParseCheckpointPieceRoot(req.piece());
  if (!piece.ok()) return piece.status();
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  if (absl::Status st = CheckShippedPart(req, *piece, job.View()); !st.ok()) return st;
  return (fs::path(job.checkpoints.root()) / req.piece() / CheckpointName(req.step()) / req.file()).string();
}

absl::StatusOr<std::string> TimelinePartPath(Job& job, const proto::TimelineChunk& req) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  if (req.file_bytes() > kMaxTimelineBytes) {
    return absl::ResourceExhaustedError(absl::StrFormat("a timeline of %d bytes; the coordinator takes at most %d",
                                                        req.file_bytes(), kMaxTimelineBytes));
  }
  if (absl::Status st = CheckPart(req.file_bytes(), req.offset(), req.data().size()); !st.ok()) return st;
  return job.TimelinePath(req.worker_id()).string();
}

absl::StatusOr<std::string> FetchedPartPath(Job& job, const proto::CheckpointFetch& req,
                                            proto::CheckpointChunk& reply) {
  if (absl::Status st = ParseCheckpointPieceRoot(req.piece()).status(); !st.ok()) return st;
  if (!IsCheckpointFile(req.file())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("\"%s\" is no file a checkpoint holds", absl::CHexEscape(req.file())));
  }
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  const proto::Plan& plan = job.plans.current();
  // Aborted where a newer plan replaced the worker's: it goes on to that one, as after a lost peer,
  // rather than taking the refusal for its own failure to read the checkpoint.
  if (req.plan_version() != plan.version()) {
    return absl::AbortedError(
        absl::StrFormat("worker %d asks for a checkpoint under plan version %d; plan version %d is the one to fetch "
                        "under",
                        req.worker_id(), req.plan_version(), plan.version()));
  }
  if (AssignmentOf(plan, req.worker_id()) == nullptr || plan.resume_checkpoint().empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d asks for a checkpoint under plan version %d, which %s", req.worker_id(), plan.version(),
        plan.resume_checkpoint().empty() ? "resumes from none" : "does not place it"));
  }
  reply.set_step(*CheckpointStep(plan.resume_checkpoint()));
  return (fs::path(job.checkpoints.root()) / req.piece() / plan.resume_checkpoint() / req.file()).string();
}

absl::Status TakeDone(Job& job, const proto::DoneReport& req) {
  if (absl::Status st = job.members.Check(req.worker_id()); !st.ok()) return st;
  if (req.timeline_bytes() > kMaxTimelineBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a timeline of %d bytes (at most %d)", req.timeline_bytes(), kMaxTimelineBytes));
  }
  // A worker done is never lost: one the plan still runs is done only once the job is.
  if (req.ok() && !job.finished && job.abort.empty() && AssignmentOf(job.plans.current(), req.worker_id()) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("worker %d says it is done, but plan version %d runs it and the job has not finished",
                        req.worker_id(), job.plans.version()));
  }
  job.members.Done(req.worker_id(),
                   {job.TimelinePath(req.worker_id()).string(), req.timeline_bytes(), req.timeline_crc32c()});
  // Bounded: the reason goes out again in every heartbeat's reply.
  if (!req.ok() && job.abort.empty()) {
    job.Abort(absl::StrCat("worker ", req.worker_id(), " failed: ", req.error().substr(0, 1000)));
    // It failed bringing in the checkpoint the running plan resumes from: resumed again, the job
    // would meet the same files. The stop reason names one to resume from once the job ended.
    if (!req.resumed_checkpoint().empty() && req.resumed_checkpoint() == job.plans.current().resume_checkpoint()) {
      job.failed_checkpoint = req.resumed_checkpoint();
    }
  }
  job.cv.SignalAll();
  return absl::OkStatus();
}

}  // namespace longhaul
