// Placement search (runtime/plan/placement.h) against its baselines on the same cost model, the
// proof item of issue 10: on the shipped heterogeneous scenarios with 16, 32 and 64 simulated
// workers, the chosen plan's predicted iteration time beside registration order, random placement
// (median of 100 seeds) and a DT-FM-style genetic search.
//
// The job: GPT-3 XL blocks (24, d_model 2048, 16 heads, seq 2048, vocab 50257), fp16 on V100s
// (16 GiB) at 35% of the tensor-core peak, 8 stages (DT-FM's pipeline depth) × W/8 replicas,
// micro-batches of one sequence and recompute, activations fp16 on the wire, sharded parameter
// server, global-norm clipping; two schedules, each with the most micro-batches whose plans fit:
// GPipe with 16 (its last stage keeps each micro-batch's fp32 logits until its backward, 2048 ×
// 50257 × 4 = 412 MB, and with 32 of them no cut fits a 16 GiB V100) and 1F1B with 32. 1F1B keeps
// at most P micro-batches in flight, so each crossing of the WAN inside a pipeline costs more
// than under GPipe: with 64 workers each pipeline fits in one region and each stage's replicas
// exchange over the WAN, where the hosts of the heavy shards (the first stage's embedding, the
// last stage's head, whole tensors) are best in the better-connected regions; with 16 or 32 a
// pipeline must span regions whatever the placement.
//
// Workers are spread over the scenario's sites two ways, each worker its own host and the
// coordinator on worker 0's host: in blocks (workers 0..W/sites-1 on the first site, and so on),
// as machines of one site tend to register together; and round-robin (the scenario's default).
// Registration order (worker r·P + s runs stage s of replica r) then lands differently: in blocks
// each pipeline sits on one site and the data-parallel exchange crosses the slow links;
// round-robin with P a multiple of the site count happens to put each stage's replicas on one
// site, which is close to what the search builds.
//
// Registration order, random placement and the genetic search keep the even cut (as DT-FM's
// baselines do); the search picks its cut. The column "genetic, cut" gives the genetic search the
// search's cut, to compare placement alone; neither moves a shard off its own replica, which the
// search does. The search gets 600 simulations, the genetic search 1280 (32 x 40). A chosen plan
// that does not fit is marked, with the worker furthest over.
//
// `--cards GBPS` gives every host a network card of that rate each way (scenario.h's nic_gbps;
// 10 is a p3.2xlarge's "up to 10 Gbit/s"), which all its links share, and adds a column: the plan
// the search chooses without cards, priced with them, against the one it chooses with them (how
// the cards change the winner).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "scenario/scenario.h"
#include "plan/placement.h"

namespace longhaul {
namespace {

constexpr int kStages = 8, kRandomSeeds = 100;

// The two schedules, each with the most micro-batches whose plans fit 16 GiB.
struct Config {
  ScheduleKind schedule;
  int micro_batches;
  const char* name;
};
constexpr Config kConfigs[] = {{ScheduleKind::kGpipe, 16, "GPipe"}, {ScheduleKind::k1F1B, 32, "1F1B"}};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double cards_gbps = 0;  // --cards

absl::StatusOr<PlacementProblem> Problem(const Config& config, const netem::Scenario& scenario, int workers,
                                          bool blocks) {
  PlacementProblem p;
  Layout& L = p.layout;
  L.stages = kStages;
  L.replicas = workers / L.stages;
  L.micro_batches = config.micro_batches;
  L.schedule = config.schedule;
  L.work.model.n_layer = 24, L.work.model.d_model = 2048, L.work.model.n_head = 16;
  L.work.model.max_seq_len = 2048, L.work.model.vocab_size = 50257;
  L.work.seq_len = 2048, L.work.micro_batch = 1, L.work.precision = Precision::kFp16, L.work.recompute = true;
  L.wire = WireDtype::kF16;
  auto v100 = DeviceCost::Named("v100", Precision::kFp16, 0.35);
  if (!v100.ok()) return v100.status();
  p.devices = {*v100};
  netem::Scenario spread = scenario;
  const int sites = static_cast<int>(scenario.sites.size());
  spread.placement.clear();
  for (int w = 0; w < workers; ++w) {
    spread.placement.push_back(blocks ? w * sites / workers : w % sites);
    p.host.push_back(w);
  }
  if (cards_gbps > 0) {
    spread.egress_mbit.assign(sites, cards_gbps * 1000);
    spread.ingress_mbit = spread.egress_mbit;
  }
  p.network = NetworkCost::FromScenario(spread);
  return p;
}

// `plan` (found on another problem of the same workers) priced on `problem`.
absl::StatusOr<PlacementResult> Reprice(PlacementProblem problem, const PlacementResult& plan) {
  const Layout& L = problem.layout;
  std::vector<int> order(problem.host.size(), -1);
  std::vector<bool> used(problem.host.size(), false);
  for (int r = 0; r < L.replicas; ++r)
    for (int s = 0; s < L.stages; ++s) {
      const int w = plan.placement.worker[s][r];
      order[r * L.stages + s] = w;
      used[w] = true;
    }
  size_t next = static_cast<size_t>(L.stages) * L.replicas;
  for (size_t w = 0; w < used.size(); ++w)
    if (!used[w]) order[next++] = static_cast<int>(w);
  problem.layout.blocks_per_stage = plan.blocks_per_stage;
  return PlaceInOrder(problem, order, plan.shard_owner);
}

int Table(const Config& config, bool blocks);

int Main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--cards" && i + 1 < argc && (cards_gbps = std::atof(argv[++i])) > 0) continue;
    std::fprintf(stderr, "usage: plan_placement [--cards GBPS]   (GBPS > 0: every host's card, each way)\n");
    return 2;
  }
  std::printf("placement: GPT-3 XL on V100 16 GiB (fp16, 35%% of peak), %d stages, micro-batches of 1 x 2048, "
              "recompute, sharded PS.\nTimes are predicted seconds per iteration; random is the median of %d seeds; the "
              "genetic search keeps the even cut, \"gen,cut\" runs it on the chosen plan's cut.\n",
              kStages, kRandomSeeds);
  if (cards_gbps > 0) {
    std::printf("Every host has a %g Gbit/s card each way; \"nocard\" is the plan chosen without cards, priced with "
                "them.\n",
                cards_gbps);
  }
  int missed = 0;
  for (const Config& config : kConfigs)
    for (bool blocks : {true, false}) {
      std::printf("\n%s, %d micro-batches; workers spread over the sites %s\n", config.name, config.micro_batches,
                  blocks ? "in blocks" : "round-robin");
      const int m = Table(config, blocks);
      if (m < 0) return 1;
      missed += m;
    }
  // Random placement's distance from the chosen is issue 10's target on the model without cards; with
  // cards every placement's hosts share them, and the search must still beat the genetic one.
  std::printf("\ntargets: %schosen no slower than the genetic search (either cut) anywhere; every chosen plan "
              "fits. %d case(s) missed.\n",
              cards_gbps > 0 ? "" : "random/chosen >= 3 on world-eight-regions; ", missed);
  return 0;
}

// Prints one table; returns the cases that miss a target, or -1 on an error.
int Table(const Config& config, bool blocks) {
  std::printf("%-20s %3s %5s %8s %8s %8s %8s %8s %7s %7s %6s %5s %6s %s %s\n", "scenario", "W", "PxD", "chosen",
              "regist.", "random", "genetic", "gen,cut", "rnd/ch", "gen/ch", "search", "sims", "GA",
              cards_gbps > 0 ? "  nocard nc/ch " : "", " cut");
  int missed = 0;
  for (const char* name : {"two-universities", "four-regions", "world-eight-regions"}) {
    auto scenario = netem::LoadScenario(absl::StrCat(LONGHAUL_SOURCE_DIR, "/netem/scenarios/", name, ".toml"));
    if (!scenario.ok()) {
      std::fprintf(stderr, "%s\n", std::string(scenario.status().message()).c_str());
      return -1;
    }
    for (int workers : {16, 32, 64}) {
      auto problem = Problem(config, *scenario, workers, blocks);
      if (!problem.ok()) {
        std::fprintf(stderr, "%s\n", std::string(problem.status().message()).c_str());
        return -1;
      }
      auto t0 = std::chrono::steady_clock::now();
      auto chosen = SearchPlacement(*problem);
      const double search_s = Seconds(t0);
      auto registration = RegistrationOrder(*problem);
      std::vector<double> random;
      for (int seed = 1; seed <= kRandomSeeds && chosen.ok(); ++seed) {
        auto r = RandomPlacement(*problem, seed);
        if (!r.ok()) {
          chosen = r.status();
          break;
        }
        random.push_back(r->iteration_s);
      }
      t0 = std::chrono::steady_clock::now();
      auto genetic = GeneticPlacement(*problem);
      const double genetic_s = Seconds(t0);
      PlacementProblem same_cut = *problem;
      if (chosen.ok()) same_cut.layout.blocks_per_stage = chosen->blocks_per_stage;
      auto genetic_cut = GeneticPlacement(same_cut);
      absl::StatusOr<PlacementResult> without_cards = PlacementResult{};
      if (cards_gbps > 0 && chosen.ok()) {
        PlacementProblem plain = *problem;
        plain.network = problem->network.WithoutCards();
        without_cards = SearchPlacement(plain);
        if (without_cards.ok()) without_cards = Reprice(*problem, *without_cards);
      }
      for (const absl::Status& st : {chosen.status(), registration.status(), genetic.status(), genetic_cut.status(),
                                     without_cards.status()}) {
        if (!st.ok()) {
          std::fprintf(stderr, "%s, %d workers: %s\n", name, workers, std::string(st.message()).c_str());
          return -1;
        }
      }
      std::sort(random.begin(), random.end());
      const double median = 0.5 * (random[(random.size() - 1) / 2] + random[random.size() / 2]);
      const double best_genetic = std::min(genetic->iteration_s, genetic_cut->iteration_s);
      const bool world = std::string(name) == "world-eight-regions";
      const bool miss =
          !chosen->fits || (world && cards_gbps == 0 && median / chosen->iteration_s < 3) ||
          best_genetic < chosen->iteration_s;
      missed += miss;
      const std::string nocard =
          cards_gbps > 0
              ? absl::StrFormat(" %8.2f %5.2f", without_cards->iteration_s, without_cards->iteration_s / chosen->iteration_s)
              : "";
      std::printf("%-20s %3d %2dx%-2d %8.2f %8.2f %8.2f %8.2f %8.2f %7.2f %7.2f %5.1fs %5d %5.1fs %s  %s%s%s\n", name,
                  workers, problem->layout.stages, problem->layout.replicas, chosen->iteration_s,
                  registration->iteration_s, median, genetic->iteration_s, genetic_cut->iteration_s,
                  median / chosen->iteration_s, genetic->iteration_s / chosen->iteration_s, search_s,
                  chosen->simulations, genetic_s, nocard.c_str(), absl::StrJoin(chosen->blocks_per_stage, ",").c_str(),
                  chosen->fits ? "" : "  DOES NOT FIT", miss ? "  TARGET MISSED" : "");
      if (!chosen->fits) std::printf("    %s\n", chosen->why_not.c_str());
    }
  }
  return missed;
}

}  // namespace
}  // namespace longhaul

int main(int argc, char** argv) { return longhaul::Main(argc, argv); }
