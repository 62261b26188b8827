#pragma once
// What the coordinator takes from the workers as the run goes: each iteration's report (once every
// worker's is in, the iteration is audited, recorded and timed, and the straggler watch sees it),
// each checkpoint piece on disk (once a step's every piece is, `latest` names it, and a shrunk
// layout may grow), the files shipped by workers that do not share the run directory and fetched
// by those that take a lost one's place, and each worker's end. Each function runs with the job's
// lock held; what reads or writes a file returns the path, and the caller does that without it.
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job.h"
#include "longhaul.pb.h"

namespace longhaul {

// A worker's timeline is its events of the whole run, some 2 KB per iteration for the demo: a
// gigabyte holds hundreds of thousands of iterations, and nothing of it is held in memory.
inline constexpr uint64_t kMaxTimelineBytes = uint64_t{1} << 30;

absl::Status TakeIterationReport(Job& job, const proto::IterationReport& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
absl::Status TakeCheckpointReport(Job& job, const proto::CheckpointReport& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// Where a checked part of a checkpoint piece goes (CheckShippedPart), for ReceivePart.
absl::StatusOr<std::string> ShippedPartPath(Job& job, const proto::CheckpointChunk& req)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// Where a part of a worker's timeline goes: timeline/worker_N.json, whose name the coordinator
// gives; at most kMaxTimelineBytes.
absl::StatusOr<std::string> TimelinePartPath(Job& job, const proto::TimelineChunk& req)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// Where the asked-for file of the checkpoint the asking worker's plan resumes from is, and its
// step (set in `reply`), for ReadPart.
absl::StatusOr<std::string> FetchedPartPath(Job& job, const proto::CheckpointFetch& req, proto::CheckpointChunk& reply)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);
// A worker is done (or failed): a placed worker is done only once the job is; a failure stops the
// job, and one in bringing in the checkpoint the running plan resumes from is kept as
// Job::failed_checkpoint, for the stop reason to name one to resume from instead.
absl::Status TakeDone(Job& job, const proto::DoneReport& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu);

}  // namespace longhaul
