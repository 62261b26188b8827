// The recovery transitions: a lost worker's place goes to a spare in a new version from the last
// checkpoint; a version that failed with every worker alive starts again.
#include "coordinator/recovery.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/synchronization/mutex.h"

#include "checkpoint/checkpoint.h"
#include "coordinator/supervisor.h"
#include "tests/support/coordinator_job.h"
#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

using Recovery = testing::CoordinatorJob;

TEST_F(Recovery, ALostWorkersPlaceGoesToASpareFromTheLastCheckpoint) {
  Join(), Join(), Join();
  Run(0, 2);
  ASSERT_TRUE(ReportIteration(0, 2).ok());  // iteration 3 under way
  absl::MutexLock lock(&job->mu);
  LoseWorker(*job, {.id = 1, .silent_s = 20});
  EXPECT_EQ(job->recovery.vacant.size(), 1u);
  FillVacancies(*job);
  const proto::Plan& plan = job->plans.current();
  EXPECT_EQ(plan.version(), 2u);
  EXPECT_EQ(WorkerAt(plan, 1, 0), 2);
  EXPECT_EQ(plan.start_iteration(), 2);
  EXPECT_EQ(job->progress.redone(), 1);
  EXPECT_TRUE(job->recovery.vacant.empty());
  ASSERT_EQ(job->recovery.events.size(), 1u);
  const nlohmann::json& event = job->recovery.events[0];
  EXPECT_EQ(event["worker"], 1);
  EXPECT_EQ(event["spare"], 2);
  EXPECT_EQ(event["new_plan_version"], 2);
  EXPECT_EQ(event["rollback_to_step"], 2);
  EXPECT_EQ(job->members.Check(1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(Recovery, AVersionThatFailedWithEveryWorkerAliveStartsAgain) {
  Join(), Join();
  {
    absl::MutexLock lock(&job->mu);
    proto::SuspectReport suspect;
    suspect.set_worker_id(1);
    suspect.set_plan_version(1);
    suspect.set_stage(0);
    suspect.set_failure("connection reset by peer");
    ASSERT_TRUE(TakeSuspect(*job, suspect).ok());
    ASSERT_TRUE(job->recovery.restart);
  }
  // Every worker is heard from a heartbeat period after the report: nobody died.
  std::this_thread::sleep_for(kRestartGrace + std::chrono::milliseconds(20));
  absl::MutexLock lock(&job->mu);
  for (int id : {0, 1}) {
    proto::HeartbeatRequest hb;
    hb.set_worker_id(id);
    proto::HeartbeatReply reply;
    ASSERT_TRUE(Heartbeat(*job, hb, reply).ok());
  }
  MaybeRestart(*job);
  EXPECT_EQ(job->plans.version(), 2u);
  EXPECT_EQ(WorkerAt(job->plans.current(), 1, 0), 1);
  EXPECT_FALSE(job->recovery.restart);
  EXPECT_EQ(job->recovery.events[0]["restart"], true);
  EXPECT_EQ(job->recovery.events[0]["reporter"], 1);
}

}  // namespace
}  // namespace longhaul
