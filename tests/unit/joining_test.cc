// How a worker joins: the first plan places the first workers once each reported its profile,
// a later one waits as a spare, and a plan a worker receives carries the run directory's token.
#include "coordinator/joining.h"

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

using Joining = testing::CoordinatorJob;

TEST_F(Joining, TheFirstPlanPlacesTheFirstWorkersOnceEachReportedItsProfile) {
  EXPECT_EQ(Join(), 0);
  EXPECT_EQ(Plan().version(), 0u);
  EXPECT_EQ(Join(), 1);
  const proto::Plan plan = Plan();
  ASSERT_EQ(plan.version(), 1u);
  EXPECT_EQ(WorkerAt(plan, 0, 0), 0);
  EXPECT_EQ(WorkerAt(plan, 1, 0), 1);
  EXPECT_EQ(Join(), 2);  // a spare
  absl::MutexLock lock(&job->mu);
  proto::PlanRequest req;
  req.set_worker_id(1);
  proto::Plan sent;
  ASSERT_TRUE(PlanFor(*job, req, sent).ok());
  EXPECT_EQ(sent.run_dir_token(), "token");
  EXPECT_EQ(job->Spares(), std::vector<int>{2});
  EXPECT_TRUE(fs::exists(JobStatePath(dir.string())));
}

}  // namespace
}  // namespace longhaul
