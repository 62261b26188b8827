// The job's shared transitions: a new plan version goes back to the last complete checkpoint and
// forgets what it redoes (reports, checkpoint counts, the start barrier), counts the iterations
// redone, and writes the job state of its version; a stop is said once, with its reason.
#include "coordinator/job.h"

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

#include "coordinator/planning.h"
#include "tests/support/coordinator_job.h"

namespace longhaul {
namespace {

using JobTransitions = testing::CoordinatorJob;

TEST_F(JobTransitions, ANewVersionGoesBackToTheLastCheckpointAndForgetsWhatItRedoes) {
  Join(), Join();
  Run(0, 2);  // iterations 0 and 1 complete, step 2's checkpoint complete
  ASSERT_TRUE(ReportIteration(0, 2).ok());
  ASSERT_TRUE(ReportIteration(1, 2).ok());
  ASSERT_TRUE(ReportIteration(0, 3).ok());  // iteration 4 under way
  {
    absl::MutexLock lock(&job->mu);
    job->ready.insert(0);
    const int64_t reached = job->Rollback();
    EXPECT_EQ(reached, 4);
    EXPECT_EQ(job->progress.start(), 2);
    const PlanRequest from{job->progress.start(), job->progress.resume_name(), job->progress.end()};
    job->Adopt(NextPlan(job->plans.current(), {}, job->members.registrations(), from), reached, "a test", {});
    EXPECT_EQ(job->plans.version(), 2u);
    EXPECT_EQ(job->plans.current().start_iteration(), 2);
    EXPECT_EQ(job->progress.completed_through(), 1);
    EXPECT_EQ(job->progress.redone(), 2);
    EXPECT_TRUE(job->progress.CheckNew(0, 3).ok());  // worker 0's report of iteration 4 was forgotten
    EXPECT_TRUE(job->ready.empty());
    EXPECT_TRUE(job->abort.empty());
  }
  // The redone iteration is taken again, and the job state holds the new version.
  for (int w : {0, 1}) ASSERT_TRUE(ReportIteration(w, 2).ok());
  absl::MutexLock lock(&job->mu);
  EXPECT_EQ(job->progress.completed_through(), 2);
  job->store.Flush();  // the state is written on a thread of its own
  const absl::StatusOr<RestoredJob> state = ReadJobState(JobStatePath(dir.string()), job->cfg);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->state.plan().version(), 2u);
  EXPECT_EQ(state->state.redone_iterations(), 2);
}

TEST_F(JobTransitions, AStopIsSaidOnceWithItsReason) {
  Join(), Join();
  absl::MutexLock lock(&job->mu);
  job->Abort("a test's reason");
  EXPECT_EQ(job->abort, "a test's reason");
  EXPECT_NE(job->ResumeAdvice().find("start the job again from the beginning"), std::string::npos);
}

}  // namespace
}  // namespace longhaul
