// The resume comparison: every key that changes the math, the samples or the layout must match,
// the rest may change, and a checkpoint that predates a key counts it at its default.
#include "checkpoint/resume_check.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "checkpoint/checkpoint.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

JobConfig Config(const std::vector<std::string>& overrides = {}) {
  auto c = ParseJobConfig("[model]\nn_layer = 4\n", "job.toml", overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::string Error(const nlohmann::json& written_with, const JobConfig& now) {
  absl::Status s = CheckResumable(written_with, now, "runs/x/checkpoints/step_00000060");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  return std::string(s.message());
}

TEST(ResumeCheck, KeysThatChangeTheMathNameEveryDifferenceWithBothValues) {
  const JobConfig then = Config();
  const std::string e = Error(then.as_json, Config({"data.alphabet=12", "train.steps=100", "transport.wire_dtype=bf16"}));
  EXPECT_NE(e.find("checkpoint runs/x/checkpoints/step_00000060 was written with data.alphabet = 24, the config has "
                   "12; train.steps = 200, the config has 100; transport.wire_dtype = \"auto\", the config has \"bf16\""),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--set data.alphabet=24 --set train.steps=200 --set transport.wire_dtype=auto"), std::string::npos)
      << e;
  EXPECT_EQ(e.find("layout"), std::string::npos) << e;
}

TEST(ResumeCheck, AnotherReplicaCountIsALayoutChangeNamingBothLayouts) {
  const JobConfig then = Config({"cluster.stages=2", "cluster.replicas=2"});
  const std::string e = Error(then.as_json, Config({"cluster.stages=2", "cluster.replicas=1"}));
  EXPECT_NE(e.find("for another layout (cluster.replicas = 2, the config has 1): a layout change"), std::string::npos)
      << e;
  EXPECT_NE(e.find("the checkpoint's layout is cluster.replicas = 2, cluster.ps = \"sharded\", the config's is "
                   "cluster.replicas = 1, cluster.ps = \"sharded\""),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--set cluster.replicas=2"), std::string::npos) << e;
}

TEST(ResumeCheck, FreeKeysMayChange) {
  const JobConfig then = Config();
  EXPECT_TRUE(CheckResumable(then.as_json,
                             Config({"train.log_every=1", "cluster.schedule=1f1b", "train.recompute=true",
                                     "train.threads=3", "train.out_dir=elsewhere", "train.checkpoint_every=5",
                                     "transport.connections=4", "cluster.heartbeat_s=2", "train.eval_every=0"}),
                             "dir")
                  .ok());
  // An explicit stage_layers equal to the even split is the same layout.
  EXPECT_TRUE(CheckResumable(Config({"cluster.stages=2"}).as_json,
                             Config({"cluster.stages=2", "cluster.stage_layers=[2,2]"}), "dir")
                  .ok());
}

// Every key of the table is compared by its rule, so a new key cannot be forgotten.
TEST(ResumeCheck, EveryKeyIsComparedByItsRule) {
  const JobConfig now = Config();
  for (const ConfigKey& k : ConfigKeys()) {
    nlohmann::json then = now.as_json;
    then[k.section][k.key] = "some other value";
    absl::Status s = CheckResumable(then, now, "dir");
    if (k.resume == ResumeRule::kFree) {
      EXPECT_TRUE(s.ok()) << k.name() << ": " << s;
    } else {
      EXPECT_NE(s.message().find(k.name() + " = \"some other value\""), std::string::npos) << k.name() << ": " << s;
      EXPECT_EQ(s.message().find("layout change") != std::string::npos, k.resume == ResumeRule::kLayout) << s;
    }
  }
}

// What checkpoints recorded before the key table: every other key counts at its default.
TEST(ResumeCheck, KeysAnOldCheckpointLacksCountAtTheirDefaults) {
  const nlohmann::json old = {
      {"model",
       {{"vocab_size", 256}, {"max_seq_len", 256}, {"n_layer", 4}, {"n_head", 4}, {"d_model", 256}, {"tied_head", false},
        {"attention", "causal"}}},
      {"data", {{"source", "builtin"}, {"path", ""}, {"seed", 1}}},
      {"train", {{"seq_len", 64}, {"micro_batch_size", 8}, {"micro_batches", 1}, {"seed", 1}, {"steps", 200}}},
      {"cluster", {{"stages", 2}, {"replicas", 1}, {"ps", "sharded"}}}};
  EXPECT_TRUE(CheckResumable(old, Config({"cluster.stages=2"}), "dir").ok())
      << "stage_layers' default resolves with the checkpoint's own stages and n_layer";
  const std::string e = Error(old, Config({"cluster.stages=2", "data.alphabet=12"}));
  EXPECT_NE(e.find("data.alphabet = 24 (not recorded: the checkpoint predates this key; taken as its default), the "
                   "config has 12"),
            std::string::npos)
      << e;
}

// The check reads state.json alone, before any tensor: a mismatch is reported even when the
// tensor files are gone.
TEST(ResumeCheck, ChecksTheStateFileBeforeAnyTensor) {
  const fs::path root = fs::path(::testing::TempDir()) / ("resume_check_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const JobConfig then = Config({"data.order=3"});
  ModelConfig m;
  m.vocab_size = 8, m.max_seq_len = 4, m.n_layer = 1, m.n_head = 1, m.d_model = 4;
  ParamLayout layout(m, StageSpec::Whole(m));
  std::vector<float> p(layout.total());
  ASSERT_TRUE(SaveCheckpoint(root.string(), {7, then.as_json}, layout, p.data(), nullptr, nullptr).ok());
  const std::string dir = (root / CheckpointName(7)).string();
  fs::remove(fs::path(dir) / "model.safetensors");
  absl::Status s = CheckCheckpointResumable(dir, Config());
  EXPECT_NE(s.message().find("data.order = 3, the config has 2"), std::string::npos) << s;
  EXPECT_TRUE(CheckCheckpointResumable(dir, then).ok());
}

TEST(ResumeCheck, AConfigThatPinsNoCutResumesWithTheCheckpointsCut) {
  const fs::path root = fs::path(::testing::TempDir()) / ("resume_cut_" + std::to_string(::getpid()));
  fs::remove_all(root);
  // The coordinator's search cut 4 blocks as [3, 1]; the user's config says nothing of a cut.
  const JobConfig searched = Config({"cluster.stages=2", "cluster.stage_layers=[3, 1]"});
  ModelConfig m;
  m.vocab_size = 8, m.max_seq_len = 4, m.n_layer = 1, m.n_head = 1, m.d_model = 4;
  ParamLayout layout(m, StageSpec::Whole(m));
  std::vector<float> p(layout.total());
  ASSERT_TRUE(SaveCheckpoint(root.string(), {7, searched.as_json}, layout, p.data(), nullptr, nullptr).ok());
  const std::string dir = (root / CheckpointName(7)).string();
  const absl::StatusOr<JobConfig> adopted = WithCheckpointCut(dir, Config({"cluster.stages=2"}));
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->Cut(), (std::vector<int>{3, 1}));
  EXPECT_TRUE(CheckCheckpointResumable(dir, *adopted).ok());
  // A cut the config pins stands, and resumes: each stage reads its tensors by name.
  const absl::StatusOr<JobConfig> pinned = WithCheckpointCut(dir, Config({"cluster.stages=2", "cluster.stage_layers=[2, 2]"}));
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(pinned->Cut(), (std::vector<int>{2, 2}));
  EXPECT_TRUE(CheckCheckpointResumable(dir, *pinned).ok());
  EXPECT_TRUE(CheckCheckpointResumable(dir, Config({"cluster.stages=3"})).ok());
  // The replicas set the global batch's split and the shards: they stay.
  EXPECT_NE(CheckCheckpointResumable(dir, Config({"cluster.stages=2", "cluster.replicas=2"})).message().find(
                "cluster.replicas = 1, the config has 2"),
            std::string::npos);
}

}  // namespace
}  // namespace longhaul
