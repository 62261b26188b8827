#pragma once
// A worker's Channel: boundary tensors to and from the neighbouring stages of its replica over the
// tensor transport, its stage's gradients to the parameter-server shards' hosts (itself for the
// shards it hosts), and the new parameters back from them. Received tensors come out of the
// worker's Mailbox; sends go through its PeerDirectory.
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "longhaul.pb.h"
#include "metrics/timeline.h"
#include "model/param_layout.h"
#include "transport/error_feedback.h"
#include "transport/mailbox.h"
#include "worker/executor.h"
#include "worker/norm_exchange.h"
#include "worker/peer_directory.h"
#include "worker/ps_host.h"

namespace longhaul {

class NetworkChannel final : public Channel {
 public:
  // The worker runs (stage, replica), which pushes `groups` groups of gradients an iteration
  // (layout/plan_layout.h GroupsPerReplica); `stage_shards` are its stage's parameter-server shards, cut
  // from `layout`. Receives wait at most the transport's timeout. The references must outlive it.
  // `norm_hosts`: every parameter-server host of the plan (worker/norm_exchange.h).
  NetworkChannel(int stage, int replica, int groups, std::vector<proto::ShardPlacement> stage_shards,
                 std::vector<NormHost> norm_hosts, const ParamLayout& layout, Mailbox& mailbox, PeerDirectory& peers,
                 Timeline& timeline);
  // The shards this worker hosts (ReduceNorm, Step).
  void SetPsHost(PsHost* host) { ps_host_ = host; }
  // Local updates (train.local_steps > 1): PushGradients pushes the change of the stage's
  // parameters since they were last pulled, which the outer step averages.
  void PushChanges() { pulled_.resize(layout_.total()); }
  // With PushChanges over a lossy exchange (transport/wire_plan.h): the parameters of an exchange
  // arrive as their change since the last one, added to the parameters as last pulled, except
  // where `whole(it)` says they travel whole.
  void PullChanges(std::function<bool(int64_t it)> whole) { whole_ = std::move(whole); }
  // An overlapped exchange lands as `own` x the stage's parameters + (1 - own) x the new ones
  // (train.overlap_mix); 0: as the new ones plus what the stage stepped since its push.
  void MixLandings(float own) { land_mix_ = own; }

  absl::StatusOr<std::vector<float>> Receive(proto::TensorKind kind, int64_t it, int micro, double* waited) override;
  void Recycle(std::vector<float> buffer) override { mailbox_.Recycle(std::move(buffer)); }
  absl::Status Stopped() override { return mailbox_.Closed(); }
  void Send(proto::TensorKind kind, int64_t it, int micro, const float* data, size_t n) override;
  void RoundAsSent(proto::TensorKind kind, int micro, float* data, size_t n) override;
  absl::Status PushGradients(int64_t it, Stage& stage, size_t from, int group) override;
  absl::Status ReduceNorm(int64_t it, double* waited) override;
  absl::StatusOr<OptimizerStepResult> Step(int64_t it) override;
  absl::Status PullParameters(int64_t it, Stage& stage, double* waited, size_t upto) override;
  absl::Status LandParameters(int64_t it, Stage& stage, double* waited) override;
  // With PushChanges: the parameters as the replicas last pulled them, which they share.
  const std::vector<float>& pulled() const { return pulled_; }
  // The iteration whose parameters the stage holds, every shard of it pulled (or Held); -1 while a
  // pull is part way, or before any.
  int64_t held() const { return held_; }
  // A shard's parameters as its owner holds them, `n` floats from `begin` of the stage's buffer,
  // into the stage as a pull of them would: rounded through the parameters' wire dtype. How a
  // resumed plan version sets what the checkpoint holds without a round trip.
  absl::Status PlaceShard(Stage& stage, size_t begin, const float* params, size_t n);
  // The stage holds iteration `it`'s parameters, `params`, without a pull (PlaceShard, or kept from
  // the version before).
  void Held(int64_t it, const float* params);
  absl::Status Flush(int64_t) override { return peers_.Flush(timeline_); }
  absl::Status FlushOverlapped(int64_t) override { return peers_.Flush(timeline_, false, /*exchange_in_flight=*/true); }
  // Flush, and until every send is acknowledged: before the worker's connections close.
  absl::Status Drain() { return peers_.Flush(timeline_, /*acknowledged=*/true); }

  // Group `group`'s error-feedback residuals, laid out as the stage's parameters (zero where a
  // shard's wire keeps none), for a checkpoint; and set from one.
  std::vector<float> Residuals(int group) const;
  void SetResiduals(int group, const float* residuals);

  // A tensor a peer sends this worker, waiting for it; the seconds waited go into `*waited`.
  absl::StatusOr<std::vector<float>> Take(proto::TensorKind kind, int64_t it, int micro, int from_stage,
                                          int from_replica, int shard, double* waited);
  // A replica's push of group `group` of a hosted shard, for the PsHost (its wait counts as
  // ReduceNorm's); the group travels as the tensor's micro-batch.
  absl::StatusOr<std::vector<float>> TakePush(int64_t it, int replica, int group, int shard) {
    return Take(proto::GRAD_PUSH, it, group, stage_, replica, shard, &ps_waited_);
  }
  // The global norm of iteration `it`, for the PsHost: this host's Σ g² per shard to every other
  // host, theirs taken (its wait counts as ReduceNorm's, as the simulator counts it).
  absl::StatusOr<double> ReduceNormAmongHosts(int64_t it, const std::vector<ShardSquares>& own);
  // Parameters of a hosted shard (or, `dtype` given, their change) to replica `replica` of this
  // stage, this worker's own included.
  void SendParams(int64_t it, int replica, int shard, const float* data, size_t n, WireDtype dtype);

 private:
  // A tensor this worker sends itself, rounded through the wire dtype as a peer receives it (`dtype`
  // where given, else the plan's): otherwise the replicas' parameters drift apart whenever the wire
  // is not fp32.
  void SendToSelf(proto::TensorKind kind, int64_t it, int micro, int shard, const float* data, size_t n,
                  WireDtype dtype = WireDtype::kAuto);
  // PullParameters, or with `land` LandParameters.
  absl::Status Pull(int64_t it, Stage& stage, double* waited, size_t upto, bool land);

  const int stage_, replica_, groups_;
  const std::vector<proto::ShardPlacement> stage_shards_;
  const std::vector<NormHost> norm_hosts_;
  std::vector<float> norm_out_;  // this host's partials, read by the sends until Flush
  const ParamLayout& layout_;
  Mailbox& mailbox_;
  PeerDirectory& peers_;
  Timeline& timeline_;
  PsHost* ps_host_ = nullptr;
  double ps_waited_ = 0;  // while the PsHost takes pushes and waits for the global norm
  // [group][shard of stage_shards_]: lossy pushes carry error feedback, each group's its own as
  // each replica of the job has; checkpoints keep the residuals (Residuals).
  std::vector<std::vector<ErrorFeedback>> feedback_;
  // With PushChanges: the parameters as last pulled, and their change since then (until the next
  // push, the change pushed).
  std::vector<float> pulled_, change_;
  std::function<bool(int64_t)> whole_;  // PullChanges'; empty: parameters always arrive whole
  float land_mix_ = 0;                  // MixLandings'
  // [group]: the gradients of a group before the last, pushed from here until Flush (the stage's
  // own start over for the next group).
  std::vector<std::vector<float>> group_grads_;
  // The shards of stage_shards_ pushed in iteration push_it_ for group push_group_, and how many
  // of them (a prefix) are pulled in pull_it_: an iteration's exchange may come in several calls.
  int64_t push_it_ = -1, pull_it_ = -1, held_ = -1;
  int push_group_ = -1;
  std::vector<bool> pushed_;
  size_t shards_pulled_ = 0;
};

}  // namespace longhaul
