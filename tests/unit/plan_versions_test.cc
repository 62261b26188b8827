// The plan versions: the running plan and the few before it are found by version, older ones not;
// each slot's worker follows the running plan; a plan sent to a worker carries the run directory's
// identity.
#include "coordinator/plan_versions.h"

#include <gtest/gtest.h>

namespace longhaul {
namespace {

proto::Plan Plan(uint64_t version, int stages, const std::vector<int>& worker_of_slot) {
  proto::Plan p;
  p.set_version(version);
  p.set_stages(stages);
  for (size_t k = 0; k < worker_of_slot.size(); ++k) {
    if (worker_of_slot[k] < 0) continue;
    proto::Assignment* a = p.add_assignments();
    a->set_worker_id(worker_of_slot[k]);
    a->set_stage(static_cast<int>(k) % stages);
    a->set_replica(static_cast<int>(k) / stages);
  }
  return p;
}

TEST(PlanVersions, TheNewestFewAreKeptAndTheSlotsFollowTheRunningOne) {
  PlanVersions plans(4, "token");
  EXPECT_EQ(plans.version(), 0u);
  EXPECT_EQ(plans.Find(0), nullptr);
  plans.Adopt(Plan(1, 2, {0, 1, 2, 3}));
  EXPECT_EQ(plans.worker_of_slot(), (std::vector<int>{0, 1, 2, 3}));
  plans.Adopt(Plan(2, 2, {4, 1, 2, 3}));  // a spare takes worker 0's place
  plans.Adopt(Plan(3, 2, {4, 1, -1, -1}));  // one replica fewer
  EXPECT_EQ(plans.worker_of_slot(), (std::vector<int>{4, 1, -1, -1}));
  for (uint64_t v = 4; v <= 6; ++v) plans.Adopt(Plan(v, 2, {4, 1, 2, 3}));
  EXPECT_EQ(plans.Find(2), nullptr);
  for (uint64_t v = 3; v <= 6; ++v) {
    ASSERT_NE(plans.Find(v), nullptr) << v;
    EXPECT_EQ(plans.Find(v)->version(), v);
  }
  EXPECT_EQ(plans.Find(3)->assignments_size(), 2);
  EXPECT_EQ(plans.current().version(), 6u);
  EXPECT_EQ(plans.ToSend().run_dir_token(), "token");
  EXPECT_EQ(plans.current().run_dir_token(), "");  // kept without it: the job state holds no token
}

}  // namespace
}  // namespace longhaul
