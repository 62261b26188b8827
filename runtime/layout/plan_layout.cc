#include "layout/plan_layout.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "model/param_layout.h"
#include "util/status_macros.h"

namespace longhaul {

int WorkerAt(const proto::Plan& plan, int stage, int replica) {
  for (const proto::Assignment& a : plan.assignments())
    if (a.stage() == stage && a.replica() == replica) return a.worker_id();
  return -1;
}

const proto::Assignment* AssignmentOf(const proto::Plan& plan, int id) {
  for (const proto::Assignment& a : plan.assignments())
    if (a.worker_id() == id) return &a;
  return nullptr;
}

int ReplicaMicroBatches(const proto::Plan& plan, const JobConfig& cfg, int replica) {
  return plan.micro_batches() > 0 ? plan.micro_batches() : cfg.MicroBatchesOf(replica);
}

int MostMicroBatches(const proto::Plan& plan, const JobConfig& cfg) {
  return plan.micro_batches() > 0 ? plan.micro_batches() : cfg.train.micro_batches;
}

int64_t FirstGlobalMicroBatch(const proto::Plan& plan, const JobConfig& cfg, int replica) {
  return plan.micro_batches() > 0 ? static_cast<int64_t>(replica) * plan.micro_batches()
                                  : cfg.FirstMicroBatchOf(replica);
}

int GroupsPerReplica(const proto::Plan& plan, const JobConfig& cfg) {
  return plan.micro_batches() > 0 ? plan.micro_batches() / cfg.train.micro_batches : 1;
}

absl::Status CheckReplicaBatches(const proto::Plan& plan, const JobConfig& cfg) {
  const int64_t global = cfg.GlobalMicroBatches();
  // The config's replicas, or (shrunk) fewer running whole groups of equal shares.
  const bool whole =
      plan.micro_batches() == 0
          ? plan.replicas() == cfg.cluster.replicas
          : cfg.cluster.replica_micro_batches.empty() && plan.micro_batches() % cfg.train.micro_batches == 0 &&
                static_cast<int64_t>(plan.replicas()) * plan.micro_batches() == global;
  if (plan.replicas() >= 1 && plan.replicas() <= cfg.cluster.replicas && plan.micro_batches() >= 0 &&
      cfg.cluster.replicas % plan.replicas() == 0 && whole) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "plan version %d runs %d replicas of %d micro-batches, not the job's global batch of %d in whole groups of its "
      "%d replicas: the coordinator and this worker disagree; run one longhaul version on every host",
      plan.version(), plan.replicas(), MostMicroBatches(plan, cfg), global, cfg.cluster.replicas));
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

}  // namespace longhaul
