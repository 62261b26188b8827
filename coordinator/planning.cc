#include "coordinator/planning.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "layout/plan_layout.h"
#include "model/param_layout.h"
#include "plan/job_problem.h"
#include "schedule/schedule.h"
#include "transport/link_connections.h"
#include "transport/wire_plan.h"
#include "util/median.h"
#include "util/status_macros.h"

namespace longhaul {

std::vector<proto::ShardPlacement> PlanShards(const JobConfig& cfg) {
  std::vector<proto::ShardPlacement> shards;
  for (int s = 0; s < cfg.cluster.stages; ++s) {
    int shard = 0;
    for (const ParamLayout::PsShardCut& cut :
         ParamLayout(cfg.model, cfg.Stage(s)).PsShards(cfg.cluster.replicas, cfg.cluster.central_ps)) {
      proto::ShardPlacement sp;
      sp.set_stage(s);
      sp.set_shard(shard++);
      sp.set_owner_replica(cut.owner_replica);
      sp.set_first_tensor(cut.first_tensor);
      sp.set_end_tensor(cut.end_tensor);
      shards.push_back(sp);
    }
  }
  return shards;
}

namespace {

// Worker `id` (registering as `reg`) at (stage, replica) with blocks [first_block, end_block) in
// `plan`: its peers reach it at its address and check its proofs by its key.
void AddAssignment(proto::Plan& plan, int id, const proto::RegisterRequest& reg, int stage, int replica,
                   int first_block, int end_block) {
  proto::Assignment* a = plan.add_assignments();
  a->set_worker_id(id);
  a->set_stage(stage);
  a->set_replica(replica);
  a->set_address(reg.address());
  a->set_public_key(reg.public_key());
  a->set_first_block(first_block);
  a->set_end_block(end_block);
}

}  // namespace

std::string WorkerBackend(const JobConfig& cfg, const proto::RegisterRequest& reg) {
  return reg.backend().empty() ? BackendName(cfg.train.backend_device) : reg.backend();
}

Backend MemoryBackend(const std::string& backend) {
  return backend.rfind("cuda", 0) == 0 ? Backend::kCuda : Backend::kCpu;
}

double LeastMemory(const std::vector<double>& reported) {
  double least = 0;
  for (double m : reported) {
    if (m > 0) least = least > 0 ? std::min(least, m) : m;
  }
  return least;
}

std::pair<int, int> SlotOf(const JobConfig& cfg, int k) { return {k % cfg.cluster.stages, k / cfg.cluster.stages}; }

std::vector<int> RegistrationOrder(const JobConfig& cfg) {
  std::vector<int> order(cfg.cluster.stages * cfg.cluster.replicas);
  std::iota(order.begin(), order.end(), 0);
  return order;
}

absl::StatusOr<SlotSearch> SearchSlots(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
                                       const std::map<int, proto::ComputeProfile>& profiles, const NetworkCost& network,
                                       bool keep_cut) {
  const int W = cfg.cluster.stages * cfg.cluster.replicas;
  if (static_cast<int>(workers.size()) != W || static_cast<int>(profiles.size()) != W) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "placement needs every worker's registration and profile: %d workers, %d registered, %d profiled", W,
        workers.size(), profiles.size()));
  }
  std::map<std::pair<std::string, std::string>, std::vector<int>> machines;  // (host, backend) -> workers
  for (const auto& [id, reg] : workers) machines[{reg.host(), WorkerBackend(cfg, reg)}].push_back(id);
  std::vector<DeviceCost> devices;
  std::vector<int> device_of(W, 0);
  for (const auto& [machine, ids] : machines) {
    auto median = [&profiles, &ids = ids](double (proto::ComputeProfile::*field)() const) {
      std::vector<double> v;
      for (int id : ids) v.push_back(std::max(1e-9, (profiles.at(id).*field)()));
      return Median(std::move(v));
    };
    const ComputeTimes block{median(&proto::ComputeProfile::block_forward_s),
                             median(&proto::ComputeProfile::block_backward_s)};
    const ComputeTimes head{median(&proto::ComputeProfile::head_forward_s),
                            median(&proto::ComputeProfile::head_backward_s)};
    const Backend backend = MemoryBackend(machine.second);
    std::vector<double> reported;
    for (int id : ids) reported.push_back(profiles.at(id).memory_bytes());
    const double memory = LeastMemory(reported);
    absl::StatusOr<DeviceCost> d =
        JobTimedDevice(cfg, absl::StrCat(machine.first, " ", machine.second), backend, block, head, memory);
    if (!d.ok()) return d.status();
    for (int id : ids) device_of[id] = static_cast<int>(devices.size());
    devices.push_back(*std::move(d));
  }
  PlacementProblem problem = JobProblem(cfg, std::move(devices), std::move(device_of), network);
  problem.keep_cut = keep_cut;
  LH_ASSIGN_OR_RETURN(ChosenPlacement chosen, ChoosePlacement(std::move(problem)));
  const PlacementResult& plan = chosen.plan;
  SlotSearch out;
  for (int k = 0; k < W; ++k) {
    const auto [stage, replica] = SlotOf(cfg, k);
    out.worker_of_slot.push_back(plan.placement.worker[stage][replica]);
  }
  out.predicted_s = plan.iteration_s;
  out.blocks_per_stage = plan.blocks_per_stage;
  out.shard_owner = plan.shard_owner;
  out.searched = chosen.searched;
  out.why_not = plan.why_not;
  out.registration_order_s = chosen.registration_order_s;
  out.simulations = chosen.simulations;
  return out;
}

proto::Plan MakePlan(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
                     const PlanRequest& request, const std::vector<int>& worker_of_slot, const NetworkCost* network,
                     const std::vector<std::vector<int>>& shard_owner) {
  proto::Plan plan;
  plan.set_version(1);
  plan.set_job_id(cfg.cluster.job_id);
  plan.set_config_toml(cfg.toml_text);
  plan.set_stages(cfg.cluster.stages);
  plan.set_replicas(cfg.cluster.replicas);
  plan.set_start_iteration(request.start_iteration);
  plan.set_resume_checkpoint(request.resume_checkpoint);
  plan.set_stop_iteration(request.stop_iteration);
  std::map<int, int> slot_of;
  for (int k = 0; k < static_cast<int>(worker_of_slot.size()); ++k) slot_of[worker_of_slot[k]] = k;
  for (const auto& [id, reg] : workers) {
    const auto [stage, replica] = SlotOf(cfg, slot_of.at(id));
    const StageSpec spec = cfg.Stage(stage);
    AddAssignment(plan, id, reg, stage, replica, spec.first_block, spec.end_block);
  }
  for (proto::ShardPlacement sp : PlanShards(cfg)) {
    if (!shard_owner.empty()) sp.set_owner_replica(shard_owner[sp.stage()][sp.shard()]);
    sp.set_home_replica(sp.owner_replica());
    *plan.add_shards() = sp;
  }
  std::vector<std::vector<int>> at(cfg.cluster.stages, std::vector<int>(cfg.cluster.replicas));
  for (int k = 0; k < static_cast<int>(worker_of_slot.size()); ++k) {
    const auto [stage, replica] = SlotOf(cfg, k);
    at[stage][replica] = worker_of_slot[k];
  }
  PlanLinks(cfg, workers, at, network, plan);
  FixStreamWires(at, cfg.train.micro_batches, plan);
  return plan;
}

void PlanLinks(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
               const std::vector<std::vector<int>>& at, const NetworkCost* network, proto::Plan& plan) {
  // Worker w on host w of the network, as the placement search has it; unknown links are fast.
  const std::vector<std::pair<int, int>> pairs = TensorPairs(at);
  SetWires(ResolveWires(cfg.transport.wire_dtype, cfg.FastWire(), pairs,
                        [&](int a, int b) {
                          return network != nullptr ? network->Between(a, b).Rate()
                                                    : std::numeric_limits<double>::infinity();
                        },
                        cfg.train.local_steps > 1, cfg.transport.exchange_dtype, cfg.transport.gradient_dtype),
           plan);
  if (network != nullptr && cfg.transport.connections == 0) {
    auto limits = [&](int id) {
      const proto::RegisterRequest& r = workers.at(id);
      return SocketBufferLimits{r.tcp_send_buffer_max(), r.tcp_receive_buffer_max()};
    };
    std::map<std::pair<int, int>, int> connections;
    for (const auto& [a, b] : pairs) {
      if (a == b) continue;
      const LinkCost there = network->Between(a, b), back = network->Between(b, a);
      connections[{a, b}] = ConnectionsFor(there.Rate(), there.latency_s + back.latency_s,
                                           ConnectionWindowBytes(limits(a), limits(b)));
    }
    SetLinkConnections(connections, plan);
  }
}

namespace {

// `old` as its next version, going on from `request`'s start iteration and checkpoint.
proto::Plan NextVersion(const proto::Plan& old, const PlanRequest& request) {
  proto::Plan plan = old;
  plan.set_version(old.version() + 1);
  plan.set_start_iteration(request.start_iteration);
  plan.set_resume_checkpoint(request.resume_checkpoint);
  plan.set_stop_iteration(request.stop_iteration);
  return plan;
}

// Worker `id` (registered in `workers`) at (stage, replica) of `plan`, with the blocks the stage
// has in `old`.
void Place(proto::Plan& plan, const proto::Plan& old, int id, int stage, int replica,
           const std::map<int, proto::RegisterRequest>& workers) {
  const proto::Assignment& peer = *AssignmentOf(old, WorkerAt(old, stage, 0));
  AddAssignment(plan, id, workers.at(id), stage, replica, peer.first_block(), peer.end_block());
}

// `old` as one replica of `run`'s stages (the job's config, or one with the model cut anew), stage
// s on left[s]; every parameter-server shard on that replica, its home the one the job's full
// layout gives it; `job_config` (empty where `run` is the job's) what a later version grows back
// into.
proto::Plan OneReplicaPlan(const proto::Plan& old, const JobConfig& run, const std::string& job_config,
                           const std::vector<int>& left, const std::map<int, proto::RegisterRequest>& workers,
                           const PlanRequest& request, const NetworkCost* network) {
  const int stages = run.cluster.stages;
  proto::Plan plan = NextVersion(old, request);
  plan.set_config_toml(run.toml_text);
  plan.set_job_config_toml(job_config);
  plan.set_stages(stages);
  plan.set_replicas(1);
  plan.set_micro_batches(run.cluster.replicas == 1 ? 0 : static_cast<int>(run.GlobalMicroBatches()));
  plan.clear_assignments();
  std::vector<std::vector<int>> at(stages);
  for (int s = 0; s < stages; ++s) {
    const StageSpec spec = run.Stage(s);
    AddAssignment(plan, left[s], workers.at(left[s]), s, 0, spec.first_block, spec.end_block);
    at[s] = {left[s]};
  }
  plan.clear_shards();
  for (proto::ShardPlacement sp : PlanShards(run)) {
    sp.set_home_replica(sp.owner_replica());
    sp.set_owner_replica(0);
    *plan.add_shards() = sp;
  }
  PlanLinks(run, workers, at, network, plan);
  return plan;
}

// The most blocks each stage may take where its workers at[s][r] (replica r) must hold it, with
// the shards of it each hosts (owner(s, k): the replica hosting shard k), in the memory they
// reported, as the placement search counts memory (Simulate's fits); `run` gives the model, the
// schedule and the shard cut, M the micro-batches a replica runs. A worker that reported none caps
// nothing; a stage with no room for one block gets 0. Where the most blocks do not fit, the cap
// counts up to the first count that does not: a replica's share of the shards need not grow
// evenly with the blocks (it may shrink by a tensor's worth as a block comes, less than the
// block's own memory, so room for the most is room for fewer).
std::vector<int> MemoryCaps(const JobConfig& run, int M, const std::vector<std::vector<int>>& at,
                            const std::function<int(int, int)>& owner,
                            const std::map<int, proto::ComputeProfile>& profiles,
                            const std::map<int, proto::RegisterRequest>& workers) {
  const int P = static_cast<int>(at.size());
  const WorkShape work = JobWorkShape(run);
  std::vector<int> caps(P, run.model.n_layer - (P - 1));
  for (int s = 0; s < P; ++s) {
    const int slots = ActivationSlots(run.cluster.schedule, P, s, M);
    for (int r = 0; r < static_cast<int>(at[s].size()); ++r) {
      auto profile = profiles.find(at[s][r]);
      auto reg = workers.find(at[s][r]);
      if (profile == profiles.end() || !(profile->second.memory_bytes() > 0) || reg == workers.end()) continue;
      const Backend backend = MemoryBackend(WorkerBackend(run, reg->second));
      // Where the blocks sit does not change the memory, only the first stage's embedding and the
      // last one's head.
      auto need = [&](int blocks) {
        const StageSpec spec{s, s + blocks, s == 0, s == P - 1};
        const double hosted = ParamLayout(run.model, spec).HostedShardFloats(
            run.cluster.replicas, run.cluster.central_ps, r, [&](int shard) { return owner(s, shard); });
        return StageMemoryOn(backend, work, spec, slots).total() + kPsShardBytesPerParam * hosted;
      };
      const double memory = profile->second.memory_bytes();
      if (need(caps[s]) <= memory) continue;
      int fits = 0;
      while (fits < caps[s] && need(fits + 1) <= memory) ++fits;
      caps[s] = fits;
    }
  }
  return caps;
}

// Blocks per stage of `stages` stages, stage s on worker left[s] (its slowest replica's):
// `reference` (empty: the even cut), or BalancedCut of the workers' measured compute, at most
// max_blocks[s] each (MemoryCaps; empty: unchecked), where it is predicted kPlacementMinGain
// faster (profiles differ by a few percent between like workers) or the reference does not fit.
// Where a worker's compute is unknown only memory moves blocks.
std::vector<int> RecutBlocks(const ModelConfig& model, int stages, const std::vector<int>& left,
                             const std::map<int, proto::ComputeProfile>& profiles, std::vector<int> reference,
                             const std::vector<int>& max_blocks) {
  if (reference.empty()) {
    for (int s = 0; s < stages; ++s) {
      const StageSpec spec = StageSpec::Even(model, s, stages);
      reference.push_back(spec.end_block - spec.first_block);
    }
  }
  auto fits = [&](const std::vector<int>& cut) {
    for (int s = 0; s < stages && !max_blocks.empty(); ++s)
      if (cut[s] > max_blocks[s]) return false;
    return true;
  };
  std::vector<double> block_s;
  for (int s = 0; s < stages; ++s) {
    auto it = profiles.find(left[s]);
    const double t = it == profiles.end() ? 0 : it->second.block_forward_s() + it->second.block_backward_s();
    if (t > 0 && std::isfinite(t)) block_s.push_back(t);
  }
  if (static_cast<int>(block_s.size()) < stages) {
    const std::vector<int> even = BalancedCut(model.n_layer, std::vector<double>(stages, 1.0), 0, max_blocks);
    return fits(reference) || even.empty() ? reference : even;
  }
  const proto::ComputeProfile& last = profiles.at(left[stages - 1]);
  const double head_s = std::max(0.0, last.head_forward_s() + last.head_backward_s());
  auto bottleneck = [&](const std::vector<int>& cut) {
    double slowest = 0;
    for (int s = 0; s < stages; ++s) slowest = std::max(slowest, cut[s] * block_s[s] + (s == stages - 1 ? head_s : 0));
    return slowest;
  };
  // Where nothing fits, the cut stays and the workers' own memory checks name the problem.
  const std::vector<int> balanced = BalancedCut(model.n_layer, block_s, head_s, max_blocks);
  if (balanced.empty()) return reference;
  if (!fits(reference)) return balanced;
  return bottleneck(balanced) < (1 - kPlacementMinGain) * bottleneck(reference) ? balanced : reference;
}

// `old` as one replica of fewer stages over `left` (one per block at most, fewer than old's), the
// model's blocks cut by RecutBlocks.
absl::StatusOr<proto::Plan> RecutPlan(const proto::Plan& old, const JobConfig& cfg, const std::vector<int>& left,
                                      const std::map<int, proto::RegisterRequest>& workers,
                                      const PlanRequest& request, const NetworkCost* network,
                                      const std::map<int, proto::ComputeProfile>& profiles) {
  const int stages = std::min({static_cast<int>(left.size()), cfg.model.n_layer, old.stages() - 1});
  if (stages < 1) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no worker is left of the %d stages, and no spare waits", old.stages()));
  }
  // One replica runs every replica's micro-batches and hosts every shard.
  std::vector<std::vector<int>> at;
  for (int s = 0; s < stages; ++s) at.push_back({left[s]});
  const std::vector<int> caps = MemoryCaps(cfg, static_cast<int>(cfg.GlobalMicroBatches()), at,
                                           [](int, int) { return 0; }, profiles, workers);
  LH_ASSIGN_OR_RETURN(const JobConfig recut, cfg.WithCut(RecutBlocks(cfg.model, stages, left, profiles, {}, caps)));
  return OneReplicaPlan(old, recut, old.job_config_toml().empty() ? old.config_toml() : old.job_config_toml(), left,
                        workers, request, network);
}

}  // namespace

proto::Plan NextPlan(const proto::Plan& old, const std::map<int, int>& replace,
                     const std::map<int, proto::RegisterRequest>& workers, const PlanRequest& request) {
  proto::Plan plan = NextVersion(old, request);
  auto now = [&](int id) {
    auto it = replace.find(id);
    return it == replace.end() ? id : it->second;
  };
  for (proto::Assignment& a : *plan.mutable_assignments()) {
    if (!replace.count(a.worker_id())) continue;
    a.set_worker_id(now(a.worker_id()));
    a.set_address(workers.at(a.worker_id()).address());
    a.set_public_key(workers.at(a.worker_id()).public_key());
  }
  for (proto::LinkWire& w : *plan.mutable_link_wires()) {
    w.set_from_worker(now(w.from_worker()));
    w.set_to_worker(now(w.to_worker()));
  }
  for (proto::LinkConnections& c : *plan.mutable_link_connections()) {
    c.set_from_worker(now(c.from_worker()));
    c.set_to_worker(now(c.to_worker()));
  }
  return plan;
}

absl::StatusOr<proto::Plan> ShrinkPlan(const proto::Plan& old, const std::vector<int>& lost,
                                       const std::vector<int>& spares,
                                       const std::map<int, proto::RegisterRequest>& workers,
                                       const PlanRequest& request, const NetworkCost* network,
                                       const std::map<int, proto::ComputeProfile>& profiles) {
  LH_ASSIGN_OR_RETURN(const JobConfig cfg, ParseJobConfig(old.config_toml(), "the job config of the plan"));
  const int P = old.stages(), D = old.replicas(), M = MostMicroBatches(old, cfg);
  if (cfg.train.local_steps > 1) {
    return absl::FailedPreconditionError("with train.local_steps > 1 each replica keeps its own optimizer state, "
                                         "which a smaller layout would lose");
  }
  if (!cfg.cluster.replica_micro_batches.empty()) {
    return absl::FailedPreconditionError("cluster.replica_micro_batches gives each replica its own share of the batch, "
                                         "which a smaller layout of whole replicas cannot keep");
  }
  // at[r][s]: the worker at (stage s, replica r) that lives, or -1.
  std::vector<std::vector<int>> at(D, std::vector<int>(P, -1));
  for (const proto::Assignment& a : old.assignments())
    if (std::find(lost.begin(), lost.end(), a.worker_id()) == lost.end()) at[a.replica()][a.stage()] = a.worker_id();
  auto living = [&](int r) { return static_cast<int>(std::count_if(at[r].begin(), at[r].end(), [](int w) { return w >= 0; })); };
  int alive = static_cast<int>(spares.size());
  for (int r = 0; r < D; ++r) alive += living(r);
  // D' divides the config's replicas, so each replica runs whole groups of its micro-batches (M
  // may already be several groups where `old` was shrunk).
  const int job_replicas = cfg.cluster.replicas;
  int keep = std::min(D - 1, alive / P);
  while (keep > 0 && job_replicas % keep != 0) --keep;
  // Replicas with the most of their workers alive first (the lower index on a tie): the fewest moves.
  std::vector<int> order(D);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return living(a) > living(b); });
  if (keep < 1) {
    // No replica of P stages fills: the survivors (in their stages' order, the fullest replica's
    // first), then the spares, run the model cut anew into as many stages.
    std::vector<int> left;
    for (int r : order)
      for (int w : at[r])
        if (w >= 0) left.push_back(w);
    left.insert(left.end(), spares.begin(), spares.end());
    return RecutPlan(old, cfg, left, workers, request, network, profiles);
  }
  // The workers that may fill a hole of stage s: the dropped replicas' worker of that stage first
  // (it holds that stage's data and code paths warm), then any dropped replica's, then spares.
  std::vector<int> pool;
  for (int s = 0; s < P; ++s)
    for (int k = keep; k < D; ++k)
      if (at[order[k]][s] >= 0) pool.push_back(at[order[k]][s]);
  pool.insert(pool.end(), spares.begin(), spares.end());
  std::vector<std::vector<int>> kept(keep, std::vector<int>(P, -1));
  std::vector<int> new_index(D, -1);
  for (int k = 0; k < keep; ++k) {
    new_index[order[k]] = k;
    kept[k] = at[order[k]];
  }
  for (int s = 0; s < P; ++s)
    for (int k = 0; k < keep; ++k) {
      if (kept[k][s] >= 0) continue;
      auto same_stage = std::find_if(pool.begin(), pool.end(), [&](int w) {
        for (int r = 0; r < D; ++r)
          if (at[r][s] == w) return true;
        return false;
      });
      auto take = same_stage != pool.end() ? same_stage : pool.begin();
      kept[k][s] = *take;
      pool.erase(take);
    }

  proto::Plan plan = NextVersion(old, request);
  plan.set_replicas(keep);
  plan.set_micro_batches(D * M / keep);
  plan.clear_assignments();
  for (int k = 0; k < keep; ++k)
    for (int s = 0; s < P; ++s) Place(plan, old, kept[k][s], s, k, workers);
  // A dropped replica's shards go round the replicas left, in order.
  int next = 0;
  for (proto::ShardPlacement& sp : *plan.mutable_shards()) {
    const int r = new_index[sp.owner_replica()];
    sp.set_owner_replica(r >= 0 ? r : next++ % keep);
  }
  return plan;
}

absl::StatusOr<proto::Plan> RebalancePlan(const proto::Plan& old, const PlanRequest& request,
                                          const std::map<int, proto::ComputeProfile>& profiles,
                                          const std::map<int, proto::RegisterRequest>& workers) {
  LH_ASSIGN_OR_RETURN(const JobConfig cfg, ParseJobConfig(old.config_toml(), "the job config of the plan"));
  const int P = old.stages();
  if (P < 2) return absl::FailedPreconditionError("a plan of one stage has no blocks to move");
  // Each stage priced at its slowest replica's worker, which every step waits for; a worker whose
  // compute is unknown stands for its stage, whose compute then is unknown too (RecutBlocks: only
  // memory moves its blocks), not hidden behind a replica that was timed.
  std::vector<int> slowest(P, -1);
  auto block_s = [&](int id) {
    auto it = profiles.find(id);
    const double t = it == profiles.end() ? 0.0 : it->second.block_forward_s() + it->second.block_backward_s();
    return t > 0 && std::isfinite(t) ? t : std::numeric_limits<double>::infinity();
  };
  std::vector<std::vector<int>> at(P, std::vector<int>(old.replicas(), -1));
  for (const proto::Assignment& a : old.assignments()) {
    if (a.stage() < 0 || a.stage() >= P || a.replica() < 0 || a.replica() >= old.replicas()) continue;
    at[a.stage()][a.replica()] = a.worker_id();
    int& w = slowest[a.stage()];
    if (w < 0 || block_s(a.worker_id()) > block_s(w)) w = a.worker_id();
  }
  // The same workers, links and shard owners; each stage's blocks and its shards' tensors anew.
  std::map<std::pair<int, int>, proto::ShardPlacement> owners;
  for (const proto::ShardPlacement& sp : old.shards()) owners[{sp.stage(), sp.shard()}] = sp;
  auto owner = [&](int stage, int shard) {
    auto it = owners.find({stage, shard});
    return it == owners.end() ? shard : it->second.owner_replica();
  };
  const std::vector<int> was = BlocksPerStage(old);
  const std::vector<int> cut = RecutBlocks(cfg.model, P, slowest, profiles, was,
                                           MemoryCaps(cfg, MostMicroBatches(old, cfg), at, owner, profiles, workers));
  if (cut == was) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no cut of the %d blocks that fits the workers' memory is predicted %.0f%% faster than [%s] at their "
        "measured compute",
        cfg.model.n_layer, 100 * kPlacementMinGain, absl::StrJoin(was, ", ")));
  }
  LH_ASSIGN_OR_RETURN(const JobConfig recut, cfg.WithCut(cut));
  const std::vector<proto::ShardPlacement> shards = PlanShards(recut);
  if (shards.size() != owners.size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the cut [%s] would make %d parameter-server shards, not the plan's %d",
                        absl::StrJoin(cut, ", "), shards.size(), owners.size()));
  }
  proto::Plan plan = NextVersion(old, request);
  plan.set_config_toml(recut.toml_text);
  for (proto::Assignment& a : *plan.mutable_assignments()) {
    const StageSpec spec = recut.Stage(a.stage());
    a.set_first_block(spec.first_block);
    a.set_end_block(spec.end_block);
  }
  plan.clear_shards();
  for (proto::ShardPlacement sp : shards) {
    auto it = owners.find({sp.stage(), sp.shard()});
    if (it == owners.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the cut [%s] gives stage %d a shard %d the plan has not", absl::StrJoin(cut, ", "), sp.stage(), sp.shard()));
    }
    sp.set_owner_replica(it->second.owner_replica());
    if (it->second.has_home_replica()) sp.set_home_replica(it->second.home_replica());
    *plan.add_shards() = sp;
  }
  return plan;
}

absl::StatusOr<proto::Plan> GrowPlan(const proto::Plan& old, const std::vector<int>& spares,
                                     const std::map<int, proto::RegisterRequest>& workers,
                                     const PlanRequest& request, const NetworkCost* network) {
  if (!old.job_config_toml().empty()) {
    LH_ASSIGN_OR_RETURN(const JobConfig job, ParseJobConfig(old.job_config_toml(), "the job config of the plan"));
    std::vector<int> left;
    for (int s = 0; s < old.stages(); ++s) left.push_back(WorkerAt(old, s, 0));
    left.insert(left.end(), spares.begin(), spares.end());
    if (static_cast<int>(left.size()) < job.cluster.stages) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%d spares and the %d workers of the pipeline cut anew make no pipeline of the job's %d stages",
          spares.size(), old.stages(), job.cluster.stages));
    }
    left.resize(job.cluster.stages);
    return OneReplicaPlan(old, job, "", left, workers, request, network);
  }
  LH_ASSIGN_OR_RETURN(const JobConfig cfg, ParseJobConfig(old.config_toml(), "the job config of the plan"));
  const int P = old.stages(), D = old.replicas(), total = static_cast<int>(cfg.GlobalMicroBatches());
  int grow = std::min(cfg.cluster.replicas, D + static_cast<int>(spares.size()) / P);
  while (grow > D && cfg.cluster.replicas % grow != 0) --grow;
  if (grow <= D) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%d spares make no replica more of %d stages beside the %d that run", spares.size(), P, D));
  }
  proto::Plan plan = NextVersion(old, request);
  plan.set_replicas(grow);
  plan.set_micro_batches(grow == cfg.cluster.replicas ? 0 : total / grow);
  auto spare = spares.begin();
  for (int r = D; r < grow; ++r)
    for (int s = 0; s < P; ++s) Place(plan, old, *spare++, s, r, workers);
  if (grow == cfg.cluster.replicas) {
    for (proto::ShardPlacement& sp : *plan.mutable_shards()) {
      sp.set_owner_replica(sp.has_home_replica() ? sp.home_replica() : sp.shard());
    }
  }
  return plan;
}

std::vector<int> BlocksPerStage(const proto::Plan& plan) {
  std::vector<int> blocks(plan.stages(), 0);
  for (const proto::Assignment& a : plan.assignments())
    if (a.replica() == 0 && a.stage() >= 0 && a.stage() < plan.stages()) blocks[a.stage()] = a.end_block() - a.first_block();
  return blocks;
}

std::vector<std::vector<int>> ShardOwners(const proto::Plan& plan) {
  const int P = plan.stages(), D = plan.replicas();
  std::vector<std::vector<int>> owners(P, std::vector<int>(D, -1));
  std::vector<std::vector<bool>> hosts(P, std::vector<bool>(D, false));
  for (const proto::ShardPlacement& sp : plan.shards()) {
    if (sp.stage() < 0 || sp.stage() >= P || sp.shard() < 0 || sp.shard() >= D || sp.owner_replica() < 0 ||
        sp.owner_replica() >= D) {
      continue;
    }
    owners[sp.stage()][sp.shard()] = sp.owner_replica();
    hosts[sp.stage()][sp.owner_replica()] = true;
  }
  for (int s = 0; s < P; ++s) {
    int idle = 0;
    for (int& r : owners[s]) {
      if (r >= 0) continue;
      while (idle < D && hosts[s][idle]) ++idle;
      r = idle < D ? idle++ : 0;
    }
  }
  return owners;
}

bool HostsShard(const proto::Plan& plan, const proto::Assignment& a, int stage, int shard) {
  for (const proto::ShardPlacement& sp : plan.shards())
    if (sp.stage() == stage && sp.shard() == shard) return sp.stage() == a.stage() && sp.owner_replica() == a.replica();
  return false;
}

}  // namespace longhaul
