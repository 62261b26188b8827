#pragma once
// Placement search: which worker runs each (stage, replica), where each parameter-server shard
// lives, and how many blocks each stage gets, chosen to minimize the simulator's iteration time
// (simulator.h). A pure function of the layout, the workers (host and device), the devices' costs
// and the network: the coordinator and `longhaul plan` call it with the same inputs and get the
// same plan.
//
// The search (SearchPlacement), after DT-FM (Yuan et al., "Decentralized Training of Foundation
// Models in Heterogeneous Environments", 2022):
//  1. Data-parallel groups: stage s's replicas exchange the stage's whole gradient and parameters
//     every iteration, far more than a pipeline boundary carries in most layouts, so workers are
//     grouped `replicas` at a time by fast links (greedy clustering on the time the shard exchange
//     takes between two workers; tightest group first, and again hardest worker first).
//  2. Pipeline order: the groups are ordered as stages along a path that minimizes the time of
//     the pipeline crossings between consecutive groups (an open travelling-salesman path: nearest
//     neighbour from every start, then 2-opt), and each replica's workers are chained across
//     consecutive groups by a greedy matching of fast pairs.
//     The other way round too, for layouts whose boundaries carry more than the exchange: workers
//     grouped `stages` at a time into pipelines by fast boundary links, the first pipeline's
//     workers ordered along such a path, the others' matched to its stages by fast exchange links.
//  3. The stage cut: blocks per stage balanced on each stage's slowest device (the last stage
//     also runs the head), so a faster device gets more blocks.
//  4. Local search scored by Simulate, first improvement in a seeded random order, each pass
//     trying in turn: moves of one block from any stage to any other; swaps of two shards' hosts
//     within a stage, where the shards differ in size (shards are cut at whole tensors, so the
//     first stage's embedding and the last stage's head make one heavy shard, and its host, which
//     takes every replica's gradient of it and sends them its parameters, is best on the stage's
//     best-connected site; with a central parameter server, which replica hosts it); group swaps (the workers of
//     one site in a stage trade places with as many of another site's in another stage: with few
//     workers per site, moving one alone spreads a stage over one more site and never looks
//     better); and swaps of two workers between slots (idle workers included). Swaps of workers
//     the cost model cannot tell apart (same device, same links to everyone) are skipped. Once a
//     pass improves nothing, iterated local search spends the rest of the budget: two random
//     swaps kick the best plan, the descent runs again, and the better plan is kept.
// The start is the best of the constructed plans (both constructions, both groupings, each path
// both ways) and registration order (with the balanced cut and with the layout's), so the search
// never returns a plan worse than registration order, and returns registration order itself where
// nothing is strictly better.
//
// Baselines on the same cost model, for the bench and tests: registration order, a seeded random
// placement, and a DT-FM-style genetic search over the worker permutation. They keep the layout's
// own cut (blocks_per_stage, or even).
//
// A plan whose stages do not fit in their devices' memory counts as worse than any plan that fits.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "plan/cost_model.h"
#include "plan/simulator.h"

namespace longhaul {

struct PlacementProblem {
  Layout layout;            // stages × replicas slots; its blocks_per_stage is the baselines' cut
  std::vector<int> host;    // [worker]: host in `network`; at least stages × replicas workers
  std::vector<int> device;  // [worker]: index into `devices`; empty: all 0
  std::vector<DeviceCost> devices;
  NetworkCost network;
  bool central_ps = false;  // one shard host per stage (its replica 0) instead of 1/replicas each
  bool clip_norm = true;
  int iterations = 2;  // simulated per candidate; 2 gives the steady state (simulator.h)
  // The layout's blocks_per_stage stands (a live job whose workers build their stages from the
  // config): only workers move.
  bool keep_cut = false;
};

struct PlacementResult {
  Placement placement;                // workers beyond stages × replicas stay idle
  std::vector<int> blocks_per_stage;  // the cut the prediction used
  // [stage][k]: the replica that hosts the shard ParamLayout::PsShards gives replica k (a
  // permutation of the replicas; the identity but where the search moved shards).
  std::vector<std::vector<int>> shard_owner;
  double iteration_s = 0;             // Simulate's prediction for this plan
  bool fits = true;                   // every stage fits its device's memory
  std::string why_not;                // where it does not: the worker furthest over, and by how much
  int simulations = 0;                // Simulate calls spent finding it
};

struct SearchOptions {
  uint64_t seed = 1;           // the local search's move order
  int max_simulations = 600;  // budget, construction included
};

absl::StatusOr<PlacementResult> SearchPlacement(const PlacementProblem& problem, const SearchOptions& options = {});

// Measured compute and links differ by a few percent from one probe to the next: a placement the
// search predicts less than this much faster than registration order with the layout's cut is no
// better, and registration order with that cut stands.
inline constexpr double kPlacementMinGain = 0.03;

// What the coordinator runs for a layout: the search's plan where it fits and registration order
// with the layout's own cut does not, or where it is predicted kPlacementMinGain faster; else
// registration order with that cut. `longhaul plan` ranks layouts by the same choice.
struct ChosenPlacement {
  PlacementResult plan;
  bool searched = false;  // the search's plan replaced registration order
  double registration_order_s = 0;
  int simulations = 0;  // the search's
};
absl::StatusOr<ChosenPlacement> ChoosePlacement(PlacementProblem problem);

// Slot k = replica · stages + stage runs worker order[k] (DefaultPlacement's numbering: the
// identity is registration order); order is a permutation of every worker. shard_owner as
// PlacementResult has it (empty: shard k on replica k).
absl::StatusOr<PlacementResult> PlaceInOrder(const PlacementProblem& problem, const std::vector<int>& order,
                                             const std::vector<std::vector<int>>& shard_owner = {});
absl::StatusOr<PlacementResult> RegistrationOrder(const PlacementProblem& problem);
absl::StatusOr<PlacementResult> RandomPlacement(const PlacementProblem& problem, uint64_t seed);

struct GeneticOptions {
  uint64_t seed = 1;
  int population = 32;
  int generations = 40;
  int elite = 2;               // best individuals copied unchanged into the next generation
  int tournament = 3;          // parents are the best of this many drawn at random
  double mutation_rate = 0.3;  // chance that a child gets one swap (and again, for each swap made)
};

// DT-FM's genetic search over the worker permutation (as PlaceInOrder reads it): order crossover,
// swap mutation, tournament selection, elitism, a fixed number of generations; every individual
// scored by Simulate. The first generation is registration order plus random permutations.
absl::StatusOr<PlacementResult> GeneticPlacement(const PlacementProblem& problem, const GeneticOptions& options = {});

// Blocks per stage minimizing the slowest stage, where stage s's block costs block_s seconds and
// the last stage also pays head_s (every stage gets at least one block, and at most max_blocks[s]
// where given: what fits its workers' memory). Among cuts with that bottleneck, blocks are taken
// from the slowest stages first. Empty where there are fewer blocks than stages, or max_blocks
// holds fewer than `blocks` or leaves a stage none.
std::vector<int> BalancedCut(int blocks, const std::vector<double>& block_s, double head_s,
                             const std::vector<int>& max_blocks = {});

}  // namespace longhaul
