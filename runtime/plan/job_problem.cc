#include "plan/job_problem.h"

#include <numeric>

#include "format/wire_dtype.h"

namespace longhaul {

WorkShape JobWorkShape(const JobConfig& cfg) {
  return {cfg.model, cfg.train.seq_len, cfg.train.micro_batch_size,
          cfg.UsesGpu() ? cfg.train.precision : Precision::kFp32, cfg.train.recompute};
}

Layout JobLayout(const JobConfig& cfg) {
  Layout L;
  L.stages = cfg.cluster.stages;
  L.replicas = cfg.cluster.replicas;
  L.blocks_per_stage = cfg.Cut();
  L.micro_batches = cfg.train.micro_batches;
  L.replica_micro_batches = cfg.cluster.replica_micro_batches;
  L.schedule = cfg.cluster.schedule;
  L.work = JobWorkShape(cfg);
  L.wire = cfg.transport.wire_dtype, L.fast_wire = cfg.FastWire(), L.exchange = cfg.transport.exchange_dtype;
  L.gradient = cfg.transport.gradient_dtype;
  L.boundary_rank_divisor = cfg.transport.boundary_rank_divisor;
  L.gradient_rank_divisor = cfg.transport.gradient_rank_divisor;
  L.shared_directions = cfg.transport.shared_directions;
  L.local_steps = cfg.train.local_steps, L.overlap_outer = cfg.train.overlap_outer;
  L.overlap_steps = cfg.train.overlap_steps;
  L.overlap = cfg.cluster.overlap_exchange;
  return L;
}

absl::StatusOr<DeviceCost> JobTimedDevice(const JobConfig& cfg, const std::string& name, Backend backend,
                                          ComputeTimes block, ComputeTimes head, double memory_bytes,
                                          double memory_bandwidth) {
  const double guess = backend == Backend::kCuda ? 2e12 : 10e9;
  return DeviceCost::Timed(name, backend, memory_bandwidth > 0 ? memory_bandwidth : guess, JobWorkShape(cfg), block,
                           head, memory_bytes);
}

PlacementProblem JobProblem(const JobConfig& cfg, std::vector<DeviceCost> devices, std::vector<int> device_of_worker,
                            NetworkCost network) {
  PlacementProblem p;
  p.layout = JobLayout(cfg);
  p.host.resize(device_of_worker.size());
  std::iota(p.host.begin(), p.host.end(), 0);
  p.device = std::move(device_of_worker);
  p.devices = std::move(devices);
  p.network = std::move(network);
  p.central_ps = cfg.cluster.central_ps;
  p.clip_norm = true;  // longhaul reduces the norm whatever train.grad_clip says (simulator.h)
  return p;
}

}  // namespace longhaul
