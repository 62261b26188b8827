// What the coordinator takes from the workers: an iteration completes once every worker
// reported it, a checkpoint once every shard is in (each piece once); a placed worker's early
// "done" is refused and its failure stops the job, naming the last intact checkpoint where the
// failure is the resumed one's.
#include "coordinator/reports.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

#include "checkpoint/checkpoint.h"
#include "coordinator/supervisor.h"
#include "tests/support/coordinator_job.h"
#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

using Reports = testing::CoordinatorJob;

TEST_F(Reports, IterationsAndCheckpointsCompleteOnceEveryWorkerReported) {
  Join(), Join();
  ASSERT_TRUE(ReportIteration(0, 0).ok());
  {
    absl::MutexLock lock(&job->mu);
    EXPECT_EQ(job->progress.completed_through(), -1);
  }
  EXPECT_EQ(ReportIteration(0, 0).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(ReportIteration(1, 0).ok());
  ASSERT_TRUE(ReportIteration(0, 1).ok());
  ASSERT_TRUE(ReportIteration(1, 1).ok());
  ASSERT_EQ(ReportCheckpoint(0, 2), absl::OkStatus());
  {
    absl::MutexLock lock(&job->mu);
    EXPECT_EQ(job->progress.completed_through(), 1);
    EXPECT_EQ(job->checkpoints.latest_step(), 0);  // stage 1's shard is not in yet
  }
  ASSERT_EQ(ReportCheckpoint(1, 2), absl::OkStatus());
  EXPECT_EQ(ReportCheckpoint(1, 2).code(), absl::StatusCode::kInvalidArgument);  // already reported
  absl::MutexLock lock(&job->mu);
  EXPECT_EQ(job->checkpoints.latest_step(), 2);
  EXPECT_EQ(*ReadWholeFile((dir / "checkpoints" / "latest").string()), CheckpointName(2) + "\n");
}

TEST_F(Reports, APlacedWorkersEarlyDoneIsRefusedAndItsFailureStopsTheJob) {
  Join(), Join();
  absl::MutexLock lock(&job->mu);
  proto::DoneReport done;
  done.set_worker_id(0);
  done.set_ok(true);
  EXPECT_EQ(TakeDone(*job, done).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(job->abort.empty());
  done.set_ok(false);
  done.set_error("out of memory");
  ASSERT_TRUE(TakeDone(*job, done).ok());
  EXPECT_EQ(job->abort, "worker 0 failed: out of memory");
}

// A worker that failed to bring in the checkpoint its plan resumes from stops the job; once it
// ended, the stop reason names the last intact checkpoint, where the one resumed from is broken.
TEST_F(Reports, AFailureInTheResumedCheckpointNamesTheLastIntactOne) {
  const std::string root = (dir / "checkpoints").string();
  const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
  const std::vector<float> params(whole.total(), 0.5f);
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(SaveCheckpoint(root, {step, EffectiveConfigJson(cfg_)}, whole, params.data(), nullptr, nullptr).ok());
  }
  fs::resize_file(dir / "checkpoints" / "step_00000002" / "model.safetensors", 10);
  Start(2, "step_00000002");
  Join(), Join();
  EXPECT_EQ(Plan().resume_checkpoint(), "step_00000002");
  {
    absl::MutexLock lock(&job->mu);
    proto::DoneReport done;
    done.set_worker_id(0);
    done.set_ok(false);
    done.set_error("model.safetensors is truncated");
    done.set_resumed_checkpoint("step_00000001");  // not the plan's: no name taken from it
    ASSERT_TRUE(TakeDone(*job, done).ok());
    EXPECT_TRUE(job->failed_checkpoint.empty());
    job->abort.clear();
    done.set_resumed_checkpoint("step_00000002");
    ASSERT_TRUE(TakeDone(*job, done).ok());
    EXPECT_EQ(job->failed_checkpoint, "step_00000002");
    done.set_worker_id(1);
    ASSERT_TRUE(TakeDone(*job, done).ok());
  }
  const absl::Status stopped = Supervise(*job);
  const std::string latest = (dir / "checkpoints" / "latest").string();
  EXPECT_EQ(stopped.message(), "worker 0 failed: model.safetensors is truncated; step_00000002 is broken, the last "
                               "intact checkpoint is step_00000001: write step_00000001 into " +
                                   latest + ", then resume with --set train.resume=true");
  std::ifstream summary(dir / "summary.json");
  EXPECT_EQ(nlohmann::json::parse(summary)["reason"].get<std::string>(), stopped.message());
}

}  // namespace
}  // namespace longhaul
