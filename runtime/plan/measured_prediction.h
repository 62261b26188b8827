#pragma once
// The simulator's prediction for a job whose compute has been measured (by a run of it, or by
// its first iterations): each stage's mean forward + backward seconds per micro-batch over its
// replicas become a profile (split 1:2, as their FLOPs are; the head is what the last stage adds
// to its blocks), and each worker computes at that profile scaled by its own time against its
// stage's mean, so a replica that computes slower (on a shared machine, the ones that compute at
// the same moments) sets the pace as it did. Where the workers stepped their own stages (local
// updates), the bytes those steps stream over their seconds are the device's memory bandwidth,
// which prices every optimizer step (DeviceCost::StepSeconds); else the backend's guess. The job's layout runs over `network` with worker w
// on host w (as `longhaul local` places them) and slot k = replica·stages + stage run by worker
// worker_of_slot[k] (empty: by worker k, registration order), each parameter-server shard on the
// replica shard_owner gives it (PlacementResult's; empty: shard k on replica k). What it checks is
// the schedule and the links, with compute taken as it was.
#include <vector>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "plan/cost_model.h"

namespace longhaul {

// What a run measured of each worker (by worker id): its compute seconds per micro-batch
// (forwards and backwards), and its own optimizer step's seconds per iteration (0 where it took
// none). `step` may be empty: none measured.
struct MeasuredCompute {
  std::vector<double> per_micro;
  std::vector<double> step;
};

// The job's device as a run measured it: its mean worker's block and head (split as above), at
// the job's own shape, holding a stage in `memory_bytes` (0: unchecked), as a profile file
// (DeviceCost::ProfileToml) `longhaul plan --profile` prices other layouts with.
absl::StatusOr<DeviceCost> MeasuredComputeDevice(const JobConfig& cfg, const MeasuredCompute& measured, Backend backend,
                                                 double memory_bytes, const std::vector<int>& worker_of_slot = {});

absl::StatusOr<double> PredictFromMeasuredCompute(const JobConfig& cfg, const MeasuredCompute& measured,
                                                  const NetworkCost& network,
                                                  const std::vector<int>& worker_of_slot = {},
                                                  const std::vector<std::vector<int>>& shard_owner = {});

}  // namespace longhaul
