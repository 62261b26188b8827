// What a worker admits under a plan: the boundary tensors of its neighbours in its replica, the
// pushes of its stage's other replicas for the shards it hosts, and the parameters of the others;
// each of the plan's size, dtype and version, sent by the worker the plan places where the header
// says it comes from. Everything else is refused, naming what is wrong. Who may connect (the
// plan's workers and the news's members, by their keys) and each one's share of connections.
#include "worker/tensor_admission.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "layout/plan_layout.h"
#include "transport/identity.h"
#include "transport/link_connections.h"
#include "model/param_layout.h"
#include "transport/wire_plan.h"
#include "worker/link_probe.h"

namespace longhaul {
namespace {

JobConfig Config(const std::string& wire = "bf16", int replicas = 2) {
  auto cfg = ParseJobConfig(R"(
[model]
n_layer = 4
d_model = 32
n_head = 2
max_seq_len = 16
[train]
seq_len = 16
micro_batch_size = 2
micro_batches = 3
[cluster]
stages = 3
stage_layers = [2, 1, 1]
replicas = )" + std::to_string(replicas) + R"(
[transport]
wire_dtype = ")" + wire + "\"\n",
                            "test.toml");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return *cfg;
}

// The key worker `id` registered, as the plan gives it.
std::string KeyOf(int id) { return std::string(kPublicKeyBytes, static_cast<char>('a' + id)); }

// Stage 1's tensors cut into one shard per replica, as the coordinator plans them; worker
// 3 r + s at (stage s, replica r).
proto::Plan Plan(const JobConfig& cfg) {
  proto::Plan plan;
  plan.set_version(3);
  plan.set_stages(3);
  plan.set_replicas(2);
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < 3; ++s) {
      proto::Assignment* a = plan.add_assignments();
      a->set_worker_id(3 * r + s), a->set_stage(s), a->set_replica(r), a->set_public_key(KeyOf(3 * r + s));
    }
  const ParamLayout layout(cfg.model, cfg.Stage(1));
  const auto cuts = layout.SplitIntoShards(2);
  for (int k = 0; k < 2; ++k) {
    proto::ShardPlacement* sp = plan.add_shards();
    sp->set_stage(1);
    sp->set_shard(k);
    sp->set_owner_replica(k);
    sp->set_first_tensor(cuts[k].first);
    sp->set_end_tensor(cuts[k].second);
  }
  SetWires(ResolveWires(cfg.transport.wire_dtype, cfg.FastWire(), {}, [](int, int) { return 0.0; }), plan);
  return plan;
}

// What `a` answers the header, sent by the worker Plan() places where the header says it comes from.
absl::StatusOr<uint64_t> AdmitFromItsPlace(const PlanAdmission& a, const proto::TensorHeader& h) {
  return a.Admit(h, 3 * h.from_replica() + h.from_stage());
}

proto::TensorHeader From(int kind, int stage, int replica, int shard = 0, int micro = 0) {
  proto::TensorHeader h;
  h.set_plan_version(3);
  h.set_kind(static_cast<proto::TensorKind>(kind));
  h.set_from_stage(stage);
  h.set_from_replica(replica);
  h.set_shard(shard);
  h.set_micro_batch(micro);
  h.set_dtype(proto::BF16);
  return h;
}

TEST(PlanAdmission, AdmitsOnlyBoundedLinkProbesBeforeThePlanAndNoneAfter) {
  PlanAdmission a;
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::ACTIVATION, 0, 0)).status().code(), absl::StatusCode::kFailedPrecondition);
  proto::TensorHeader probe = From(proto::LINK_PROBE, 0, 0);
  probe.set_total_elements(kLinkProbeMaxElements);
  EXPECT_EQ(AdmitFromItsPlace(a, probe).value_or(0), kLinkProbeMaxElements);
  probe.set_total_elements(kLinkProbeMaxElements + 1);
  EXPECT_EQ(AdmitFromItsPlace(a, probe).status().code(), absl::StatusCode::kResourceExhausted);
  probe.set_total_elements(0);
  EXPECT_EQ(AdmitFromItsPlace(a, probe).status().code(), absl::StatusCode::kResourceExhausted);
  const JobConfig cfg = Config();
  a.SetPlan(Plan(cfg), cfg, /*stage=*/1, /*replica=*/0);
  probe.set_total_elements(10);
  const absl::Status after = AdmitFromItsPlace(a, probe).status();
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(after.message().find("link probe after the plan"), std::string::npos) << after;
}

TEST(PlanAdmission, AdmitsWhatThePlanSaysAtTheSizeItSays) {
  const JobConfig cfg = Config();
  const proto::Plan plan = Plan(cfg);
  PlanAdmission a;
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/0);
  const uint64_t boundary = 2 * 16 * 32;
  const ParamLayout layout(cfg.model, cfg.Stage(1));
  const auto [b0, e0] = layout.Range(plan.shards(0).first_tensor(), plan.shards(0).end_tensor());
  const auto [b1, e1] = layout.Range(plan.shards(1).first_tensor(), plan.shards(1).end_tensor());
  for (int m = 0; m < 3; ++m) {
    EXPECT_EQ(*AdmitFromItsPlace(a, From(proto::ACTIVATION, 0, 0, 0, m)), boundary);
    EXPECT_EQ(*AdmitFromItsPlace(a, From(proto::GRADIENT, 2, 0, 0, m)), boundary);
  }
  EXPECT_EQ(*AdmitFromItsPlace(a, From(proto::GRAD_PUSH, 1, 1, 0)), e0 - b0);  // replica 1 pushes to the shard hosted here
  EXPECT_EQ(*AdmitFromItsPlace(a, From(proto::PARAMS, 1, 1, 1)), e1 - b1);     // the shard replica 1 hosts
  // The other host's norm partial: one double, as two floats on an fp32 wire, whatever the links'.
  proto::TensorHeader norm = From(proto::NORM, 1, 1);
  const absl::Status bf16_norm = AdmitFromItsPlace(a, norm).status();
  EXPECT_EQ(bf16_norm.code(), absl::StatusCode::kInvalidArgument) << "in bf16";
  EXPECT_NE(bf16_norm.message().find("norm partials of iteration 0"), std::string::npos) << bf16_norm;
  norm.set_dtype(proto::F32);
  EXPECT_EQ(*AdmitFromItsPlace(a, norm), 2u);
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::NORM, 0, 0)).status().code(), absl::StatusCode::kPermissionDenied)
      << "stage 0 has no shard in this plan: no host there";
  // A subspace model's boundaries carry its kept columns only: a whole-width tensor is not its.
  JobConfig narrow = cfg;
  narrow.model.subspace_divisor = 4;
  PlanAdmission n;
  n.SetPlan(plan, narrow, 1, 0);
  EXPECT_EQ(*AdmitFromItsPlace(n, From(proto::ACTIVATION, 0, 0, 0, 0)), boundary / 4);
  EXPECT_EQ(*AdmitFromItsPlace(n, From(proto::GRADIENT, 2, 0, 0, 0)), boundary / 4);
  // With local updates no norm is reduced.
  JobConfig local = cfg;
  local.train.local_steps = 2;
  PlanAdmission b;
  b.SetPlan(plan, local, 1, 0);
  EXPECT_EQ(AdmitFromItsPlace(b, norm).status().code(), absl::StatusCode::kPermissionDenied);
}

// With local updates a replica's push and a shard's parameters come only on the iterations that
// exchange (every train.local_steps-th and the run's last), and parameters on the one before the
// run's first (the initial broadcast); boundary tensors on every iteration.
// A resumed version has no start barrier: a tensor of the next version waits for this worker to
// set it up, as long as that takes where the version was published (Expect), else a moment only.
TEST(PlanAdmission, ATensorOfTheNextVersionIsAheadWhileThatVersionIsExpected) {
  const JobConfig cfg = Config();
  proto::Plan plan = Plan(cfg);
  PlanAdmission a;
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/0);
  proto::TensorHeader next = From(proto::ACTIVATION, 0, 0);
  next.set_plan_version(4);
  const std::chrono::milliseconds moment(10), long_after(30000);
  EXPECT_TRUE(a.Ahead(next, moment));
  EXPECT_FALSE(a.Ahead(next, PlanAdmission::kUnheardPatience)) << "a version nobody published";
  EXPECT_FALSE(a.Ahead(From(proto::ACTIVATION, 0, 0), moment)) << "this version";
  proto::TensorHeader probe = next;
  probe.set_kind(proto::LINK_PROBE);
  EXPECT_FALSE(a.Ahead(probe, moment));
  a.Expect(4);
  EXPECT_TRUE(a.Ahead(next, long_after)) << "a published version waits for the set-up";
  next.set_plan_version(5);
  EXPECT_FALSE(a.Ahead(next, long_after));
  plan.set_version(4);
  a.SetPlan(plan, cfg, 1, 0);
  next.set_plan_version(4);
  EXPECT_FALSE(a.Ahead(next, long_after));
  EXPECT_EQ(AdmitFromItsPlace(a, next).value_or(0), 2u * 16 * 32);
}

// A tensor of a version older than the one set, or than one published since (Expect), or of one
// this worker gave up (Leave) is stale: a peer's send from before it moved on, which the server
// drops without closing the connection.
TEST(PlanAdmission, TensorsOfAVersionLeftOrBeingReplacedAreStale) {
  const JobConfig cfg = Config();
  proto::Plan plan = Plan(cfg);  // version 3
  PlanAdmission a;
  proto::TensorHeader h = From(proto::ACTIVATION, 0, 0);
  h.set_plan_version(1);
  EXPECT_FALSE(a.Stale(h)) << "no plan yet: nothing to compare with";
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/0);
  EXPECT_TRUE(a.Stale(h));
  h.set_plan_version(3);
  EXPECT_FALSE(a.Stale(h)) << "the version running";
  a.Expect(4);
  EXPECT_TRUE(a.Stale(h)) << "the version running, once a newer one was published";
  h.set_plan_version(4);
  EXPECT_FALSE(a.Stale(h));
  PlanAdmission failed;
  failed.SetPlan(plan, cfg, 1, 0);
  h.set_plan_version(3);
  failed.Leave();
  EXPECT_TRUE(failed.Stale(h)) << "the version running, once this worker gave it up";
  h.set_plan_version(4);
  EXPECT_FALSE(failed.Stale(h)) << "the next version's, which the worker waits for";
  proto::TensorHeader probe = From(proto::LINK_PROBE, 0, 0);
  probe.set_plan_version(0);
  EXPECT_FALSE(a.Stale(probe)) << "a probe is refused by Admit, with the reason";
}

TEST(PlanAdmission, LocalUpdatesAdmitPushesAndParametersOnlyWhereTheReplicasExchange) {
  JobConfig cfg = Config();
  cfg.train.local_steps = 4;
  cfg.train.steps = 10;
  proto::Plan plan = Plan(cfg);
  plan.set_start_iteration(5);
  PlanAdmission a;
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/0);
  auto at = [](proto::TensorHeader h, int64_t it) {
    h.set_iteration(it);
    return h;
  };
  for (int64_t it : {4, 7, 9}) {
    EXPECT_TRUE(AdmitFromItsPlace(a, at(From(proto::PARAMS, 1, 1, 1), it)).ok()) << "parameters of iteration " << it;
  }
  for (int64_t it : {7, 9}) EXPECT_TRUE(AdmitFromItsPlace(a, at(From(proto::GRAD_PUSH, 1, 1, 0), it)).ok()) << it;
  for (int64_t it : {5, 6, 8}) {
    const absl::Status push = AdmitFromItsPlace(a, at(From(proto::GRAD_PUSH, 1, 1, 0), it)).status();
    EXPECT_EQ(push.code(), absl::StatusCode::kOutOfRange) << it;
    EXPECT_NE(push.message().find("train.local_steps = 4"), std::string::npos) << push;
    EXPECT_EQ(AdmitFromItsPlace(a, at(From(proto::PARAMS, 1, 1, 1), it)).status().code(), absl::StatusCode::kOutOfRange) << it;
    EXPECT_TRUE(AdmitFromItsPlace(a, at(From(proto::ACTIVATION, 0, 0), it)).ok()) << it;
  }
}

// An "auto" plan names each link's dtype: the activation from a peer across a slow link must come
// in int8, the gradient from a near one in the default, parameters in the plan's.
TEST(PlanAdmission, EachPeerSendsInItsLinksDtype) {
  const JobConfig cfg = Config("auto");
  proto::Plan plan = Plan(cfg);
  // Worker 3 (stage 0, replica 1) to worker 4 (stage 1, replica 1) is slow.
  SetWires(ResolveWires(WireDtype::kAuto, WireDtype::kF32, {{3, 4}, {5, 4}}, [](int from, int) { return from == 3 ? 1e6 : 1e12; }),
           plan);
  PlanAdmission a;
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/1);
  proto::TensorHeader act = From(proto::ACTIVATION, 0, 1), grad = From(proto::GRADIENT, 2, 1),
                      params = From(proto::PARAMS, 1, 0, 0);
  act.set_dtype(proto::INT8), grad.set_dtype(proto::F32), params.set_dtype(proto::BF16);
  EXPECT_TRUE(AdmitFromItsPlace(a, act).ok()) << AdmitFromItsPlace(a, act).status();
  EXPECT_TRUE(AdmitFromItsPlace(a, grad).ok()) << AdmitFromItsPlace(a, grad).status();
  EXPECT_TRUE(AdmitFromItsPlace(a, params).ok()) << AdmitFromItsPlace(a, params).status();
  act.set_dtype(proto::F32), grad.set_dtype(proto::INT8);
  for (const proto::TensorHeader& h : {act, grad}) {
    const absl::Status s = AdmitFromItsPlace(a, h).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("the plan's for it is"), std::string::npos) << s;
  }
}

// With transport.gradient_dtype a gradient must come in it and an activation in the wire's: a
// peer cannot send either direction in the other's format, and the refusal names the key.
TEST(PlanAdmission, GradientsComeInTheGradientsOwnDtype) {
  JobConfig cfg = Config("int4");
  cfg.transport.gradient_dtype = WireDtype::kInt2;
  proto::Plan plan = Plan(cfg);
  SetWires(ResolveWires(WireDtype::kInt4, WireDtype::kF32, {}, [](int, int) { return 0.0; }, false, WireDtype::kAuto,
                        WireDtype::kInt2),
           plan);
  PlanAdmission a;
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/0);
  proto::TensorHeader act = From(proto::ACTIVATION, 0, 0), grad = From(proto::GRADIENT, 2, 0);
  act.set_dtype(proto::INT4), grad.set_dtype(proto::INT2);
  EXPECT_EQ(AdmitFromItsPlace(a, act).value_or(0), static_cast<uint64_t>(cfg.boundary_floats(false)));
  EXPECT_EQ(AdmitFromItsPlace(a, grad).value_or(0), static_cast<uint64_t>(cfg.boundary_floats(true)));
  act.set_dtype(proto::INT2), grad.set_dtype(proto::INT4);
  const absl::Status wrong_act = AdmitFromItsPlace(a, act).status(), wrong_grad = AdmitFromItsPlace(a, grad).status();
  EXPECT_EQ(wrong_act.code(), absl::StatusCode::kInvalidArgument) << wrong_act;
  EXPECT_NE(wrong_act.message().find("the plan's for it is int4 (transport.wire_dtype)"), std::string::npos)
      << wrong_act;
  EXPECT_EQ(wrong_grad.code(), absl::StatusCode::kInvalidArgument) << wrong_grad;
  EXPECT_NE(wrong_grad.message().find("the plan's for it is int2 (transport.gradient_dtype)"), std::string::npos)
      << wrong_grad;
}

// Boundaries in low rank: a neighbour's activation is admitted as its rank-8 factors (8 x (32 +
// 32) floats of its 32 x 32) and its gradient as rank 4's, never the whole tensor's count, so a
// header claiming the whole is refused by the transport before anything is reserved.
TEST(PlanAdmission, ALowRankBoundaryIsAdmittedAsItsFactorsOnly) {
  JobConfig cfg = Config("bf16");
  cfg.transport.boundary_rank_divisor = 4, cfg.transport.gradient_rank_divisor = 8;
  const proto::Plan plan = Plan(cfg);
  PlanAdmission a;
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/0);
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::ACTIVATION, 0, 0)).value_or(0), 8u * (32 + 32));
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::GRADIENT, 2, 0)).value_or(0), 4u * (32 + 32));
  EXPECT_EQ(cfg.boundary(false).kept_floats(), 32u * 32) << "the whole tensor, which no header may claim";
}

// Shared directions: micro-batch 0's activation is admitted as its coordinates (rank 8 x 32
// tokens) and the directions (8 x 32, padded to 4096 floats), the later micro-batches' and every
// gradient as coordinates alone.
TEST(PlanAdmission, SharedDirectionsComeWithTheFirstMicroBatchOnly) {
  JobConfig cfg = Config("bf16");
  cfg.transport.boundary_rank_divisor = 4, cfg.transport.shared_directions = true;
  const proto::Plan plan = Plan(cfg);
  PlanAdmission a;
  a.SetPlan(plan, cfg, /*stage=*/1, /*replica=*/0);
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::ACTIVATION, 0, 0)).value_or(0), 8u * 32 + 4096);
  for (int m : {1, 2}) EXPECT_EQ(AdmitFromItsPlace(a, From(proto::ACTIVATION, 0, 0, 0, m)).value_or(0), 8u * 32) << m;
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::GRADIENT, 2, 0)).value_or(0), 8u * 32);
}

// A job of 4 replicas shrunk to 2 of 6 micro-batches: each replica pushes two groups, the group
// as the push's micro-batch, and no third.
TEST(PlanAdmission, AShrunkReplicaPushesOneGroupPerJobReplicaItStandsFor) {
  const JobConfig cfg = Config("bf16", 4);
  proto::Plan plan = Plan(cfg);
  plan.set_micro_batches(6);
  ASSERT_TRUE(CheckReplicaBatches(plan, cfg).ok());
  PlanAdmission a;
  a.SetPlan(plan, cfg, 1, 0);
  const ParamLayout layout(cfg.model, cfg.Stage(1));
  const auto [b0, e0] = layout.Range(plan.shards(0).first_tensor(), plan.shards(0).end_tensor());
  for (int group : {0, 1}) EXPECT_EQ(*AdmitFromItsPlace(a, From(proto::GRAD_PUSH, 1, 1, 0, group)), e0 - b0) << group;
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::GRAD_PUSH, 1, 1, 0, 2)).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(AdmitFromItsPlace(a, From(proto::ACTIVATION, 0, 0, 0, 5)).ok());
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::ACTIVATION, 0, 0, 0, 6)).status().code(), absl::StatusCode::kOutOfRange);
}

// The same job shrunk under "auto", its streams fixed by its first layout (wire_plan.h): the
// groups a replica stands for arrive each in its own job replica's dtype.
TEST(PlanAdmission, AShrunkReplicasGroupsArriveEachInItsStreamsDtype) {
  const JobConfig cfg = Config("auto", 4);
  proto::Plan plan = Plan(cfg);
  plan.set_micro_batches(6);
  plan.set_stream_group_micro_batches(3);
  auto fix = [&](proto::TensorKind kind, int stage, int job_replica, int shard) {
    proto::StreamWire* sw = plan.add_stream_wires();
    sw->set_kind(kind), sw->set_stage(stage), sw->set_job_replica(job_replica), sw->set_shard(shard);
    sw->set_dtype(proto::INT8);
  };
  fix(proto::ACTIVATION, 0, 1, 0);  // replica 0's second group
  fix(proto::GRAD_PUSH, 1, 2, 0);   // replica 1's first group, to shard 0
  PlanAdmission a;
  a.SetPlan(plan, cfg, 1, 0);
  auto in = [&](int kind, int stage, int replica, int shard, int micro, proto::WireDtype dtype) {
    proto::TensorHeader h = From(kind, stage, replica, shard, micro);
    h.set_dtype(dtype);
    return AdmitFromItsPlace(a, h).status();
  };
  for (int m = 0; m < 6; ++m) {
    const proto::WireDtype want = m < 3 ? proto::F32 : proto::INT8, other = m < 3 ? proto::INT8 : proto::F32;
    EXPECT_TRUE(in(proto::ACTIVATION, 0, 0, 0, m, want).ok()) << m;
    EXPECT_EQ(in(proto::ACTIVATION, 0, 0, 0, m, other).code(), absl::StatusCode::kInvalidArgument) << m;
  }
  EXPECT_TRUE(in(proto::GRAD_PUSH, 1, 1, 0, 0, proto::INT8).ok());
  EXPECT_TRUE(in(proto::GRAD_PUSH, 1, 1, 0, 1, proto::F32).ok());
  const absl::Status s = in(proto::GRAD_PUSH, 1, 1, 0, 0, proto::F32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the plan's for it is int8"), std::string::npos) << s;
}

TEST(PlanAdmission, RefusesWhatThePlanDoesNotSay) {
  const JobConfig cfg = Config();
  PlanAdmission a;
  a.SetPlan(Plan(cfg), cfg, 1, 0);
  const std::vector<std::pair<const char*, proto::TensorHeader>> refused = {
      {"activation from another replica", From(proto::ACTIVATION, 0, 1)},
      {"activation from the next stage", From(proto::ACTIVATION, 2, 0)},
      {"gradient from the previous stage", From(proto::GRADIENT, 0, 0)},
      {"a push from this worker's own replica (it puts its own)", From(proto::GRAD_PUSH, 1, 0, 0)},
      {"a push for a shard hosted elsewhere", From(proto::GRAD_PUSH, 1, 1, 1)},
      {"parameters of this worker's own shard", From(proto::PARAMS, 1, 0, 0)},
      {"a shard that does not exist", From(proto::PARAMS, 1, 1, 7)},
      {"a stage of another worker", From(proto::PARAMS, 2, 1, 0)},
      {"an unknown kind", From(9, 0, 0)},
  };
  for (const auto& [what, h] : refused) {
    auto r = AdmitFromItsPlace(a, h);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << what;
  }
  proto::TensorHeader micro = From(proto::ACTIVATION, 0, 0, 0, 3);
  EXPECT_EQ(AdmitFromItsPlace(a, micro).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(AdmitFromItsPlace(a, From(proto::GRAD_PUSH, 1, 1, 0, 1)).status().code(), absl::StatusCode::kOutOfRange)
      << "a second group's push where each replica runs one group";
  micro.set_micro_batch(-1);
  EXPECT_EQ(AdmitFromItsPlace(a, micro).status().code(), absl::StatusCode::kOutOfRange);
  proto::TensorHeader version = From(proto::ACTIVATION, 0, 0);
  version.set_plan_version(2);
  EXPECT_EQ(AdmitFromItsPlace(a, version).status().code(), absl::StatusCode::kFailedPrecondition);
  proto::TensorHeader dtype = From(proto::ACTIVATION, 0, 0);
  dtype.set_dtype(proto::F32);
  auto r = AdmitFromItsPlace(a, dtype);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("transport.wire_dtype"), std::string::npos) << r.status();
}

TEST(PlanAdmission, EndStagesHaveNoNeighbourOnTheOpenSide) {
  const JobConfig cfg = Config("fp32");
  PlanAdmission first, last;
  first.SetPlan(Plan(cfg), cfg, 0, 1);
  last.SetPlan(Plan(cfg), cfg, 2, 1);
  proto::TensorHeader act = From(proto::ACTIVATION, 1, 1), grad = From(proto::GRADIENT, 1, 1);
  act.set_dtype(proto::F32), grad.set_dtype(proto::F32);
  EXPECT_TRUE(AdmitFromItsPlace(first, grad).ok());
  EXPECT_TRUE(AdmitFromItsPlace(last, act).ok());
  act.set_from_stage(-1), grad.set_from_stage(3);
  EXPECT_FALSE(AdmitFromItsPlace(first, act).ok());
  EXPECT_FALSE(AdmitFromItsPlace(last, grad).ok());
}

// Each tensor comes from the place the plan gives the worker whose hello proved it sent it: a
// member claiming another worker's place, whatever the tensor, is refused naming both, and so is
// one claiming a place the plan does not have.
TEST(PlanAdmission, AWorkerSendsOnlyFromItsOwnPlace) {
  const JobConfig cfg = Config();
  PlanAdmission a;
  a.SetPlan(Plan(cfg), cfg, /*stage=*/1, /*replica=*/0);
  const std::vector<proto::TensorHeader> admitted = {From(proto::ACTIVATION, 0, 0), From(proto::GRADIENT, 2, 0),
                                                     From(proto::GRAD_PUSH, 1, 1, 0), From(proto::PARAMS, 1, 1, 1)};
  for (const proto::TensorHeader& h : admitted) {
    ASSERT_TRUE(AdmitFromItsPlace(a, h).ok()) << h.DebugString();
    const int owner = 3 * h.from_replica() + h.from_stage();
    for (const int sender : {owner == 0 ? 2 : 0, 99}) {  // another placed worker; a spare
      const absl::Status s = a.Admit(h, sender).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
      EXPECT_NE(s.message().find(absl::StrFormat("worker %d sends", sender)), std::string::npos) << s;
      EXPECT_NE(s.message().find(absl::StrFormat("worker %d's place in plan v3", owner)), std::string::npos) << s;
    }
  }
  const absl::Status nowhere = a.Admit(From(proto::ACTIVATION, 5, 0), 99).status();
  EXPECT_EQ(nowhere.code(), absl::StatusCode::kPermissionDenied) << nowhere;
  EXPECT_NE(nowhere.message().find("plan v3 has no stage 5 replica 0"), std::string::npos) << nowhere;
}

// Who may connect: the plan's workers and the members the coordinator's news names, each by its
// key; one neither has any longer was lost; one never heard of may still be heard of.
TEST(PlanAdmission, MembersAreThePlansWorkersAndTheNewsesByTheirKeys) {
  const JobConfig cfg = Config();
  PlanAdmission a;
  EXPECT_EQ(a.Member(0, KeyOf(0)).code(), absl::StatusCode::kUnavailable) << "not heard of yet";
  proto::Peer spare;
  spare.set_worker_id(6);
  spare.set_public_key(KeyOf(6));
  a.SetMembers({spare});
  EXPECT_TRUE(a.Member(6, KeyOf(6)).ok());
  const absl::Status other_key = a.Member(6, KeyOf(7));
  EXPECT_EQ(other_key.code(), absl::StatusCode::kPermissionDenied) << other_key;
  EXPECT_NE(other_key.message().find("another key than the one it registered"), std::string::npos) << other_key;
  a.SetPlan(Plan(cfg), cfg, 1, 0);
  for (int w = 0; w < 6; ++w) EXPECT_TRUE(a.Member(w, KeyOf(w)).ok()) << "worker " << w << " of the plan";
  a.SetMembers({});  // the spare lost
  const absl::Status lost = a.Member(6, KeyOf(6));
  EXPECT_EQ(lost.code(), absl::StatusCode::kPermissionDenied) << lost;
  EXPECT_NE(lost.message().find("worker 6 was lost"), std::string::npos) << lost;
  EXPECT_TRUE(a.Member(4, KeyOf(4)).ok()) << "placed in the plan this worker runs, whatever the news";
  const absl::Status unknown = a.Member(9, KeyOf(9));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnavailable) << unknown;
  EXPECT_NE(unknown.message().find("worker 9 is no member of this job as worker 1 knows it"), std::string::npos)
      << unknown;
}

// A member's share of connections: twice those its clients open to this worker (one set kept from
// the news, of transport.connections, and one of the plan's for the link) and two more; the plan's
// workers are placed (before a plan every member is, as each probes its links).
TEST(PlanAdmission, AMembersShareIsTwiceItsClientsConnectionsAndTwoMore) {
  const JobConfig cfg = Config();
  PlanAdmission a;
  a.SetConnections(0);
  EXPECT_EQ(a.ShareOf(6).connections, 2 * (1 + 1) + 2);
  EXPECT_TRUE(a.ShareOf(6).placed) << "before the plan";
  proto::Plan plan = Plan(cfg);
  SetLinkConnections({{{0, 1}, 4}, {{1, 0}, 8}}, plan);  // worker 0 -> this worker (1): 4 connections
  a.SetPlan(plan, cfg, 1, 0);
  EXPECT_EQ(a.ShareOf(0).connections, 2 * (1 + 4) + 2);
  EXPECT_TRUE(a.ShareOf(0).placed);
  EXPECT_EQ(a.ShareOf(2).connections, 2 * (1 + 1) + 2);
  EXPECT_EQ(a.ShareOf(6).connections, 2 * (1 + 1) + 2);
  EXPECT_FALSE(a.ShareOf(6).placed) << "a spare";
}

}  // namespace
}  // namespace longhaul
