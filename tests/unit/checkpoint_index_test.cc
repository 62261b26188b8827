// The checkpoint index: a step is complete once its every piece is reported, each once; only then
// does `latest` name it and the steps older than the kept ones go; a rollback forgets the counts of
// the steps it writes again. Shipped files arrive in parts, in order, within their size; fetched
// ones leave in parts.
#include "coordinator/checkpoint_index.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "checkpoint/safetensors.h"
#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("checkpoint_index_test_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

using CheckpointIndexTest = TempDir;
using FileParts = TempDir;

constexpr CheckpointPieceRoot Shard(int stage, int shard) { return {CheckpointPieceRoot::Kind::kShard, stage, shard}; }

TEST_F(CheckpointIndexTest, AStepIsCompleteOnceEveryPieceIsInAndLatestMovesOnlyThen) {
  CheckpointIndex index((dir / "checkpoints").string(), 0, "");
  for (int64_t step : {5, 10}) fs::create_directories(dir / "checkpoints" / "stage_0_shard_0" / CheckpointName(step));
  EXPECT_FALSE(*index.Add(5, Shard(0, 0), 3));
  EXPECT_FALSE(*index.Add(5, Shard(1, 0), 3));
  EXPECT_EQ(index.Add(5, Shard(1, 0), 3).status().code(), absl::StatusCode::kAlreadyExists);
  // The residuals of job replica 0 are another piece than shard 0's.
  EXPECT_TRUE(*index.Add(5, {CheckpointPieceRoot::Kind::kResidual, 1, 0}, 3));
  EXPECT_EQ(index.latest_step(), 0);
  ASSERT_TRUE(index.Complete(5, 0).ok());
  EXPECT_EQ(index.latest_step(), 5);
  EXPECT_EQ(index.latest_name(), CheckpointName(5));
  EXPECT_EQ(*LatestCheckpoint(index.root()), (dir / "checkpoints" / CheckpointName(5)).string());
  // The completed step's count stays: a second report of its piece is refused.
  EXPECT_EQ(index.Add(5, Shard(0, 0), 3).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(CheckpointIndexTest, ARollbackForgetsTheStepsItWritesAgain) {
  CheckpointIndex index((dir / "checkpoints").string(), 5, CheckpointName(5));
  EXPECT_FALSE(*index.Add(10, Shard(0, 0), 2));
  index.Rewind(5);
  EXPECT_FALSE(*index.Add(10, Shard(0, 0), 2));  // counted anew, not "already reported"
  EXPECT_TRUE(*index.Add(10, Shard(0, 1), 2));
}

TEST_F(CheckpointIndexTest, OlderStepsThanTheKeptOnesGo) {
  const fs::path root = dir / "checkpoints";
  for (int64_t step : {5, 10, 15}) {
    fs::create_directories(root / "stage_0_shard_0" / CheckpointName(step));
    fs::create_directories(root / "stage_1_shard_0" / CheckpointName(step));
  }
  CheckpointIndex index(root.string(), 10, CheckpointName(10));
  EXPECT_FALSE(*index.Add(15, Shard(0, 0), 2));
  EXPECT_TRUE(*index.Add(15, Shard(1, 0), 2));
  const absl::StatusOr<std::string> warning = index.Complete(15, 2);
  ASSERT_TRUE(warning.ok()) << warning.status();
  EXPECT_EQ(*warning, "");
  EXPECT_FALSE(fs::exists(root / "stage_0_shard_0" / CheckpointName(5)));
  EXPECT_TRUE(fs::exists(root / "stage_0_shard_0" / CheckpointName(10)));
  EXPECT_TRUE(fs::exists(root / "stage_1_shard_0" / CheckpointName(15)));
}

TEST_F(FileParts, PartsArriveInOrderWithinTheFile) {
  EXPECT_TRUE(CheckPart(10, 0, 10).ok());
  EXPECT_EQ(CheckPart(10, 5, 6).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPart(10, 11, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPart(uint64_t{1} << 40, 0, kCheckpointChunkBytes + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPart(UINT64_MAX, UINT64_MAX, 1).code(), absl::StatusCode::kInvalidArgument);

  const std::string path = (dir / "a" / "b" / "model.safetensors").string();
  ASSERT_TRUE(ReceivePart(path, 6, 0, "abc").ok());
  EXPECT_FALSE(fs::exists(path));  // not whole yet: a reader finds nothing rather than half
  const absl::Status gap = ReceivePart(path, 6, 4, "ef");
  EXPECT_EQ(gap.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gap.message().find("where 3 bytes of it are here: ship the file from its start"), std::string::npos);
  ASSERT_TRUE(ReceivePart(path, 6, 3, "def").ok());
  EXPECT_EQ(*ReadWholeFile(path), "abcdef");

  const absl::StatusOr<FilePart> part = ReadPart(path, 2);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->file_bytes, 6u);
  EXPECT_EQ(part->data, "cdef");
  EXPECT_EQ(ReadPart(path, 7).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReadPart((dir / "none").string(), 0).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace longhaul
