#pragma once
// Checkpoint pieces between a worker and the coordinator's run directory, for a worker that writes
// to a disk of its own (another machine without a filesystem shared with the coordinator's). Each
// piece it writes (a shard's, its residuals', its own AdamW state's) goes to the coordinator before
// it is reported, so a checkpoint the coordinator calls complete is whole there; a worker that
// resumes lacking a piece (a spare in a lost worker's place, a survivor given other blocks) fetches
// it from there. Without this, the shards of a dead machine died with its disk.
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace longhaul {

class CoordinatorClient;

// Ships step directory `step_dir` (checkpoints/<piece>/step_N) of `step` under plan `version`, file
// by file in parts, state.json last.
absl::Status ShipCheckpointPiece(CoordinatorClient& client, const std::string& step_dir, int64_t step,
                                 uint64_t version);

// Fetches step directory `step_dir` of the checkpoint plan `version` resumes from: written aside
// and renamed into place once whole. NotFound where the coordinator has no such piece. No file may
// exceed `max_file_bytes` (what the job's whole model takes), checked before it is written.
absl::Status FetchCheckpointPiece(CoordinatorClient& client, const std::string& step_dir, uint64_t version,
                                  uint64_t max_file_bytes);

}  // namespace longhaul
