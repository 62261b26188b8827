#include "coordinator/planning.h"

#include "model/param_layout.h"

namespace longhaul {

std::vector<proto::ShardPlacement> PlanShards(const JobConfig& cfg) {
  std::vector<proto::ShardPlacement> shards;
  for (int s = 0; s < cfg.cluster.stages; ++s) {
    const ParamLayout layout(cfg.model, cfg.Stage(s));
    const auto cuts = cfg.cluster.central_ps
                          ? std::vector<std::pair<int, int>>{{0, static_cast<int>(layout.tensors().size())}}
                          : layout.SplitIntoShards(cfg.cluster.replicas);
    int shard = 0;
    for (size_t k = 0; k < cuts.size(); ++k) {
      if (cuts[k].first == cuts[k].second) continue;  // no tensors, no shard, no PS duty
      proto::ShardPlacement sp;
      sp.set_stage(s);
      sp.set_shard(shard++);
      sp.set_owner_replica(cfg.cluster.central_ps ? 0 : static_cast<int>(k));
      sp.set_first_tensor(cuts[k].first);
      sp.set_end_tensor(cuts[k].second);
      shards.push_back(sp);
    }
  }
  return shards;
}

std::pair<int, int> SlotOf(const JobConfig& cfg, int id) { return {id % cfg.cluster.stages, id / cfg.cluster.stages}; }

proto::Plan MakePlan(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
                     const PlanRequest& request) {
  proto::Plan plan;
  plan.set_version(1);
  plan.set_job_id(cfg.cluster.job_id);
  plan.set_config_toml(cfg.toml_text);
  plan.set_stages(cfg.cluster.stages);
  plan.set_replicas(cfg.cluster.replicas);
  plan.set_start_iteration(request.start_iteration);
  plan.set_resume_checkpoint(request.resume_checkpoint);
  plan.set_stop_iteration(request.stop_iteration);
  for (const auto& [id, reg] : workers) {
    proto::Assignment* a = plan.add_assignments();
    const auto [stage, replica] = SlotOf(cfg, id);
    a->set_worker_id(id);
    a->set_stage(stage);
    a->set_replica(replica);
    a->set_address(reg.address());
    const StageSpec spec = cfg.Stage(stage);
    a->set_first_block(spec.first_block);
    a->set_end_block(spec.end_block);
  }
  for (const proto::ShardPlacement& sp : PlanShards(cfg)) *plan.add_shards() = sp;
  return plan;
}

bool HostsShard(const proto::Plan& plan, const proto::Assignment& a, int stage, int shard) {
  for (const proto::ShardPlacement& sp : plan.shards())
    if (sp.stage() == stage && sp.shard() == shard) return sp.stage() == a.stage() && sp.owner_replica() == a.replica();
  return false;
}

}  // namespace longhaul
