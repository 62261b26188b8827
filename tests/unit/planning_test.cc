// The coordinator's plan as a pure function: slots in registration order (replica-major) or as a
// placement gives them, the blocks of each stage, parameter-server shards covering every stage's
// tensors exactly once, and who hosts which shard; the placement search over registered workers
// on a scenario's sites.
#include "coordinator/planning.h"

#include <gtest/gtest.h>

#include <iostream>
#include <set>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "layout/plan_layout.h"
#include "model/param_layout.h"
#include "scenario/scenario.h"
#include "plan/job_problem.h"
#include "schedule/schedule.h"
#include "transport/link_connections.h"
#include "transport/wire_plan.h"

namespace longhaul {
namespace {

JobConfig Config(const std::vector<std::string>& overrides) {
  auto c = ParseJobConfig("[model]\nn_layer = 4\nd_model = 16\nn_head = 2\n", "job.toml", overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Bytes stage s of P with `blocks` blocks needs on a CPU worker hosting all its shards (one replica
// running M micro-batches), as the planner counts memory: what MemoryCaps holds a worker's report to.
double StageBytes(const JobConfig& cfg, int P, int s, int blocks, int M) {
  const StageSpec spec{s, s + blocks, s == 0, s == P - 1};
  return StageMemoryOn(Backend::kCpu, JobWorkShape(cfg), spec, ActivationSlots(cfg.cluster.schedule, P, s, M)).total() +
         kPsShardBytesPerParam * StageParamCount(cfg.model, spec);
}

std::map<int, proto::RegisterRequest> Workers(int n) {
  std::map<int, proto::RegisterRequest> w;
  for (int i = 0; i < n; ++i) w[i].set_address("10.0.0." + std::to_string(i) + ":7000");
  return w;
}

TEST(Planning, WorkersTakeTheSlotsReplicaMajorWithTheirStagesBlocks) {
  const JobConfig cfg = Config({"cluster.stages=3", "cluster.replicas=2", "cluster.stage_layers=[2,1,1]"});
  const proto::Plan plan = MakePlan(cfg, Workers(6), {4, "step-000004", 9}, RegistrationOrder(cfg));
  EXPECT_EQ(plan.version(), 1u);
  EXPECT_EQ(plan.stages(), 3);
  EXPECT_EQ(plan.replicas(), 2);
  EXPECT_EQ(plan.start_iteration(), 4);
  EXPECT_EQ(plan.resume_checkpoint(), "step-000004");
  EXPECT_EQ(plan.stop_iteration(), 9);
  EXPECT_EQ(plan.config_toml(), cfg.toml_text);
  ASSERT_EQ(plan.assignments_size(), 6);
  const int first_block[] = {0, 2, 3}, end_block[] = {2, 3, 4};
  for (int id = 0; id < 6; ++id) {
    const proto::Assignment& a = plan.assignments(id);
    EXPECT_EQ(a.worker_id(), id);
    EXPECT_EQ(a.stage(), id % 3);
    EXPECT_EQ(a.replica(), id / 3);
    EXPECT_EQ(std::make_pair(a.stage(), a.replica()), SlotOf(cfg, id));
    EXPECT_EQ(a.address(), "10.0.0." + std::to_string(id) + ":7000");
    EXPECT_EQ(a.first_block(), first_block[a.stage()]);
    EXPECT_EQ(a.end_block(), end_block[a.stage()]);
  }
}

TEST(Planning, APlacementGivesEachWorkerItsSlot) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=2"});
  const std::vector<int> worker_of_slot = {2, 0, 3, 1};  // slot k = replica * 2 + stage
  const proto::Plan plan = MakePlan(cfg, Workers(4), {}, worker_of_slot);
  ASSERT_EQ(plan.assignments_size(), 4);
  for (int k = 0; k < 4; ++k) {
    const proto::Assignment& a = plan.assignments(worker_of_slot[k]);
    EXPECT_EQ(a.worker_id(), worker_of_slot[k]);
    EXPECT_EQ(std::make_pair(a.stage(), a.replica()), SlotOf(cfg, k));
    EXPECT_EQ(a.first_block(), cfg.Stage(a.stage()).first_block);
  }
}

// Two sites, 100 ms and 10 Mbit/s between them, workers alternating between sites (worker w on
// host w, hosts round-robin): registration order puts every pipeline across the slow link, and
// each stage's replicas on one site. With activations far larger than a stage's parameters, the
// search keeps each pipeline on one site instead, and says how much faster that is.
TEST(Planning, TheSearchKeepsPipelinesOffASlowLink) {
  // fp32 on the wire: an "auto" wire's int8 on the slow link shrinks what placement saves.
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=2", "train.seq_len=256",
                                "train.micro_batch_size=8", "train.micro_batches=4", "transport.wire_dtype=\"fp32\""});
  auto scenario = netem::ParseScenario(
      "delays_are = \"one-way\"\nsites = [\"a\", \"b\"]\ndelay_ms = [[0.1, 100], [100, 0.1]]\n"
      "rate_mbit = [[10000, 10], [10, 10000]]\n",
      "two-sites");
  ASSERT_TRUE(scenario.ok()) << scenario.status();
  std::map<int, proto::RegisterRequest> workers = Workers(4);
  std::map<int, proto::ComputeProfile> profiles;
  for (int w = 0; w < 4; ++w) {
    workers[w].set_host("box");
    workers[w].set_backend("cpu");
    proto::ComputeProfile& p = profiles[w];
    // Noise between workers of one machine: they are priced as one device all the same.
    p.set_block_forward_s(0.010 * (1 + 0.01 * w)), p.set_block_backward_s(0.020);
    p.set_head_forward_s(0.002), p.set_head_backward_s(0.004);
  }
  const absl::StatusOr<SlotSearch> found =
      SearchSlots(cfg, workers, profiles, NetworkCost::FromScenario(*scenario), /*keep_cut=*/true);
  ASSERT_TRUE(found.ok()) << found.status();
  std::cout << "predicted " << found->predicted_s << " s, registration order " << found->registration_order_s
            << " s\n";
  ASSERT_EQ(found->worker_of_slot.size(), 4u);
  std::set<int> seen(found->worker_of_slot.begin(), found->worker_of_slot.end());
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 3}));
  for (int r = 0; r < 2; ++r) {  // both stages of a replica on one site: hosts of equal parity
    EXPECT_EQ(found->worker_of_slot[r * 2] % 2, found->worker_of_slot[r * 2 + 1] % 2) << "replica " << r;
  }
  // 0.59 s against 1.17 s when written: the stages' shards are whole tensors, so one replica's
  // share of the exchange over the slow link is larger than half.
  EXPECT_LT(found->predicted_s, 0.6 * found->registration_order_s);
  EXPECT_GT(found->simulations, 1);

  profiles.erase(3);
  EXPECT_EQ(SearchSlots(cfg, workers, profiles, NetworkCost::FromScenario(*scenario), true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Two machines on a fast link, one computing three times as fast as the other: the search gives
// the fast one more blocks, unless the cut is kept.
// An "auto" wire: int8 on each pair of talking workers whose link is under 10 Gbit/s, the
// compute's dtype elsewhere, parameters in bf16 to every replica once any link is int8. Without
// known links every link counts as fast; a named dtype holds everywhere.
// Two sites joined at 1 Gbit/s with `one_way_ms` of delay, workers 0 and 1 at the first.
NetworkCost TwoSites(double one_way_ms) {
  auto scenario = netem::ParseScenario(
      absl::StrFormat("delays_are = \"one-way\"\nsites = [\"a\", \"b\"]\ndelay_ms = [[0.1, %g], [%g, 0.1]]\n"
                      "rate_mbit = [[40000, 1000], [1000, 40000]]\nplacement = [0, 0, 1, 1]\n",
                      one_way_ms, one_way_ms),
      "two-sites");
  EXPECT_TRUE(scenario.ok()) << scenario.status();
  return NetworkCost::FromScenario(*scenario);
}

TEST(Planning, AnAutoWireIsInt8OnTheSlowLinksOnly) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=2"});
  const NetworkCost network = TwoSites(10);
  // Registration order: replica 0 (workers 0, 1) on site a, replica 1 (workers 2, 3) on site b.
  const proto::Plan plan = MakePlan(cfg, Workers(4), {}, RegistrationOrder(cfg), &network);
  EXPECT_EQ(plan.wire_dtype(), proto::F32);
  EXPECT_EQ(plan.params_wire_dtype(), proto::BF16);
  std::set<std::pair<int, int>> int8;
  for (const proto::LinkWire& l : plan.link_wires()) {
    EXPECT_EQ(l.dtype(), proto::INT8);
    int8.insert({l.from_worker(), l.to_worker()});
  }
  // Only the data-parallel pairs cross the sites: stage 0's (0, 2) and stage 1's (1, 3).
  EXPECT_EQ(int8, (std::set<std::pair<int, int>>{{0, 2}, {2, 0}, {1, 3}, {3, 1}}));
  const WirePlan wires = WiresOf(plan);
  EXPECT_EQ(wires.Of(0, 1, proto::ACTIVATION), WireDtype::kF32);
  EXPECT_EQ(wires.Of(2, 0, proto::GRAD_PUSH), WireDtype::kInt8);
  EXPECT_EQ(wires.Of(0, 1, proto::PARAMS), WireDtype::kBf16);

  const proto::Plan unknown = MakePlan(cfg, Workers(4), {}, RegistrationOrder(cfg));
  EXPECT_EQ(unknown.link_wires_size(), 0);
  EXPECT_EQ(unknown.params_wire_dtype(), proto::F32);
  const proto::Plan named =
      MakePlan(Config({"cluster.stages=2", "cluster.replicas=2", "transport.wire_dtype=\"bf16\""}), Workers(4), {},
               RegistrationOrder(cfg), &network);
  EXPECT_EQ(named.link_wires_size(), 0);
  EXPECT_EQ(named.wire_dtype(), proto::BF16);
}

// transport.connections = 0: a link whose rate × round trip exceeds one connection's window (the
// hosts' reported buffers) is split over enough connections; one within a site needs one.
TEST(Planning, ALongFatLinkIsSplitOverEnoughConnections) {
  const NetworkCost network = TwoSites(50);
  std::map<int, proto::RegisterRequest> workers = Workers(4);
  for (auto& [id, r] : workers) r.set_tcp_send_buffer_max(4 << 20), r.set_tcp_receive_buffer_max(6 << 20);
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=2"});
  // 1 Gbit/s x 100 ms = 12.5 MB over windows of 2.8 MiB (70% of the sender's 4 MiB): 5 connections.
  const proto::Plan plan = MakePlan(cfg, workers, {}, RegistrationOrder(cfg), &network);
  EXPECT_EQ(LinkConnectionsOf(plan),
            (std::map<std::pair<int, int>, int>{{{0, 2}, 5}, {{2, 0}, 5}, {{1, 3}, 5}, {{3, 1}, 5}}));
  EXPECT_EQ(MakePlan(Config({"cluster.stages=2", "cluster.replicas=2", "transport.connections=2"}), workers, {},
                     RegistrationOrder(cfg), &network)
                .link_connections_size(),
            0)
      << "a configured count holds on every link";
  EXPECT_EQ(MakePlan(cfg, workers, {}, RegistrationOrder(cfg)).link_connections_size(), 0) << "links unknown";
}

// A spare takes a lost worker's slot whole: its blocks, its shards, its links' wire dtypes and
// connection counts; every other worker keeps its own, and the run goes back to the checkpoint.
TEST(Planning, TheNextVersionGivesALostWorkersPlaceToASpare) {
  const NetworkCost network = TwoSites(50);
  std::map<int, proto::RegisterRequest> workers = Workers(4);
  for (auto& [id, r] : workers) r.set_tcp_send_buffer_max(4 << 20), r.set_tcp_receive_buffer_max(6 << 20);
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=2"});
  const proto::Plan v1 = MakePlan(cfg, workers, {0, "", 100}, RegistrationOrder(cfg), &network);
  workers.erase(3);
  workers[7].set_address("10.0.0.7:7000");
  const proto::Plan v2 = NextPlan(v1, {{3, 7}}, workers, {40, "step_00000040", 100});
  EXPECT_EQ(v2.version(), 2u);
  EXPECT_EQ(v2.start_iteration(), 40);
  EXPECT_EQ(v2.resume_checkpoint(), "step_00000040");
  EXPECT_EQ(WorkerAt(v2, 1, 1), 7);
  EXPECT_EQ(AssignmentOf(v2, 3), nullptr);
  EXPECT_EQ(AssignmentOf(v2, 7)->address(), "10.0.0.7:7000");
  EXPECT_EQ(AssignmentOf(v2, 7)->first_block(), AssignmentOf(v1, 3)->first_block());
  for (int id : {0, 1, 2}) EXPECT_EQ(AssignmentOf(v2, id)->DebugString(), AssignmentOf(v1, id)->DebugString());
  EXPECT_EQ(LinkConnectionsOf(v2),
            (std::map<std::pair<int, int>, int>{{{0, 2}, 5}, {{2, 0}, 5}, {{1, 7}, 5}, {{7, 1}, 5}}));
  const WirePlan before = WiresOf(v1), after = WiresOf(v2);
  EXPECT_EQ(after.Of(7, 1, proto::GRAD_PUSH), before.Of(3, 1, proto::GRAD_PUSH));
  EXPECT_EQ(after.Of(1, 7, proto::GRAD_PUSH), before.Of(1, 3, proto::GRAD_PUSH));
  EXPECT_EQ(v2.shards_size(), v1.shards_size());
}

// 2 stages x 4 replicas, 2 micro-batches each: worker 3 (stage 1, replica 1) is lost with no spare.
// 7 workers could fill 3 replicas, but 3 does not divide the job's 4 (a replica would run 8 / 3
// micro-batches, not whole groups of 2, and its sums would not be the job's): two replicas of 4
// keep the global batch of 8. Replicas 0 and 2 (whole) stay, renumbered 0 and 1; the lost
// worker's replica's survivor and replica 3 wait as spares. Every global micro-batch is sampled
// once; every shard has an owner left, its cut unchanged.
TEST(Planning, WithoutASpareTheLayoutShrinksToFewerReplicasForTheSameGlobalBatch) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=4", "train.micro_batches=2"});
  std::map<int, proto::RegisterRequest> workers = Workers(8);
  const proto::Plan v1 = MakePlan(cfg, workers, {0, "", 100}, RegistrationOrder(cfg));
  workers.erase(3);
  absl::StatusOr<proto::Plan> v2 = ShrinkPlan(v1, {3}, {}, workers, {40, "step_00000040", 100});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->version(), 2u);
  EXPECT_EQ(v2->start_iteration(), 40);
  EXPECT_EQ(v2->replicas(), 2);
  EXPECT_EQ(MostMicroBatches(*v2, cfg), 4);
  EXPECT_EQ(GroupsPerReplica(*v2, cfg), 2);
  EXPECT_TRUE(CheckReplicaBatches(*v2, cfg).ok());
  EXPECT_EQ(v2->config_toml(), v1.config_toml()) << "the job's config, so its checkpoints resume as the job's";
  ASSERT_EQ(v2->assignments_size(), 4);
  EXPECT_EQ(WorkerAt(*v2, 0, 0), 0);
  EXPECT_EQ(WorkerAt(*v2, 1, 0), 1);
  EXPECT_EQ(WorkerAt(*v2, 0, 1), 4);
  EXPECT_EQ(WorkerAt(*v2, 1, 1), 5);
  for (int spare : {2, 6, 7}) EXPECT_EQ(AssignmentOf(*v2, spare), nullptr) << "worker " << spare << " waits as a spare";
  EXPECT_EQ(AssignmentOf(*v2, 5)->first_block(), AssignmentOf(v1, 5)->first_block());
  // Replica r' samples global micro-batches r' * 4 + m: 0..7, each once, as before the loss.
  std::set<int> global;
  for (int r = 0; r < v2->replicas(); ++r)
    for (int m = 0; m < MostMicroBatches(*v2, cfg); ++m) EXPECT_TRUE(global.insert(r * 4 + m).second);
  EXPECT_EQ(global.size(), 8u);
  ASSERT_EQ(v2->shards_size(), v1.shards_size());
  for (int i = 0; i < v1.shards_size(); ++i) {
    EXPECT_EQ(v2->shards(i).first_tensor(), v1.shards(i).first_tensor());
    EXPECT_EQ(v2->shards(i).end_tensor(), v1.shards(i).end_tensor());
    EXPECT_LT(v2->shards(i).owner_replica(), 2);
  }

  // Workers 1, 3 and 5 lost: replica 3 stays whole, and replica 0 (its stage 1 lost) is filled
  // from a dropped replica's survivor; two replicas again, none of the lost workers.
  workers.erase(1);
  workers.erase(5);
  v2 = ShrinkPlan(v1, {1, 3, 5}, {}, workers, {40, "step_00000040", 100});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->replicas(), 2);
  EXPECT_EQ(WorkerAt(*v2, 0, 0), 6);
  EXPECT_EQ(WorkerAt(*v2, 1, 0), 7);
  EXPECT_EQ(WorkerAt(*v2, 0, 1), 0);
  EXPECT_EQ(WorkerAt(*v2, 1, 1), 2);

  // 2 stages x 3 replicas that lose one worker: 2 replicas do not divide 3, so one replica of 6.
  const JobConfig three = Config({"cluster.stages=2", "cluster.replicas=3", "train.micro_batches=2"});
  std::map<int, proto::RegisterRequest> six = Workers(6);
  const proto::Plan t1 = MakePlan(three, six, {0, "", 100}, RegistrationOrder(three));
  six.erase(3);
  const absl::StatusOr<proto::Plan> t2 = ShrinkPlan(t1, {3}, {}, six, {40, "step_00000040", 100});
  ASSERT_TRUE(t2.ok()) << t2.status();
  EXPECT_EQ(t2->replicas(), 1);
  EXPECT_EQ(MostMicroBatches(*t2, three), 6);

}

// 3 stages [2, 1, 1], one replica: worker 1 (stage 1) is lost with no spare. The two left run the
// model cut anew into 2 stages of 2 blocks, in their stages' order (or as their measured compute
// balances them); the plan's config carries the
// cut, its shards are that cut's, and a worker checks it as any plan; a spare that joins later
// grows it back into the job's own 3 stages and cut. With a spare and two lost,
// the spare is the second stage; a 2 x 2 job down to one worker runs the whole model on it, every
// shard of the job's (two per stage) there, homed where the full layout has them.
TEST(Planning, WithoutASpareAPipelineIsCutAnewOverTheWorkersLeftAndGrowsBack) {
  const NetworkCost network = TwoSites(50);
  const JobConfig cfg = Config({"cluster.stages=3", "cluster.stage_layers=[2,1,1]", "transport.wire_dtype=\"auto\""});
  std::map<int, proto::RegisterRequest> workers = Workers(3);
  const proto::Plan v1 = MakePlan(cfg, workers, {0, "", 100}, RegistrationOrder(cfg), &network);
  workers.erase(1);
  absl::StatusOr<proto::Plan> v2 = ShrinkPlan(v1, {1}, {}, workers, {40, "step_00000040", 100}, &network);
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->version(), 2u);
  EXPECT_EQ(v2->start_iteration(), 40);
  EXPECT_EQ(v2->resume_checkpoint(), "step_00000040");
  EXPECT_EQ(v2->stages(), 2);
  EXPECT_EQ(v2->replicas(), 1);
  const absl::StatusOr<JobConfig> recut = ParseJobConfig(v2->config_toml(), "plan");
  ASSERT_TRUE(recut.ok()) << recut.status();
  EXPECT_EQ(recut->cluster.stages, 2);
  EXPECT_EQ(recut->Cut(), (std::vector<int>{2, 2}));
  EXPECT_TRUE(CheckPlanShards(*v2, *recut).ok()) << CheckPlanShards(*v2, *recut);
  EXPECT_TRUE(CheckReplicaBatches(*v2, *recut).ok());
  ASSERT_EQ(v2->assignments_size(), 2);
  EXPECT_EQ(WorkerAt(*v2, 0, 0), 0);
  EXPECT_EQ(WorkerAt(*v2, 1, 0), 2);
  EXPECT_EQ(AssignmentOf(*v2, 2)->first_block(), 2);
  EXPECT_EQ(AssignmentOf(*v2, 2)->end_block(), 4);
  EXPECT_EQ(AssignmentOf(*v2, 2)->address(), "10.0.0.2:7000");
  for (const proto::LinkWire& w : v2->link_wires()) {
    EXPECT_NE(w.from_worker(), 1);
    EXPECT_NE(w.to_worker(), 1);
  }
  EXPECT_EQ(WiresOf(*v2).Of(0, 2, proto::ACTIVATION), WiresOf(v1).Of(1, 2, proto::ACTIVATION))
      << "the new link 0 -> 2 crosses the sites as 1 -> 2 did";
  EXPECT_EQ(v2->job_config_toml(), v1.config_toml());

  // A spare fills the job's 3 stages again: its own config and cut [2, 1, 1], the spare last.
  std::map<int, proto::RegisterRequest> grown = workers;
  grown[5].set_address("10.0.0.5:7000");
  EXPECT_EQ(GrowPlan(*v2, {}, grown, {50, "step_00000050", 100}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<proto::Plan> v3 = GrowPlan(*v2, {5}, grown, {50, "step_00000050", 100}, &network);
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->version(), 3u);
  EXPECT_EQ(v3->start_iteration(), 50);
  EXPECT_EQ(v3->stages(), 3);
  EXPECT_EQ(v3->config_toml(), v1.config_toml());
  EXPECT_TRUE(v3->job_config_toml().empty());
  EXPECT_TRUE(CheckPlanShards(*v3, cfg).ok()) << CheckPlanShards(*v3, cfg);
  EXPECT_EQ(WorkerAt(*v3, 0, 0), 0);
  EXPECT_EQ(WorkerAt(*v3, 1, 0), 2);
  EXPECT_EQ(WorkerAt(*v3, 2, 0), 5);
  EXPECT_EQ(AssignmentOf(*v3, 2)->first_block(), 2);
  EXPECT_EQ(AssignmentOf(*v3, 2)->end_block(), 3);

  // The cut follows the workers' measured compute where it is enough faster: like workers (3%
  // apart) keep the even cut; a survivor that computes a block in 3x the time gets 1 block of 4
  // (the slowest stage 3.1 s, against 6.1 s evenly).
  auto profile = [](double block_s, double head_s) {
    proto::ComputeProfile p;
    p.set_block_forward_s(block_s / 3);
    p.set_block_backward_s(2 * block_s / 3);
    p.set_head_forward_s(head_s / 3);
    p.set_head_backward_s(2 * head_s / 3);
    return p;
  };
  auto cut_of = [&](const std::map<int, proto::ComputeProfile>& profiles) {
    const absl::StatusOr<proto::Plan> p = ShrinkPlan(v1, {1}, {}, workers, {40, "step_00000040", 100}, &network, profiles);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? ParseJobConfig(p->config_toml(), "plan")->Cut() : std::vector<int>();
  };
  EXPECT_EQ(cut_of({{0, profile(1.0, 0.1)}, {2, profile(1.03, 0.1)}}), (std::vector<int>{2, 2}));
  EXPECT_EQ(cut_of({{0, profile(1.0, 0.1)}, {2, profile(3.0, 0.1)}}), (std::vector<int>{3, 1}));
  EXPECT_EQ(cut_of({{0, profile(3.0, 0.1)}, {2, profile(1.0, 0.1)}}), (std::vector<int>{1, 3}));
  EXPECT_EQ(cut_of({{0, profile(1.0, 0.1)}}), (std::vector<int>{2, 2})) << "a worker without a profile: even";
  EXPECT_EQ(cut_of({{0, profile(1.0, 0.1)}, {2, profile(1.0, 3.0)}}), (std::vector<int>{3, 1}))
      << "the last stage's head counts: 2 + 3 s evenly, 3 s and 1 + 3 s cut so";
  // No stage takes more blocks than fit the memory its worker reported (the one replica left runs
  // the job's micro-batches and hosts every shard), and a cut that does not fit moves for memory
  // alone; where nothing fits the cut stays, for the workers' own checks to name.
  const int M = cfg.cluster.replicas * cfg.train.micro_batches;
  auto with_memory = [&](proto::ComputeProfile p, int stage, int blocks) {
    p.set_memory_bytes(1.001 * StageBytes(cfg, 2, stage, blocks, M));
    return p;
  };
  EXPECT_EQ(cut_of({{0, with_memory(profile(1.0, 0.1), 0, 2)}, {2, profile(3.0, 0.1)}}), (std::vector<int>{2, 2}))
      << "the fast worker has room for 2 blocks, not 3";
  EXPECT_EQ(cut_of({{0, profile(1.0, 0.1)}, {2, with_memory(profile(1.0, 0.1), 1, 1)}}), (std::vector<int>{3, 1}))
      << "the last worker has room for 1 block: the even cut does not fit";
  EXPECT_EQ(cut_of({{0, proto::ComputeProfile()}, {2, with_memory(proto::ComputeProfile(), 1, 1)}}),
            (std::vector<int>{3, 1}))
      << "memory moves blocks without a timing";
  EXPECT_EQ(cut_of({{0, with_memory(profile(1.0, 0.1), 0, 1)}, {2, with_memory(profile(1.0, 0.1), 1, 1)}}),
            (std::vector<int>{2, 2}))
      << "2 blocks fit, of 4";
  proto::ComputeProfile roomless = profile(3.0, 0.1);
  roomless.set_memory_bytes(0.5 * StageBytes(cfg, 2, 1, 1, M));
  EXPECT_EQ(cut_of({{0, profile(1.0, 0.1)}, {2, roomless}}), (std::vector<int>{2, 2}))
      << "no room for one block: nothing fits, however slow the worker";

  workers.erase(2);
  workers[5].set_address("10.0.0.5:7000");
  v2 = ShrinkPlan(v1, {1, 2}, {5}, workers, {40, "step_00000040", 100});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->stages(), 2);
  EXPECT_EQ(WorkerAt(*v2, 0, 0), 0);
  EXPECT_EQ(WorkerAt(*v2, 1, 0), 5);

  const JobConfig two = Config({"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2"});
  const proto::Plan d1 = MakePlan(two, Workers(4), {0, "", 100}, RegistrationOrder(two));
  v2 = ShrinkPlan(d1, {1, 2, 3}, {}, Workers(1), {40, "step_00000040", 100});
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->stages(), 1);
  EXPECT_EQ(MostMicroBatches(*v2, two), 4);
  const absl::StatusOr<JobConfig> whole = ParseJobConfig(v2->config_toml(), "plan");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(CheckPlanShards(*v2, *whole).ok()) << CheckPlanShards(*v2, *whole);
  EXPECT_TRUE(CheckReplicaBatches(*v2, *whole).ok());
  ASSERT_EQ(v2->shards_size(), 2);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(v2->shards(k).owner_replica(), 0);
    EXPECT_EQ(v2->shards(k).home_replica(), k);
  }
  // Spares bring back the job's 2 stages first (one replica of 4 micro-batches), then its second
  // replica, every shard on its home replica again.
  std::map<int, proto::RegisterRequest> back = Workers(7);
  const absl::StatusOr<proto::Plan> one = GrowPlan(*v2, {4}, back, {50, "step_00000050", 100});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->stages(), 2);
  EXPECT_EQ(one->replicas(), 1);
  EXPECT_EQ(MostMicroBatches(*one, two), 4);
  EXPECT_EQ(one->config_toml(), d1.config_toml());
  EXPECT_TRUE(CheckPlanShards(*one, two).ok()) << CheckPlanShards(*one, two);
  EXPECT_EQ(WorkerAt(*one, 1, 0), 4);
  const absl::StatusOr<proto::Plan> v4 = GrowPlan(*one, {5, 6}, back, {60, "step_00000060", 100});
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->replicas(), 2);
  EXPECT_EQ(MostMicroBatches(*v4, two), 2);
  EXPECT_TRUE(CheckPlanShards(*v4, two).ok()) << CheckPlanShards(*v4, two);
  for (const proto::ShardPlacement& sp : v4->shards()) EXPECT_EQ(sp.owner_replica(), sp.home_replica());

  // Nobody left, or local updates (each replica's own optimizer state): no smaller layout runs.
  const absl::Status none = ShrinkPlan(v1, {0, 1, 2}, {}, {}, {0, "", 100}).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition) << none;
  EXPECT_NE(none.message().find("no worker is left of the 3 stages"), std::string::npos) << none;
  const JobConfig local = Config({"cluster.stages=2", "train.local_steps=2"});
  const absl::Status own =
      ShrinkPlan(MakePlan(local, Workers(2), {0, "", 100}, RegistrationOrder(local)), {1}, {}, Workers(1), {0, "", 100})
          .status();
  EXPECT_EQ(own.code(), absl::StatusCode::kFailedPrecondition) << own;
  // Nor replicas of unequal shares, which fewer replicas of whole groups cannot keep.
  const JobConfig shares =
      Config({"cluster.replicas=2", "train.micro_batches=2", "cluster.replica_micro_batches=[2,1]"});
  const absl::Status kept = ShrinkPlan(MakePlan(shares, Workers(2), {0, "", 100}, RegistrationOrder(shares)), {1}, {},
                                       Workers(1), {0, "", 100})
                                .status();
  EXPECT_EQ(kept.code(), absl::StatusCode::kFailedPrecondition) << kept;
  EXPECT_NE(kept.message().find("cluster.replica_micro_batches"), std::string::npos) << kept;
}

// A straggler with no spare: the same workers keep their places and the blocks move off its stage
// (in every replica: each stage priced at its slowest worker) where its compute, scaled by its
// slowdown, makes a cut enough faster; the links and the shard owners stay.
TEST(Planning, AStragglersBlocksMoveToTheOtherStages) {
  const NetworkCost network = TwoSites(50);
  const JobConfig cfg = Config({"cluster.stages=3", "transport.wire_dtype=\"auto\""});
  const proto::Plan v1 = MakePlan(cfg, Workers(3), {0, "", 100}, RegistrationOrder(cfg), &network);
  ASSERT_EQ(BlocksPerStage(v1), (std::vector<int>{2, 1, 1}));
  auto profile = [](double block_s) {
    proto::ComputeProfile p;
    p.set_block_forward_s(block_s / 3);
    p.set_block_backward_s(2 * block_s / 3);
    p.set_head_forward_s(0.01);
    p.set_head_backward_s(0.02);
    return p;
  };
  // Like workers, 3% apart: the cut stays, and says why.
  const absl::Status same =
      RebalancePlan(v1, {40, "step_00000040", 100}, {{0, profile(1.0)}, {1, profile(1.03)}, {2, profile(1.0)}},
                    Workers(3))
          .status();
  EXPECT_EQ(same.code(), absl::StatusCode::kFailedPrecondition) << same;
  EXPECT_NE(same.message().find("than [2, 1, 1]"), std::string::npos) << same;
  // Stage 0's worker at 2.5x: 2 blocks of it are 5 s against 1 s for the others; 1 block is 2.5 s.
  const absl::StatusOr<proto::Plan> v2 =
      RebalancePlan(v1, {40, "step_00000040", 100}, {{0, profile(2.5)}, {1, profile(1.0)}, {2, profile(1.0)}},
                    Workers(3));
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->version(), 2u);
  EXPECT_EQ(v2->start_iteration(), 40);
  EXPECT_EQ(v2->resume_checkpoint(), "step_00000040");
  EXPECT_EQ(BlocksPerStage(*v2), (std::vector<int>{1, 2, 1}));
  for (int s = 0; s < 3; ++s) EXPECT_EQ(WorkerAt(*v2, s, 0), s);
  const absl::StatusOr<JobConfig> recut = ParseJobConfig(v2->config_toml(), "plan");
  ASSERT_TRUE(recut.ok()) << recut.status();
  EXPECT_EQ(recut->Cut(), (std::vector<int>{1, 2, 1}));
  EXPECT_TRUE(CheckPlanShards(*v2, *recut).ok()) << CheckPlanShards(*v2, *recut);
  EXPECT_TRUE(v2->job_config_toml().empty()) << "the job's config from now on has the new cut";
  EXPECT_EQ(WiresOf(*v2).Of(0, 1, proto::ACTIVATION), WiresOf(v1).Of(0, 1, proto::ACTIVATION));
  // Moved again, from the plan that moved them.
  const absl::StatusOr<proto::Plan> v3 =
      RebalancePlan(*v2, {60, "step_00000060", 100}, {{0, profile(1.0)}, {1, profile(3.0)}, {2, profile(1.0)}},
                    Workers(3));
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(BlocksPerStage(*v3), (std::vector<int>{2, 1, 1}));
  // The blocks go only where they fit: stage 1's worker has room for 1 block, so stage 2 takes the
  // one stage 0 gives up; and a cut that does not fit a worker moves with no straggler at all.
  const int M = cfg.train.micro_batches;
  auto with_memory = [&](proto::ComputeProfile p, int stage, int blocks) {
    p.set_memory_bytes(1.001 * StageBytes(cfg, 3, stage, blocks, M));
    return p;
  };
  const absl::StatusOr<proto::Plan> roomless = RebalancePlan(
      v1, {40, "step_00000040", 100}, {{0, profile(2.5)}, {1, with_memory(profile(1.0), 1, 1)}, {2, profile(1.0)}},
      Workers(3));
  ASSERT_TRUE(roomless.ok()) << roomless.status();
  EXPECT_EQ(BlocksPerStage(*roomless), (std::vector<int>{1, 1, 2}));
  const absl::StatusOr<proto::Plan> full = RebalancePlan(
      v1, {40, "step_00000040", 100}, {{0, with_memory(profile(1.0), 0, 1)}, {1, profile(1.0)}, {2, profile(1.0)}},
      Workers(3));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(BlocksPerStage(*full), (std::vector<int>{1, 2, 1}));
  const absl::Status tight = RebalancePlan(v1, {40, "step_00000040", 100},
                                           {{0, profile(2.5)},
                                            {1, with_memory(profile(1.0), 1, 1)},
                                            {2, with_memory(profile(1.0), 2, 1)}},
                                           Workers(3))
                                 .status();
  EXPECT_EQ(tight.code(), absl::StatusCode::kFailedPrecondition) << tight;
  EXPECT_NE(tight.message().find("fits the workers' memory"), std::string::npos) << tight;

  // 2 x 2: worker 0 (stage 0, replica 0) at 3x prices stage 0 for both replicas; each shard keeps
  // the owner the placement gave it.
  const JobConfig two = Config({"cluster.stages=2", "cluster.replicas=2"});
  const std::vector<std::vector<int>> owners = {{1, 0}, {0, 1}};
  const proto::Plan d1 = MakePlan(two, Workers(4), {0, "", 100}, RegistrationOrder(two), nullptr, owners);
  const absl::StatusOr<proto::Plan> d2 = RebalancePlan(
      d1, {30, "step_00000030", 100}, {{0, profile(3.0)}, {1, profile(1.0)}, {2, profile(1.0)}, {3, profile(1.0)}},
      Workers(4));
  ASSERT_TRUE(d2.ok()) << d2.status();
  EXPECT_EQ(BlocksPerStage(*d2), (std::vector<int>{1, 3}));
  for (const proto::Assignment& a : d2->assignments()) {
    EXPECT_EQ(a.worker_id(), a.replica() * 2 + a.stage());
    EXPECT_EQ(a.end_block() - a.first_block(), a.stage() == 0 ? 1 : 3) << a.DebugString();
  }
  const absl::StatusOr<JobConfig> wide = ParseJobConfig(d2->config_toml(), "plan");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_TRUE(CheckPlanShards(*d2, *wide).ok()) << CheckPlanShards(*d2, *wide);
  EXPECT_EQ(ShardOwners(*d2), owners);
  // Stage 0's other worker not timed (a spare that took its place): stage 0's compute is unknown,
  // and the blocks stay where nothing but the compute would move them.
  proto::ComputeProfile untimed;
  untimed.set_memory_bytes(1e12);
  for (const std::map<int, proto::ComputeProfile>& some :
       {std::map<int, proto::ComputeProfile>{{0, profile(3.0)}, {1, profile(1.0)}, {3, profile(1.0)}},
        std::map<int, proto::ComputeProfile>{{0, profile(3.0)}, {1, profile(1.0)}, {2, untimed}, {3, profile(1.0)}}}) {
    const absl::Status unknown = RebalancePlan(d1, {30, "step_00000030", 100}, some, Workers(4)).status();
    EXPECT_EQ(unknown.code(), absl::StatusCode::kFailedPrecondition) << unknown;
  }

  const JobConfig one = Config({"cluster.stages=1"});
  EXPECT_EQ(RebalancePlan(MakePlan(one, Workers(1), {0, "", 100}, RegistrationOrder(one)), {0, "", 100},
                          {{0, profile(3.0)}}, Workers(1))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

// The layout shrunk above grows back once spares make whole replicas: two spares make a third,
// which does not divide the job's 4; four make two, and it runs 4 replicas of 2 micro-batches
// again, the spares as replicas 2 and 3, every shard with the owner the first plan gave it (here
// the placement's, which moved stage 0's shards).
TEST(Planning, AShrunkLayoutGrowsBackWhenSparesMakeWholeReplicas) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=4", "train.micro_batches=2"});
  std::map<int, proto::RegisterRequest> workers = Workers(8);
  const proto::Plan v1 =
      MakePlan(cfg, workers, {0, "", 100}, RegistrationOrder(cfg), nullptr, {{2, 0, 1, 3}, {0, 1, 2, 3}});
  workers.erase(3);
  const absl::StatusOr<proto::Plan> v2 = ShrinkPlan(v1, {3}, {}, workers, {40, "step_00000040", 100});
  ASSERT_TRUE(v2.ok()) << v2.status();
  ASSERT_EQ(v2->replicas(), 2);
  workers[8].set_address("10.0.0.8:7000");
  for (const std::vector<int>& few : std::vector<std::vector<int>>{{8}, {7, 8}}) {
    const absl::Status s = GrowPlan(*v2, few, workers, {50, "step_00000050", 100}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << few.size() << " spares: " << s;
  }
  const absl::StatusOr<proto::Plan> v3 = GrowPlan(*v2, {2, 6, 7, 8}, workers, {50, "step_00000050", 100});
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->version(), 3u);
  EXPECT_EQ(v3->start_iteration(), 50);
  EXPECT_EQ(v3->replicas(), 4);
  EXPECT_EQ(MostMicroBatches(*v3, cfg), 2);
  EXPECT_EQ(WorkerAt(*v3, 0, 2), 2);
  EXPECT_EQ(WorkerAt(*v3, 1, 2), 6);
  EXPECT_EQ(WorkerAt(*v3, 0, 3), 7);
  EXPECT_EQ(WorkerAt(*v3, 1, 3), 8);
  EXPECT_EQ(AssignmentOf(*v3, 8)->first_block(), AssignmentOf(v1, 1)->first_block());
  for (int id : {0, 1, 4, 5}) EXPECT_EQ(AssignmentOf(*v3, id)->DebugString(), AssignmentOf(*v2, id)->DebugString());
  ASSERT_EQ(v3->shards_size(), v1.shards_size());
  for (int i = 0; i < v1.shards_size(); ++i) EXPECT_EQ(v3->shards(i).DebugString(), v1.shards(i).DebugString());
}

TEST(Planning, TheSearchCutsTheModelUnevenlyForUnevenDevicesUnlessTheCutIsKept) {
  const JobConfig cfg = Config({"model.n_layer=8", "cluster.stages=2", "cluster.replicas=1"});
  std::map<int, proto::RegisterRequest> workers = Workers(2);
  std::map<int, proto::ComputeProfile> profiles;
  for (int w = 0; w < 2; ++w) {
    workers[w].set_host(w == 0 ? "fast" : "slow");
    workers[w].set_backend("cpu");
    const double f = w == 0 ? 1 : 3;
    proto::ComputeProfile& p = profiles[w];
    p.set_block_forward_s(0.010 * f), p.set_block_backward_s(0.020 * f);
    p.set_head_forward_s(0.001 * f), p.set_head_backward_s(0.002 * f);
  }
  const NetworkCost fast = NetworkCost::Uniform({0.0001, 1.25e9, 0});
  const absl::StatusOr<SlotSearch> cut = SearchSlots(cfg, workers, profiles, fast, /*keep_cut=*/false);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(cut->blocks_per_stage.size(), 2u);
  const int fast_stage = cut->worker_of_slot[0] == 0 ? 0 : 1;
  std::cout << "cut [" << cut->blocks_per_stage[0] << ", " << cut->blocks_per_stage[1] << "], the fast worker at stage "
            << fast_stage << ": predicted " << cut->predicted_s << " s, registration order with the even cut "
            << cut->registration_order_s << " s\n";
  EXPECT_GE(cut->blocks_per_stage[fast_stage], 6) << "the fast device takes most blocks";
  EXPECT_LT(cut->predicted_s, 0.8 * cut->registration_order_s);
  const absl::StatusOr<SlotSearch> kept = SearchSlots(cfg, workers, profiles, fast, /*keep_cut=*/true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->blocks_per_stage, cfg.Cut());

  // The fast machine reports less memory than 7 blocks and the head take: the cut must fit what
  // each worker reported (1F1B: stage 0 holds 2 micro-batches' activations, stage 1 one).
  const absl::StatusOr<DeviceCost> priced = JobTimedDevice(cfg, "probe", Backend::kCpu, {1, 1}, {1, 1});
  ASSERT_TRUE(priced.ok());
  auto needs = [&](int stage, const std::vector<int>& blocks) {
    const int first = stage == 0 ? 0 : blocks[0];
    const StageSpec spec{first, first + blocks[stage], stage == 0, stage == 1};
    return priced->StageMemory(JobWorkShape(cfg), spec, stage == 0 ? 2 : 1).total();
  };
  const double memory = 0.99 * needs(1, {1, 7});
  profiles[0].set_memory_bytes(memory);
  const absl::StatusOr<SlotSearch> fitted = SearchSlots(cfg, workers, profiles, fast, /*keep_cut=*/false);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  const int stage_of_fast = fitted->worker_of_slot[0] == 0 ? 0 : 1;
  std::cout << "with " << memory / 1e6 << " MB on the fast machine: cut [" << fitted->blocks_per_stage[0] << ", "
            << fitted->blocks_per_stage[1] << "], the fast worker at stage " << stage_of_fast << "\n";
  EXPECT_LE(needs(stage_of_fast, fitted->blocks_per_stage), memory);
  EXPECT_NE(fitted->blocks_per_stage, (std::vector<int>{1, 7}));
}

// Every tensor of every stage in exactly one shard, shards numbered from 0 per stage.
void ExpectShardsCoverEveryTensorOnce(const JobConfig& cfg, const std::vector<proto::ShardPlacement>& shards) {
  for (int s = 0; s < cfg.cluster.stages; ++s) {
    const ParamLayout layout(cfg.model, cfg.Stage(s));
    int next_tensor = 0, next_shard = 0;
    for (const proto::ShardPlacement& sp : shards) {
      if (sp.stage() != s) continue;
      EXPECT_EQ(sp.shard(), next_shard++);
      EXPECT_EQ(sp.first_tensor(), next_tensor);
      EXPECT_GT(sp.end_tensor(), sp.first_tensor());
      next_tensor = sp.end_tensor();
    }
    EXPECT_EQ(next_tensor, static_cast<int>(layout.tensors().size())) << "stage " << s;
  }
}

TEST(Planning, ShardedParameterServersSpreadEachStageOverItsReplicas) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=3"});
  const std::vector<proto::ShardPlacement> shards = PlanShards(cfg);
  ExpectShardsCoverEveryTensorOnce(cfg, shards);
  for (int s = 0; s < 2; ++s) {
    std::set<int> owners;
    for (const proto::ShardPlacement& sp : shards)
      if (sp.stage() == s) owners.insert(sp.owner_replica());
    EXPECT_EQ(owners, (std::set<int>{0, 1, 2})) << "stage " << s;
  }
  const proto::Plan plan = MakePlan(cfg, Workers(6), {}, RegistrationOrder(cfg));
  for (const proto::ShardPlacement& sp : plan.shards()) {
    for (const proto::Assignment& a : plan.assignments()) {
      EXPECT_EQ(HostsShard(plan, a, sp.stage(), sp.shard()), a.stage() == sp.stage() && a.replica() == sp.owner_replica());
    }
  }
  EXPECT_FALSE(HostsShard(plan, plan.assignments(0), 0, 99));
}

// The placement search may host a stage's shards on other replicas than their numbers: the plan
// carries its owners (and keeps them as each shard's home), and ShardOwners reads them back.
TEST(Planning, ThePlacementsShardOwnersGoIntoThePlan) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=3"});
  const std::vector<std::vector<int>> owners = {{1, 2, 0}, {0, 2, 1}};
  const proto::Plan plan = MakePlan(cfg, Workers(6), {}, RegistrationOrder(cfg), nullptr, owners);
  ASSERT_EQ(plan.shards_size(), 6);
  for (const proto::ShardPlacement& sp : plan.shards()) {
    EXPECT_EQ(sp.owner_replica(), owners[sp.stage()][sp.shard()]);
    EXPECT_EQ(sp.home_replica(), sp.owner_replica());
  }
  EXPECT_EQ(ShardOwners(plan), owners);
  EXPECT_EQ(ShardOwners(MakePlan(cfg, Workers(6), {}, RegistrationOrder(cfg))),
            (std::vector<std::vector<int>>{{0, 1, 2}, {0, 1, 2}}));
  // A central parameter server: stage s's one shard on replica 2, the numbers it lacks on the rest.
  const JobConfig central = Config({"cluster.stages=2", "cluster.replicas=3", "cluster.ps=\"central\""});
  const proto::Plan one = MakePlan(central, Workers(6), {}, RegistrationOrder(central), nullptr, {{2, 0, 1}, {2, 1, 0}});
  for (const proto::ShardPlacement& sp : one.shards()) EXPECT_EQ(sp.owner_replica(), 2);
  EXPECT_EQ(ShardOwners(one), (std::vector<std::vector<int>>{{2, 0, 1}, {2, 0, 1}}));
}

TEST(Planning, ACentralParameterServerIsReplicaZeroWithTheWholeStage) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=3", "cluster.ps=\"central\""});
  const std::vector<proto::ShardPlacement> shards = PlanShards(cfg);
  ExpectShardsCoverEveryTensorOnce(cfg, shards);
  ASSERT_EQ(shards.size(), 2u);
  for (const proto::ShardPlacement& sp : shards) EXPECT_EQ(sp.owner_replica(), 0);
}

TEST(Planning, AStageWithFewerTensorsThanReplicasLeavesSomeWithoutAShard) {
  // The last stage has no blocks: its final LayerNorm and head are 3 tensors, for 4 replicas.
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=4", "cluster.stage_layers=[4,0]"});
  const std::vector<proto::ShardPlacement> shards = PlanShards(cfg);
  ExpectShardsCoverEveryTensorOnce(cfg, shards);
  int last_stage_shards = 0;
  for (const proto::ShardPlacement& sp : shards) last_stage_shards += sp.stage() == 1;
  EXPECT_GE(last_stage_shards, 1);
  EXPECT_LE(last_stage_shards, static_cast<int>(ParamLayout(cfg.model, cfg.Stage(1)).tensors().size()));
  EXPECT_LT(last_stage_shards, 4);
}

}  // namespace
}  // namespace longhaul
