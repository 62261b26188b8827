#include "plan/measured_prediction.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "model/param_layout.h"
#include "plan/job_problem.h"
#include "util/status_macros.h"

namespace longhaul {

namespace {

// A block's and the head's forward + backward seconds per micro-batch, each worker's time
// against its stage's mean, and the bandwidth its steps streamed at (0: not measured).
struct MeasuredSplit {
  double block = 0, head = 0;
  std::vector<double> factor;  // by worker
  double step_bandwidth = 0;   // bytes/s
};

absl::StatusOr<MeasuredSplit> SplitMeasured(const JobConfig& cfg, const MeasuredCompute& measured,
                                            const std::vector<int>& worker_of_slot) {
  const std::vector<double>& per_micro_by_worker = measured.per_micro;
  const int P = cfg.cluster.stages, W = P * cfg.cluster.replicas;
  if (static_cast<int>(per_micro_by_worker.size()) != W) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compute of %d workers for a job of %d", per_micro_by_worker.size(), W));
  }
  if (!measured.step.empty() && static_cast<int>(measured.step.size()) != W) {
    return absl::InvalidArgumentError(absl::StrFormat("steps of %d workers for a job of %d", measured.step.size(), W));
  }
  std::vector<int> stage_of(W);
  for (int k = 0; k < W; ++k) stage_of[worker_of_slot.empty() ? k : worker_of_slot[k]] = k % P;
  std::vector<double> stage_mean(P, 0);
  for (int w = 0; w < W; ++w) stage_mean[stage_of[w]] += per_micro_by_worker[w] / cfg.cluster.replicas;
  // A block's time from the stages without the head; the head's is what the last stage adds (at
  // least a microsecond: a profile's times are positive, and a small vocabulary's head can cost
  // less than the noise between stages).
  MeasuredSplit out;
  int blocks = 0;
  for (int s = 0; s < std::max(1, P - 1); ++s) {
    out.block += stage_mean[s];
    blocks += cfg.Stage(s).end_block - cfg.Stage(s).first_block;
  }
  out.block /= std::max(1, blocks);
  const StageSpec last = cfg.Stage(P - 1);
  out.head = std::max(1e-6, stage_mean[P - 1] - (last.end_block - last.first_block) * out.block);
  out.block = std::max(1e-6, out.block);
  for (int w = 0; w < W; ++w) {
    out.factor.push_back(stage_mean[stage_of[w]] > 0 ? per_micro_by_worker[w] / stage_mean[stage_of[w]] : 1);
  }
  // Every worker's step over its whole stage, as the simulator prices a local step.
  double bytes = 0, seconds = 0;
  for (int w = 0; w < static_cast<int>(measured.step.size()); ++w) {
    if (!(measured.step[w] > 0)) continue;
    bytes += DeviceCost::StepBytes(ParamLayout(cfg.model, cfg.Stage(stage_of[w])).total(), 1);
    seconds += measured.step[w];
  }
  if (seconds > 0) out.step_bandwidth = bytes / seconds;
  return out;
}

absl::StatusOr<DeviceCost> ScaledDevice(const JobConfig& cfg, const std::string& name, Backend backend,
                                        const MeasuredSplit& m, double f, double memory_bytes) {
  return JobTimedDevice(cfg, name, backend, {f * m.block / 3, f * 2 * m.block / 3}, {f * m.head / 3, f * 2 * m.head / 3},
                        memory_bytes, m.step_bandwidth);
}

}  // namespace

absl::StatusOr<DeviceCost> MeasuredComputeDevice(const JobConfig& cfg, const MeasuredCompute& measured, Backend backend,
                                                 double memory_bytes, const std::vector<int>& worker_of_slot) {
  LH_ASSIGN_OR_RETURN(const MeasuredSplit m, SplitMeasured(cfg, measured, worker_of_slot));
  return ScaledDevice(cfg,
                      absl::StrFormat("%s, as a run of %d workers measured it", backend == Backend::kCpu ? "CPU" : "GPU",
                                      measured.per_micro.size()),
                      backend, m, 1, memory_bytes);
}

absl::StatusOr<double> PredictFromMeasuredCompute(const JobConfig& cfg, const MeasuredCompute& measured,
                                                  const NetworkCost& network,
                                                  const std::vector<int>& worker_of_slot,
                                                  const std::vector<std::vector<int>>& shard_owner) {
  LH_ASSIGN_OR_RETURN(const MeasuredSplit m, SplitMeasured(cfg, measured, worker_of_slot));
  const int W = static_cast<int>(measured.per_micro.size());
  std::vector<DeviceCost> devices;
  std::vector<int> device_of(W);
  for (int w = 0; w < W; ++w) {
    LH_ASSIGN_OR_RETURN(DeviceCost device, ScaledDevice(cfg, absl::StrFormat("worker %d, as measured", w),
                                                        Backend::kCpu, m, m.factor[w], 0));
    device_of[w] = w;
    devices.push_back(std::move(device));
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
