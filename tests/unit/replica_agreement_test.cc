// Replicas of a stage hold the same parameters after each step: a step counts as checked once
// every worker's checksum is in; a difference is named with both replicas and checksums; what a
// rollback redoes is checked again, what a complete checkpoint settles stays counted.
#include "coordinator/replica_agreement.h"

#include <gtest/gtest.h>

namespace longhaul {
namespace {

// Worker w at stage w % 2, replica w / 2, reporting step `it`'s parameters as `crc`.
proto::IterationReport Report(int worker, int64_t it, uint32_t crc) {
  proto::IterationReport r;
  r.set_worker_id(worker);
  r.set_stage(worker % 2);
  r.set_replica(worker / 2);
  proto::ParamsCrc* p = r.add_params();
  p->set_iteration(it);
  p->set_crc32c(crc);
  return r;
}

TEST(ReplicaAgreement, AStepIsCheckedOnceEveryWorkersChecksumIsIn) {
  ReplicaAgreement a;
  EXPECT_FALSE(a.LastReported(0));
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(a.checked(), 0);
    EXPECT_FALSE(a.Add(Report(w, 0, 100 + w % 2), 2, 2, 4));
  }
  EXPECT_EQ(a.checked(), 1);
  EXPECT_EQ(*a.LastReported(3), 0);
}

TEST(ReplicaAgreement, ADifferenceNamesBothReplicas) {
  ReplicaAgreement a;
  EXPECT_FALSE(a.Add(Report(1, 4, 0xabc), 2, 2, 4));
  const std::optional<std::string> d = a.Add(Report(3, 4, 0xdef), 2, 2, 4);
  ASSERT_TRUE(d);
  EXPECT_NE(d->find("after iteration 5, replica 0 of stage 1 holds parameters with CRC-32C 00000abc and replica 1 "
                    "00000def"),
            std::string::npos)
      << *d;
}

TEST(ReplicaAgreement, ARollbackChecksAgainWhatItRedoesAndASettledStepStays) {
  ReplicaAgreement a;
  for (int64_t it = 0; it < 4; ++it)
    for (int w = 0; w < 4; ++w) a.Add(Report(w, it, 7), 2, 2, 4);
  EXPECT_EQ(a.checked(), 4);
  a.Settle(2);  // a checkpoint at step 2: iterations 0 and 1 stay counted
  a.Rewind(3);  // a version from step 3 redoes iteration 3
  EXPECT_EQ(a.checked(), 3);
  EXPECT_FALSE(a.LastReported(0));
  // One replica alone checks nothing.
  ReplicaAgreement one;
  one.Add(Report(0, 0, 7), 2, 1, 2);
  one.Add(Report(1, 0, 7), 2, 1, 2);
  EXPECT_EQ(one.checked(), 0);
}

}  // namespace
}  // namespace longhaul
