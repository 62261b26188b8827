#include "plan/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/memory_estimate.h"
#include "scenario/scenario.h"

namespace longhaul {
namespace {

constexpr double kFp32 = 4;

DeviceCost Cpu(const char* name) {
  auto d = DeviceCost::Named(name, Precision::kFp32, 1.0);
  EXPECT_TRUE(d.ok()) << d.status();
  return *d;
}

// Sites with the given one-way delays and rates (the diagonal inside a site); host h on
// site site_of[h].
netem::Scenario Sites(const std::vector<std::vector<double>>& delay_ms, const std::vector<std::vector<double>>& mbit,
                      std::vector<int> site_of) {
  netem::Scenario s;
  s.name = "test";
  for (size_t i = 0; i < delay_ms.size(); ++i) s.sites.push_back("site" + std::to_string(i));
  s.delay_ms = delay_ms;
  s.rate_mbit = mbit;
  s.placement = std::move(site_of);
  return s;
}

// Two sites joined by a 10 Mbit/s, 20 ms link; 10 Gbit/s inside a site.
netem::Scenario TwoSites(std::vector<int> site_of) {
  return Sites({{0.1, 20}, {20, 0.1}}, {{10000, 10}, {10, 10000}}, std::move(site_of));
}

PlacementProblem Problem(int stages, int replicas, int micro, int d_model, int seq_len, netem::Scenario network) {
  PlacementProblem p;
  Layout& L = p.layout;
  L.stages = stages, L.replicas = replicas, L.micro_batches = micro;
  L.work.model.n_layer = stages, L.work.model.d_model = d_model, L.work.model.n_head = 4;
  L.work.model.vocab_size = 64, L.work.model.max_seq_len = seq_len;
  L.work.seq_len = seq_len;
  p.devices = {Cpu("cpu:100")};
  for (int w = 0; w < stages * replicas; ++w) p.host.push_back(w);
  p.network = NetworkCost::FromScenario(std::move(network));
  p.clip_norm = false;
  return p;
}

PlacementResult Ok(const absl::StatusOr<PlacementResult>& r) {
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : PlacementResult{};
}

TEST(Placement, HeavyPipelineBoundaryKeepsEachReplicaOnOneSite) {
  // Hosts alternate between the sites, so registration order runs every pipeline across the slow
  // link. A boundary carries 8 micro-batches of 1024 x 64 fp32 each way, several times what a
  // worker's half of the stage's exchange is.
  const std::vector<int> site_of = {0, 1, 0, 1};
  PlacementProblem p = Problem(2, 2, 8, 64, 1024, TwoSites(site_of));
  p.layout.work.model.n_layer = 3;  // an uneven cut for keep_cut to keep
  p.layout.blocks_per_stage = {1, 2};
  const double boundary = p.layout.micro_batches * p.layout.BoundaryBytes();
  const double exchange = kFp32 * StageParamCount(p.layout.work.model, p.layout.Spec(0)) / 2;
  ASSERT_GT(boundary, 4 * exchange);
  // Also with the cut fixed (a live job's workers build their stages from the config).
  for (bool keep_cut : {false, true}) {
    p.keep_cut = keep_cut;
    const PlacementResult r = Ok(SearchPlacement(p));
    for (int replica = 0; replica < 2; ++replica) {
      EXPECT_EQ(site_of[r.placement.worker[0][replica]], site_of[r.placement.worker[1][replica]]) << replica;
    }
    EXPECT_LT(r.iteration_s, Ok(RegistrationOrder(p)).iteration_s);
    if (keep_cut) {
      EXPECT_EQ(r.blocks_per_stage, (std::vector<int>{1, 2}));
    }
  }
}

TEST(Placement, HeavyExchangeKeepsEachStagesReplicasOnOneSite) {
  // The opposite sizes: one micro-batch of 16 x 256 on the boundary, a 256-wide block's gradient
  // in the exchange. Registration order puts each stage's replicas on both sites.
  const std::vector<int> site_of = {0, 0, 1, 1};
  PlacementProblem p = Problem(2, 2, 1, 256, 16, TwoSites(site_of));
  const double boundary = p.layout.micro_batches * p.layout.BoundaryBytes();
  const double exchange = kFp32 * StageParamCount(p.layout.work.model, p.layout.Spec(0)) / 2;
  ASSERT_GT(exchange, 4 * boundary);
  const PlacementResult r = Ok(SearchPlacement(p));
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_EQ(site_of[r.placement.worker[stage][0]], site_of[r.placement.worker[stage][1]]) << stage;
  }
  EXPECT_LT(r.iteration_s, Ok(RegistrationOrder(p)).iteration_s);
}

// Four sites with uneven links, 16 workers round-robin: 4 stages x 4 replicas.
PlacementProblem FourSites() {
  std::vector<int> site_of(16);
  for (int h = 0; h < 16; ++h) site_of[h] = h % 4;
  PlacementProblem p = Problem(4, 4, 8, 64, 256,
                               Sites({{0.1, 30, 40, 80}, {30, 0.1, 70, 55}, {40, 70, 0.1, 110}, {80, 55, 110, 0.1}},
                                     {{10000, 100, 100, 50}, {100, 10000, 80, 80}, {100, 80, 10000, 40},
                                      {50, 80, 40, 10000}},
                                     site_of));
  p.clip_norm = true;
  return p;
}

TEST(Placement, NeverWorseThanRegistrationOrderRandomOrTheGeneticSearch) {
  const PlacementProblem p = FourSites();
  const PlacementResult chosen = Ok(SearchPlacement(p));
  EXPECT_LE(chosen.iteration_s, Ok(RegistrationOrder(p)).iteration_s);
  std::vector<double> random;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    random.push_back(Ok(RandomPlacement(p, seed)).iteration_s);
    EXPECT_LE(chosen.iteration_s, random.back()) << "seed " << seed;
  }
  std::sort(random.begin(), random.end());
  EXPECT_LT(2 * chosen.iteration_s, random[10]);  // the median, by a margin
  GeneticOptions small;
  small.population = 12, small.generations = 10;
  EXPECT_LE(chosen.iteration_s, Ok(GeneticPlacement(p, small)).iteration_s);
}

TEST(Placement, GeneticSearchKeepsTheBestItSawAndItsBudget) {
  const PlacementProblem p = FourSites();
  GeneticOptions o;
  o.population = 8, o.generations = 5;
  const PlacementResult g = Ok(GeneticPlacement(p, o));
  // Registration order is in the first generation and the elite survive.
  EXPECT_LE(g.iteration_s, Ok(RegistrationOrder(p)).iteration_s);
  EXPECT_EQ(g.simulations, o.population + (o.generations - 1) * (o.population - o.elite));
  EXPECT_EQ(g.blocks_per_stage, p.layout.blocks_per_stage);  // the baselines keep the layout's cut
}

TEST(Placement, BalancedCutGivesFasterStagesMoreBlocksAndTheHeadFewer) {
  EXPECT_EQ(BalancedCut(8, {1, 3}, 0), (std::vector<int>{6, 2}));
  EXPECT_EQ(BalancedCut(8, {1, 1, 1, 1}, 0), (std::vector<int>{2, 2, 2, 2}));
  // A head worth 1.75 blocks: the last stage gives up blocks, the slowest stages give first.
  const std::vector<int> cut = BalancedCut(24, std::vector<double>(8, 1.0), 1.75);
  EXPECT_EQ(std::accumulate(cut.begin(), cut.end(), 0), 24);
  EXPECT_EQ(cut.back(), 2);
  EXPECT_EQ(*std::max_element(cut.begin(), cut.end()), 4);
  // Every stage keeps a block.
  EXPECT_EQ(BalancedCut(3, {1, 100, 1}, 0), (std::vector<int>{1, 1, 1}));
  // At most max_blocks[s] each: the fast stage's room caps it, the rest go where the time is least.
  EXPECT_EQ(BalancedCut(8, {1, 3}, 0, {4, 8}), (std::vector<int>{4, 4}));
  EXPECT_EQ(BalancedCut(9, {1, 1, 1}, 0, {1, 8, 8}), (std::vector<int>{1, 4, 4}));
  EXPECT_TRUE(BalancedCut(8, {1, 1}, 0, {3, 4}).empty()) << "room for 7 blocks of 8";
  EXPECT_TRUE(BalancedCut(8, {1, 1}, 0, {0, 8}).empty()) << "no room for stage 0's one block";
  EXPECT_TRUE(BalancedCut(2, {1, 1, 1}, 0).empty()) << "3 stages of 2 blocks";
}

TEST(Placement, FasterDeviceGetsMoreBlocks) {
  PlacementProblem p = Problem(2, 1, 4, 64, 64, Sites({{0.1}}, {{10000}}, {0, 0}));
  p.layout.work.model.n_layer = 8;
  p.devices = {Cpu("cpu:100"), Cpu("cpu:300")};
  p.device = {0, 1};
  const PlacementResult r = Ok(SearchPlacement(p));
  const int fast_stage = r.placement.worker[0][0] == 1 ? 0 : 1;
  EXPECT_GT(r.blocks_per_stage[fast_stage], r.blocks_per_stage[1 - fast_stage]);
  EXPECT_EQ(r.blocks_per_stage[0] + r.blocks_per_stage[1], 8);
  PlacementProblem even = p;
  even.layout.blocks_per_stage = {4, 4};
  EXPECT_LT(r.iteration_s, Ok(RegistrationOrder(even)).iteration_s);
}

// A plan that does not fit loses to any that does, however fast: a device three times faster
// would take six of eight blocks, but holds no more than an even stage. Forced into the faster
// plan, the result says which worker is over and by how much.
TEST(Placement, APlanThatFitsBeatsAFasterOneThatDoesNot) {
  PlacementProblem p = Problem(2, 1, 4, 64, 64, Sites({{0.1}}, {{10000}}, {0, 0}));
  p.layout.work.model.n_layer = 8;
  p.devices = {Cpu("cpu:100"), Cpu("cpu:300")};
  p.device = {0, 1};
  const PlacementResult unlimited = Ok(SearchPlacement(p));
  EXPECT_GT(*std::max_element(unlimited.blocks_per_stage.begin(), unlimited.blocks_per_stage.end()), 4);

  Layout even = p.layout;
  even.blocks_per_stage = {4, 4};
  double most = 0;  // the larger even stage with its shard (one replica: the whole stage)
  for (int s = 0; s < 2; ++s) {
    most = std::max(most, p.devices[0].StageMemory(even.work, even.Spec(s), even.micro_batches).total() +
                              kPsShardBytesPerParam * StageParamCount(even.work.model, even.Spec(s)));
  }
  PlacementProblem small = p;
  for (DeviceCost& d : small.devices) {
    auto block = d.Block(p.layout.work), head = d.Head(p.layout.work);
    ASSERT_TRUE(block.ok() && head.ok());
    d = *DeviceCost::Timed(d.name(), Backend::kCpu, 20e9, p.layout.work, *block, *head, most);
  }
  const PlacementResult r = Ok(SearchPlacement(small));
  EXPECT_TRUE(r.fits) << r.why_not;
  EXPECT_TRUE(r.why_not.empty());
  EXPECT_EQ(r.blocks_per_stage, (std::vector<int>{4, 4}));
  EXPECT_GT(r.iteration_s, unlimited.iteration_s);

  small.layout.blocks_per_stage = unlimited.blocks_per_stage;
  std::vector<int> order = {unlimited.placement.worker[0][0], unlimited.placement.worker[1][0]};
  const PlacementResult forced = Ok(PlaceInOrder(small, order));
  EXPECT_FALSE(forced.fits);
  EXPECT_NE(forced.why_not.find("over its"), std::string::npos) << forced.why_not;
  const int big = unlimited.blocks_per_stage[0] > 4 ? 0 : 1;  // the stage over the limit
  EXPECT_NE(forced.why_not.find(absl::StrCat("worker ", order[big], " (stage ", big, ")")), std::string::npos)
      << forced.why_not;
}

TEST(Placement, SlowSpareWorkerStaysIdle) {
  // Three workers for two slots, one of them ten times slower.
  PlacementProblem p = Problem(2, 1, 4, 64, 64, Sites({{0.1}}, {{10000}}, {0, 0, 0}));
  p.host = {0, 1, 2};
  p.devices = {Cpu("cpu:100"), Cpu("cpu:10")};
  p.device = {1, 0, 0};
  const PlacementResult r = Ok(SearchPlacement(p));
  EXPECT_NE(r.placement.worker[0][0], 0);
  EXPECT_NE(r.placement.worker[1][0], 0);
  EXPECT_LT(r.iteration_s, Ok(RegistrationOrder(p)).iteration_s);
}

// One site, one device: every placement costs the same, and the search hands back registration
// order rather than an equal stranger.
TEST(Placement, NothingBetterKeepsRegistrationOrder) {
  PlacementProblem p = Problem(2, 2, 4, 64, 128, Sites({{1}}, {{1000}}, {}));
  p.keep_cut = true;
  const PlacementResult r = Ok(SearchPlacement(p));
  EXPECT_EQ(r.placement.worker, Ok(RegistrationOrder(p)).placement.worker);
  EXPECT_EQ(r.iteration_s, Ok(RegistrationOrder(p)).iteration_s);
}

TEST(Placement, SameSeedSamePlan) {
  const PlacementProblem p = FourSites();
  const PlacementResult a = Ok(SearchPlacement(p, {.seed = 7}));
  const PlacementResult b = Ok(SearchPlacement(p, {.seed = 7}));
  EXPECT_EQ(a.placement.worker, b.placement.worker);
  EXPECT_EQ(a.blocks_per_stage, b.blocks_per_stage);
  EXPECT_EQ(a.iteration_s, b.iteration_s);
  EXPECT_EQ(a.simulations, b.simulations);
  EXPECT_EQ(Ok(RandomPlacement(p, 3)).placement.worker, Ok(RandomPlacement(p, 3)).placement.worker);
  EXPECT_EQ(Ok(GeneticPlacement(p, {.seed = 5, .population = 6, .generations = 3})).placement.worker,
            Ok(GeneticPlacement(p, {.seed = 5, .population = 6, .generations = 3})).placement.worker);
}

TEST(Placement, SixtyFourWorkersWithinTheSimulationBudget) {
  auto world = netem::LoadScenario(LONGHAUL_SOURCE_DIR "/netem/scenarios/world-eight-regions.toml");
  ASSERT_TRUE(world.ok()) << world.status();
  world->placement.clear();  // round-robin over the eight regions
  PlacementProblem p = Problem(8, 8, 8, 64, 256, *world);
  p.layout.work.model.n_layer = 16;
  SearchOptions o;
  o.max_simulations = 300;
  const PlacementResult r = Ok(SearchPlacement(p, o));
  EXPECT_LE(r.simulations, o.max_simulations);
  EXPECT_GT(r.simulations, 5);  // the starts, then local search
  EXPECT_LE(r.iteration_s, Ok(RegistrationOrder(p)).iteration_s);
  EXPECT_EQ(std::accumulate(r.blocks_per_stage.begin(), r.blocks_per_stage.end(), 0), 16);
}

// GPT-3 XL over eight regions, a pipeline of 8 stages in each (1F1B puts a boundary crossing
// between each forward and backward, so pipelines stay in their regions) and each stage's eight
// replicas in eight: the first stage's embedding and the last stage's head are one heavy shard
// each, whose host takes every replica's gradient of it over the WAN. The search moves such shards
// to better-connected regions (the plan with every shard on its own replica is slower), and so
// beats the genetic search, which only permutes workers (bench/plan_placement's case).
TEST(Placement, HeavyShardsMoveToBetterConnectedReplicas) {
  auto world = netem::LoadScenario(LONGHAUL_SOURCE_DIR "/netem/scenarios/world-eight-regions.toml");
  ASSERT_TRUE(world.ok()) << world.status();
  world->placement.clear();
  for (int w = 0; w < 64; ++w) world->placement.push_back(w / 8);  // in blocks: eight workers a region
  PlacementProblem p = Problem(8, 8, 32, 2048, 2048, *world);
  Layout& L = p.layout;
  L.schedule = ScheduleKind::k1F1B;
  L.work.model.n_layer = 24, L.work.model.n_head = 16, L.work.model.vocab_size = 50257;
  L.work.precision = Precision::kFp16, L.work.recompute = true;
  L.wire = WireDtype::kF16;
  auto v100 = DeviceCost::Named("v100", Precision::kFp16, 0.35);
  ASSERT_TRUE(v100.ok()) << v100.status();
  p.devices = {*v100};
  p.clip_norm = true;
  const PlacementResult r = Ok(SearchPlacement(p));
  EXPECT_TRUE(r.fits) << r.why_not;
  int moved = 0;
  for (const std::vector<int>& owners : r.shard_owner)
    for (size_t k = 0; k < owners.size(); ++k) moved += owners[k] != static_cast<int>(k);
  EXPECT_GT(moved, 0);
  std::vector<int> order;
  for (int s = 0; s < 8; ++s) ASSERT_EQ(r.placement.worker[s].size(), 8u);
  for (int k = 0; k < 64; ++k) order.push_back(r.placement.worker[k % 8][k / 8]);
  p.layout.blocks_per_stage = r.blocks_per_stage;
  const PlacementResult same = Ok(PlaceInOrder(p, order, r.shard_owner));
  EXPECT_EQ(same.iteration_s, r.iteration_s);
  EXPECT_GT(Ok(PlaceInOrder(p, order)).iteration_s, r.iteration_s);
  p.layout.blocks_per_stage.clear();
  const PlacementResult genetic = Ok(GeneticPlacement(p));
  std::printf("heavy shards: chosen %.2f s (%d shards moved), genetic %.2f s\n", r.iteration_s, moved,
              genetic.iteration_s);
  EXPECT_LE(r.iteration_s, genetic.iteration_s);
}

TEST(Placement, RejectsTooFewWorkersAndBadOrders) {
  PlacementProblem p = FourSites();
  p.host.resize(15);
  EXPECT_EQ(SearchPlacement(p).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegistrationOrder(p).status().code(), absl::StatusCode::kInvalidArgument);
  const PlacementProblem q = FourSites();
  std::vector<int> order(16, 0);
  EXPECT_EQ(PlaceInOrder(q, order).status().code(), absl::StatusCode::kInvalidArgument);
  std::iota(order.begin(), order.end(), 0);
  const int P = q.layout.stages, D = q.layout.replicas;
  std::vector<std::vector<int>> owners(P, std::vector<int>(D, 0));
  EXPECT_EQ(PlaceInOrder(q, order, owners).status().code(), absl::StatusCode::kInvalidArgument);  // not permutations
  owners.pop_back();
  EXPECT_EQ(PlaceInOrder(q, order, owners).status().code(), absl::StatusCode::kInvalidArgument);  // a stage short
}

}  // namespace
}  // namespace longhaul
