// The stage a worker runs across plan versions: kept for a version that leaves it as it was and
// sets every parameter from a checkpoint, else rebuilt; a spare's warm stage taken for its key and
// the others let go, at once or in the background; a snapshot of pulled parameters set back only
// for its own step, and forgotten with a stage not kept.
#include "worker/stage_keeper.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/status/statusor.h"

#include "config/job_config.h"

namespace longhaul {
namespace {

StageRequest Request() {
  auto cfg = ParseJobConfig("[model]\nn_layer = 2\nd_model = 16\nn_head = 2\nvocab_size = 256\nmax_seq_len = 8\n"
                            "[train]\nseq_len = 8\nmicro_batch_size = 1\n",
                            "job.toml");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return StageRequestFor(*cfg, 0, -1, 1);
}

std::unique_ptr<Stage> Made() {
  absl::StatusOr<std::unique_ptr<Stage>> stage = MakeStage(Request());
  EXPECT_TRUE(stage.ok()) << stage.status();
  return *std::move(stage);
}

std::vector<float> ParamsOf(Stage& stage) {
  const absl::StatusOr<const float*> params = stage.Params();
  EXPECT_TRUE(params.ok()) << params.status();
  return std::vector<float>(*params, *params + stage.num_params());
}

// Which stage is which: every parameter set to `mark` (a freed stage's address may be reused).
void Mark(Stage& stage, float mark) {
  const std::vector<float> marks(stage.num_params(), mark);
  ASSERT_TRUE(stage.SetParams(0, marks.data(), marks.size()).ok());
}
bool Marked(Stage& stage, float mark) { return ParamsOf(stage) == std::vector<float>(stage.num_params(), mark); }

TEST(StageKeeper, KeepsTheStageForItsKeyWhereReused) {
  StageKeeper keeper;
  EXPECT_EQ(keeper.stage(), nullptr);
  const std::string key = StageKeeper::Key(0, -1, 1, "config");
  absl::StatusOr<bool> kept = keeper.Take(key, true, Request(), false);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(*kept);  // none held yet: made
  ASSERT_NE(keeper.stage(), nullptr);
  Mark(*keeper.stage(), 0.5f);
  kept = keeper.Take(key, true, Request(), false);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(*kept);
  EXPECT_TRUE(Marked(*keeper.stage(), 0.5f));
  // Not reused (a start from the initial parameters, local updates), or built for another key.
  kept = keeper.Take(key, false, Request(), false);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(*kept);
  EXPECT_FALSE(Marked(*keeper.stage(), 0.5f));
  Mark(*keeper.stage(), 0.25f);
  kept = keeper.Take(StageKeeper::Key(0, -1, 2, "config"), true, Request(), false);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(*kept);
  EXPECT_FALSE(Marked(*keeper.stage(), 0.25f));
  EXPECT_NE(StageKeeper::Key(0, -1, 1, "config"), StageKeeper::Key(0, -1, 1, "config2"));
}

TEST(StageKeeper, TakesTheWarmStageOfItsKeyAndLetsTheOthersGo) {
  for (bool background : {false, true}) {
    StageKeeper keeper;
    std::unique_ptr<Stage> warm0 = Made(), warm1 = Made();
    Mark(*warm0, 0.25f);
    Mark(*warm1, 0.5f);
    keeper.AddWarm(StageKeeper::Key(0, -1, 1, "config"), std::move(warm0));
    keeper.AddWarm(StageKeeper::Key(1, -1, 1, "config"), std::move(warm1));
    EXPECT_EQ(keeper.warm_stages(), 2u);
    absl::StatusOr<bool> kept = keeper.Take(StageKeeper::Key(1, -1, 1, "config"), true, Request(), background);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_FALSE(*kept);
    EXPECT_TRUE(Marked(*keeper.stage(), 0.5f)) << background;
    EXPECT_EQ(keeper.warm_stages(), 0u) << background;
  }
}

TEST(StageKeeper, AWarmStageServesOnlyAReusedStage) {
  StageKeeper keeper;
  std::unique_ptr<Stage> warm = Made();
  Mark(*warm, 0.5f);
  const std::string key = StageKeeper::Key(0, -1, 1, "config");
  keeper.AddWarm(key, std::move(warm));
  absl::StatusOr<bool> kept = keeper.Take(key, false, Request(), false);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(*kept);
  EXPECT_FALSE(Marked(*keeper.stage(), 0.5f));
  EXPECT_EQ(keeper.warm_stages(), 0u);
}

TEST(StageKeeper, RestoresASnapshotOnlyForItsStepAndWhileTheStageIsKept) {
  StageKeeper keeper;
  const std::string key = StageKeeper::Key(0, -1, 1, "config");
  ASSERT_TRUE(keeper.Take(key, true, Request(), false).ok());
  Stage& stage = *keeper.stage();
  std::vector<float> pulled(stage.num_params());
  for (size_t i = 0; i < pulled.size(); ++i) pulled[i] = 0.001f * static_cast<float>(i % 97);
  keeper.Snapshot(5, pulled.data());
  const std::vector<float> zeros(stage.num_params(), 0.0f);
  ASSERT_TRUE(stage.SetParams(0, zeros.data(), zeros.size()).ok());
  absl::StatusOr<bool> restored = keeper.Restore(4);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_FALSE(*restored);
  EXPECT_EQ(ParamsOf(stage), zeros);
  restored = keeper.Restore(5);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored);
  EXPECT_EQ(ParamsOf(stage), pulled);
  // Kept, the snapshot stays; rebuilt, it goes.
  ASSERT_TRUE(keeper.Take(key, true, Request(), false).ok());
  EXPECT_TRUE(*keeper.Restore(5));
  ASSERT_TRUE(keeper.Take(key, false, Request(), false).ok());
  EXPECT_FALSE(*keeper.Restore(5));
}

}  // namespace
}  // namespace longhaul
