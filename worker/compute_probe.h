#pragma once
// A worker's backend timed on the job's own shapes before the plan: what one transformer block and
// what the head (final LayerNorm, projection, loss) take for one micro-batch, forward and backward.
// The coordinator's placement search prices each worker's stages with it. Bounded: three timed
// rounds after a warm-up, fewer when one round alone takes seconds.
#include <limits>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "model/micro_batch.h"
#include "longhaul.pb.h"
#include "model/stage.h"

namespace longhaul {

// `device`: -1 for the CPU, N for cuda:N. Medians of the timed rounds. ResourceExhausted, before
// anything is built on the CPU, when one block and the head do not fit this machine. Processes of
// one machine take turns (an exclusive flock on kComputeProbeLock-<uid>.lock).
inline constexpr char kComputeProbeLock[] = "/tmp/longhaul-compute-probe";
absl::StatusOr<proto::ComputeProfile> MeasureCompute(const JobConfig& cfg, int device);

struct StageTimes {
  double forward_s = 0, backward_s = 0;
};

struct TimingRounds {
  int warmups = 1;  // untimed rounds first (allocations, library handles)
  int rounds = 3;   // timed rounds, at most
  double enough_s = std::numeric_limits<double>::infinity();  // stop after a timed round this long
};

// Median forward and backward seconds of micro-batch `mb` through `stage` (slot 0), each from a
// synchronized start to its result on the host; a non-first stage reads a (B, T, d_model) input,
// a non-last one a gradient of that shape. Shared with bench/gpu_profile.
absl::StatusOr<StageTimes> TimeStage(Stage& stage, const MicroBatch& mb, int d_model, const TimingRounds& rounds);

}  // namespace longhaul
