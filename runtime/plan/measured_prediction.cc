#include "plan/measured_prediction.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "plan/job_problem.h"

namespace longhaul {

absl::StatusOr<double> PredictFromMeasuredCompute(const JobConfig& cfg, const std::vector<double>& per_micro_by_worker,
                                                  const NetworkCost& network,
                                                  const std::vector<int>& worker_of_slot,
                                                  const std::vector<std::vector<int>>& shard_owner) {
  const int P = cfg.cluster.stages, W = P * cfg.cluster.replicas;
  if (static_cast<int>(per_micro_by_worker.size()) != W) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compute of %d workers for a job of %d", per_micro_by_worker.size(), W));
  }
  std::vector<int> stage_of(W);
  for (int k = 0; k < W; ++k) stage_of[worker_of_slot.empty() ? k : worker_of_slot[k]] = k % P;
  std::vector<double> stage_mean(P, 0);
  for (int w = 0; w < W; ++w) stage_mean[stage_of[w]] += per_micro_by_worker[w] / cfg.cluster.replicas;
  // A block's time from the stages without the head; the head's is what the last stage adds (at
  // least a microsecond: a profile's times are positive, and a small vocabulary's head can cost
  // less than the noise between stages).
  double block = 0;
  int blocks = 0;
  for (int s = 0; s < std::max(1, P - 1); ++s) {
    block += stage_mean[s];
    blocks += cfg.Stage(s).end_block - cfg.Stage(s).first_block;
  }
  block /= std::max(1, blocks);
  const StageSpec last = cfg.Stage(P - 1);
  const double head = std::max(1e-6, stage_mean[P - 1] - (last.end_block - last.first_block) * block);
  block = std::max(1e-6, block);
  std::vector<DeviceCost> devices;
  std::vector<int> device_of(W);
  for (int w = 0; w < W; ++w) {
    const double f = stage_mean[stage_of[w]] > 0 ? per_micro_by_worker[w] / stage_mean[stage_of[w]] : 1;
    absl::StatusOr<DeviceCost> device =
        JobTimedDevice(cfg, absl::StrFormat("worker %d, as measured", w), Backend::kCpu,
                       {f * block / 3, f * 2 * block / 3}, {f * head / 3, f * 2 * head / 3});
    if (!device.ok()) return device.status();
    device_of[w] = w;
    devices.push_back(*std::move(device));
  }
  PlacementProblem problem = JobProblem(cfg, std::move(devices), std::move(device_of), network);
  problem.iterations = 3;
  std::vector<int> order = worker_of_slot;
  if (order.empty()) {
    order.resize(W);
    std::iota(order.begin(), order.end(), 0);
  }
  absl::StatusOr<PlacementResult> r = PlaceInOrder(problem, order, shard_owner);
  if (!r.ok()) return r.status();
  return r->iteration_s;
}

}  // namespace longhaul
