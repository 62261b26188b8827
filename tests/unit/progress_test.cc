// How far the running plan has come: an iteration completes once every worker reported it, each
// once; a complete one takes no more reports; a rollback to the last checkpoint counts what it
// redoes, and a new version forgets the reports of what it redoes.
#include "coordinator/progress.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace longhaul {
namespace {

proto::IterationReport Report(int worker, int64_t it) {
  proto::IterationReport r;
  r.set_worker_id(worker);
  r.set_iteration(it);
  return r;
}

TEST(Progress, AnIterationCompletesOnceEveryWorkerReportedItOnce) {
  Progress p(0, "", 10);
  EXPECT_FALSE(*p.Add(Report(0, 0), 2));
  EXPECT_EQ(p.Add(Report(0, 0), 2).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(*p.Add(Report(0, 1), 2));  // a worker runs ahead
  EXPECT_TRUE(*p.Add(Report(1, 0), 2));
  const std::map<int, proto::IterationReport> done = p.Complete(0);
  EXPECT_EQ(done.size(), 2u);
  EXPECT_EQ(p.completed_through(), 0);
  const absl::Status late = p.CheckNew(1, 0);
  EXPECT_EQ(late.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(late.message().find("iteration 1 is complete"), std::string::npos);
  EXPECT_TRUE(p.CheckNew(1, 1).ok());
}

TEST(Progress, ARollbackCountsWhatItRedoesAndTheNewVersionForgetsIt) {
  Progress p(0, "", 10);
  for (int64_t it = 0; it < 4; ++it) {
    ASSERT_FALSE(*p.Add(Report(0, it), 2));
    if (it < 3) {
      ASSERT_TRUE(*p.Add(Report(1, it), 2));
      p.Complete(it);
    }
  }
  // Iterations 0-2 complete, 3 under way; the last checkpoint is step 2.
  EXPECT_EQ(p.Rollback(2, "step_00000002"), 4);
  EXPECT_EQ(p.redone(), 2);
  EXPECT_EQ(p.start(), 2);
  EXPECT_EQ(p.resume_name(), "step_00000002");
  p.Restart();
  EXPECT_EQ(p.completed_through(), 1);
  EXPECT_TRUE(p.CheckNew(0, 3).ok());  // worker 0's report of iteration 3 was forgotten
  EXPECT_TRUE(p.CheckNew(0, 2).ok());
  EXPECT_EQ(p.Rollback(2, "step_00000002"), 2);  // nothing begun since: nothing more to redo
  EXPECT_EQ(p.redone(), 2);
}

}  // namespace
}  // namespace longhaul
