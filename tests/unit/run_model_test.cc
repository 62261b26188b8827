// A run's whole model from its checkpoints, whatever layout wrote them: a one-process run's single
// file, or a 2-stage, 2-replica cluster's four parameter-server shards, give the same tensors
// bitwise; a stage of another cut reads its tensors from the shards that hold them; a missing
// shard, a corrupt file or an unknown step is named with the fix.
#include "checkpoint/run_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "config/job_config.h"
#include "model/param_layout.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

class RunModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.model.vocab_size = 256, cfg_.model.max_seq_len = 8, cfg_.model.n_layer = 3, cfg_.model.n_head = 2;
    cfg_.model.d_model = 8;
    cfg_.train.seq_len = 8;
    cfg_.cluster.stages = 2, cfg_.cluster.replicas = 2;
    run_ = fs::path(::testing::TempDir()) / ("run_model_" + std::to_string(::getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(run_);
    const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
    params_.resize(whole.total());
    for (size_t i = 0; i < params_.size(); ++i) params_[i] = 0.25f * static_cast<float>(i) - 3.0f;
  }

  // Every stage's shards, as the workers of a 2 x 2 cluster write them at `step`.
  void WriteCluster(int64_t step) {
    const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
    const std::string root = (run_ / "checkpoints").string();
    for (int s = 0; s < cfg_.cluster.stages; ++s) {
      const ParamLayout stage(cfg_.model, cfg_.Stage(s));
      std::vector<float> stage_params(stage.total());
      for (const ParamTensor& t : stage.tensors()) {
        const ParamTensor& w = whole.tensors()[whole.Find(t.name)];
        std::copy_n(params_.begin() + w.offset, t.size, stage_params.begin() + t.offset);
      }
      int k = 0;
      for (const auto& [first, end] : stage.SplitIntoShards(cfg_.cluster.replicas)) {
        const ParamLayout shard = stage.Slice(first, end);
        ASSERT_TRUE(SaveCheckpoint(ShardCheckpointRoot(root, s, k++), {step, EffectiveConfigJson(cfg_)}, shard,
                                   stage_params.data() + stage.Range(first, end).first, nullptr, nullptr)
                        .ok());
      }
    }
    ASSERT_TRUE(SetLatestCheckpoint(root, step).ok());
  }

  JobConfig cfg_;
  fs::path run_;
  std::vector<float> params_;
};

TEST_F(RunModelTest, AClustersShardsMakeTheWholeModel) {
  WriteCluster(40);
  const absl::StatusOr<RunModel> m = LoadRunModel(run_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 40);
  EXPECT_EQ(m->checkpoint, "step_00000040");
  EXPECT_EQ(m->model.n_layer, 3);
  EXPECT_EQ(m->params, params_);
}

TEST_F(RunModelTest, AOneProcessRunsCheckpointIsTheWholeModel) {
  const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
  const std::string root = (run_ / "checkpoints").string();
  ASSERT_TRUE(SaveCheckpoint(root, {7, EffectiveConfigJson(cfg_)}, whole, params_.data(), nullptr, nullptr).ok());
  ASSERT_TRUE(SaveCheckpoint(root, {9, EffectiveConfigJson(cfg_)}, whole, params_.data(), nullptr, nullptr).ok());
  for (const std::string& dir : {run_.string(), root}) {
    const absl::StatusOr<RunModel> m = LoadRunModel(dir, 7);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->step, 7);
    EXPECT_EQ(m->params, params_);
  }
  EXPECT_EQ(LoadRunModel(run_.string())->step, 9) << "the newest by default";
  const absl::Status s = LoadRunModel(run_.string(), 8).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no checkpoint step_00000008"), std::string::npos) << s;
}

TEST_F(RunModelTest, AMissingShardOrACorruptFileIsNamedAndAnotherLayoutsDirectoryIgnored) {
  WriteCluster(40);
  const fs::path shard = run_ / "checkpoints" / "stage_1_shard_1";
  fs::rename(shard, run_ / "elsewhere");
  absl::Status s = LoadRunModel(run_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  for (const char* part : {"lacks", "lm_head.weight", "copy every shard's directory into one"})
    EXPECT_NE(s.message().find(part), std::string::npos) << part << "\n" << s;
  fs::rename(run_ / "elsewhere", shard);
  // A shard directory of another layout (left from before a re-cut) is no piece of this step.
  fs::copy(run_ / "checkpoints" / "stage_0_shard_0", run_ / "checkpoints" / "stage_2_shard_0",
           fs::copy_options::recursive);
  fs::resize_file(run_ / "checkpoints" / "stage_2_shard_0" / "step_00000040" / "model.safetensors", 10);
  const absl::StatusOr<RunModel> m = LoadRunModel(run_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->params, params_);
  // A corrupt file is caught by its CRC-32 before anything is read from it.
  const fs::path file = run_ / "checkpoints" / "stage_0_shard_0" / "step_00000040" / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 4);
  s = LoadRunModel(run_.string()).status();
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
}

// The last intact checkpoint before a broken one: the newest older step whose every shard the
// recorded layout names is there, and whose every piece's files (a residual's too) are as their
// state.json records; none where no older step is.
TEST_F(RunModelTest, TheLastIntactCheckpointIsTheNewestOlderWholeStep) {
  for (int64_t step : {10, 20, 30, 40}) WriteCluster(step);
  const std::string root = (run_ / "checkpoints").string();
  const ParamLayout stage0(cfg_.model, cfg_.Stage(0));
  const std::vector<float> residuals(stage0.total(), 0.5f);
  for (int64_t step : {10, 20, 30, 40}) {
    ASSERT_TRUE(SaveCheckpoint(ResidualCheckpointRoot(root, 0, 1), {step, EffectiveConfigJson(cfg_)}, stage0,
                               residuals.data(), nullptr, nullptr)
                    .ok());
  }
  for (int64_t step : {10, 20, 30, 40}) EXPECT_TRUE(VerifyCheckpointStep(root, CheckpointName(step)).ok()) << step;
  auto file = [&](const std::string& piece, int64_t step) {
    return run_ / "checkpoints" / piece / CheckpointName(step) / "model.safetensors";
  };
  fs::resize_file(file("stage_1_shard_0", 40), 10);
  absl::Status s = VerifyCheckpointStep(root, "step_00000040");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(file("stage_1_shard_0", 40).string() + " is truncated"), std::string::npos) << s;
  // Step 30's residuals are corrupt, step 20 lacks a shard: step 10 is the one to go back to.
  std::fstream(file("residual_stage_0_replica_1", 30), std::ios::in | std::ios::out | std::ios::binary).put('\x7f');
  fs::remove_all(run_ / "checkpoints" / "stage_1_shard_1" / "step_00000020");
  EXPECT_FALSE(VerifyCheckpointStep(root, "step_00000030").ok());
  EXPECT_FALSE(VerifyCheckpointStep(root, "step_00000020").ok());
  absl::StatusOr<std::string> intact = LastIntactCheckpoint(root, 40);
  ASSERT_TRUE(intact.ok()) << intact.status();
  EXPECT_EQ(*intact, "step_00000010");
  EXPECT_EQ(LastIntactCheckpoint(root, 10).status().code(), absl::StatusCode::kNotFound);
  // A one-process run's steps are under the checkpoints directory itself.
  const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
  const std::string own = (run_ / "own").string();
  for (int64_t step : {7, 9})
    ASSERT_TRUE(SaveCheckpoint(own, {step, EffectiveConfigJson(cfg_)}, whole, params_.data(), nullptr, nullptr).ok());
  intact = LastIntactCheckpoint(own, 9);
  ASSERT_TRUE(intact.ok()) << intact.status();
  EXPECT_EQ(*intact, "step_00000007");
}

// The cluster's 2 stages cut 3 blocks [2, 1]; a 3-stage cut [1, 1, 1] reads each of its stages'
// tensors from whichever shards hold them, bitwise.
TEST_F(RunModelTest, AStageOfAnotherCutReadsItsTensorsFromTheShardsThatHoldThem) {
  WriteCluster(40);
  const std::string root = (run_ / "checkpoints").string();
  const absl::StatusOr<std::vector<CheckpointPiece>> pieces = CheckpointPieces(root, "step_00000040");
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 4u);
  const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
  JobConfig recut = cfg_;
  recut.cluster.stages = 3;
  for (int s = 0; s < 3; ++s) {
    const ParamLayout stage(cfg_.model, recut.Stage(s));
    std::vector<float> got(stage.total(), -1.0f), want(stage.total());
    for (const ParamTensor& t : stage.tensors())
      std::copy_n(params_.begin() + whole.tensors()[whole.Find(t.name)].offset, t.size, want.begin() + t.offset);
    ASSERT_TRUE(LoadFromPieces(*pieces, stage, got.data(), nullptr, nullptr).ok());
    EXPECT_EQ(got, want) << "stage " << s;
  }
  // A model the checkpoint was not written for is named.
  JobConfig wider = cfg_;
  wider.model.n_layer = 4;
  std::vector<float> buf(ParamLayout(wider.model, StageSpec::Whole(wider.model)).total());
  const absl::Status s =
      LoadFromPieces(*pieces, ParamLayout(wider.model, StageSpec::Whole(wider.model)), buf.data(), nullptr, nullptr);
  EXPECT_NE(s.message().find("holds no tensor h.3."), std::string::npos) << s;
}

}  // namespace
}  // namespace longhaul
