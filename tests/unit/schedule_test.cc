#include "schedule/schedule.h"

#include <gtest/gtest.h>

namespace longhaul {
namespace {

TEST(Schedule, GpipeAllForwardsThenAllBackwards) {
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 3, 1, 2, false)),
            "RecvAct(0) Forward(0) SendAct(0) RecvAct(1) Forward(1) SendAct(1) "
            "RecvGrad(0) Backward(0) SendGrad(0) RecvGrad(1) Backward(1) SendGrad(1) PushGrads PullParams");
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 1, 0, 2, false)),
            "Forward(0) Forward(1) Backward(0) Backward(1) PushGrads PullParams");
}

TEST(Schedule, AShardHostListsTheParameterServersExchangeBetweenPushAndPull) {
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 1, 0, 2, true)),
            "Forward(0) Forward(1) Backward(0) Backward(1) PushGrads ReduceNorm Step PullParams");
}

// Local updates: between exchanges a worker steps its own stage and exchanges nothing; the
// iteration that exchanges steps its own stage first, then pushes the change.
TEST(Schedule, LocalUpdatesStepTheStageThenExchangeOnlyWhereTheyExchange) {
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 1, 0, 2, true, IterationEnd::kLocalStep)),
            "Forward(0) Forward(1) Backward(0) Backward(1) LocalStep");
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 1, 0, 2, true, IterationEnd::kLocalStepThenExchange)),
            "Forward(0) Forward(1) Backward(0) Backward(1) LocalStep PushGrads ReduceNorm Step PullParams");
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 2, 1, 1, false, IterationEnd::kLocalStepThenExchange)),
            "RecvAct(0) Forward(0) Backward(0) SendGrad(0) LocalStep PushGrads PullParams");
}

// An overlapped exchange (train.overlap_outer) in three iterations, each with its own compute and
// step: the round's last pushes, the next one's host steps the shards with the pushes of the
// iteration before, the one after that takes the parameters of two iterations before.
TEST(Schedule, AnOverlappedExchangeSpreadsOverThreeIterations) {
  auto list = [](bool hosts, IterationEnd end) { return ToString(MakeSchedule(ScheduleKind::kGpipe, 1, 0, 1, hosts, end)); };
  EXPECT_EQ(list(true, IterationEnd::kLocalStepThenPush), "Forward(0) Backward(0) LocalStep PushGrads");
  EXPECT_EQ(list(true, IterationEnd::kLocalStepThenOuterStep),
            "Forward(0) Backward(0) LocalStep ReduceNorm(it-1) Step(it-1)");
  EXPECT_EQ(list(false, IterationEnd::kLocalStepThenOuterStep), "Forward(0) Backward(0) LocalStep");
  EXPECT_EQ(list(true, IterationEnd::kLocalStepThenLand), "Forward(0) Backward(0) LocalStep PullParams(it-2)");
  EXPECT_EQ(list(true, IterationEnd::kLocalStepInFlight), "Forward(0) Backward(0) LocalStep");
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 1, 0, 1, true, IterationEnd::kLocalStepThenLand, 5)),
            "Forward(0) Backward(0) LocalStep PullParams(it-5)");
  // Landing 5 iterations after the push, it is stepped after 3: the pushes travel under 3, the
  // parameters under 2.
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::kGpipe, 1, 0, 1, true, IterationEnd::kLocalStepThenOuterStep, 5)),
            "Forward(0) Backward(0) LocalStep ReduceNorm(it-3) Step(it-3)");
  EXPECT_EQ(OuterStepDelay(2), 1);
  EXPECT_EQ(OuterStepDelay(4), 2);
}

TEST(Schedule, OneFOneBInterleavesAfterWarmup) {
  // Stage 0 of 3 warms up with two forwards, then alternates.
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::k1F1B, 3, 0, 4, false)),
            "Forward(0) SendAct(0) Forward(1) SendAct(1) Forward(2) SendAct(2) RecvGrad(0) Backward(0) "
            "Forward(3) SendAct(3) RecvGrad(1) Backward(1) RecvGrad(2) Backward(2) RecvGrad(3) Backward(3) "
            "PushGrads PullParams");
  // The last stage runs forward, backward, forward, backward.
  EXPECT_EQ(ToString(MakeSchedule(ScheduleKind::k1F1B, 3, 2, 2, false)),
            "RecvAct(0) Forward(0) Backward(0) SendGrad(0) RecvAct(1) Forward(1) Backward(1) SendGrad(1) PushGrads "
            "PullParams");
  EXPECT_EQ(ActivationSlots(ScheduleKind::k1F1B, 3, 0, 8), 3);
  EXPECT_EQ(ActivationSlots(ScheduleKind::kGpipe, 3, 0, 8), 8);
}

TEST(Schedule, EveryMicroBatchForwardBeforeBackwardAndSlotsSuffice) {
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::k1F1B})
    for (int P = 1; P <= 4; ++P)
      for (int s = 0; s < P; ++s)
        for (int M = 1; M <= 6; ++M) {
          std::vector<int> fwd(M, -1), bwd(M, -1);
          int live = 0, max_live = 0, i = 0;
          for (const Instr& in : MakeSchedule(k, P, s, M, s == 0)) {
            if (in.op == Op::kForward) fwd[in.micro] = i, max_live = std::max(max_live, ++live);
            if (in.op == Op::kBackward) bwd[in.micro] = i, --live;
            ++i;
          }
          for (int m = 0; m < M; ++m) {
            ASSERT_GE(fwd[m], 0);
            ASSERT_GT(bwd[m], fwd[m]);
            if (m > 0) {
              ASSERT_GT(bwd[m], bwd[m - 1]);  // ascending backward order
            }
          }
          ASSERT_LE(max_live, ActivationSlots(k, P, s, M));
        }
  EXPECT_FALSE(ParseSchedule("interleaved").ok());
}

}  // namespace
}  // namespace longhaul
