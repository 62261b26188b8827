#pragma once
// The simulator's prediction for a job whose compute has been measured (by a run of it, or by
// its first iterations): each stage's mean forward + backward seconds per micro-batch become a
// profile (split 1:2, as their FLOPs are), and the job's layout runs over `network` with worker
// r·stages + s, the worker that takes that slot, on host r·stages + s (as `longhaul local` places
// them). What it checks is the schedule and the links, with compute taken as it was.
#include <vector>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "plan/cost_model.h"

namespace longhaul {

// `per_micro_by_stage[s]`: stage s's compute seconds per micro-batch. `coordinator_host`: -1 when
// the coordinator sits beside every host (an emulation's router).
absl::StatusOr<double> PredictFromMeasuredCompute(const JobConfig& cfg, const std::vector<double>& per_micro_by_stage,
                                                  const NetworkCost& network, int coordinator_host);

}  // namespace longhaul
