#pragma once
// Runs one stage's schedule (runtime/schedule: the same instruction list a cost model runs to
// predict the iteration) for one iteration, against a Stage and a Channel: receive, forward, send;
// receive, backward, send; push the gradients; pull the new parameters (or, with local updates,
// step the stage itself). It times compute and waits
// and puts both in the timeline.
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "data/micro_batch.h"
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
  // The stage's gradients (its whole flat buffer) to the parameter servers; the stage's gradients
  // stay unchanged until Flush.
  virtual absl::Status PushGradients(int64_t it, Stage& stage) = 0;
  // The shards this process hosts (schedule.h's ReduceNorm, Step, Broadcast): every replica's
  // push of each taken and summed, and the global norm reduced over every shard of every stage
  // (the seconds waited for pushes go into `*waited`); each stepped with it, giving the norm and
  // learning rate of the step; each one's new parameters sent to every replica of the stage.
  virtual absl::Status ReduceNorm(int64_t it, double* waited) = 0;
  virtual absl::StatusOr<OptimizerStepResult> Step(int64_t it) = 0;
  virtual absl::Status Broadcast(int64_t it) = 0;
  // The stage's new parameters, from every shard's host, written into it; the seconds waited go
  // into `*waited`.
  virtual absl::Status PullParameters(int64_t it, Stage& stage, double* waited) = 0;
  // Waits until the data of every send of iteration `it` may change (the bytes left this process);
  // reports a failed send of this or an earlier iteration.
  virtual absl::Status Flush(int64_t it) = 0;
};

struct IterationResult {
  double loss = 0;  // last stage: the mean micro-batch loss; else 0
  double compute_seconds = 0, wait_seconds = 0;
  OptimizerStepResult step;
};

class Executor {
 public:
  // `stage` is stage `stage_index` of `stages`; `schedule` its instructions for `micro_batches`
  // micro-batches, whose activations must fit in the stage's slots. Boundary tensors hold
  // `boundary` floats. The references must outlive the executor.
  Executor(Stage& stage, Channel& channel, Timeline& timeline, std::vector<Instr> schedule, int stage_index,
           int stages, int micro_batches, size_t boundary);

  // Local updates (train.local_steps > 1): the list of an iteration that does not exchange, the
  // constructor's being one that does.
  void SetLocalSchedule(std::vector<Instr> schedule) { local_schedule_ = std::move(schedule); }

  // One iteration over `mbs`, which holds the stage's micro-batches in order; `exchange` false
  // runs the local schedule.
  absl::StatusOr<IterationResult> Run(int64_t it, const std::vector<MicroBatch>& mbs, bool exchange = true);

 private:
  Stage& stage_;
  Channel& channel_;
  Timeline& timeline_;
  const std::vector<Instr> schedule_;
  std::vector<Instr> local_schedule_;
  const bool first_, last_;
  const int micro_batches_;
  const size_t boundary_;
  // Input gradients waiting to be sent: a stage's own buffer is overwritten by the next backward,
  // and an fp32 send reads its buffer until the iteration's sends are done.
  std::vector<std::vector<float>> grads_out_;
};

}  // namespace longhaul
