// cluster.communication = "auto": the coordinator's choice among a penalties file's settings by
// effective tokens/s (tokens/s / (1 + penalty)) on prices it is given, each setting applied on
// top of the exact path's communication keys whatever the config set; the settings it cannot run
// named with their reasons.
#include "coordinator/communication.h"

#include <gtest/gtest.h>

#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul {
namespace {

JobConfig Config(const std::vector<std::string>& overrides) {
  auto c = ParseJobConfig("[model]\nn_layer = 4\nd_model = 16\nn_head = 2\n[cluster]\nreplicas = 2\n", "job.toml",
                          overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

SettingPenalty Setting(std::string name, std::vector<std::string> set, double penalty, bool choosable = true) {
  SettingPenalty p;
  p.name = std::move(name);
  p.overrides = std::move(set);
  p.penalty = penalty;
  p.choosable = choosable;
  return p;
}

PenaltyTable Table() {
  PenaltyTable t;
  t.settings = {Setting("exact", {}, 0), Setting("int8 wire", {"transport.wire_dtype=\"int8\""}, -0.04),
                Setting("local_steps 4", {"train.local_steps=4"}, 0.2),
                Setting("local_steps 16", {"train.local_steps=16"}, 0.25),
                Setting("topk", {"train.local_steps=16", "transport.exchange_dtype=\"topk\""}, 3, false)};
  SettingPenalty batch = Setting("batch x2", {}, 0.3);
  batch.batch_scale = 2;
  t.settings.push_back(batch);
  return t;
}

// An iteration time per local_steps and wire: slow links make every exchange cost 1 s, int8 half.
PriceConfig Slow(std::map<int, double> compute_s = {{1, 0.1}, {4, 0.1}, {16, 0.1}}) {
  return [compute_s](const JobConfig& c) -> absl::StatusOr<SlotSearch> {
    SlotSearch s;
    const double exchange = c.transport.wire_dtype == WireDtype::kInt8 ? 0.5 : 1.0;
    s.predicted_s = compute_s.at(c.train.local_steps) + exchange / c.train.local_steps;
    return s;
  };
}

TEST(Communication, ChoosesTheSettingFastestToTheSameLoss) {
  // exact 1.1 s; int8 0.6 s (its negative penalty counted as 0); local_steps 4: 0.35 s x 1.2 =
  // 0.42; local_steps 16: 0.1625 s x 1.25 = 0.203: the fastest to the same loss.
  auto choice = ChooseCommunication(Config({}), Table(), Slow());
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->candidates[choice->chosen].name, "local_steps 16");
  EXPECT_EQ(choice->cfg.train.local_steps, 16);
  const CommunicationCandidate& c = choice->candidates[choice->chosen];
  EXPECT_DOUBLE_EQ(c.iteration_s, 0.1625);
  EXPECT_DOUBLE_EQ(c.effective, c.tokens_per_s / 1.25);
  EXPECT_DOUBLE_EQ(c.tokens_per_s, choice->cfg.tokens_per_step() / 0.1625);
  EXPECT_DOUBLE_EQ(choice->candidates[1].effective, choice->candidates[1].tokens_per_s) << "a negative penalty is 0";
  EXPECT_NE(choice->candidates[4].why_not.find("never reached"), std::string::npos);
  EXPECT_NE(choice->candidates[5].why_not.find("train.micro_batches"), std::string::npos)
      << choice->candidates[5].why_not;
  EXPECT_EQ(choice->Json()["chosen"], "local_steps 16");
}

TEST(Communication, TheConfigsOwnKeysDoNotLeakIntoTheExactPath) {
  // The config asks for local steps 4 and int4 pushes; with local steps costing compute (a slow
  // AdamW, say) the exact path wins, and it runs synchronously on the compute's own wire.
  auto choice = ChooseCommunication(Config({"train.local_steps=4", "transport.exchange_dtype=\"int4\"",
                                            "train.outer_lr=0.9"}),
                                    Table(), Slow({{1, 0.1}, {4, 5}, {16, 5}}));
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->candidates[choice->chosen].name, "int8 wire");
  EXPECT_EQ(choice->cfg.train.local_steps, 1);
  EXPECT_EQ(choice->cfg.transport.exchange_dtype, WireDtype::kAuto);
  EXPECT_FLOAT_EQ(choice->cfg.train.outer_lr, JobConfig{}.train.outer_lr);
}

TEST(Communication, SettingsTheJobCannotRunAreNamedWithTheirReason) {
  // Checkpoints every 10 steps are no multiple of 4 or 16; a lossy wire measured on one stage is
  // not charged for a pipeline boundary.
  auto choice = ChooseCommunication(Config({"train.checkpoint_every=10", "cluster.stages=2"}), Table(), Slow());
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->candidates[choice->chosen].name, "exact");
  EXPECT_NE(choice->candidates[1].why_not.find("no penalty measured for a pipeline boundary"), std::string::npos);
  EXPECT_NE(choice->candidates[2].why_not.find("train.checkpoint_every = 10 is not a multiple"), std::string::npos)
      << choice->candidates[2].why_not;
  // Nothing priced: an error that names each setting's reason.
  auto none = ChooseCommunication(Config({}), Table(), [](const JobConfig&) -> absl::StatusOr<SlotSearch> {
    return absl::ResourceExhaustedError("no placement fits");
  });
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("exact: not priced: no placement fits"), std::string::npos)
      << none.status();
}

TEST(Communication, APipelineMayTakeABoundaryFormatTheBenchMeasuredOnAPipeline) {
  // int4 measured on 2 stages: its cluster.stages says where it was measured, not what it sets.
  PenaltyTable t = Table();
  SettingPenalty int4 = Setting("int4 boundaries", {"cluster.stages=2", "transport.wire_dtype=\"int4\""}, 0.05);
  int4.stages = 2;
  t.settings.push_back(int4);
  auto choice = ChooseCommunication(Config({"cluster.stages=3", "cluster.replicas=1"}), t,
                                    [](const JobConfig& c) -> absl::StatusOr<SlotSearch> {
                                      SlotSearch s;
                                      s.predicted_s = c.transport.wire_dtype == WireDtype::kInt4 ? 0.3 : 1.0;
                                      return s;
                                    });
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->candidates[choice->chosen].name, "int4 boundaries");
  EXPECT_EQ(choice->cfg.cluster.stages, 3);
  EXPECT_EQ(choice->cfg.transport.wire_dtype, WireDtype::kInt4);
  EXPECT_NE(choice->candidates[1].why_not.find("no penalty measured for a pipeline boundary"), std::string::npos);
}

}  // namespace
}  // namespace longhaul
