// The supervisor ends a finished job with its records written and its job state removed.
#include "coordinator/supervisor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/synchronization/mutex.h"

#include "checkpoint/checkpoint.h"
#include "tests/support/coordinator_job.h"
#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

using Supervisor = testing::CoordinatorJob;

TEST_F(Supervisor, TheSupervisorEndsAFinishedJobWithItsRecords) {
  Join(), Join();
  Run(0, 4);
  {
    absl::MutexLock lock(&job->mu);
    EXPECT_TRUE(job->finished);
    for (int id : {0, 1}) {
      proto::DoneReport done;
      done.set_worker_id(id);
      done.set_ok(true);
      ASSERT_TRUE(TakeDone(*job, done).ok());
    }
  }
  ASSERT_TRUE(Supervise(*job).ok());
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
  EXPECT_FALSE(fs::exists(JobStatePath(dir.string())));  // a coordinator started here starts anew
}

}  // namespace
}  // namespace longhaul
