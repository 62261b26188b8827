#include "plan/layout_search.h"

#include <gtest/gtest.h>

#include <chrono>

#include "metrics/flops.h"

namespace longhaul {
namespace {

ModelConfig Gpt3Xl() {
  ModelConfig m;
  m.n_layer = 24, m.d_model = 2048, m.n_head = 16, m.max_seq_len = 2048, m.vocab_size = 50257;
  return m;
}

ModelConfig Small() {
  ModelConfig m;
  m.n_layer = 8, m.d_model = 128, m.n_head = 4, m.max_seq_len = 64, m.vocab_size = 256;
  return m;
}

LayoutSearchRequest Request(const ModelConfig& model, int seq_len, int global_batch, int workers,
                            const std::string& device, LinkCost link) {
  LayoutSearchRequest r;
  r.model = model;
  r.seq_len = seq_len;
  r.global_batch = global_batch;
  r.workers = workers;
  auto d = DeviceCost::Named(device, Precision::kFp32, 0.5);
  EXPECT_TRUE(d.ok()) << d.status();
  r.device = *d;
  r.network = NetworkCost::Uniform(link);
  return r;
}

LayoutSearchResult Searched(const LayoutSearchRequest& r) {
  auto s = SearchLayouts(r);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : LayoutSearchResult{};
}

std::vector<RankedLayout> All(const LayoutSearchResult& s) {
  std::vector<RankedLayout> all = s.fitting;
  all.insert(all.end(), s.unfit.begin(), s.unfit.end());
  return all;
}

// GPT-3 XL on one 16 GB V100: 24 blocks of fp32 weights, gradients and AdamW moments alone are
// about 20 GB, so no single-stage layout fits, and the note names stage 0 with the excess.
TEST(LayoutSearch, LayoutWhoseMemoryCannotFitIsReportedWithItsStage) {
  LayoutSearchRequest r = Request(Gpt3Xl(), 2048, 8, 1, "v100", {0.05e-3, 1.25e9, 0});
  r.exhaustive = true;
  const LayoutSearchResult s = Searched(r);
  EXPECT_TRUE(s.fitting.empty());
  ASSERT_FALSE(s.unfit.empty());
  for (const RankedLayout& c : s.unfit) {
    EXPECT_FALSE(c.fits);
    EXPECT_EQ(c.peak_stage, 0);
    EXPECT_GT(c.peak_memory.total(), r.device.memory_bytes());
    EXPECT_NE(c.why_not.find("stage 0 needs"), std::string::npos) << c.why_not;
    EXPECT_NE(c.why_not.find("over the device's 16.0 GiB"), std::string::npos) << c.why_not;
  }
}

// 12 stages of 2 blocks: the weights fit in 16 GB, but micro-batches of 16 sequences do not, under
// either schedule, with or without recompute; the one entry for that split names the stage.
TEST(LayoutSearch, ActivationsThatCannotFitNameTheStage) {
  LayoutSearchRequest r = Request(Gpt3Xl(), 2048, 64, 12, "v100", {0.05e-3, 1.25e9, 0});
  r.exhaustive = true;
  const LayoutSearchResult s = Searched(r);
  int seen = 0;
  for (const RankedLayout& c : All(s)) {
    const Layout& L = c.layout;
    if (L.stages != 12 || L.replicas != 1 || L.work.micro_batch != 16) continue;
    ++seen;
    EXPECT_FALSE(c.fits);
    const MemoryEstimate& m = c.peak_memory;
    EXPECT_LT(m.bytes("parameters") + m.bytes("gradients") + m.bytes("AdamW moments"), r.device.memory_bytes() / 2);
    EXPECT_GT(m.total(), r.device.memory_bytes());
    EXPECT_NE(c.why_not.find("stage " + std::to_string(c.peak_stage) + " needs"), std::string::npos) << c.why_not;
  }
  EXPECT_EQ(seen, 1);
  // Where some variant fits (recompute), the ones that do not are not listed.
  for (const RankedLayout& c : s.unfit) EXPECT_FALSE(c.layout.stages == 12 && c.layout.work.micro_batch == 1);
}

TEST(LayoutSearch, RankedBySimulatedTimeAndPruningKeepsTheTop) {
  LayoutSearchRequest r = Request(Gpt3Xl(), 2048, 64, 12, "v100", {10e-3, 1e9 / 8, 0});
  r.top = 5;
  const LayoutSearchResult pruned = Searched(r);
  r.exhaustive = true;
  const LayoutSearchResult all = Searched(r);
  ASSERT_EQ(pruned.fitting.size(), 5u);
  EXPECT_LT(pruned.simulated, all.simulated);
  EXPECT_EQ(all.simulated, all.candidates);
  for (size_t i = 1; i < all.fitting.size(); ++i) EXPECT_LE(all.fitting[i - 1].iteration_s, all.fitting[i].iteration_s);
  for (size_t i = 1; i < all.unfit.size(); ++i) EXPECT_LE(all.unfit[i - 1].iteration_s, all.unfit[i].iteration_s);
  for (size_t i = 0; i < pruned.fitting.size(); ++i) {
    EXPECT_DOUBLE_EQ(pruned.fitting[i].iteration_s, all.fitting[i].iteration_s) << i;
    // The bound is a bound.
    EXPECT_LE(all.fitting[i].lower_bound_s, all.fitting[i].iteration_s * (1 + 1e-9));
  }
  // Every figure follows from the time.
  const RankedLayout& best = pruned.fitting.front();
  EXPECT_NEAR(best.tokens_per_s, 64.0 * 2048 / best.iteration_s, 1e-6);
  EXPECT_NEAR(best.days_per_100b_tokens, DaysFor100BTokens(best.tokens_per_s), 1e-9);
  EXPECT_NEAR(best.tflops_per_device * 1e12 * best.iteration_s * best.devices(),
              ModelFlopsPerIteration(Gpt3Xl(), 64, 2048, best.layout.work.recompute), 1e3);
  EXPECT_GT(best.mfu, 0);
  EXPECT_LT(best.mfu, 0.5);  // at most the efficiency
}

// A small model on a fast network: the parameter-server exchange is cheap and a pipeline's bubble
// is not, so replicas win.
TEST(LayoutSearch, OnAFastNetworkReplicasBeatStages) {
  const LayoutSearchRequest r = Request(Small(), 64, 32, 8, "cpu:100", {1e-6, 100e9, 0});
  const LayoutSearchResult s = Searched(r);
  ASSERT_FALSE(s.fitting.empty());
  EXPECT_EQ(s.fitting.front().layout.stages, 1);
  EXPECT_EQ(s.fitting.front().layout.replicas, 8);
}

// 12 workers for a batch of 64: replicas need not divide it. 12 replicas of 6 and 5 micro-batches
// beat 8 of 8 where the exchange is cheap.
TEST(LayoutSearch, ReplicasMayShareTheBatchUnevenly) {
  EXPECT_EQ(ReplicaShares(64, 12), (std::vector<int>{6, 6, 6, 6, 5, 5, 5, 5, 5, 5, 5, 5}));
  EXPECT_EQ(ReplicaShares(8, 4), (std::vector<int>{2, 2, 2, 2}));
  const LayoutSearchResult s = Searched(Request(Small(), 64, 64, 12, "cpu:100", {1e-6, 100e9, 0}));
  ASSERT_FALSE(s.fitting.empty());
  const Layout& best = s.fitting.front().layout;
  EXPECT_EQ(best.stages, 1);
  EXPECT_EQ(best.replicas, 12);
  EXPECT_EQ(best.replica_micro_batches, ReplicaShares(64 / best.work.micro_batch, 12));
}

TEST(LayoutSearch, EveryCandidateKeepsTheGlobalBatchAndTheWorkers) {
  for (int workers : {1, 3, 7, 12}) {
    LayoutSearchRequest r = Request(Gpt3Xl(), 2048, 48, workers, "a100", {1e-3, 1e9, 0});
    r.exhaustive = true;
    const LayoutSearchResult s = Searched(r);
    EXPECT_GT(s.candidates, 0);
    for (const RankedLayout& c : All(s)) {
      const Layout& L = c.layout;
      int micro_batches = 0;
      for (int r = 0; r < L.replicas; ++r) micro_batches += L.MicroBatchesOf(r);
      EXPECT_EQ(micro_batches * L.work.micro_batch, 48);
      if (!L.replica_micro_batches.empty()) {
        EXPECT_EQ(L.replica_micro_batches.front(), L.micro_batches);
        EXPECT_EQ(L.replica_micro_batches.back(), L.micro_batches - 1) << "shares within one of each other";
      }
      EXPECT_LE(L.stages * L.replicas, workers);
      EXPECT_GE(L.stages, 1);
      EXPECT_LE(L.stages, 24);
    }
  }
}

TEST(LayoutSearch, AnswersInSeconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const LayoutSearchResult s = Searched(Request(Gpt3Xl(), 2048, 64, 12, "v100", {10e-3, 1e9 / 8, 0}));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(s.fitting.empty());
  EXPECT_LT(seconds, 10) << s.simulated << " of " << s.candidates << " simulated";
}

TEST(LayoutSearch, BadRequestsAreRefused) {
  LayoutSearchRequest r = Request(Small(), 64, 32, 0, "cpu:100", {});
  EXPECT_EQ(SearchLayouts(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.workers = 2, r.global_batch = 0;
  EXPECT_EQ(SearchLayouts(r).status().code(), absl::StatusCode::kInvalidArgument);
}

// With `place`, each layout is timed on the placement the coordinator would run: ChoosePlacement
// of the same problem, never slower than registration order; --layout's filter keeps one split.
TEST(LayoutSearch, PlacedLayoutsAreTimedOnTheCoordinatorsPlacement) {
  LayoutSearchRequest r = Request(Small(), 64, 16, 8, "v100", {0.05e-3, 1.25e9, 0});
  // Two sites 40 ms apart, hosts alternating between them: registration order puts every stage
  // across both.
  std::vector<std::vector<LinkCost>> links(8, std::vector<LinkCost>(8, {0.05e-3, 1.25e9, 0}));
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b)
      if (a % 2 != b % 2) links[a][b] = {40e-3, 12.5e6, 0};
  r.network = NetworkCost::FromMatrix(links);
  r.place = true;
  r.only_stages = 2, r.only_replicas = 4;
  const LayoutSearchResult s = Searched(r);
  ASSERT_FALSE(s.fitting.empty());
  EXPECT_GE(s.placed, static_cast<int>(s.fitting.size()));
  bool searched = false;
  for (const RankedLayout& c : s.fitting) {
    EXPECT_EQ(c.layout.stages, 2);
    EXPECT_EQ(c.layout.replicas, 4);
    ASSERT_TRUE(c.placement.has_value());
    EXPECT_LE(c.iteration_s, c.placement->registration_order_s);
    EXPECT_EQ(c.iteration_s, c.placement->plan.iteration_s);
    searched = searched || c.placement->searched;
    PlacementProblem problem;
    problem.layout = c.layout;
    for (int st = 0; st < 2; ++st) problem.layout.blocks_per_stage.push_back(4);
    problem.host = {0, 1, 2, 3, 4, 5, 6, 7};
    problem.devices = {r.device};
    problem.network = r.network;
    problem.central_ps = c.central_ps;
    auto chosen = ChoosePlacement(problem);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_EQ(chosen->plan.iteration_s, c.iteration_s);
  }
  EXPECT_TRUE(searched) << "registration order splits every stage over both sites; the search does better";
}

}  // namespace
}  // namespace longhaul
