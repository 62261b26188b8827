#include "worker/tensor_admission.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "layout/plan_layout.h"
#include "model/param_layout.h"
#include "transport/link_connections.h"
#include "transport/wire_plan.h"
#include "worker/job_setup.h"
#include "worker/link_probe.h"
#include "worker/norm_exchange.h"

namespace longhaul {

void PlanAdmission::SetPlan(const proto::Plan& plan, const JobConfig& cfg, int stage, int replica) {
  std::map<Source, Expected> expected;
  const int P = plan.stages(), M = ReplicaMicroBatches(plan, cfg, replica), groups = GroupsPerReplica(plan, cfg);
  const BoundaryShape acts = cfg.boundary(false);
  const uint64_t boundary = acts.sent(), gradient = cfg.boundary_floats(true);
  const WirePlan wires = WiresOf(plan);
  const int me = WorkerAt(plan, stage, replica);
  // Each micro-batch's (a push's: each group's) dtype: a fixed stream's may differ by group.
  auto dtypes = [&](proto::TensorKind kind, int from_stage, int from_replica, int count, int shard) {
    std::vector<WireDtype> d;
    for (int m = 0; m < count; ++m) {
      d.push_back(wires.Of(WorkerAt(plan, from_stage, from_replica), me, kind, from_stage, from_replica, m, shard));
    }
    return d;
  };
  auto expect = [&](proto::TensorKind kind, int from_stage, int from_replica, int shard, uint64_t elements, int count) {
    expected[{kind, from_stage, from_replica, shard}] = {elements, count,
                                                         dtypes(kind, from_stage, from_replica, count, shard)};
  };
  if (stage > 0) {
    expect(proto::ACTIVATION, stage - 1, replica, 0, boundary, M);
    expected[{proto::ACTIVATION, stage - 1, replica, 0}].first_elements = acts.sent(true);
  }
  // Each evaluation's micro-batch carries directions of its own where they are shared.
  if (const int evals = cfg.train.EvalShare(plan.replicas(), replica); stage > 0 && evals > 0) {
    expect(proto::EVAL_ACTIVATION, stage - 1, replica, 0, acts.sent(true), evals);
  }
  if (stage < P - 1) expect(proto::GRADIENT, stage + 1, replica, 0, gradient, M);
  const ParamLayout layout(cfg.model, cfg.Stage(stage));
  for (const proto::ShardPlacement& sp : plan.shards()) {
    if (sp.stage() != stage) continue;
    const auto [begin, end] = layout.Range(sp.first_tensor(), sp.end_tensor());
    if (sp.owner_replica() == replica) {
      // This worker hosts the shard: every other replica of the stage pushes each of its groups'
      // gradients, the group as the micro-batch.
      for (int r = 0; r < plan.replicas(); ++r)
        if (r != replica) expect(proto::GRAD_PUSH, stage, r, sp.shard(), end - begin, groups);
    } else {
      expected[{proto::PARAMS, stage, sp.owner_replica(), sp.shard()}] = {end - begin, 1, {wires.params_dtype}};
    }
  }
  // A host's norm partials, from every other host, where the norm is reduced (not with local updates).
  const std::vector<NormHost> hosts = NormHosts(plan);
  auto hosts_here = [&](const NormHost& h) { return h.stage == stage && h.replica == replica; };
  if (cfg.train.local_steps <= 1 && std::any_of(hosts.begin(), hosts.end(), hosts_here)) {
    for (const NormHost& h : hosts)
      if (!hosts_here(h)) expected[{proto::NORM, h.stage, h.replica, 0}] = {2 * h.shards.size(), 1, {WireDtype::kF32}};
  }
  std::map<std::pair<int, int>, int> places;
  std::map<int, std::string> placed;
  for (const proto::Assignment& a : plan.assignments()) {
    places[{a.stage(), a.replica()}] = a.worker_id();
    placed[a.worker_id()] = a.public_key();
  }
  std::map<int, int> links;
  for (const auto& [link, n] : LinkConnectionsOf(plan))
    if (link.second == me) links[link.first] = n;
  absl::MutexLock lock(&mu_);
  expected_ = std::move(expected);
  plan_version_ = plan.version();
  stage_ = stage, replica_ = replica;
  self_ = me;
  places_ = std::move(places);
  placed_ = std::move(placed);
  for (const auto& [worker, key] : placed_) known_.insert(worker);
  links_ = std::move(links);
  connections_ = std::max(1, cfg.transport.connections);
  train_ = cfg.train;
  wires_ = wires;
  start_ = plan.start_iteration();
  end_ = RunEnd(plan, cfg);
  have_plan_ = true;
}

void PlanAdmission::SetMembers(const std::vector<proto::Peer>& members) {
  std::map<int, std::string> keys;
  for (const proto::Peer& p : members) keys[p.worker_id()] = p.public_key();
  absl::MutexLock lock(&mu_);
  members_ = std::move(keys);
  for (const auto& [worker, key] : members_) known_.insert(worker);
}

void PlanAdmission::SetConnections(int transport_connections) {
  absl::MutexLock lock(&mu_);
  connections_ = std::max(1, transport_connections);
}

absl::Status PlanAdmission::Member(int worker, absl::string_view public_key) const {
  absl::MutexLock lock(&mu_);
  const std::string* key = nullptr;
  if (auto p = placed_.find(worker); p != placed_.end()) key = &p->second;
  if (auto m = members_.find(worker); key == nullptr && m != members_.end()) key = &m->second;
  if (key == nullptr && known_.count(worker) > 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "worker %d was lost: neither plan v%d nor the coordinator's news of the job's members has it any longer",
        worker, plan_version_));
  }
  if (key == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "worker %d is no member of this job as worker %d knows it (plan v%d and the coordinator's news of its members)",
        worker, self_, plan_version_));
  }
  if (*key != public_key) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "worker %d signs its hello with another key than the one it registered with the coordinator", worker));
  }
  return absl::OkStatus();
}

TensorAdmission::Share PlanAdmission::ShareOf(int worker) const {
  absl::MutexLock lock(&mu_);
  const auto link = links_.find(worker);
  const int per_link = link == links_.end() ? connections_ : link->second;
  // Before the plan every member probes its links; from the plan on, the plan's workers are the
  // ones whose connections matter.
  return {2 * (connections_ + per_link) + 2, !have_plan_ || placed_.count(worker) > 0};
}

bool PlanAdmission::Ahead(const proto::TensorHeader& h, std::chrono::steady_clock::duration waited) const {
  absl::MutexLock lock(&mu_);
  return h.kind() != proto::LINK_PROBE && h.plan_version() > plan_version_ &&
         (h.plan_version() <= expected_version_ || waited < kUnheardPatience);
}

bool PlanAdmission::Stale(const proto::TensorHeader& h) const {
  absl::MutexLock lock(&mu_);
  return have_plan_ && h.kind() != proto::LINK_PROBE &&
         (h.plan_version() < plan_version_ || h.plan_version() < expected_version_ || h.plan_version() <= left_version_);
}

void PlanAdmission::Leave() {
  absl::MutexLock lock(&mu_);
  left_version_ = std::max(left_version_, plan_version_);
}

void PlanAdmission::Expect(uint64_t version) {
  absl::MutexLock lock(&mu_);
  expected_version_ = std::max(expected_version_, version);
}

absl::StatusOr<uint64_t> PlanAdmission::Admit(const proto::TensorHeader& h, int sender) const {
  absl::MutexLock lock(&mu_);
  if (h.kind() == proto::LINK_PROBE) {
    // Probes come from the job's workers (the hello checked the job) while they measure their
    // links, before any plan; they are read and dropped, never held.
    if (have_plan_) {
      return absl::FailedPreconditionError(
          "a link probe after the plan: workers measure their links before the coordinator plans");
    }
    if (h.total_elements() == 0 || h.total_elements() > kLinkProbeMaxElements) {
      return absl::ResourceExhaustedError(absl::StrFormat("a link probe of %d elements; probes are 1 to %d",
                                                          h.total_elements(), kLinkProbeMaxElements));
    }
    return h.total_elements();
  }
  if (!have_plan_) return absl::FailedPreconditionError("this worker has no plan yet");
  if (h.plan_version() != plan_version_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("a tensor of plan version %d; this worker runs plan version %d", h.plan_version(), plan_version_));
  }
  const TensorKey key{h.kind(), h.iteration(), h.micro_batch(), h.from_stage(), h.from_replica(), h.shard()};
  // Whatever it is, it comes from the place the plan gives its sender, or not at all: a part that
  // claims another worker's place must not reserve that place's stream.
  const auto place = places_.find({h.from_stage(), h.from_replica()});
  if (place == places_.end()) {
    return absl::PermissionDeniedError(absl::StrFormat("worker %d sends %s; plan v%d has no stage %d replica %d", sender,
                                                       key.DebugString(), plan_version_, h.from_stage(),
                                                       h.from_replica()));
  }
  if (place->second != sender) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "worker %d sends %s; stage %d replica %d is worker %d's place in plan v%d, and a worker sends only from its own",
        sender, key.DebugString(), h.from_stage(), h.from_replica(), place->second, plan_version_));
  }
  auto it = expected_.find({h.kind(), h.from_stage(), h.from_replica(), h.shard()});
  if (it == expected_.end()) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "plan v%d has no %s for the worker of stage %d replica %d", plan_version_, key.DebugString(), stage_, replica_));
  }
  if (h.micro_batch() < 0 || h.micro_batch() >= it->second.micro_batches) {
    const int count = it->second.micro_batches;
    return absl::OutOfRangeError(
        h.kind() == proto::GRAD_PUSH
            ? absl::StrFormat("%s: a replica of the plan pushes %d groups per iteration (its micro-batch)",
                              key.DebugString(), count)
            : absl::StrFormat("%s: the plan has %d micro-batches per iteration", key.DebugString(), count));
  }
  if ((h.kind() == proto::GRAD_PUSH || h.kind() == proto::PARAMS) && h.iteration() != start_ - 1 &&
      !train_.ExchangesAfter(h.iteration(), end_)) {
    return absl::OutOfRangeError(absl::StrFormat("%s: with train.local_steps = %d the replicas exchange only after "
                                                 "every %d-th iteration and the run's last",
                                                 key.DebugString(), train_.local_steps, train_.local_steps));
  }
  const std::vector<WireDtype>& dtypes = it->second.dtypes;
  WireDtype want = dtypes[std::min<size_t>(static_cast<size_t>(h.micro_batch()), dtypes.size() - 1)];
  if (h.kind() == proto::PARAMS && !ParamsTravelWhole(wires_, h.iteration(), start_)) {
    want = wires_.change_dtype;
  }
  if (h.dtype() != static_cast<proto::WireDtype>(want)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s in wire dtype %s; the plan's for it is %s (%s)", key.DebugString(),
        IsWireDtype(h.dtype()) ? WireDtypeName(static_cast<WireDtype>(h.dtype())) : "unknown", WireDtypeName(want),
        wires_.KeyOf(h.kind())));
  }
  if (h.micro_batch() == 0 && it->second.first_elements > 0) return it->second.first_elements;
  return it->second.elements;
}

}  // namespace longhaul
