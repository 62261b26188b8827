// The plan queries every role asks: which worker runs a place, each replica's micro-batches and
// the job replicas it stands for, and the checks that a plan is a layout of its config.
#include "layout/plan_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

#include "model/param_layout.h"

namespace longhaul {
namespace {

TEST(PlanLayout, WorkerAtNamesThePlacesWorker) {
  proto::Plan plan;
  proto::Assignment* a = plan.add_assignments();
  a->set_worker_id(7), a->set_stage(1), a->set_replica(2);
  EXPECT_EQ(WorkerAt(plan, 1, 2), 7);
  EXPECT_EQ(WorkerAt(plan, 0, 0), -1);
  EXPECT_EQ(AssignmentOf(plan, 7), &plan.assignments(0));
  EXPECT_EQ(AssignmentOf(plan, 8), nullptr) << "a spare";
}

// A plan's replicas run the job's global batch: the config's, or a shrunk layout's fewer replicas
// of whole groups of the config's micro-batches; anything else (a coordinator of another build) is
// refused, named.
TEST(PlanLayout, APlansReplicasMustRunTheJobsGlobalBatch) {
  auto cfg = ParseJobConfig("[cluster]\nstages = 2\nreplicas = 4\n[train]\nmicro_batches = 2\n", "job.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  proto::Plan plan;
  plan.set_version(3);
  plan.set_replicas(4);
  EXPECT_TRUE(CheckReplicaBatches(plan, *cfg).ok());
  EXPECT_EQ(MostMicroBatches(plan, *cfg), 2);
  plan.set_replicas(2);
  plan.set_micro_batches(4);
  EXPECT_TRUE(CheckReplicaBatches(plan, *cfg).ok());
  EXPECT_EQ(MostMicroBatches(plan, *cfg), 4);
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
  EXPECT_EQ(FirstGlobalMicroBatch(plan, *six, 2), 8) << "a shrunk plan's replica 2 runs global 8 to 11";
}

// Replicas of unequal shares (cluster.replica_micro_batches) each run their own, numbered replica
// after replica, in the config's layout only: a shrunk one cannot keep the shares.
TEST(PlanLayout, ReplicasOfUnequalSharesRunTheirOwn) {
  auto cfg = ParseJobConfig("[cluster]\nreplicas = 3\nreplica_micro_batches = [3, 1, 2]\n[train]\nmicro_batches = 3\n",
                            "job.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  proto::Plan plan;
  plan.set_replicas(3);
  EXPECT_TRUE(CheckReplicaBatches(plan, *cfg).ok());
  EXPECT_EQ(ReplicaMicroBatches(plan, *cfg, 1), 1);
  EXPECT_EQ(ReplicaMicroBatches(plan, *cfg, 2), 2);
  EXPECT_EQ(FirstGlobalMicroBatch(plan, *cfg, 2), 4);
  EXPECT_EQ(MostMicroBatches(plan, *cfg), 3);
  EXPECT_EQ(GroupsPerReplica(plan, *cfg), 1);
  plan.set_replicas(1);
  plan.set_micro_batches(6);
  const absl::Status s = CheckReplicaBatches(plan, *cfg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not the job's global batch of 6"), std::string::npos) << s;
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
TEST(PlanLayout, APlansShardsMustBeTheJobsCutsEachOnAReplicaItRuns) {
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
TEST(PlanLayout, APlanPlacesOneWorkerAtEachPlaceOfItsLayoutWithItsStagesBlocks) {
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
