#pragma once
// A discrete-event simulator of training iterations: every worker runs its stage's instruction
// list from schedule/schedule.h (the lists worker/executor.cc runs) against the cost model, and
// the simulator predicts iteration time, where each worker's time goes, the bytes on each link
// and each worker's peak memory.
//
// Semantics, as the executor has them:
//  - Forward and Backward occupy the worker's device for the cost model's time.
//  - SendAct and SendGrad are asynchronous: the message queues on the link from this worker's
//    host to the peer's and the worker goes on. A link carries one message at a time per
//    direction: a message starts when the link is free, holds it for bytes / rate, and arrives one
//    latency after its last byte left. Workers on one host talk for free.
//  - A host's network card (NetworkCost::EgressRate, IngressRate), where the network has one, is
//    shared by every link out of it (and every link into it): it passes the messages it takes on
//    in the order they come, at its rate; a message has left once its link and its sender's card
//    have both passed it, and is in once the receiver's card has passed it too. For a burst of
//    messages to (or from) many peers the last is through when fair sharing would have it, the
//    first ones earlier; how a link splits its bytes over TCP connections changes neither.
//  - RecvAct and RecvGrad block until the message has arrived.
//  - The parameter-server exchange runs as listed: PushGrads sends each shard of the stage's
//    gradients to the shard's host and goes on. A host's ReduceNorm waits until every replica's
//    push of each shard it hosts is in; with global-norm clipping it then sends its partial
//    squares to every other host and waits until every other host's have arrived (one latency
//    each; control-sized messages are latency only). Step occupies the host for the sum and AdamW
//    of each of its shards in turn at memory bandwidth (DeviceCost::StepSeconds), and each shard's
//    parameters leave for every replica of its stage as soon as it is stepped; PullParams blocks
//    until all of its stage's shards are back.
//  - On a CPU worker in step (no local updates) the exchange overlaps compute as the executor's
//    block hooks make it (model/exchange_hooks.h), block by block: on stage 0 the last
//    micro-batch's Backward sends each shard once the head and every block that holds part of it
//    are done (PushGrads then sends nothing more); on every stage PullParams does not wait, and
//    the next iteration's first Forward reaches shard j after the blocks wholly before it (the
//    embedding costs nothing) and waits there until shard j is in. A GPU worker queues its work
//    and exchanges whole iterations, as listed.
// Several iterations run back to back, each worker starting the next as soon as its PullParams
// is done (or, overlapped, at once); the iteration time is measured on stage 0 of replica 0, as ../shared/DESIGN.md defines
// it, between the ends of the last two iterations (so it is the steady state, not the first
// iteration's start-up).
// With local updates (Layout::local_steps = H) a worker's LocalStep occupies it for AdamW over its
// stage, and only every H-th iteration exchanges, without the norm's all-reduce (the outer step
// does not clip). Two rounds of min(H, 4) iterations run; the iteration time is the mean over a
// round of H, from the second round's local iterations and its exchange, and the per-worker and
// per-link figures are the exchanging iteration's. Overlapped (Layout::overlap_outer), three rounds
// of max(4, overlap_steps + 2) run whatever H, each round's OuterStepDelay-th iteration carrying
// the round before's outer step, its overlap_steps-th the landing and its last the push; the last
// round gives the time (the first starts with every replica together, a later one where each
// landed the round before), what it takes beyond that many local iterations (timed on the one
// before the push, which carries no part of the exchange) being its exchange's.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "format/wire_dtype.h"
#include "longhaul.pb.h"
#include "model/memory_estimate.h"
#include "model/model_config.h"
#include "plan/cost_model.h"
#include "schedule/schedule.h"
#include "transport/wire_plan.h"

namespace longhaul {

struct Layout {
  int stages = 1, replicas = 1;
  std::vector<int> blocks_per_stage;  // sums to work.model.n_layer; empty: StageSpec::Even
  int micro_batches = 1;
  // cluster.replica_micro_batches: each replica's micro-batches where they differ (micro_batches
  // is then the largest); empty: micro_batches each.
  std::vector<int> replica_micro_batches;
  ScheduleKind schedule = ScheduleKind::kGpipe;
  WorkShape work;                // the model, sequence length, micro-batch size, precision, recompute
  // transport.wire_dtype; "auto" is resolved per link as the coordinator does (wire_plan.h), with
  // fast_wire on the fast links (JobConfig::FastWire).
  WireDtype wire = WireDtype::kF32, fast_wire = WireDtype::kF32;
  // transport.exchange_dtype: the pushes' and the parameters' dtype where not kAuto (wire_plan.h).
  WireDtype exchange = WireDtype::kAuto;
  // transport.gradient_dtype: the boundaries' gradients' dtype where not kAuto.
  WireDtype gradient = WireDtype::kAuto;
  // transport.boundary_rank_divisor and gradient_rank_divisor: boundaries in low rank.
  int boundary_rank_divisor = 1, gradient_rank_divisor = 0;
  bool shared_directions = false;  // transport.shared_directions
  // train.local_steps: workers step their own stages and exchange every local_steps-th iteration.
  int local_steps = 1;
  // train.overlap_outer (with local_steps > overlap_steps): each exchange spreads over the round's
  // last iteration and the next overlap_steps, its hosts stepping it after OuterStepDelay of them
  // (schedule.h).
  bool overlap_outer = false;
  int overlap_steps = 2;
  // cluster.overlap_exchange: CPU workers overlap the exchange with compute (see above).
  bool overlap = true;

  StageSpec Spec(int stage) const;
  int MicroBatchesOf(int replica) const {
    return replica_micro_batches.empty() ? micro_batches : replica_micro_batches[replica];
  }
  // One micro-batch's activations, or (`gradient`) their gradients, as a boundary carries them.
  BoundaryShape Boundary(bool gradient) const;
  // What a link carries of them, shared directions counted as their share of the iteration's
  // micro-batches.
  double BoundaryElements(bool gradient) const {
    const BoundaryShape b = Boundary(gradient);
    const double directions = gradient ? 0.0 : static_cast<double>(b.directions());
    return static_cast<double>(b.sent()) + directions / std::max(micro_batches, 1);
  }
  // The activations' bytes between two stages; "auto" counted as int8, what it sends on the slow
  // links that placement is about.
  double BoundaryBytes() const;
};

// One parameter-server shard: `params` fp32 parameters of `stage`, hosted by worker `worker`.
struct ShardPlacement {
  int stage = 0;
  double params = 0;
  int worker = 0;
};

struct Placement {
  std::vector<std::vector<int>> worker;  // [stage][replica]: the worker that runs it
  std::vector<int> host;                 // [worker]: its host in the network
  std::vector<int> device;               // [worker]: index into Simulation::devices; empty: all 0
  std::vector<ShardPlacement> shards;
  // Every step waits for the global norm's exchange among the shard hosts, as longhaul's
  // parameter servers always reduce it (for clipping and for the run's records); false models a
  // system without it (the source experiment's, bench/plan_seed001).
  bool clip_norm = true;
};

// Worker r·stages + s runs (stage s, replica r), on host of its own number. The shards are the
// runtime's (ParamLayout::PsShards): sharded, replica k hosts the k-th cut of the stage's tensors
// (whole tensors, so the shares are uneven: the embedding is one); central, replica 0 hosts all.
Placement DefaultPlacement(const Layout& layout, bool central_ps);

// What each tensor of `layout` travels in, run as `placement` places it on `network`: the plan's
// wires (transport/wire_plan.h) as the coordinator would resolve them, by host.
WirePlan LayoutWires(const Layout& layout, const Placement& placement, const NetworkCost& network);

struct Simulation {
  Layout layout;
  Placement placement;
  std::vector<DeviceCost> devices;
  NetworkCost network;
  int iterations = 2;
};

struct WorkerReport {
  int stage = 0, replica = 0;
  double busy_s = 0;        // forward and backward, last iteration
  double waiting_s = 0;     // blocked on receives, pushes, the norm and PullParams, last iteration
  double ps_busy_s = 0;     // stepping hosted shards (Step), last iteration
  MemoryEstimate memory;    // the stage on its device (memory_estimate.h)
  double ps_bytes = 0;      // hosted shards: fp32 parameters, gradient sum, AdamW m and v
  bool fits = true;         // memory.total() + ps_bytes within the device's memory (where it has one)
};

struct LinkReport {
  int from_host = 0, to_host = 0;
  double bytes = 0;  // last iteration
  double busy_s = 0;
};

struct SimulationReport {
  double iteration_s = 0;
  std::vector<WorkerReport> workers;
  std::vector<LinkReport> links;  // host pairs that carried bytes
  int64_t events = 0;
};

absl::StatusOr<SimulationReport> Simulate(const Simulation& sim);

}  // namespace longhaul
