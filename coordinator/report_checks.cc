#include "coordinator/report_checks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "coordinator/checkpoint_index.h"
#include "layout/plan_layout.h"
#include "transport/mailbox.h"

namespace longhaul {
namespace {

// A report's parameter CRCs name this iteration or the one before (or, train.overlap_outer, the one
// whose exchange lands in it), each at most once: a duplicate counted as another worker's would
// mark a step checked before every replica's parameters were compared.
absl::Status CheckParamsIterations(const proto::IterationReport& r, const RunView& run) {
  if (r.params_size() > 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker %d's report of iteration %d carries %d parameter checksums; at most this iteration's and the one "
        "before's may come",
        r.worker_id(), r.iteration() + 1, r.params_size()));
  }
  for (int i = 0; i < r.params_size(); ++i) {
    const proto::ParamsCrc& p = r.params(i);
    const bool landed =
        p.iteration() == r.iteration() - run.cfg.train.overlap_steps &&
        run.cfg.train.OverlapsAfter(p.iteration(), RunEnd(run.plan, run.cfg));
    if (p.iteration() > r.iteration() || (p.iteration() < r.iteration() - 1 && !landed) ||
        (i > 0 && p.iteration() == r.params(0).iteration())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker %d's report of iteration %d carries the parameters of iteration %d; only this iteration's or the "
          "one before may come (or the one whose overlapped exchange lands in it)",
          r.worker_id(), r.iteration() + 1, p.iteration() + 1));
    }
  }
  return absl::OkStatus();
}

// A worker reports each step's parameters once, in step order: one counted twice would mark a step
// checked before every replica's were compared.
absl::Status CheckParamsOnce(const proto::IterationReport& r, std::optional<int64_t> last) {
  for (const proto::ParamsCrc& p : r.params()) {
    if (last && p.iteration() <= *last) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "worker %d reports the parameters of iteration %d %s", r.worker_id(), p.iteration() + 1,
          p.iteration() == *last ? std::string("again") : absl::StrFormat("after those of iteration %d", *last + 1)));
    }
  }
  return absl::OkStatus();
}

// A report's times are durations: what the straggler watch and the metrics divide by.
absl::Status CheckTimes(const proto::IterationReport& r) {
  for (const double t : {r.seconds(), r.compute_seconds(), r.wait_seconds(), r.step_seconds()}) {
    if (!std::isfinite(t) || t < 0 || t > kLongestSeconds) {
      return absl::InvalidArgumentError(absl::StrFormat("worker %d's report of iteration %d gives a time of %g s",
                                                        r.worker_id(), r.iteration() + 1, t));
    }
  }
  return absl::OkStatus();
}

// A report's micro-batches are global indices of the iteration among its replica's own, at most
// the replica's count: what the audit keeps is bounded by the plan.
absl::Status CheckMicroBatches(const proto::IterationReport& r, const RunView& run) {
  const int64_t first = FirstGlobalMicroBatch(run.plan, run.cfg, r.replica());
  const int count = ReplicaMicroBatches(run.plan, run.cfg, r.replica());
  bool ok = r.micro_batches_size() <= count;
  for (int64_t g : r.micro_batches()) ok = ok && g >= first && g < first + count;
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "worker %d's report of iteration %d names %d micro-batches outside its replica's [%d, %d) or more than the %d "
      "it runs",
      r.worker_id(), r.iteration() + 1, r.micro_batches_size(), first, first + count, count));
}

// Only the last stage reports validation losses, for the steps train.eval_every names, each replica
// its whole share of train.eval_batches.
absl::Status CheckValidation(const proto::IterationReport& r, const RunView& run) {
  const int owed = r.stage() == run.plan.stages() - 1 && run.cfg.train.EvaluatesIn(r.iteration(), RunEnd(run.plan, run.cfg))
                       ? run.cfg.train.EvalShare(run.plan.replicas(), r.replica())
                       : 0;
  if (r.val_batches() == owed && (owed > 0 || r.val_loss_sum() == 0)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "worker %d's report of iteration %d holds %d validation micro-batches; the plan has %d there for stage %d "
      "replica %d",
      r.worker_id(), r.iteration() + 1, r.val_batches(), owed, r.stage(), r.replica()));
}

}  // namespace

absl::Status CheckPlaced(int id, int64_t iteration, uint64_t version, const RunView& run) {
  if (run.plan.version() == 0) return absl::FailedPreconditionError("no plan yet");
  if (version != run.plan.version()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d reports under plan version %d; the plan is version %d", id, version, run.plan.version()));
  }
  if (AssignmentOf(run.plan, id) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("worker %d has no place in plan version %d", id, run.plan.version()));
  }
  if (iteration < run.start || iteration >= run.end) {
    return absl::OutOfRangeError(
        absl::StrFormat("iteration %d is outside this run's [%d, %d)", iteration, run.start, run.end));
  }
  // Held until complete: no worker runs further ahead of the others than its mailbox's window,
  // here with room for reports on their way.
  const int64_t ahead = 8 * Mailbox::WindowIterations(run.cfg.train.local_steps);
  const int64_t complete = std::max(run.completed_through, run.start - 1);
  if (iteration > complete + ahead) {
    return absl::OutOfRangeError(absl::StrFormat("iteration %d is more than %d past the last complete one, %d",
                                                 iteration + 1, ahead, complete + 1));
  }
  return absl::OkStatus();
}

absl::Status CheckIterationReport(const proto::IterationReport& r, std::optional<int64_t> last_params,
                                  const RunView& run) {
  if (absl::Status st = CheckPlaced(r.worker_id(), r.iteration(), r.plan_version(), run); !st.ok()) return st;
  const proto::Assignment& a = *AssignmentOf(run.plan, r.worker_id());
  if (r.stage() != a.stage() || r.replica() != a.replica()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker %d reports as stage %d replica %d; the plan has it at stage %d replica %d",
                        r.worker_id(), r.stage(), r.replica(), a.stage(), a.replica()));
  }
  if (absl::Status st = CheckParamsIterations(r, run); !st.ok()) return st;
  if (absl::Status st = CheckParamsOnce(r, last_params); !st.ok()) return st;
  if (absl::Status st = CheckTimes(r); !st.ok()) return st;
  if (absl::Status st = CheckMicroBatches(r, run); !st.ok()) return st;
  return CheckValidation(r, run);
}

CheckpointPieceRoot ReportedPiece(const proto::CheckpointReport& r) {
  if (r.residual_replica() > 0) return {CheckpointPieceRoot::Kind::kResidual, r.stage(), r.residual_replica() - 1};
  return {CheckpointPieceRoot::Kind::kShard, r.stage(), r.shard()};
}

std::string DescribeCheckpointReport(const proto::CheckpointReport& r) {
  const CheckpointPieceRoot piece = ReportedPiece(r);
  return absl::StrFormat("worker %d reports a checkpoint of %s of stage %d at step %d", r.worker_id(),
                         piece.kind == CheckpointPieceRoot::Kind::kResidual
                             ? absl::StrFormat("replica %d's error-feedback residuals", piece.index)
                             : absl::StrFormat("shard %d", piece.index),
                         r.stage(), r.step());
}

absl::Status CheckCheckpointReport(const proto::CheckpointReport& r, const RunView& run) {
  if (absl::Status st = CheckPlaced(r.worker_id(), r.step() - 1, r.plan_version(), run); !st.ok()) return st;
  if (!PlanGives(run.plan, run.cfg, *AssignmentOf(run.plan, r.worker_id()), ReportedPiece(r))) {
    return absl::InvalidArgumentError(DescribeCheckpointReport(r) + ", which the plan does not give it");
  }
  // Checked before the piece is counted: a premature report would make the step's real one a
  // second report.
  const int64_t end = RunEnd(run.plan, run.cfg);
  if (!run.cfg.train.CheckpointsAfter(r.step() - 1, end)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s, where none is due (train.checkpoint_every = %d, local_steps = %d, this plan ends after step %d): does "
        "the worker run the job's config?",
        DescribeCheckpointReport(r), run.cfg.train.checkpoint_every, run.cfg.train.local_steps, end));
  }
  return absl::OkStatus();
}

absl::Status CheckShippedPart(const proto::CheckpointChunk& c, const CheckpointPieceRoot& piece, const RunView& run) {
  if (absl::Status st = CheckPlaced(c.worker_id(), c.step() - 1, c.plan_version(), run); !st.ok()) return st;
  if (!PlanGives(run.plan, run.cfg, *AssignmentOf(run.plan, c.worker_id()), piece)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker %d ships checkpoint piece %s, which plan version %d does not give it", c.worker_id(), c.piece(),
        run.plan.version()));
  }
  const auto [floats, tensors] = PieceSize(run.plan, run.cfg, piece);
  const absl::StatusOr<uint64_t> most =
      MaxCheckpointFileBytes(c.file(), floats, tensors, piece.kind != CheckpointPieceRoot::Kind::kResidual);
  if (!most.ok()) return most.status();
  if (c.file_bytes() > *most) {
    return absl::ResourceExhaustedError(absl::StrFormat("%s/%s of %d bytes: the plan's piece of %d parameters takes at "
                                                        "most %d",
                                                        c.piece(), c.file(), c.file_bytes(), floats, *most));
  }
  return CheckPart(c.file_bytes(), c.offset(), c.data().size());
}

}  // namespace longhaul
