#pragma once
// A worker's backend timed on the job's own shapes before the plan: what one transformer block and
// what the head (final LayerNorm, projection, loss) take for one micro-batch, forward and backward.
// The coordinator's placement search prices each worker's stages with it. Bounded: three timed
// rounds after a warm-up, fewer when one round alone takes seconds.
#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "longhaul.pb.h"

namespace longhaul {

// `device`: -1 for the CPU, N for cuda:N. Medians of the timed rounds. ResourceExhausted, before
// anything is built on the CPU, when one block and the head do not fit this machine.
absl::StatusOr<proto::ComputeProfile> MeasureCompute(const JobConfig& cfg, int device);

}  // namespace longhaul
