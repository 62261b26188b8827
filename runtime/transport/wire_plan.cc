#include "transport/wire_plan.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_format.h"
#include "model/param_layout.h"
#include "util/status_macros.h"

namespace longhaul {

WireDtype WirePlan::Of(int from, int to, int kind) const {
  if (kind == proto::PARAMS) return params_dtype;
  if (kind == proto::NORM) return WireDtype::kF32;  // doubles as float pairs, bit for bit
  // Rare, and the validation loss is to be the one-process run's for the same parameters.
  if (kind == proto::EVAL_ACTIVATION) return WireDtype::kF32;
  auto it = links.find({from, to});
  return it == links.end() ? default_dtype : it->second;
}

WireDtype WirePlan::Of(int from, int to, int kind, int stage, int replica, int micro, int shard) const {
  if (group_micro_batches <= 0 || (kind != proto::ACTIVATION && kind != proto::GRADIENT && kind != proto::GRAD_PUSH)) {
    return Of(from, to, kind);
  }
  const bool push = kind == proto::GRAD_PUSH;
  const int job_replica = replica * groups + (push ? micro : micro / group_micro_batches);
  auto it = streams.find({kind, stage, job_replica, push ? shard : 0});
  return it == streams.end() ? default_dtype : it->second;
}

std::vector<std::pair<int, int>> TensorPairs(const std::vector<std::vector<int>>& at) {
  std::vector<std::pair<int, int>> pairs;
  for (size_t s = 0; s < at.size(); ++s)
    for (size_t r = 0; r < at[s].size(); ++r) {
      if (s + 1 < at.size()) {
        pairs.push_back({at[s][r], at[s + 1][r]});
        pairs.push_back({at[s + 1][r], at[s][r]});
      }
      for (size_t q = 0; q < at[s].size(); ++q)
        if (q != r) pairs.push_back({at[s][r], at[s][q]});
    }
  return pairs;
}

WirePlan ResolveWires(WireDtype configured, WireDtype fast, const std::vector<std::pair<int, int>>& pairs,
                      const std::function<double(int, int)>& rate) {
  WirePlan w;
  if (configured != WireDtype::kAuto) {
    w.default_dtype = configured;
    w.params_dtype = WireDtypeFor(configured, proto::PARAMS);
    return w;
  }
  w.default_dtype = w.params_dtype = fast;
  for (const auto& [from, to] : pairs) {
    if (from == to || rate(from, to) >= kAutoInt8Below) continue;
    w.links[{from, to}] = WireDtype::kInt8;
    w.params_dtype = WireDtypeFor(WireDtype::kInt8, proto::PARAMS);
  }
  return w;
}

void SetWires(const WirePlan& wires, proto::Plan& plan) {
  plan.set_wire_dtype(static_cast<proto::WireDtype>(wires.default_dtype));
  plan.set_params_wire_dtype(static_cast<proto::WireDtype>(wires.params_dtype));
  plan.clear_link_wires();
  for (const auto& [pair, dtype] : wires.links) {
    proto::LinkWire* l = plan.add_link_wires();
    l->set_from_worker(pair.first);
    l->set_to_worker(pair.second);
    l->set_dtype(static_cast<proto::WireDtype>(dtype));
  }
}

WirePlan WiresOf(const proto::Plan& plan) {
  WirePlan w;
  w.default_dtype = static_cast<WireDtype>(plan.wire_dtype());
  w.params_dtype = static_cast<WireDtype>(plan.params_wire_dtype());
  for (const proto::LinkWire& l : plan.link_wires()) {
    w.links[{l.from_worker(), l.to_worker()}] = static_cast<WireDtype>(l.dtype());
  }
  // A plan running a cut of its own has streams of its own: its links decide.
  if (plan.stream_group_micro_batches() > 0 && plan.job_config_toml().empty()) {
    w.group_micro_batches = plan.stream_group_micro_batches();
    w.groups = std::max(1, plan.micro_batches() / w.group_micro_batches);
    for (const proto::StreamWire& sw : plan.stream_wires()) {
      w.streams[{sw.kind(), sw.stage(), sw.job_replica(), sw.shard()}] = static_cast<WireDtype>(sw.dtype());
    }
  }
  return w;
}

void FixStreamWires(const std::vector<std::vector<int>>& at, int micro_batches, proto::Plan& plan) {
  const WirePlan wires = WiresOf(plan);
  plan.clear_stream_wires();
  plan.set_stream_group_micro_batches(micro_batches);
  auto fix = [&](proto::TensorKind kind, int stage, int replica, int shard, int to) {
    const WireDtype dtype = wires.Of(at[stage][replica], to, kind);
    if (dtype == wires.default_dtype) return;
    proto::StreamWire* sw = plan.add_stream_wires();
    sw->set_kind(kind);
    sw->set_stage(stage);
    sw->set_job_replica(replica);
    sw->set_shard(shard);
    sw->set_dtype(static_cast<proto::WireDtype>(dtype));
  };
  const int stages = static_cast<int>(at.size());
  for (int s = 0; s < stages; ++s)
    for (int r = 0; r < static_cast<int>(at[s].size()); ++r) {
      if (s + 1 < stages) fix(proto::ACTIVATION, s, r, 0, at[s + 1][r]);
      if (s > 0) fix(proto::GRADIENT, s, r, 0, at[s - 1][r]);
      for (const proto::ShardPlacement& sp : plan.shards())
        if (sp.stage() == s) fix(proto::GRAD_PUSH, s, r, sp.shard(), at[s][sp.owner_replica()]);
    }
}

int WorkerAt(const proto::Plan& plan, int stage, int replica) {
  for (const proto::Assignment& a : plan.assignments())
    if (a.stage() == stage && a.replica() == replica) return a.worker_id();
  return -1;
}

int ReplicaMicroBatches(const proto::Plan& plan, const JobConfig& cfg) {
  return plan.micro_batches() > 0 ? plan.micro_batches() : cfg.train.micro_batches;
}

int GroupsPerReplica(const proto::Plan& plan, const JobConfig& cfg) {
  return ReplicaMicroBatches(plan, cfg) / cfg.train.micro_batches;
}

std::set<std::pair<int, int>> FeedbackStreams(const proto::Plan& plan, const JobConfig& cfg) {
  const WirePlan wires = WiresOf(plan);
  const int groups = GroupsPerReplica(plan, cfg);
  std::set<std::pair<int, int>> streams;
  for (const proto::Assignment& a : plan.assignments())
    for (const proto::ShardPlacement& sp : plan.shards()) {
      if (sp.stage() != a.stage()) continue;
      const int owner = WorkerAt(plan, sp.stage(), sp.owner_replica());
      for (int g = 0; g < groups; ++g)
        if (wires.Of(a.worker_id(), owner, proto::GRAD_PUSH, a.stage(), a.replica(), g, sp.shard()) ==
            WireDtype::kInt8) {
          streams.insert({a.stage(), a.replica() * groups + g});
        }
    }
  return streams;
}

absl::Status CheckReplicaBatches(const proto::Plan& plan, const JobConfig& cfg) {
  const int64_t global = static_cast<int64_t>(cfg.cluster.replicas) * cfg.train.micro_batches;
  if (plan.replicas() >= 1 && plan.replicas() <= cfg.cluster.replicas && plan.micro_batches() >= 0 &&
      cfg.cluster.replicas % plan.replicas() == 0 &&
      static_cast<int64_t>(plan.replicas()) * ReplicaMicroBatches(plan, cfg) == global) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "plan version %d runs %d replicas of %d micro-batches, not the job's global batch of %d in whole groups of its "
      "%d replicas of %d: "
      "the coordinator and this worker disagree; run one longhaul version on every host",
      plan.version(), plan.replicas(), ReplicaMicroBatches(plan, cfg), global, cfg.cluster.replicas,
      cfg.train.micro_batches));
}

absl::Status CheckPlanShards(const proto::Plan& plan, const JobConfig& cfg) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "plan version %d: %s; the coordinator and this worker disagree: run one longhaul version on every host",
        plan.version(), why));
  };
  std::map<std::pair<int, int>, const proto::ShardPlacement*> shards;  // (stage, shard)
  for (const proto::ShardPlacement& sp : plan.shards()) {
    if (!shards.insert({{sp.stage(), sp.shard()}, &sp}).second) {
      return bad(absl::StrFormat("shard %d of stage %d is listed twice", sp.shard(), sp.stage()));
    }
    if (sp.owner_replica() < 0 || sp.owner_replica() >= plan.replicas()) {
      return bad(absl::StrFormat("shard %d of stage %d is on replica %d of %d", sp.shard(), sp.stage(),
                                 sp.owner_replica(), plan.replicas()));
    }
  }
  size_t expected = 0;
  for (int s = 0; s < cfg.cluster.stages; ++s) {
    for (const ParamLayout::PsShardCut& cut :
         ParamLayout(cfg.model, cfg.Stage(s)).PsShards(cfg.cluster.replicas, cfg.cluster.central_ps)) {
      ++expected;
      auto it = shards.find({s, cut.owner_replica});  // PsShards numbers a shard by its first owner
      if (it == shards.end()) return bad(absl::StrFormat("no host for shard %d of stage %d", cut.owner_replica, s));
      if (it->second->first_tensor() != cut.first_tensor || it->second->end_tensor() != cut.end_tensor) {
        return bad(absl::StrFormat("shard %d of stage %d holds tensors [%d, %d), the job's cut [%d, %d)",
                                   cut.owner_replica, s, it->second->first_tensor(), it->second->end_tensor(),
                                   cut.first_tensor, cut.end_tensor));
      }
    }
  }
  if (shards.size() != expected) {
    return bad(absl::StrFormat("%d parameter-server shards, the job has %d", shards.size(), expected));
  }
  return absl::OkStatus();
}

absl::Status CheckPlanLayout(const proto::Plan& plan, const JobConfig& cfg) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrFormat("plan version %d: %s", plan.version(), why));
  };
  if (plan.stages() != cfg.cluster.stages) {
    return bad(absl::StrFormat("%d stages, its config %d", plan.stages(), cfg.cluster.stages));
  }
  LH_RETURN_IF_ERROR(CheckReplicaBatches(plan, cfg));
  std::set<std::pair<int, int>> places;
  std::set<int> workers;
  for (const proto::Assignment& a : plan.assignments()) {
    if (a.stage() < 0 || a.stage() >= plan.stages() || a.replica() < 0 || a.replica() >= plan.replicas()) {
      return bad(absl::StrFormat("worker %d at stage %d replica %d of %d x %d", a.worker_id(), a.stage(), a.replica(),
                                 plan.stages(), plan.replicas()));
    }
    if (!places.insert({a.stage(), a.replica()}).second) {
      return bad(absl::StrFormat("two workers at stage %d replica %d", a.stage(), a.replica()));
    }
    if (!workers.insert(a.worker_id()).second) return bad(absl::StrFormat("worker %d placed twice", a.worker_id()));
    const StageSpec spec = cfg.Stage(a.stage());
    if (a.first_block() != spec.first_block || a.end_block() != spec.end_block) {
      return bad(absl::StrFormat("worker %d runs blocks [%d, %d) of stage %d, whose cut is [%d, %d)", a.worker_id(),
                                 a.first_block(), a.end_block(), a.stage(), spec.first_block, spec.end_block));
    }
  }
  if (static_cast<int64_t>(places.size()) != static_cast<int64_t>(plan.stages()) * plan.replicas()) {
    return bad(absl::StrFormat("%d workers for %d x %d places", places.size(), plan.stages(), plan.replicas()));
  }
  return CheckPlanShards(plan, cfg);
}

const proto::Assignment* AssignmentOf(const proto::Plan& plan, int id) {
  for (const proto::Assignment& a : plan.assignments())
    if (a.worker_id() == id) return &a;
  return nullptr;
}

}  // namespace longhaul
