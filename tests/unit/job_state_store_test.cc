// The job state a coordinator leaves for the next one: read back only where it is this job's, of
// this directory, undamaged and placing only workers it records, each refusal naming the fix; the
// first version's state is on disk before the write returns; the run directory's token is made
// once and kept; a closed store removes the state and writes no more.
#include "coordinator/job_state_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "checkpoint/safetensors.h"
#include "coordinator/planning.h"
#include "transport/job_secret.h"
#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

class JobStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("job_state_store_test_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto c = ParseJobConfig("[model]\nn_layer = 2\nd_model = 16\nn_head = 2\n[cluster]\njob_id = \"j\"\nstages = 2\n",
                            "job.toml", {"train.out_dir=\"" + dir.string() + "\""});
    ASSERT_TRUE(c.ok()) << c.status();
    cfg = *c;
  }
  void TearDown() override { fs::remove_all(dir); }

  // A state of version 3 placing workers 0 and 1, both recorded.
  proto::JobState State() const {
    std::map<int, proto::RegisterRequest> workers;
    for (int i = 0; i < 2; ++i) workers[i].set_address("10.0.0.1:700" + std::to_string(i));
    proto::JobState s;
    *s.mutable_plan() = MakePlan(cfg, workers, {0, "", 10}, RegistrationOrder(cfg));
    s.mutable_plan()->set_version(3);
    for (int i = 0; i < 2; ++i) s.add_workers()->set_id(i);
    return s;
  }
  void Write(const proto::JobState& s) const {
    std::ofstream(JobStatePath(dir.string()), std::ios::binary) << s.SerializeAsString();
  }
  absl::Status Read() const { return ReadJobState(JobStatePath(dir.string()), cfg).status(); }
  void ExpectRefused(absl::StatusCode code, const std::string& says) const {
    const absl::Status st = Read();
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  }

  fs::path dir;
  JobConfig cfg;
};

TEST_F(JobStateStoreTest, AStateIsReadBackOnlyWhereItIsThisJobsAndWhole) {
  JobStateStore store(dir.string());
  ASSERT_TRUE(store.Write(State(), "{}\n").ok());
  const absl::StatusOr<RestoredJob> back = ReadJobState(JobStatePath(dir.string()), cfg);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->state.plan().version(), 3u);
  EXPECT_EQ(back->cfg.train.out_dir, cfg.train.out_dir);
  EXPECT_EQ(*ReadWholeFile((dir / "cluster.json").string()), "{}\n");

  std::ofstream(JobStatePath(dir.string()), std::ios::binary) << "not a job state";
  ExpectRefused(absl::StatusCode::kDataLoss, "is damaged: remove it to start the job anew");

  proto::JobState other = State();
  other.mutable_plan()->set_job_id("other");
  Write(other);
  ExpectRefused(absl::StatusCode::kFailedPrecondition, "holds the state of job 'other', not 'j'");

  proto::JobState unrecorded = State();
  unrecorded.mutable_workers()->RemoveLast();
  Write(unrecorded);
  ExpectRefused(absl::StatusCode::kDataLoss, "its plan places worker 1, which it does not record");

  proto::JobState twice = State();
  twice.add_workers()->set_id(0);
  Write(twice);
  ExpectRefused(absl::StatusCode::kDataLoss, "worker 0 recorded twice");

  proto::JobState huge = State();
  huge.mutable_plan()->set_version(uint64_t{1} << 63);
  Write(huge);
  ExpectRefused(absl::StatusCode::kDataLoss, "plan version 9223372036854775808");
}

TEST_F(JobStateStoreTest, AStateCopiedFromAnotherDirectoryIsNotTaken) {
  const fs::path elsewhere = dir / "elsewhere";
  fs::create_directories(elsewhere);
  proto::JobState s = State();
  auto moved = ParseJobConfig(cfg.toml_text, "job.toml", {"train.out_dir=\"" + elsewhere.string() + "\""});
  ASSERT_TRUE(moved.ok());
  s.mutable_plan()->set_config_toml(moved->toml_text);
  Write(s);
  ExpectRefused(absl::StatusCode::kFailedPrecondition, "a run directory copied or moved elsewhere goes on from its "
                                                       "checkpoints");
}

TEST_F(JobStateStoreTest, TheRunDirectorysTokenIsMadeOnceAndAClosedStoreWritesNoMore) {
  const absl::StatusOr<std::string> token = RunDirToken(dir.string());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->size(), 2 * kNonceBytes);
  EXPECT_EQ(*RunDirToken(dir.string()), *token);

  JobStateStore store(dir.string());
  ASSERT_TRUE(store.Write(State(), "{}\n").ok());
  EXPECT_TRUE(fs::exists(JobStatePath(dir.string())));
  store.Close();
  EXPECT_FALSE(fs::exists(JobStatePath(dir.string())));
  EXPECT_TRUE(store.Write(State(), "{}\n").ok());
  EXPECT_FALSE(fs::exists(JobStatePath(dir.string())));
}

}  // namespace
}  // namespace longhaul
