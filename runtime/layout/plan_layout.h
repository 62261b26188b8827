#pragma once
// What a plan lays out, asked by every role: which worker runs (stage, replica), each worker's
// assignment, how many micro-batches and job replicas each replica of the plan runs, where its run
// stops, and whether a plan is a layout of its config at all (CheckPlanLayout), which a worker
// checks before it indexes anything by the plan and a coordinator before it resumes a job
// state's. The wire each tensor of a plan travels in is transport's (transport/wire_plan.h).
#include <cstdint>

#include "absl/status/status.h"
#include "config/job_config.h"
#include "longhaul.pb.h"

namespace longhaul {

// The id of the worker that runs (stage, replica) in `plan`, or -1.
int WorkerAt(const proto::Plan& plan, int stage, int replica);
// Worker `id`'s assignment in `plan`, or null where the plan has none for it (a spare).
const proto::Assignment* AssignmentOf(const proto::Plan& plan, int id);
// The micro-batches replica `replica` of `plan` runs: Plan.micro_batches (every replica of a
// shrunk plan), or the config's (JobConfig::MicroBatchesOf); the most any of them runs (what memory
// is sized for); and the global index of its first.
int ReplicaMicroBatches(const proto::Plan& plan, const JobConfig& cfg, int replica);
int MostMicroBatches(const proto::Plan& plan, const JobConfig& cfg);
int64_t FirstGlobalMicroBatch(const proto::Plan& plan, const JobConfig& cfg, int replica);
// The job's replicas each replica of `plan` stands for: 1 in the config's layout, more in a shrunk
// one, whose replica runs that many groups of train.micro_batches and pushes each group's
// gradients on its own, so the shards sum the job's replicas in their order whatever the layout.
int GroupsPerReplica(const proto::Plan& plan, const JobConfig& cfg);
// The iteration a plan's run stops before: the plan's stop (`longhaul local --stop-at`), else
// train.steps.
inline int64_t RunEnd(const proto::Plan& plan, const JobConfig& cfg) {
  return plan.stop_iteration() > 0 ? plan.stop_iteration() : cfg.train.steps;
}
// A plan's replicas run the job's global batch (JobConfig::GlobalMicroBatches): the config's
// replicas, or fewer of a count that divides them (whole groups, GroupsPerReplica, where every job
// replica runs train.micro_batches): what a worker checks before it sizes anything by the plan.
absl::Status CheckReplicaBatches(const proto::Plan& plan, const JobConfig& cfg);
// A plan's parameter-server shards are the job's cuts (ParamLayout::PsShards of each stage: the
// same numbers and tensor ranges, each once), each on a replica the plan runs: a shard hosted
// nowhere, twice or on a replica that does not exist would leave the workers waiting for
// parameters nobody sends, or step tensors twice.
absl::Status CheckPlanShards(const proto::Plan& plan, const JobConfig& cfg);
// A plan is a layout of `cfg` (the plan's own config): its stages, a worker at each (stage,
// replica) it runs and nowhere else, each worker once, each with its stage's blocks of the cut;
// its replicas' batches (CheckReplicaBatches) and shards (CheckPlanShards). What a worker checks
// before it indexes anything by the plan, and a coordinator before it resumes a job state's.
absl::Status CheckPlanLayout(const proto::Plan& plan, const JobConfig& cfg);

}  // namespace longhaul
