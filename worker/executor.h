#pragma once
// Runs one stage's schedule (runtime/schedule: the same instruction list a cost model runs to
// predict the iteration) for one iteration, against a Stage and a Channel: receive, forward, send;
// receive, backward, send; push the gradients; pull the new parameters (or, with local updates,
// step the stage itself). It times compute and waits
// and puts both in the timeline.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "cpu/low_rank.h"
#include "model/micro_batch.h"
#include "longhaul.pb.h"
#include "metrics/timeline.h"
#include "model/stage.h"
#include "optim/train_step.h"
#include "schedule/schedule.h"

namespace longhaul {

// Where a stage's tensors come from and go to: boundary tensors to and from the neighbouring
// stages of its replica, and its gradients to and parameters from the parameter servers. A
// worker's channel is the network (NetworkChannel); a test's can be memory.
class Channel {
 public:
  virtual ~Channel() = default;
  // The previous stage's activation (ACTIVATION) or the next stage's gradient (GRADIENT) of
  // micro-batch `micro`, waiting for it; the seconds waited go into `*waited`.
  virtual absl::StatusOr<std::vector<float>> Receive(proto::TensorKind kind, int64_t it, int micro,
                                                     double* waited) = 0;
  // Hands a received buffer back for reuse.
  virtual void Recycle(std::vector<float> buffer) = 0;
  // To the next stage (ACTIVATION) or the previous (GRADIENT); `data` stays unchanged until Flush.
  virtual void Send(proto::TensorKind kind, int64_t it, int micro, const float* data, size_t n) = 0;
  // `data` (n floats from the start of a Send of `kind` and `micro`) as the receiver will decode
  // it: rounded through the link's wire dtype. Shared directions are used as both ends hold them.
  virtual void RoundAsSent(proto::TensorKind /*kind*/, int /*micro*/, float* /*data*/, size_t /*n*/) {}
  // The stage's gradients of each parameter-server shard that begins at float `from` of the
  // stage or later and was not pushed yet in iteration `it` for the replica's group `group` of
  // train.micro_batches (from 0: every one left), to the shards' hosts. The last group's pushed
  // gradients stay unchanged until Flush; an earlier group's (a shrunk layout's replica runs
  // several, layout/plan_layout.h GroupsPerReplica) may change once the call returns, as the next group's
  // backwards start from zero.
  virtual absl::Status PushGradients(int64_t it, Stage& stage, size_t from, int group) = 0;
  // The shards this process hosts (schedule.h's ReduceNorm, Step): every replica's push of each
  // taken and summed, and the global norm reduced over every shard of every stage (the seconds
  // waited for pushes go into `*waited`); then each stepped with it and its new parameters sent
  // to every replica of the stage at once, in the stage's order, giving the norm and learning
  // rate of the step.
  virtual absl::Status ReduceNorm(int64_t it, double* waited) = 0;
  virtual absl::StatusOr<OptimizerStepResult> Step(int64_t it) = 0;
  // The stage's new parameters of iteration `it` from the shards' hosts, written into it: every
  // shard that begins before float `upto` of the stage and is not in yet (SIZE_MAX: all). The
  // seconds waited go into `*waited`.
  virtual absl::Status PullParameters(int64_t it, Stage& stage, double* waited, size_t upto) = 0;
  // An overlapped exchange's landing (schedule.h): PullParameters of iteration `it` (two before
  // the current), each shard set to its new parameters plus what the stage stepped since its push.
  virtual absl::Status LandParameters(int64_t it, Stage&, double*) {
    return absl::FailedPreconditionError(
        absl::StrFormat("iteration %d's exchange is overlapped; this channel carries no local updates", it + 1));
  }
  // Waits until the data of every send of iteration `it` may change (the bytes left this process);
  // reports a failed send of this or an earlier iteration.
  virtual absl::Status Flush(int64_t it) = 0;
  // Flush, except that an overlapped exchange's sends (pushes, parameters) may stay in flight: what
  // they read stays unchanged until the round's next push, several Flushes later.
  virtual absl::Status FlushOverlapped(int64_t it) { return Flush(it); }
  // The error of a plan version that was stopped (a newer one, a lost peer), else OK: asked before
  // each forward and backward, so a stopped version computes nothing more.
  virtual absl::Status Stopped() { return absl::OkStatus(); }
};

struct IterationResult {
  double loss = 0;  // last stage: the mean micro-batch loss; else 0
  double compute_seconds = 0, wait_seconds = 0;
  double step_seconds = 0;  // the worker's own optimizer step (local updates), where the host timed it
  OptimizerStepResult step;
};

class Executor {
 public:
  // `stage` is stage `stage_index` of `stages`; `schedule` its instructions for `micro_batches`
  // micro-batches, whose activations must fit in the stage's slots. Their gradients, each scaled
  // by `weight` (JobConfig::MicroBatchWeight: 1 / group where every replica runs as many), sum in
  // groups of `group` (a job replica's micro-batches; micro_batches a multiple of it), each pushed on
  // its own, as the job's replica it stands for would push it. Boundary tensors are shaped as
  // `acts` (activations) and `grads` (their gradients) say: a subspace model's cross a link
  // narrowed to its kept columns, and with a rank as a low-rank product. The references must
  // outlive the executor.
  Executor(Stage& stage, Channel& channel, Timeline& timeline, std::vector<Instr> schedule, int stage_index,
           int stages, int micro_batches, int group, float weight, BoundaryShape acts, BoundaryShape grads);
  ~Executor();
  Executor(const Executor&) = delete;  // the stage's hooks call back into this object
  Executor& operator=(const Executor&) = delete;

  // Local updates (train.local_steps > 1): the list of an iteration that ends as `end` says, the
  // constructor's being the one that exchanges (kExchange or kLocalStepThenExchange).
  void SetSchedule(IterationEnd end, std::vector<Instr> schedule) { programs_[end] = std::move(schedule); }

  // One iteration over `mbs`, which holds the stage's micro-batches in order, ending as `end` says
  // (SetSchedule). Where the stage takes exchange hooks (model/exchange_hooks.h), the
  // first stage's last backward pushes each shard's gradients as soon as they are complete, and
  // with `defer_pull` the iteration's new parameters are pulled during the next Run's first
  // forward, each shard just before a block reads it (until then the stage holds the previous
  // iteration's parameters, and pull_pending() names the iteration).
  absl::StatusOr<IterationResult> Run(int64_t it, const std::vector<MicroBatch>& mbs,
                                      IterationEnd end = IterationEnd::kExchange, bool defer_pull = false);
  int64_t pull_pending() const { return pull_pending_; }
  // Forward only over validation micro-batches `mbs` with the parameters of iteration `it`'s step
  // (a deferred pull completes first): receive, forward, send, as EVAL_ACTIVATION. Returns the
  // sum of their losses on the last stage, else 0.
  absl::StatusOr<double> Evaluate(int64_t it, const std::vector<MicroBatch>& mbs);
  // Called with the iteration whose deferred pull just completed, before anything changes the
  // stage's parameters again.
  void SetOnDeferredPull(std::function<void(int64_t it)> f) { on_deferred_pull_ = std::move(f); }
  // cluster.overlap_exchange false: every iteration pushes after its backwards and pulls before it
  // ends, as a backend without hooks does.
  void SetOverlap(bool overlap) { hooked_ = stage_.SetExchangeHooks(overlap ? &hooks_ : nullptr) && overlap; }

 private:
  // One Run: its iteration and micro-batches, the tensors it received, the sends it holds back and
  // what it reports.
  struct Pass {
    Pass(int64_t it, const std::vector<MicroBatch>& mbs, bool defer_pull)
        : it(it), mbs(mbs), defer_pull(defer_pull), inputs(mbs.size()), grads_in(mbs.size()) {}
    const int64_t it;
    const std::vector<MicroBatch>& mbs;
    const bool defer_pull;
    IterationResult result;
    std::vector<std::vector<float>> inputs, grads_in;  // [micro-batch]: received
    // Sends held back: a stage that queues its work sends a micro-batch's result once the next
    // compute is queued (its copy then overlaps that compute), and before anything that waits on
    // a peer.
    std::vector<Instr> deferred;
    bool pushes = false;      // the program pushes gradients
    bool push_early = false;  // the last group's are pushed during the last backward, by the hooks
    int last_group = 0;
    bool stepped_locally = false;  // the report then gives the local step's learning rate and norm
  };
  // Instruction `in` of the pass's program.
  absl::Status Execute(Pass& pass, const Instr& in);
  absl::Status Forward(Pass& pass, int m);
  absl::Status Backward(Pass& pass, int m);
  // A kSendAct or kSendGrad now.
  absl::Status Send(Pass& pass, const Instr& in);
  absl::Status FlushSends(Pass& pass);
  // Times one compute instruction and puts it in the timeline. On a stage that queues its work
  // this is the time to queue it; the waits for its results land in the sends. A forward that
  // pulled parameters between its blocks waited `waited` seconds of it, counted as waiting.
  void Computed(Pass& pass, const std::string& name, int m, int64_t t0, double waited = 0);
  // A hook's failure (it gave up the Forward or Backward that called it), once that returned.
  absl::Status TakeHookStatus();
  // A boundary tensor of `shape` as it leaves as `kind` (ACTIVATION, EVAL_ACTIVATION or
  // GRADIENT) of micro-batch `micro`: what the stage gave (`full`) copied into `out`, narrowed
  // and put in low rank where the shape says and the host does it (HostRecodes; the rank's random
  // directions drawn from LowRankSeed(mb, gradient)). With shared directions micro-batch 0's
  // activation (and each evaluation's) draws them and carries them first.
  absl::Status Outgoing(const BoundaryShape& shape, const float* full, std::vector<float>& out, const MicroBatch& mb,
                        proto::TensorKind kind, int micro);
  // Whether a boundary of `shape` leaves and arrives through the host's copy (narrowed, or put
  // in low rank here), rather than as the stage gives and reads it (whole, or in low rank by the
  // stage itself: Stage::EncodeLowRank).
  bool HostRecodes(const BoundaryShape& shape) const { return shape.recoded() && !device_low_rank_; }
  // A received boundary tensor as the stage reads it (widened or multiplied out where `shape`
  // says), and its buffer given back once read: to the mailbox's pool, or a recoded one to
  // widened_. It came as `kind` of micro-batch `micro`: with shared directions, an iteration's
  // first activation (and each evaluation's) brings the ones it and the iteration's later
  // micro-batches travel in.
  absl::StatusOr<std::vector<float>> Incoming(const BoundaryShape& shape, std::vector<float> sent,
                                              proto::TensorKind kind, int micro);
  void Release(const BoundaryShape& shape, std::vector<float> read);
  // Before a forward of `kind` and `micro`: a stage that puts its boundaries in shared directions
  // itself hears whether this one brings and draws them (Stage::NextDirections).
  void DeviceDirections(proto::TensorKind kind, int micro);

  Stage& stage_;
  Channel& channel_;
  Timeline& timeline_;
  const std::vector<Instr> schedule_;
  std::map<IterationEnd, std::vector<Instr>> programs_;
  const bool first_, last_;
  const int micro_batches_, group_;
  const float weight_;
  const BoundaryShape acts_, grads_;
  bool device_low_rank_ = false;  // the stage puts them in low rank itself (Stage::EncodeLowRank)
  cpu::LowRankCodec low_rank_;
  std::vector<float> kept_;  // a narrowed tensor's kept columns, on their way into or out of low rank
  // Shared directions (BoundaryShape::shared; rank × kept, padded to directions()): those this
  // stage's activations travel in, drawn from the iteration's first micro-batch (an evaluation's
  // from each of its own) as the link rounds them, and those its input came in, in which its
  // gradients go back. An iteration draws them anew, so a rerun after a recovery draws the same.
  std::vector<float> sent_directions_, received_directions_;
  // Input gradients waiting to be sent: a stage's own buffer is overwritten by the next backward,
  // and an fp32 send reads its buffer until the iteration's sends are done. Recoded activations
  // wait so too; whole ones are sent from the stage's slot, which lives until their backward.
  std::vector<std::vector<float>> grads_out_, acts_out_;
  // Recoded buffers read and given back, for the next Incoming: the mailbox hands out buffers of
  // the size a link carries only, and a fresh one a micro-batch would fault its pages in anew.
  std::vector<std::vector<float>> widened_;
  // What the stage's hooks do while one of these is set (-1: nothing); a hook's failure waits in
  // hook_status_ until its Forward or Backward returns.
  ExchangeHooks hooks_;
  bool hooked_ = false;
  int64_t pull_pending_ = -1, push_early_ = -1;
  int push_group_ = 0;  // the group push_early_ pushes
  double* pull_waited_ = nullptr;
  std::function<void(int64_t)> on_deferred_pull_;
  absl::Status hook_status_;
};

}  // namespace longhaul
