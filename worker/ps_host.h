#pragma once
// The parameter-server shards one worker hosts (runtime/ps/ps_shard.h). Each iteration it takes
// every replica's push of each of its groups for each shard (one group per replica of the job:
// layout/plan_layout.h GroupsPerReplica), sums them in the job's replica order, has the global norm reduced
// over every shard of every stage (among the hosts: worker/norm_exchange.h), steps, and sends the
// new parameters to every replica of its stage.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul.pb.h"
#include "optim/lr_schedule.h"
#include "optim/train_step.h"
#include "format/wire_dtype.h"
#include "ps/ps_shard.h"
#include "transport/error_feedback.h"
#include "worker/norm_exchange.h"

namespace longhaul {

// How a PsHost meets the world: a worker's reach the network and the coordinator, a test's need not.
struct PsLinks {
  // Replica `replica`'s push of its group `group` of `shard` for iteration `it` (waits for it).
  std::function<absl::StatusOr<std::vector<float>>(int64_t it, int replica, int group, int shard)> take_push;
  // Hands a taken push back for reuse.
  std::function<void(std::vector<float>)> recycle;
  // The global norm of iteration `it` over every shard of every stage, from this host's Σ g² per
  // shard (worker/norm_exchange.h).
  std::function<absl::StatusOr<double>(int64_t it, const std::vector<ShardSquares>&)> reduce_norm;
  // The shard's parameters (or, `dtype` given, their change: wire_plan.h) to replica `replica`
  // (this worker's own included); `data` stays valid until the iteration's sends are done.
  std::function<void(int64_t it, int replica, int shard, const float* data, size_t n, WireDtype dtype)> send_params;
};

// Local updates (train.local_steps > 1): what a replica pushes is its change since the last
// exchange, and the shards step it with Nesterov momentum, unclipped, so no norm is reduced.
// Over a lossy exchange (wire_plan.h) the shards send the replicas their parameters' change in `change_dtype`
// with error feedback, whose residual each shard keeps in its second-moment slot (checkpoints
// carry it), and set themselves to what the replicas then hold; whole where `whole` says so
// (transport/wire_plan.h ParamsTravelWhole).
struct OuterOptimizer {
  bool local_updates = false;
  float lr = 0.7f, momentum = 0.5f;
  WireDtype change_dtype = WireDtype::kAuto;  // kAuto: parameters always travel whole
  std::function<bool(int64_t it)> whole;
};

class PsHost {
 public:
  // The host of stage `stage` in a plan of `replicas` replicas of `groups` groups each (their
  // product is the job's replicas, which its shards sum), run by worker `worker_id`.
  PsHost(int worker_id, int stage, int replicas, int groups, LrSchedule schedule, float grad_clip,
         OuterOptimizer outer, PsLinks links);

  // `stepped`: the last iteration whose step the shard's state holds, where the caller knows it.
  void Add(std::unique_ptr<PsShard> shard, int64_t stepped = -1) { Place(std::move(shard), nullptr, stepped); }
  // A shard whose state is still being read (a recovery's, from the checkpoint, while the first
  // forwards compute): `make` waits for what it reads and builds the shard, at the host's first
  // exchange (Broadcast, ReduceNorm, Step or Checkpoint), in the place of the order it was added.
  using MakeShard = std::function<absl::StatusOr<std::unique_ptr<PsShard>>()>;
  void AddPending(MakeShard make, int64_t stepped) { Place(nullptr, std::move(make), stepped); }
  // The hosted shards, a pending one null until it is made.
  const std::vector<std::unique_ptr<PsShard>>& shards() const { return shards_; }
  // A hosted shard and the last iteration it stepped (-1: unknown).
  struct Hosted {
    std::unique_ptr<PsShard> shard;
    int64_t stepped = -1;
  };
  // Every hosted shard, without the gradients of an iteration under way: a new plan version's
  // host keeps one whose state is the one it resumes from. A pending one is dropped unmade (once
  // its reading ended): the next version reads it again.
  std::vector<Hosted> Release();

  // Sends every hosted shard's parameters to every replica (how a run starts: the same init, or
  // the checkpoint's, everywhere).
  absl::Status Broadcast(int64_t it);
  // Iteration `it`'s exchange, in the order a schedule lists it (schedule.h): ReduceNorm takes
  // every group's push of each hosted shard, sums them in the job's replica order and has the global norm
  // reduced (not with local updates); Step steps each hosted shard with that norm (with local
  // updates, the outer step) and sends its new parameters to every replica before it steps the
  // next, in the stage's order, so the first blocks' parameters are on their way first; it gives
  // the norm and learning rate of the step (lr 0 when this worker hosts no shard).
  absl::Status ReduceNorm(int64_t it);
  absl::StatusOr<OptimizerStepResult> Step(int64_t it);
  // Writes every hosted shard's checkpoint of `step` under `checkpoints_root` and reports each.
  absl::Status Checkpoint(int64_t step, const std::string& checkpoints_root, const nlohmann::json& run_config,
                          const std::function<absl::Status(const proto::CheckpointReport&)>& report);

 private:
  absl::Status Send(int64_t it, PsShard& shard);
  // The shard's change in iteration `it` since `before_` (its parameters before the step), with
  // what earlier changes lost to rounding, to every replica; the shard then holds before_ + the
  // change as the replicas decode it, and the new residual.
  absl::Status SendChange(int64_t it, PsShard& shard);
  // A shard, or how to make it, in the next place of the order.
  void Place(std::unique_ptr<PsShard> shard, MakeShard make, int64_t stepped) {
    shards_.push_back(std::move(shard));
    pending_.push_back(std::move(make));
    stepped_.push_back(stepped);
  }
  // Makes every pending shard (AddPending).
  absl::Status MakePending();

  const int worker_id_, stage_, replicas_, groups_;
  const LrSchedule schedule_;
  const float grad_clip_;
  const OuterOptimizer outer_;
  PsLinks links_;
  std::vector<std::unique_ptr<PsShard>> shards_;
  std::vector<MakeShard> pending_;  // [shard of shards_]: how to make it while it is null
  std::vector<int64_t> stepped_;  // [shard of shards_]: the last iteration it stepped, -1 where unknown
  // One shard's parameters and moments on their way to a checkpoint, kept between checkpoints:
  // memory allocated afresh for every one is slower to fill, its pages faulted in as it is written.
  std::vector<float> checkpoint_state_;
  // Parameters sent as their change: the error feedback (its residual the shard's), and scratch.
  ErrorFeedback change_feedback_{WireDtype::kAuto};
  std::vector<float> before_, change_, rounded_;
  int64_t norm_iteration_ = -1;  // the iteration whose global norm ReduceNorm holds
  double global_norm_ = 0;
};

}  // namespace longhaul
