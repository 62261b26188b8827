// Resolving transport.wire_dtype per link: which pairs carry tensors, "auto" against the link
// rates, a named dtype everywhere, the plan's copy of the result, and the streams it fixes.
#include "transport/wire_plan.h"

#include <gtest/gtest.h>

#include <set>

#include "model/param_layout.h"

namespace longhaul {
namespace {

TEST(WirePlan, TensorPairsAreNeighbouringStagesAndEachStagesReplicas) {
  // 2 stages x 2 replicas: at[stage][replica].
  const auto pairs = TensorPairs({{0, 2}, {1, 3}});
  const std::set<std::pair<int, int>> got(pairs.begin(), pairs.end());
  EXPECT_EQ(got, (std::set<std::pair<int, int>>{{0, 1}, {1, 0}, {2, 3}, {3, 2}, {0, 2}, {2, 0}, {1, 3}, {3, 1}}));
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

TEST(WirePlan, APlanCarriesItAndNamesItsWorkers) {
  const WirePlan w =
      ResolveWires(WireDtype::kAuto, WireDtype::kF32, {{3, 4}, {4, 3}}, [](int, int) { return 1e6; });
  proto::Plan plan;
  SetWires(w, plan);
  const WirePlan back = WiresOf(plan);
  EXPECT_EQ(back.default_dtype, w.default_dtype);
  EXPECT_EQ(back.params_dtype, w.params_dtype);
  EXPECT_EQ(back.links, w.links);
  proto::Assignment* a = plan.add_assignments();
  a->set_worker_id(7), a->set_stage(1), a->set_replica(2);
  EXPECT_EQ(WorkerAt(plan, 1, 2), 7);
  EXPECT_EQ(WorkerAt(plan, 0, 0), -1);
}

// A plan's replicas run the job's global batch: the config's, or a shrunk layout's fewer replicas
// of whole groups of the config's micro-batches; anything else (a coordinator of another build) is
// refused, named.
TEST(WirePlan, APlansReplicasMustRunTheJobsGlobalBatch) {
  auto cfg = ParseJobConfig("[cluster]\nstages = 2\nreplicas = 4\n[train]\nmicro_batches = 2\n", "job.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  proto::Plan plan;
  plan.set_version(3);
  plan.set_replicas(4);
  EXPECT_TRUE(CheckReplicaBatches(plan, *cfg).ok());
  EXPECT_EQ(ReplicaMicroBatches(plan, *cfg), 2);
  plan.set_replicas(2);
  plan.set_micro_batches(4);
  EXPECT_TRUE(CheckReplicaBatches(plan, *cfg).ok());
  EXPECT_EQ(ReplicaMicroBatches(plan, *cfg), 4);
  EXPECT_EQ(GroupsPerReplica(plan, *cfg), 2) << "each replica stands for two of the job's";
  for (const auto& [replicas, micro] : std::vector<std::pair<int, int>>{{2, 0}, {2, 1000000}, {8, 1}, {0, 8}, {3, 3}, {2, -4}}) {
    plan.set_replicas(replicas);
    plan.set_micro_batches(micro);
    const absl::Status s = CheckReplicaBatches(plan, *cfg);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << replicas << " x " << micro;
    EXPECT_NE(s.message().find("not the job's global batch of 8"), std::string::npos) << s;
  }
  // 4 replicas of 3 run the global batch of 6 x 2, but a replica's 3 micro-batches are not whole
  // groups of 2: its pushes could not sum as the job's replicas do.
  auto six = ParseJobConfig("[cluster]\nreplicas = 6\n[train]\nmicro_batches = 2\n", "job.toml");
  ASSERT_TRUE(six.ok()) << six.status();
  plan.set_replicas(4);
  plan.set_micro_batches(3);
  EXPECT_EQ(CheckReplicaBatches(plan, *six).code(), absl::StatusCode::kInvalidArgument);
  plan.set_replicas(3);
  plan.set_micro_batches(4);
  EXPECT_TRUE(CheckReplicaBatches(plan, *six).ok());
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

// The job's parameter-server shards of a 2-replica `cfg`, each on the replica `owner` gives it.
void AddJobShards(proto::Plan& plan, const JobConfig& cfg, int (*owner)(int shard)) {
  for (int s = 0; s < cfg.cluster.stages; ++s)
    for (const ParamLayout::PsShardCut& cut : ParamLayout(cfg.model, cfg.Stage(s)).PsShards(2, false)) {
      proto::ShardPlacement* sp = plan.add_shards();
      sp->set_stage(s);
      sp->set_shard(cut.owner_replica);
      sp->set_owner_replica(owner(cut.owner_replica));
      sp->set_first_tensor(cut.first_tensor);
      sp->set_end_tensor(cut.end_tensor);
    }
}

// A check's refusal of a plan: invalid, naming `why`.
void ExpectRefused(const absl::Status& s, const std::string& why) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << why;
  EXPECT_NE(s.message().find(why), std::string::npos) << s;
}

// A plan's shards are the job's cuts, each hosted once by a replica the plan runs; a coordinator
// of another build that disagrees is named, before the worker waits for parameters nobody sends.
TEST(WirePlan, APlansShardsMustBeTheJobsCutsEachOnAReplicaItRuns) {
  auto cfg = ParseJobConfig("[cluster]\nstages = 2\nreplicas = 2\n", "job.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  proto::Plan plan;
  plan.set_version(2);
  plan.set_replicas(2);
  AddJobShards(plan, *cfg, [](int shard) { return 1 - shard; });  // moved, as the placement search may
  ASSERT_EQ(plan.shards_size(), 4);
  EXPECT_TRUE(CheckPlanShards(plan, *cfg).ok()) << CheckPlanShards(plan, *cfg);
  auto refused = [&](const proto::Plan& p, const std::string& why) { ExpectRefused(CheckPlanShards(p, *cfg), why); };
  proto::Plan p = plan;
  p.mutable_shards(1)->set_owner_replica(2);
  refused(p, "shard 1 of stage 0 is on replica 2 of 2");
  p = plan;
  p.mutable_shards(3)->set_owner_replica(-1);
  refused(p, "is on replica -1 of 2");
  p = plan;
  *p.add_shards() = plan.shards(0);
  refused(p, "shard 0 of stage 0 is listed twice");
  p = plan;
  p.mutable_shards()->RemoveLast();
  refused(p, "no host for shard 1 of stage 1");
  p = plan;
  p.mutable_shards(0)->set_end_tensor(plan.shards(0).end_tensor() + 1);
  refused(p, "the job's cut");
  p = plan;
  proto::ShardPlacement* extra = p.add_shards();
  extra->set_stage(5);
  refused(p, "5 parameter-server shards, the job has 4");
}

// A plan is a layout of its config: a worker at each place, once, with its stage's blocks; a plan
// a worker or a restarted coordinator would index out of its layout is refused, naming why.
TEST(WirePlan, APlanPlacesOneWorkerAtEachPlaceOfItsLayoutWithItsStagesBlocks) {
  auto cfg = ParseJobConfig("[cluster]\nstages = 2\nreplicas = 2\n", "job.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  proto::Plan plan;
  plan.set_version(3);
  plan.set_stages(2);
  plan.set_replicas(2);
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 2; ++s) {
      proto::Assignment* a = plan.add_assignments();
      a->set_worker_id(10 * r + s);
      a->set_stage(s);
      a->set_replica(r);
      a->set_first_block(cfg->Stage(s).first_block);
      a->set_end_block(cfg->Stage(s).end_block);
    }
  AddJobShards(plan, *cfg, [](int shard) { return shard; });
  EXPECT_TRUE(CheckPlanLayout(plan, *cfg).ok()) << CheckPlanLayout(plan, *cfg);
  auto refused = [&](const proto::Plan& p, const std::string& why) { ExpectRefused(CheckPlanLayout(p, *cfg), why); };
  proto::Plan p = plan;
  p.set_stages(3);
  refused(p, "3 stages, its config 2");
  p = plan;
  p.mutable_assignments(1)->set_replica(100000);
  refused(p, "worker 1 at stage 1 replica 100000 of 2 x 2");
  p = plan;
  p.mutable_assignments(2)->set_stage(-1);
  refused(p, "at stage -1");
  p = plan;
  p.mutable_assignments(3)->set_stage(0);
  refused(p, "two workers at stage 0 replica 1");
  p = plan;
  p.mutable_assignments(3)->set_worker_id(10);
  refused(p, "worker 10 placed twice");
  p = plan;
  p.mutable_assignments()->RemoveLast();
  refused(p, "3 workers for 2 x 2 places");
  p = plan;
  p.mutable_assignments(0)->set_end_block(cfg->Stage(0).end_block + 1);
  refused(p, "whose cut is");
  p = plan;
  p.set_replicas(3);
  refused(p, "runs 3 replicas");
}

}  // namespace
}  // namespace longhaul
