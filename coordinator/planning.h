#pragma once
// The coordinator's plan as a pure function of the job config and the registrations: which
// (stage, replica) each worker runs, which blocks that is, and where each parameter-server shard
// lives. Today workers take the slots in registration order (replica-major: the workers of one
// pipeline registered next to each other); the planner (runtime/plan) is what will choose instead.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/job_config.h"
#include "longhaul.pb.h"

namespace longhaul {

// The job's parameter-server shards: each stage's tensors cut over its replicas (sharded; a stage
// with fewer tensors than replicas leaves some replicas without one) or whole on replica 0 (central).
std::vector<proto::ShardPlacement> PlanShards(const JobConfig& cfg);

// (stage, replica) of the worker that registered `id`-th (from 0).
std::pair<int, int> SlotOf(const JobConfig& cfg, int id);

struct PlanRequest {
  int64_t start_iteration = 0;   // > 0 when resuming
  std::string resume_checkpoint;  // checkpoint directory name to load shards from, or empty
  int64_t stop_iteration = 0;     // the run ends after this many steps
};

// Version 1 of the plan for `workers` (every slot's worker registered), by worker id.
proto::Plan MakePlan(const JobConfig& cfg, const std::map<int, proto::RegisterRequest>& workers,
                     const PlanRequest& request);

// Whether the worker at assignment `a` hosts shard `shard` of stage `stage` in `plan`.
bool HostsShard(const proto::Plan& plan, const proto::Assignment& a, int stage, int shard);

}  // namespace longhaul
