// Resolving transport.wire_dtype per link: which pairs carry tensors, "auto" against the link
// rates, a named dtype everywhere, the plan's copy of the result, and the streams it fixes.
#include "transport/wire_plan.h"

#include <gtest/gtest.h>

#include <set>

namespace longhaul {
namespace {

TEST(WirePlan, TensorPairsAreNeighbouringStagesAndEachStagesReplicas) {
  // 2 stages x 2 replicas: at[stage][replica].
  const auto pairs = TensorPairs({{0, 2}, {1, 3}});
  const std::set<std::pair<int, int>> got(pairs.begin(), pairs.end());
  EXPECT_EQ(got, (std::set<std::pair<int, int>>{{0, 1}, {1, 0}, {2, 3}, {3, 2}, {0, 2}, {2, 0}, {1, 3}, {3, 1}}));
}

// Before the links are known: a named exchange dtype decides; else "auto" or a lossy wire may be.
TEST(WirePlan, ExchangeMayBeLossyAsResolveWiresCouldMakeIt) {
  EXPECT_TRUE(ExchangeMayBeLossy(WireDtype::kAuto, WireDtype::kAuto));
  EXPECT_TRUE(ExchangeMayBeLossy(WireDtype::kInt4, WireDtype::kAuto));
  EXPECT_FALSE(ExchangeMayBeLossy(WireDtype::kBf16, WireDtype::kAuto));
  EXPECT_FALSE(ExchangeMayBeLossy(WireDtype::kAuto, WireDtype::kF32));
  EXPECT_TRUE(ExchangeMayBeLossy(WireDtype::kF32, WireDtype::kTopK));
  // A boundary has no dtype of its own: "auto" or a lossy wire may make it lossy.
  EXPECT_TRUE(BoundaryMayBeLossy(WireDtype::kAuto));
  EXPECT_TRUE(BoundaryMayBeLossy(WireDtype::kInt2));
  EXPECT_FALSE(BoundaryMayBeLossy(WireDtype::kBf16));
}

TEST(WirePlan, AutoIsInt8BelowTenGigabitAndTheFastDtypeAbove) {
  const auto rate = [](int from, int to) { return from + to == 1 ? 1e9 / 8 : 40e9 / 8; };  // 0<->1 at 1 Gbit/s
  const WirePlan w = ResolveWires(WireDtype::kAuto, WireDtype::kBf16, {{0, 1}, {1, 0}, {0, 2}, {2, 2}}, rate);
  EXPECT_EQ(w.Of(0, 1, proto::ACTIVATION), WireDtype::kInt8);
  EXPECT_EQ(w.Of(1, 0, proto::GRAD_PUSH), WireDtype::kInt8);
  EXPECT_EQ(w.Of(0, 2, proto::ACTIVATION), WireDtype::kBf16);
  EXPECT_EQ(w.Of(5, 6, proto::GRADIENT), WireDtype::kBf16);  // a pair it was not asked about
  EXPECT_EQ(w.Of(0, 2, proto::PARAMS), WireDtype::kBf16);
  EXPECT_EQ(w.links.size(), 2u);

  const WirePlan fast = ResolveWires(WireDtype::kAuto, WireDtype::kF32, {{0, 2}}, rate);
  EXPECT_TRUE(fast.links.empty());
  EXPECT_EQ(fast.params_dtype, WireDtype::kF32);
}

TEST(WirePlan, ANamedDtypeHoldsOnEveryLinkAndParametersAvoidInt8) {
  const auto slow = [](int, int) { return 1e3; };
  const WirePlan w = ResolveWires(WireDtype::kInt8, WireDtype::kF32, {{0, 1}}, slow);
  EXPECT_TRUE(w.links.empty());
  EXPECT_EQ(w.Of(0, 1, proto::ACTIVATION), WireDtype::kInt8);
  EXPECT_EQ(w.Of(0, 1, proto::PARAMS), WireDtype::kBf16);
  EXPECT_EQ(ResolveWires(WireDtype::kF16, WireDtype::kF32, {{0, 1}}, slow).Of(0, 1, proto::ACTIVATION),
            WireDtype::kF16);
}

// transport.exchange_dtype sets every push's dtype apart from the boundaries', and with local
// updates the parameters travel as their change in it (whole in fp32 only where a run starts).
TEST(WirePlan, TheExchangesOwnDtypeSetsThePushesAndTheParameters) {
  const auto slow = [](int, int) { return 1e3; };
  const WirePlan sync = ResolveWires(WireDtype::kAuto, WireDtype::kF32, {{0, 1}, {1, 0}}, slow, false, WireDtype::kTopK);
  EXPECT_EQ(sync.Of(0, 1, proto::ACTIVATION), WireDtype::kInt8) << "the boundary keeps its link's";
  EXPECT_EQ(sync.Of(0, 1, proto::GRAD_PUSH), WireDtype::kTopK);
  EXPECT_EQ(sync.Of(0, 1, proto::PARAMS), WireDtype::kBf16);
  EXPECT_EQ(sync.change_dtype, WireDtype::kAuto);
  const WirePlan local = ResolveWires(WireDtype::kF32, WireDtype::kF32, {{0, 1}}, slow, true, WireDtype::kTopK);
  EXPECT_EQ(local.Of(0, 1, proto::ACTIVATION), WireDtype::kF32);
  EXPECT_EQ(local.Of(0, 1, proto::GRAD_PUSH), WireDtype::kTopK);
  EXPECT_EQ(local.change_dtype, WireDtype::kTopK);
  EXPECT_EQ(local.params_dtype, WireDtype::kF32);
  // An exact exchange over an int8 wire: pushes and parameters whole in fp32, no change sent.
  const WirePlan exact = ResolveWires(WireDtype::kInt8, WireDtype::kF32, {{0, 1}}, slow, true, WireDtype::kF32);
  EXPECT_EQ(exact.Of(0, 1, proto::GRAD_PUSH), WireDtype::kF32);
  EXPECT_EQ(exact.params_dtype, WireDtype::kF32);
  EXPECT_EQ(exact.change_dtype, WireDtype::kAuto);
}

// transport.gradient_dtype sets every boundary gradient's dtype, on slow links and fast ones,
// apart from the activations' and the pushes'; a plan carries it, and its streams keep it.
TEST(WirePlan, TheGradientsOwnDtypeSetsEveryBoundaryGradient) {
  const auto rate = [](int from, int) { return from == 0 ? 1e6 : 1e12; };  // from worker 0 slow
  const WirePlan w = ResolveWires(WireDtype::kAuto, WireDtype::kF32, {{0, 1}, {1, 0}, {2, 3}, {3, 2}}, rate, false,
                                  WireDtype::kAuto, WireDtype::kInt2);
  EXPECT_EQ(w.Of(0, 1, proto::ACTIVATION), WireDtype::kInt8);
  EXPECT_EQ(w.Of(2, 3, proto::ACTIVATION), WireDtype::kF32);
  EXPECT_EQ(w.Of(1, 0, proto::GRADIENT), WireDtype::kInt2);
  EXPECT_EQ(w.Of(3, 2, proto::GRADIENT), WireDtype::kInt2);
  EXPECT_EQ(w.Of(0, 1, proto::GRAD_PUSH), WireDtype::kInt8);
  EXPECT_NE(DescribeWires(w).find("the boundaries' gradients int2"), std::string::npos) << DescribeWires(w);
  EXPECT_TRUE(BoundaryMayBeLossy(WireDtype::kBf16, WireDtype::kInt4));
  EXPECT_FALSE(BoundaryMayBeLossy(WireDtype::kBf16, WireDtype::kF32));

  proto::Plan plan;
  plan.set_replicas(1);
  const std::vector<std::vector<int>> at = {{0}, {1}};
  for (int s = 0; s < 2; ++s) {
    proto::Assignment* a = plan.add_assignments();
    a->set_worker_id(s), a->set_stage(s), a->set_replica(0);
  }
  SetWires(ResolveWires(WireDtype::kInt4, WireDtype::kF32, TensorPairs(at), rate, false, WireDtype::kAuto,
                        WireDtype::kInt2),
           plan);
  EXPECT_EQ(WiresOf(plan).gradient_dtype, WireDtype::kInt2);
  FixStreamWires(at, 1, plan);
  const WirePlan fixed = WiresOf(plan);
  EXPECT_EQ(fixed.Of(1, 0, proto::GRADIENT, 1, 0, 0, 0), WireDtype::kInt2);
  EXPECT_EQ(fixed.Of(9, 0, proto::GRADIENT, 1, 0, 0, 0), WireDtype::kInt2) << "a spare in stage 1 keeps the stream's";
  EXPECT_EQ(fixed.Of(0, 1, proto::ACTIVATION, 0, 0, 0, 0), WireDtype::kInt4);
}

TEST(WirePlan, APlanCarriesIt) {
  const WirePlan w = ResolveWires(WireDtype::kAuto, WireDtype::kF32, {{3, 4}, {4, 3}}, [](int, int) { return 1e6; },
                                  true, WireDtype::kTopK);
  proto::Plan plan;
  SetWires(w, plan);
  const WirePlan back = WiresOf(plan);
  EXPECT_EQ(back.default_dtype, w.default_dtype);
  EXPECT_EQ(back.params_dtype, w.params_dtype);
  EXPECT_EQ(back.change_dtype, WireDtype::kTopK);
  EXPECT_EQ(back.push_dtype, WireDtype::kTopK);
  EXPECT_EQ(back.links, w.links);
}

// The push streams that carry error feedback: a replica's pushes to a shard host over an int8
// wire, one stream per job replica it stands for (two in a shrunk layout's replica).
TEST(WirePlan, FeedbackStreamsAreTheJobReplicasPushingOverInt8) {
  auto cfg = ParseJobConfig("[cluster]\nstages = 2\nreplicas = 2\n", "job.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  proto::Plan plan;
  plan.set_replicas(2);
  for (int id = 0; id < 4; ++id) {
    proto::Assignment* a = plan.add_assignments();
    a->set_worker_id(id), a->set_stage(id % 2), a->set_replica(id / 2);
  }
  for (int k = 0; k < 2; ++k) {
    proto::ShardPlacement* sp = plan.add_shards();
    sp->set_stage(1), sp->set_shard(k), sp->set_owner_replica(k);
  }
  // fp32 everywhere but worker 1 -> worker 3 (stage 1 replica 0 to replica 1's shard).
  SetWires(ResolveWires(WireDtype::kAuto, WireDtype::kF32, {{1, 3}}, [](int, int) { return 1e6; }), plan);
  EXPECT_EQ(FeedbackStreams(plan, *cfg), (std::set<std::pair<int, int>>{{1, 0}}));
  plan.clear_link_wires();
  plan.set_wire_dtype(proto::INT8);
  EXPECT_EQ(FeedbackStreams(plan, *cfg), (std::set<std::pair<int, int>>{{1, 0}, {1, 1}})) << "stage 0 has no shard";
  // Shrunk to replica 0 of 2 groups, which hosts both shards.
  plan.set_replicas(1);
  plan.set_micro_batches(2);
  plan.mutable_assignments()->DeleteSubrange(2, 2);
  plan.mutable_shards(1)->set_owner_replica(0);
  EXPECT_EQ(FeedbackStreams(plan, *cfg), (std::set<std::pair<int, int>>{{1, 0}, {1, 1}}));
}

// Each tensor stream keeps the dtype the job's first layout gave it wherever a later version puts
// it: on a spare whose links the plan never resolved, or in a shrunk replica that pushes to its
// own shards what crossed an int8 link before. Otherwise its rounding and error feedback would
// change, and the run would no longer end bitwise as the uninterrupted one.
TEST(WirePlan, StreamsKeepTheFirstLayoutsDtypeWhereverALaterVersionPutsThem) {
  auto cfg = ParseJobConfig("[cluster]\nstages = 2\nreplicas = 2\n[train]\nmicro_batches = 2\n", "job.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const std::vector<std::vector<int>> at = {{0, 2}, {1, 3}};  // [stage][replica]
  proto::Plan plan;
  plan.set_replicas(2);
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < 2; ++r) {
      proto::Assignment* a = plan.add_assignments();
      a->set_worker_id(at[s][r]), a->set_stage(s), a->set_replica(r);
      proto::ShardPlacement* sp = plan.add_shards();
      sp->set_stage(s), sp->set_shard(r), sp->set_owner_replica(r);
    }
  SetWires(ResolveWires(WireDtype::kAuto, WireDtype::kF32, TensorPairs(at), [](int, int) { return 1e6; }), plan);
  FixStreamWires(at, 2, plan);
  WirePlan w = WiresOf(plan);
  EXPECT_EQ(w.Of(0, 1, proto::ACTIVATION, 0, 0, 1, 0), WireDtype::kInt8);
  EXPECT_EQ(w.Of(3, 2, proto::GRADIENT, 1, 1, 0, 0), WireDtype::kInt8);
  EXPECT_EQ(w.Of(0, 0, proto::GRAD_PUSH, 0, 0, 0, 0), WireDtype::kF32) << "its own shard";
  EXPECT_EQ(w.Of(0, 2, proto::GRAD_PUSH, 0, 0, 0, 1), WireDtype::kInt8);
  EXPECT_EQ(w.Of(0, 2, proto::PARAMS, 0, 0, 0, 1), WireDtype::kBf16);
  // A spare (worker 9) in stage 0 replica 0: its pair with worker 1 was never resolved.
  EXPECT_EQ(w.Of(9, 1, proto::ACTIVATION), WireDtype::kF32);
  EXPECT_EQ(w.Of(9, 1, proto::ACTIVATION, 0, 0, 0, 0), WireDtype::kInt8);

  // Shrunk to replica 0 of 2 groups of 2 micro-batches, which hosts every shard.
  plan.set_replicas(1);
  plan.set_micro_batches(4);
  for (proto::ShardPlacement& sp : *plan.mutable_shards()) sp.set_owner_replica(0);
  w = WiresOf(plan);
  EXPECT_EQ(w.groups, 2);
  for (int m = 0; m < 4; ++m) EXPECT_EQ(w.Of(0, 1, proto::ACTIVATION, 0, 0, m, 0), WireDtype::kInt8) << m;
  EXPECT_EQ(w.Of(0, 0, proto::GRAD_PUSH, 0, 0, 0, 0), WireDtype::kF32) << "job replica 0 to shard 0";
  EXPECT_EQ(w.Of(0, 0, proto::GRAD_PUSH, 0, 0, 0, 1), WireDtype::kInt8) << "job replica 0 to shard 1";
  EXPECT_EQ(w.Of(0, 0, proto::GRAD_PUSH, 0, 0, 1, 0), WireDtype::kInt8) << "job replica 1 to shard 0";
  EXPECT_EQ(w.Of(0, 0, proto::GRAD_PUSH, 0, 0, 1, 1), WireDtype::kF32) << "job replica 1 to shard 1";
  plan.clear_assignments();
  for (int s = 0; s < 2; ++s) {
    proto::Assignment* a = plan.add_assignments();
    a->set_worker_id(at[s][0]), a->set_stage(s), a->set_replica(0);
  }
  EXPECT_EQ(FeedbackStreams(plan, *cfg), (std::set<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));

  // A plan running a cut of its own has streams of its own: its links decide.
  plan.set_job_config_toml("[cluster]\nstages = 2\n");
  EXPECT_EQ(WiresOf(plan).Of(0, 0, proto::GRAD_PUSH, 0, 0, 0, 1), WireDtype::kF32);
}

}  // namespace
}  // namespace longhaul
