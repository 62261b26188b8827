#include "plan/measured_prediction.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "plan/simulator.h"
#include "transport/wire_dtype.h"

namespace longhaul {

absl::StatusOr<double> PredictFromMeasuredCompute(const JobConfig& cfg, const std::vector<double>& per_micro_by_stage,
                                                  const NetworkCost& network, int coordinator_host) {
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
  const WorkShape shape{cfg.model, cfg.train.seq_len, cfg.train.micro_batch_size, Precision::kFp32,
                        cfg.train.recompute};
  block = std::max(1e-6, block);
  absl::StatusOr<DeviceCost> device = DeviceCost::Timed("this machine, as measured", Backend::kCpu, 10e9, shape,
                                                        {block / 3, 2 * block / 3}, {head / 3, 2 * head / 3});
  if (!device.ok()) return device.status();
  Simulation sim;
  sim.layout.stages = P;
  sim.layout.replicas = cfg.cluster.replicas;
  for (int s = 0; s < P; ++s) sim.layout.blocks_per_stage.push_back(cfg.Stage(s).end_block - cfg.Stage(s).first_block);
  sim.layout.micro_batches = cfg.train.micro_batches;
  sim.layout.schedule = cfg.cluster.schedule;
  sim.layout.work = shape;
  sim.layout.wire_bytes = static_cast<double>(WireBytesPerElement(cfg.transport.wire_dtype));
  sim.placement = DefaultPlacement(sim.layout, cfg.cluster.central_ps);
  sim.placement.clip_norm = cfg.train.grad_clip > 0;
  sim.placement.coordinator_host = coordinator_host;
  sim.devices = {*device};
  sim.network = network;
  sim.iterations = 3;
  absl::StatusOr<SimulationReport> r = Simulate(sim);
  if (!r.ok()) return r.status();
  return r->iteration_s;
}

}  // namespace longhaul
