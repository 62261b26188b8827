#pragma once
// A job config as the planner reads it: its layout, its work shape, and the placement problem of
// its workers, worker w on host w of the network (as `longhaul local` places them, and as the
// coordinator numbers hosts until workers report where they are). Shared by the coordinator's
// live plan and by the prediction from measured compute, so both price the same job.
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "config/job_config.h"
#include "plan/cost_model.h"
#include "plan/placement.h"
#include "plan/simulator.h"

namespace longhaul {

// The job's micro-batch shape, at the precision its stages compute in (fp32 on the CPU).
WorkShape JobWorkShape(const JobConfig& cfg);
Layout JobLayout(const JobConfig& cfg);
// A device timed on the job's shape (a worker's profile, or a run's measured compute); its
// optimizer steps stream fp32 at `memory_bandwidth` bytes/s, where measured, else at a guess: a
// CPU's ten GB/s or a GPU's terabytes.
absl::StatusOr<DeviceCost> JobTimedDevice(const JobConfig& cfg, const std::string& name, Backend backend,
                                          ComputeTimes block, ComputeTimes head, double memory_bytes = 0,
                                          double memory_bandwidth = 0);
// The job's stages × replicas over `device_of_worker.size()` workers, worker w on host w and on
// devices[device_of_worker[w]].
PlacementProblem JobProblem(const JobConfig& cfg, std::vector<DeviceCost> devices, std::vector<int> device_of_worker,
                            NetworkCost network);

}  // namespace longhaul
