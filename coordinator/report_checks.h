#pragma once
// The checks a worker's report passes before the coordinator counts it, as pure functions of the
// report, the running plan and how far the run has come: a report names a place and an iteration
// that the plan gives its worker now, and nothing in it may make the coordinator keep more than the
// plan bounds. Each refusal names what is wrong. The caller checked that the worker is registered
// and not lost (Membership::Check).
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.h"
#include "config/job_config.h"
#include "longhaul.pb.h"

namespace longhaul {

// What a report is checked against.
struct RunView {
  const proto::Plan& plan;  // the running plan (version 0: none yet)
  const JobConfig& cfg;     // the job's config (the plan's, where it cut the model anew)
  int64_t start = 0;        // the plan's first iteration
  int64_t end = 0;          // the run's end, exclusive
  int64_t completed_through = -1;  // every iteration up to it is complete
};

// Worker `id` has a place in the running plan and reports iteration `iteration` of this run under
// its version `version` (a report of a replaced plan's iteration must not count for the new one's),
// at most a mailbox's window of iterations past the last complete one.
absl::Status CheckPlaced(int id, int64_t iteration, uint64_t version, const RunView& run);

// An iteration report: placed (CheckPlaced) at the place it says; its parameter CRCs this
// iteration's or the one before's, each once, later than `last_params` (the last step whose
// parameters the worker reported, ReplicaAgreement::LastReported); its times durations a clock
// could measure; its micro-batches global indices of the iteration, no more than a replica runs;
// its validation batches the plan's share for its place and step.
absl::Status CheckIterationReport(const proto::IterationReport& r, std::optional<int64_t> last_params,
                                  const RunView& run);

// The piece a checkpoint report names: a shard's, or with residual_replica the error-feedback
// residuals of job replica residual_replica - 1; and the report said for people.
CheckpointPieceRoot ReportedPiece(const proto::CheckpointReport& r);
std::string DescribeCheckpointReport(const proto::CheckpointReport& r);

// A checkpoint report: placed, of a piece the plan gives the worker, at a step where one is due.
absl::Status CheckCheckpointReport(const proto::CheckpointReport& r, const RunView& run);

// A part of a checkpoint file a worker ships: placed, of a piece the plan gives it, the file one a
// checkpoint has and no larger than the piece's tensors take, the part within it (CheckPart).
// `piece` is the chunk's piece, parsed (ParseCheckpointPieceRoot).
absl::Status CheckShippedPart(const proto::CheckpointChunk& c, const CheckpointPieceRoot& piece, const RunView& run);

}  // namespace longhaul
