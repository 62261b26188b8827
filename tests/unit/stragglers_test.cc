// The straggler watch: a worker whose compute per micro-batch stays past 1.5x its own at the start,
// or past its stage's other replicas', is reported once until it recovers; noise does not make one.
#include "coordinator/stragglers.h"

#include <gtest/gtest.h>

#include <cmath>

namespace longhaul {
namespace {

// Iteration reports of a 2-stage x 2-replica job, each worker computing `seconds(id)`.
template <typename F>
std::map<int, proto::IterationReport> Reports(F seconds) {
  std::map<int, proto::IterationReport> out;
  for (int id = 0; id < 4; ++id) {
    proto::IterationReport& r = out[id];
    r.set_worker_id(id);
    r.set_stage(id % 2);
    r.set_replica(id / 2);
    r.set_compute_seconds(seconds(id));
  }
  return out;
}

TEST(StragglerWatch, ASlowedWorkerIsReportedOnceAgainstItsStartAndItsPeers) {
  StragglerWatch watch;
  int it = 0;
  // Stage 1 does twice stage 0's work; a few percent of noise everywhere.
  auto normal = [&](int id) { return (id % 2 == 0 ? 0.010 : 0.020) * (1 + 0.05 * std::sin(7.0 * it + id)); };
  for (; it < 50; ++it) EXPECT_TRUE(watch.Add(Reports(normal)).empty()) << "iteration " << it;
  for (const auto& [id, s] : watch.Current()) {
    EXPECT_NEAR(s.vs_start, 1, 0.1) << "worker " << id;
    EXPECT_NEAR(s.vs_peers, 1, 0.1) << "worker " << id << ": compared within its stage only";
  }
  // Worker 3 (stage 1, replica 1) slows to twice its pace: once the median moves (half a window)
  // and it stays slow for a window, it is reported.
  std::vector<std::pair<int, Slowdown>> reported;
  auto slowed = [&](int id) { return normal(id) * (id == 3 ? 2.0 : 1.0); };
  for (int k = 0; k < 40; ++k, ++it)
    for (const auto& r : watch.Add(Reports(slowed))) reported.push_back(r);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].first, 3);
  EXPECT_GT(reported[0].second.worst(), StragglerWatch::kThreshold);
  EXPECT_NEAR(watch.Current().at(3).vs_start, 2, 0.2);
  EXPECT_NEAR(watch.Current().at(3).vs_peers, 2, 0.2);
  EXPECT_NEAR(watch.Current().at(1).vs_peers, 0.5, 0.05) << "its peer, worker 3, is the slow one";
  // Each pace is per micro-batch (one here), the window's median.
  EXPECT_NEAR(watch.Paces().at(0), 0.010, 0.001);
  EXPECT_NEAR(watch.Paces().at(3), 0.040, 0.004);
  // Back to its pace: no longer a straggler; its worst stays on record.
  for (int k = 0; k < 40; ++k, ++it) EXPECT_TRUE(watch.Add(Reports(normal)).empty());
  EXPECT_LT(watch.Current().at(3).worst(), StragglerWatch::kThreshold);
  ASSERT_EQ(watch.worst().size(), 1u);
  EXPECT_NEAR(watch.worst().at(3).vs_start, 2, 0.2);
  EXPECT_FALSE(watch.Quick(3)) << "back to its start's pace is not faster than it";
  // Slowed again: reported again.
  int again = 0;
  for (int k = 0; k < 40; ++k, ++it) again += static_cast<int>(watch.Add(Reports(slowed)).size());
  EXPECT_EQ(again, 1);
}

// A straggler whose blocks moved starts its pace again slow (Restart); once it computes faster
// than 1/1.5 of that start for a window, beyond the others' drift, it is quick; a job-wide
// speed-up makes no one quick.
TEST(StragglerWatch, AWorkerFasterThanItsStartForAWindowIsQuick) {
  StragglerWatch watch;
  int it = 0;
  auto slow = [&](int id) { return (id == 0 ? 0.030 : 0.010) * (1 + 0.05 * std::sin(7.0 * it + id)); };
  for (; it < 30; ++it) watch.Add(Reports(slow));
  auto all_faster = [&](int id) { return slow(id) * 0.6; };
  for (int k = 0; k < 40; ++k, ++it) watch.Add(Reports(all_faster));
  for (int id = 0; id < 4; ++id) EXPECT_FALSE(watch.Quick(id)) << "worker " << id;
  auto fast = [&](int id) { return 0.010 * (1 + 0.05 * std::sin(7.0 * it + id)); };
  int quick_at = -1;
  for (int k = 0; k < 40 && quick_at < 0; ++k, ++it) {
    watch.Add(Reports(fast));
    if (watch.Quick(0)) quick_at = k;
  }
  EXPECT_GE(quick_at, StragglerWatch::kWindow - 1) << "a window of it, after the median moved";
  EXPECT_LT(quick_at, 2 * StragglerWatch::kWindow);
  for (int id = 1; id < 4; ++id) EXPECT_FALSE(watch.Quick(id)) << "worker " << id;
}

TEST(StragglerWatch, AFirstSlowIterationAndShortSpikesMakeNoStraggler) {
  StragglerWatch watch;
  for (int it = 0; it < 200; ++it) {
    // The first iteration is ten times slower (start-up); every tenth a worker spikes 3x, and for
    // 15 iterations in a row one runs at 1.8x.
    auto seconds = [&](int id) {
      return it == 0 ? 0.1 : (it % 10 == id ? 0.03 : (id == 2 && it >= 100 && it < 115 ? 0.018 : 0.01));
    };
    EXPECT_TRUE(watch.Add(Reports(seconds)).empty()) << "iteration " << it;
  }
  EXPECT_TRUE(watch.worst().empty());
}

// Every worker computing twice as slowly as at the start (processes sharing one machine's cores,
// whose contention grows as the pipeline fills) is no straggler; one of them slowing down further
// still is, against the others' drift.
TEST(StragglerWatch, AJobWideSlowdownMakesNoStraggler) {
  StragglerWatch watch;
  for (int it = 0; it < 200; ++it) {
    auto seconds = [&](int id) {
      const double job = it < 40 ? 1 : 2;  // every worker from iteration 40 on
      return 0.01 * job * (id == 1 && it >= 120 ? 2 : 1);
    };
    const auto became = watch.Add(Reports(seconds));
    if (it < 120) {
      EXPECT_TRUE(became.empty()) << "iteration " << it;
    }
  }
  ASSERT_EQ(watch.worst().size(), 1u);
  EXPECT_EQ(watch.worst().begin()->first, 1);
  EXPECT_NEAR(watch.Current().at(1).vs_start, 2, 0.05);
  EXPECT_NEAR(watch.Current().at(0).vs_start, 1, 0.05);
}

// A layout shrunk to one replica (ShrinkPlan) gives workers 0 and 1 both replicas' micro-batches:
// twice the compute per iteration, the same per micro-batch, and no straggler. Workers 2 and 3 left
// the plan and are no one's peers.
TEST(StragglerWatch, MoreMicroBatchesAfterAShrinkMakeNoStragglerAndTheWorkersGoneAreForgotten) {
  StragglerWatch watch;
  auto reports = [](int workers, int micro_batches) {
    std::map<int, proto::IterationReport> out;
    for (int id = 0; id < workers; ++id) {
      proto::IterationReport& r = out[id];
      r.set_stage(id % 2);
      r.set_replica(id / 2);
      r.set_compute_seconds(0.01 * micro_batches);
      for (int m = 0; m < micro_batches; ++m) r.add_micro_batches(r.replica() * micro_batches + m);
    }
    return out;
  };
  for (int it = 0; it < 50; ++it) EXPECT_TRUE(watch.Add(reports(4, 2)).empty());
  for (int it = 0; it < 60; ++it) EXPECT_TRUE(watch.Add(reports(2, 4)).empty()) << "iteration " << it;
  EXPECT_EQ(watch.Current().size(), 2u);
  for (const auto& [id, s] : watch.Current()) EXPECT_NEAR(s.worst(), 1, 1e-9) << "worker " << id;
}

// A pipeline cut anew gives a worker more blocks at the same stage: measured against its start it
// would straggle (worker 1 of two, its work doubled, the other's the same); after Restart its pace
// starts again.
TEST(StragglerWatch, APipelineCutAnewStartsEveryPaceAgain) {
  auto pipeline = [](double stage1) {
    std::map<int, proto::IterationReport> out;
    for (int id = 0; id < 2; ++id) {
      out[id].set_stage(id);
      out[id].set_compute_seconds(id == 0 ? 0.010 : stage1);
    }
    return out;
  };
  StragglerWatch kept, restarted;
  for (int it = 0; it < 40; ++it) kept.Add(pipeline(0.010)), restarted.Add(pipeline(0.010));
  restarted.Restart();
  int reported_kept = 0, reported_restarted = 0;
  for (int it = 0; it < 60; ++it) {
    reported_kept += static_cast<int>(kept.Add(pipeline(0.020)).size());
    reported_restarted += static_cast<int>(restarted.Add(pipeline(0.020)).size());
  }
  EXPECT_EQ(reported_kept, 1) << "without Restart the doubled work reads as a slowdown";
  EXPECT_EQ(reported_restarted, 0);
  EXPECT_NEAR(restarted.Current().at(1).vs_start, 1, 1e-9);
}

}  // namespace
}  // namespace longhaul
