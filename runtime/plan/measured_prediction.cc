#include "plan/measured_prediction.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "plan/job_problem.h"

namespace longhaul {

absl::StatusOr<double> PredictFromMeasuredCompute(const JobConfig& cfg, const std::vector<double>& per_micro_by_stage,
                                                  const NetworkCost& network, int coordinator_host,
                                                  const std::vector<int>& worker_of_slot) {
  const int P = cfg.cluster.stages;
  if (static_cast<int>(per_micro_by_stage.size()) != P) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compute of %d stages for a job of %d", per_micro_by_stage.size(), P));
  }
  // A block's time from the stages without the head; the head's is what the last stage adds (at
  // least a microsecond: a profile's times are positive, and a small vocabulary's head can cost
  // less than the noise between stages).
  double block = 0;
  int blocks = 0;
  for (int s = 0; s < std::max(1, P - 1); ++s) {
    block += per_micro_by_stage[s];
    blocks += cfg.Stage(s).end_block - cfg.Stage(s).first_block;
  }
  block /= std::max(1, blocks);
  const StageSpec last = cfg.Stage(P - 1);
  const double head = std::max(1e-6, per_micro_by_stage[P - 1] - (last.end_block - last.first_block) * block);
  block = std::max(1e-6, block);
  absl::StatusOr<DeviceCost> device = JobTimedDevice(cfg, "this machine, as measured", Backend::kCpu,
                                                     {block / 3, 2 * block / 3}, {head / 3, 2 * head / 3});
  if (!device.ok()) return device.status();
  const int W = P * cfg.cluster.replicas;
  PlacementProblem problem = JobProblem(cfg, {*device}, std::vector<int>(W, 0), network, coordinator_host);
  problem.iterations = 3;
  absl::StatusOr<PlacementResult> r =
      worker_of_slot.empty() ? RegistrationOrder(problem) : PlaceInOrder(problem, worker_of_slot);
  if (!r.ok()) return r.status();
  return r->iteration_s;
}

}  // namespace longhaul
