// Convergence penalties: the tokens a curve needs to reach a target, interpolated between
// evaluations; a setting's penalty over seeds, the final gap of one that never reaches the target;
// the file the planner reads.
#include "plan/convergence_penalty.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <toml++/toml.h>

namespace longhaul {
namespace {
namespace fs = std::filesystem;

// Loss 4, 3, 2, 1 at 100, 200, 300, 400 tokens.
std::vector<LossPoint> Falling(double shift = 0) {
  return {{100, 4 + shift}, {200, 3 + shift}, {300, 2 + shift}, {400, 1 + shift}};
}

TEST(TokensToReach, InterpolatesBetweenEvaluations) {
  EXPECT_DOUBLE_EQ(*TokensToReach(Falling(), 2.5), 250);
  EXPECT_DOUBLE_EQ(*TokensToReach(Falling(), 1), 400);
  EXPECT_DOUBLE_EQ(*TokensToReach(Falling(), 9), 100) << "reached at the first evaluation";
  EXPECT_FALSE(TokensToReach(Falling(), 0.5).has_value());
  EXPECT_FALSE(TokensToReach({}, 1).has_value());
  // The first crossing counts, where noise crosses twice.
  EXPECT_DOUBLE_EQ(*TokensToReach({{100, 3}, {200, 1}, {300, 2}, {400, 0.5}}, 2), 150);
}

TEST(MeasurePenalty, SameSeedTargetsAndTheirMean) {
  // Seed 0's exact path ends at 1, seed 1's at 1.5; the setting reaches 1 at 400 (penalty 0) and
  // 1.5 at 350 of 400 tokens (penalty -0.125).
  const SettingPenalty p = MeasurePenalty({Falling(), Falling()}, {Falling(), Falling(0.5)}, 400);
  ASSERT_TRUE(p.choosable);
  EXPECT_DOUBLE_EQ(p.penalty, -0.0625);
  EXPECT_DOUBLE_EQ(p.penalty_min, -0.125);
  EXPECT_DOUBLE_EQ(p.penalty_max, 0);
  EXPECT_DOUBLE_EQ(p.final_gap, -0.25);
  EXPECT_DOUBLE_EQ(p.final_spread, 0);
}

// A seed that ends short of its target is charged the exact path's pace: seed 0 ends at 1.25,
// which the exact path reached at 375 of 400 tokens (penalty 400 / 375 - 1); seed 1 reaches it.
TEST(MeasurePenalty, ASeedShortOfItsTargetIsChargedTheExactPathsPaceToItsLoss) {
  const SettingPenalty p = MeasurePenalty({Falling(0.25), Falling()}, {Falling(), Falling()}, 400);
  ASSERT_TRUE(p.choosable);
  EXPECT_DOUBLE_EQ(p.penalty_max, 400.0 / 375 - 1);
  EXPECT_DOUBLE_EQ(p.penalty_min, 0);
  EXPECT_DOUBLE_EQ(p.final_gap, 0.125);
  EXPECT_DOUBLE_EQ(p.final_spread, 0.25);
  EXPECT_FALSE(p.tokens_to_target[0].has_value());
  EXPECT_DOUBLE_EQ(*p.tokens_to_target[1], 400);
}

// One that ends above the exact path's first evaluation has no penalty and is not chosen; the
// exact path against itself is 0, even where a noisy curve dipped below its end earlier.
TEST(MeasurePenalty, ASeedAboveTheExactPathsFirstLossIsNotChoosableAndTheExactPathIsZero) {
  const SettingPenalty stuck = MeasurePenalty({Falling(5), Falling()}, {Falling(), Falling()}, 400);
  EXPECT_FALSE(stuck.choosable);
  EXPECT_DOUBLE_EQ(stuck.final_gap, 2.5);
  const std::vector<LossPoint> noisy = {{100, 3}, {200, 1}, {300, 2}, {400, 1.5}};
  const SettingPenalty exact = MeasurePenalty({noisy}, {noisy}, 400);
  ASSERT_TRUE(exact.choosable);
  EXPECT_EQ(exact.penalty, 0);
}

TEST(PenaltyTable, WritesWhatThePlannerReads) {
  const fs::path path = fs::path(::testing::TempDir()) / ("penalties_" + std::to_string(getpid()) + ".toml");
  PenaltyTable t{"GPT", "bytes", "here", "longhaul convergence", 400, {1, 2}, {1.0, 1.5}, {}};
  SettingPenalty reached = MeasurePenalty({Falling(), Falling()}, {Falling(), Falling(0.5)}, 400);
  reached.name = "int8 wire", reached.overrides = {"transport.wire_dtype=\"int8\""}, reached.iteration_s = 0.5;
  SettingPenalty never = MeasurePenalty({Falling(5), Falling()}, {Falling(), Falling()}, 400);
  never.name = "batch x4", never.batch_scale = 4;
  t.settings = {reached, never};
  ASSERT_TRUE(WritePenaltyTable(path.string(), t).ok());
  const toml::table f = toml::parse_file(path.string());
  EXPECT_EQ(f["tokens"].value<double>(), 400);
  EXPECT_EQ(f["exact_spread"].value<double>(), 0.5);
  const toml::array& s = *f["setting"].as_array();
  ASSERT_EQ(s.size(), 2u);
  const toml::table& a = *s[0].as_table();
  EXPECT_EQ(a["name"].value<std::string>(), "int8 wire");
  EXPECT_EQ(a["set"][0].value<std::string>(), "transport.wire_dtype=\"int8\"");
  EXPECT_EQ(a["choosable"].value<bool>(), true);
  EXPECT_EQ(a["penalty"].value<double>(), -0.0625);
  EXPECT_EQ(a["iteration_s"].value<double>(), 0.5);
  const toml::table& b = *s[1].as_table();
  EXPECT_EQ(b["choosable"].value<bool>(), false);
  EXPECT_EQ(b["batch_scale"].value<int64_t>(), 4);
  EXPECT_FALSE(b.contains("penalty")) << "a setting that never reached the target has no penalty";
  EXPECT_EQ(b["final_gap"].value<double>(), 2.5);
  fs::remove(path);
}

// What `longhaul plan --penalties` reads back is what the bench wrote; a file that is not one is
// refused naming what is wrong.
TEST(PenaltyTable, ReadsBackWhatItWroteAndRefusesOtherFiles) {
  const fs::path path = fs::path(::testing::TempDir()) / ("penalties_read_" + std::to_string(getpid()) + ".toml");
  PenaltyTable t{"GPT", "bytes", "here", "longhaul convergence", 400, {1, 2}, {1.0, 1.5}, {}};
  SettingPenalty exact = MeasurePenalty({Falling(), Falling()}, {Falling(), Falling()}, 400);
  exact.name = "exact (sync fp32)";
  SettingPenalty int8 = MeasurePenalty({Falling(), Falling()}, {Falling(), Falling(0.5)}, 400);
  int8.name = "int8 wire", int8.overrides = {"transport.wire_dtype=\"int8\""}, int8.iteration_s = 0.5;
  SettingPenalty never = MeasurePenalty({Falling(5), Falling()}, {Falling(), Falling()}, 400);
  never.name = "batch x4", never.batch_scale = 4;
  t.settings = {exact, int8, never};
  ASSERT_TRUE(WritePenaltyTable(path.string(), t).ok());
  auto read = LoadPenaltyTable(path.string());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->tokens, 400);
  EXPECT_EQ(read->seeds, t.seeds);
  EXPECT_EQ(read->exact_final_loss, t.exact_final_loss);
  ASSERT_EQ(read->settings.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const SettingPenalty &a = read->settings[i], &b = t.settings[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.overrides, b.overrides);
    EXPECT_EQ(a.batch_scale, b.batch_scale);
    EXPECT_EQ(a.choosable, b.choosable);
    EXPECT_NEAR(a.penalty, b.penalty, 1e-6) << a.name;  // written to 6 digits
    EXPECT_EQ(a.iteration_s, b.iteration_s);
  }
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"tokens = 400\n[[setting]]\nname = \"int8\"\nset = [\"transport.wire_dtype=\\\"int8\\\"\"]\n",
            "not the exact path"},
           {"tokens = 400\n[[setting]]\nname = \"exact\"\nchoosable = true\n", "has no penalty"},
           {"[[setting]]\nname = \"exact\"\n", "no tokens"},
           {"tokens = [", "line 1"}}) {
    std::ofstream(path, std::ios::trunc) << text;
    auto bad = LoadPenaltyTable(path.string());
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find(says), std::string::npos) << bad.status();
  }
  fs::remove(path);
}

// A setting measured on 2 stages, its replicas sharing the batch as 5 and 3 micro-batches of 2, is
// planned on whatever layout the planner finds: its communication keys are kept, the layout's
// dropped (the exact path's communication keys fill the rest).
TEST(SettingOverrides, KeepTheSettingsCommunicationAndLeaveTheLayoutToThePlanner) {
  SettingPenalty p;
  p.overrides = {"cluster.stages=2", "train.local_steps=16", "train.micro_batch_size=2", "train.micro_batches=5",
                 "cluster.replica_micro_batches=[5,3]"};
  const std::vector<std::string> out = SettingOverrides(JobConfig{}, p);
  EXPECT_NE(std::find(out.begin(), out.end(), "train.local_steps=16"), out.end());
  for (const std::string& o : out) {
    EXPECT_EQ(o.rfind("cluster.stages", 0), std::string::npos) << o;
    EXPECT_EQ(o.rfind("train.micro_batch", 0), std::string::npos) << o;
    EXPECT_EQ(o.rfind("cluster.replica_micro_batches", 0), std::string::npos) << o;
  }
  EXPECT_TRUE(KeysBeyondCommunication(p).empty());
}

// A penalty measured on one stage says nothing of a boundary in low rank, as of one in a lossy
// dtype; a row measured on two stages does.
TEST(BoundaryUnmeasured, ALowRankBoundaryNeedsARowMeasuredAcrossOne) {
  SettingPenalty p;
  p.stages = 1;
  TransportConfig t;
  t.wire_dtype = WireDtype::kF32;
  EXPECT_FALSE(BoundaryUnmeasured(p, t));
  t.boundary_rank_divisor = 4;
  EXPECT_TRUE(BoundaryUnmeasured(p, t));
  t.boundary_rank_divisor = 1, t.gradient_rank_divisor = 8;
  EXPECT_TRUE(BoundaryUnmeasured(p, t));
  p.stages = 2;
  EXPECT_FALSE(BoundaryUnmeasured(p, t));
}

}  // namespace
}  // namespace longhaul
