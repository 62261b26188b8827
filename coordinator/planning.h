#pragma once
// The coordinator's plan as a pure function of the job config, the registrations, the workers'
// compute profiles and the links: which (stage, replica) each worker runs, which blocks that is,
// and where each parameter-server shard lives. Slot k = replica·stages + stage; in registration
// order worker k runs it (the workers of one pipeline registered next to each other), and the
// placement search (runtime/plan) may choose otherwise.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "longhaul.pb.h"
#include "plan/placement.h"

namespace longhaul {

// The job's parameter-server shards: each stage's tensors cut over its replicas (sharded; a stage
// with fewer tensors than replicas leaves some replicas without one) or whole on replica 0 (central).
std::vector<proto::ShardPlacement> PlanShards(const JobConfig& cfg);

// (stage, replica) of slot k.
std::pair<int, int> SlotOf(const JobConfig& cfg, int k);

// Worker k runs slot k.
std::vector<int> RegistrationOrder(const JobConfig& cfg);

// The placement search over the registered workers, worker w on host w of `network`, each priced
// by its compute profile (`profiles`, by worker id). Workers with one host name and one backend
// are one device priced at the median of their profiles: the same hardware, each timed while the
// others timed themselves too, so their differences are noise. With `keep_cut` the config's cut
// stands; else the search may cut the model unevenly (a faster device more blocks), and the
// coordinator puts that cut into the config the workers build their stages from.
struct SlotSearch {
  std::vector<int> worker_of_slot;
  std::vector<std::vector<int>> shard_owner;  // PlacementResult's: [stage][k], the replica hosting shard k
  std::vector<int> blocks_per_stage;  // the cut the prediction used
  bool searched = false;  // the search's plan was enough faster to replace registration order
  std::string why_not;    // empty where every stage fits its worker's reported memory
  double predicted_s = 0;           // the simulator's iteration time for this placement
  double registration_order_s = 0;  // and for registration order, on the same costs
  int simulations = 0;
};
// The backend a worker computes on: its --backend, else the job's.
std::string WorkerBackend(const JobConfig& cfg, const proto::RegisterRequest& reg);
// Which memory estimate a backend's stage is checked against.
Backend MemoryBackend(const std::string& backend);
// The memory a stage must fit on any of the workers that `reported` it: the least above 0 (0:
// unknown, checks nothing).
double LeastMemory(const std::vector<double>& reported);

absl::StatusOr<SlotSearch> SearchSlots(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
                                       const std::map<int, proto::ComputeProfile>& profiles, const NetworkCost& network,
                                       bool keep_cut);

struct PlanRequest {
  int64_t start_iteration = 0;   // > 0 when resuming
  std::string resume_checkpoint;  // checkpoint directory name to load shards from, or empty
  int64_t stop_iteration = 0;     // the run ends after this many steps
};

// Version 1 of the plan for `workers` (every one registered), by worker id; slot k runs on worker
// worker_of_slot[k], and shard k of stage s on replica shard_owner[s][k] (empty: on replica k).
// The links between workers (worker w on host w; null: unknown, all fast) resolve an "auto"
// transport.wire_dtype per link, and each tensor stream keeps its link's dtype in every later
// version (transport/wire_plan.h FixStreamWires).
proto::Plan MakePlan(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
                     const PlanRequest& request, const std::vector<int>& worker_of_slot,
                     const NetworkCost* network = nullptr, const std::vector<std::vector<int>>& shard_owner = {});

// The wire dtypes and connection counts of the links between the workers at[stage][replica] for
// `plan`: "auto" resolves per link from the network's rates (worker w on host w; null: unknown,
// all fast), and transport.connections = 0 splits a long fat link over enough connections.
void PlanLinks(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
               const std::vector<std::vector<int>>& at, const NetworkCost* network, proto::Plan& plan);

// The plan's shard owners as PlacementResult has them: [stage][k], the replica that hosts shard k,
// and the replicas hosting no shard of the stage on the numbers of the shards it lacks, in order.
std::vector<std::vector<int>> ShardOwners(const proto::Plan& plan);

// The version after `old`: each worker `lost` of `replace` (lost -> spare) gives its place, its
// links' wire dtypes and connection counts to the spare, registered in `workers` (a spare
// inherits the slot whole, so the run's numerics stay those of the plan before); the run goes on
// from `request`'s start iteration and checkpoint.
proto::Plan NextPlan(const proto::Plan& old, const std::map<int, int>& replace,
                     const std::map<int, proto::RegisterRequest>& workers, const PlanRequest& request);

// The version after `old` with fewer data-parallel replicas, for when workers `lost` left places no
// spare took: whole replicas stay together (the ones with fewest losses first, renumbered from 0),
// their holes filled by the surviving workers of the replicas dropped and then by `spares`; the
// rest wait as spares. The global batch stays: each of the D' replicas left runs D·M / D'
// micro-batches (D' the most replicas the workers fill that divides D), so replica r' samples
// global micro-batches [r'·M', (r'+1)·M') and every one of the step's is still run once. Those
// are whole groups of M, one per job replica it stands for (GroupsPerReplica), each summed and
// pushed on its own, so the shards add the same gradients in the same order and the run stays
// bitwise the uninterrupted one; a D' that does not divide D would split a group, so it is not
// used. The config stays the job's (its checkpoints resume as the job's: Plan.micro_batches carries M'); the
// parameter-server shards keep their cut (the checkpoint's) and move to the replicas left.
// Where not one replica of the P stages fills (a pipeline-only job, or its last replica), the
// pipeline is cut anew: one replica of P' < P stages over the survivors (in their stages' order)
// and the spares, the blocks split evenly unless the workers' measured compute (`profiles`, by
// worker id) gives a cut predicted kPlacementMinGain faster (BalancedCut: a slower worker gets
// fewer blocks, the last stage's head counted) or needed for a stage to fit a worker's memory (as
// RebalancePlan's), the plan's config carrying the new cluster.stages and
// cluster.stage_layers (Plan.job_config_toml the job's own) and the links' wire dtypes and
// connections planned anew (`network`, as MakePlan's). Each stage reads its tensors from the
// checkpoint by name (CheckpointPieces), and a pipeline sums each gradient in the one process's
// order at any cut, so the run stays bitwise the uninterrupted one where the tensors between
// stages travel in fp32 (a narrower wire rounds at the boundaries, which the new cut moves).
// FailedPrecondition where no smaller layout can run (no worker left, or local updates).
absl::StatusOr<proto::Plan> ShrinkPlan(const proto::Plan& old, const std::vector<int>& lost,
                                       const std::vector<int>& spares,
                                       const std::map<int, proto::RegisterRequest>& workers,
                                       const PlanRequest& request, const NetworkCost* network = nullptr,
                                       const std::map<int, proto::ComputeProfile>& profiles = {});

// The version after `old` with the same workers, links and shard owners and the model's blocks cut
// anew by their compute (`profiles`, by worker id, as measured now: the coordinator scales each
// join profile to the worker's pace), each stage priced at its slowest replica's worker (one not
// timed leaves the stage's compute unknown, whose blocks then move only to fit memory):
// BalancedCut's where it is predicted kPlacementMinGain faster than the plan's cut, no stage given
// more blocks than fit the memory each of its workers reported at join (with the shards it hosts,
// as the placement search counts memory; `workers` give their backends). Every replica runs the new cut, which
// the plan's config carries (as a cut the placement search chose would; Plan.job_config_toml
// stays what it was); each stage's shards cover its new tensors, owned where the plan's shard of
// that number was. A pipeline sums each gradient in the one process's order at any cut, so the
// run stays bitwise the uninterrupted one as after any re-cut (see ShrinkPlan). FailedPrecondition
// for one stage, where no cut is that much faster, or where the new cut would change a stage's
// shard count.
absl::StatusOr<proto::Plan> RebalancePlan(const proto::Plan& old, const PlanRequest& request,
                                          const std::map<int, proto::ComputeProfile>& profiles,
                                          const std::map<int, proto::RegisterRequest>& workers);

// The version after a shrunk `old` with more replicas again: `spares` (in order) make whole new
// replicas, up to the config's count, as many as divide the config's (whole groups); at the config's
// count each runs train.micro_batches again and every shard goes back to its home replica.
// A pipeline cut anew grows back first: once its workers (in their stages' order) and the spares
// fill the job's own stages, one replica of the job's config and cut (Plan.job_config_toml), the
// links planned anew (`network`). FailedPrecondition where the spares make no replica (or stage)
// more.
absl::StatusOr<proto::Plan> GrowPlan(const proto::Plan& old, const std::vector<int>& spares,
                                     const std::map<int, proto::RegisterRequest>& workers,
                                     const PlanRequest& request, const NetworkCost* network = nullptr);

// The blocks each stage of `plan` runs, in stage order.
std::vector<int> BlocksPerStage(const proto::Plan& plan);

// Whether the worker at assignment `a` hosts shard `shard` of stage `stage` in `plan`.
bool HostsShard(const proto::Plan& plan, const proto::Assignment& a, int stage, int shard);

}  // namespace longhaul
