#include "worker/executor.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace longhaul {

Executor::Executor(Stage& stage, Channel& channel, Timeline& timeline, std::vector<Instr> schedule, int stage_index,
                   int stages, int micro_batches, int group, size_t boundary)
    : stage_(stage), channel_(channel), timeline_(timeline), schedule_(std::move(schedule)),
      first_(stage_index == 0), last_(stage_index == stages - 1), micro_batches_(micro_batches), group_(group),
      boundary_(boundary), grads_out_(micro_batches) {
  // Between blocks too, a stopped version computes nothing more.
  hooks_.before_forward = [this](size_t end) {
    if (hook_status_.ok()) hook_status_ = channel_.Stopped();
    if (pull_pending_ >= 0 && hook_status_.ok()) {
      hook_status_ = channel_.PullParameters(pull_pending_, stage_, pull_waited_, end);
    }
    return hook_status_.ok();
  };
  hooks_.after_backward = [this](size_t begin) {
    if (hook_status_.ok()) hook_status_ = channel_.Stopped();
    if (push_early_ >= 0 && hook_status_.ok()) {
      hook_status_ = channel_.PushGradients(push_early_, stage_, begin, push_group_);
    }
    return hook_status_.ok();
  };
  hooked_ = stage_.SetExchangeHooks(&hooks_);
}

Executor::~Executor() {
  if (hooked_) stage_.SetExchangeHooks(nullptr);
}

absl::StatusOr<IterationResult> Executor::Run(int64_t it, const std::vector<MicroBatch>& mbs, bool exchange,
                                              bool defer_pull) {
  if (static_cast<int>(mbs.size()) != micro_batches_ || group_ < 1 || micro_batches_ % group_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%d micro-batches for a schedule of %d in groups of %d",
                                                      mbs.size(), micro_batches_, group_));
  }
  IterationResult result;
  std::vector<std::vector<float>> inputs(micro_batches_), grads_in(micro_batches_);
  const int slots = stage_.slots();
  // Times one compute instruction and puts it in the timeline. On a stage that queues its work
  // this is the time to queue it; the waits for its results land in the sends. A forward that
  // pulled parameters between its blocks waited `waited` seconds of it, counted as waiting.
  auto computed = [&](const std::string& name, int m, int64_t t0, double waited = 0) {
    const int64_t t1 = Timeline::NowMicros();
    result.compute_seconds += (t1 - t0) * 1e-6 - waited;
    timeline_.Add(name, Track::kCompute, t0, t1, it, m);
  };
  auto send = [&](const Instr& in) -> absl::Status {
    const int m = in.micro;
    if (in.op == Op::kSendAct) {
      LH_ASSIGN_OR_RETURN(const float* out, stage_.Output(m % slots));
      channel_.Send(proto::ACTIVATION, it, m, out, boundary_);
      return absl::OkStatus();
    }
    LH_ASSIGN_OR_RETURN(const float* grad, stage_.InputGrad(m % slots));
    grads_out_[m].assign(grad, grad + boundary_);
    channel_.Send(proto::GRADIENT, it, m, grads_out_[m].data(), boundary_);
    return absl::OkStatus();
  };
  // A stage that queues its work sends a micro-batch's result once the next compute is queued
  // (its copy then overlaps that compute), and before anything that waits on a peer.
  std::vector<Instr> deferred;
  auto flush_sends = [&]() -> absl::Status {
    for (const Instr& in : deferred) LH_RETURN_IF_ERROR(send(in));
    deferred.clear();
    return absl::OkStatus();
  };
  hook_status_ = absl::OkStatus();
  LH_RETURN_IF_ERROR(stage_.ZeroGrads());
  const std::vector<Instr>& program = exchange ? schedule_ : local_schedule_;
  // A group's gradients are complete in its last backward (schedules run them in ascending
  // micro-batch order); with local updates what is pushed is the change after the local step
  // instead. Only the first stage pushes the last group during that backward: a later one would
  // encode its pushes on the critical path of the previous stage, which waits for its input
  // gradient. An earlier group is pushed after its last backward, and the next starts from zero.
  const bool pushes = std::find(program.begin(), program.end(), Instr{Op::kPushGrads}) != program.end();
  const bool push_early = hooked_ && first_ && local_schedule_.empty() && pushes;
  const int last_group = micro_batches_ / group_ - 1;
  bool stepped_locally = false;  // the report then gives the local step's learning rate and norm
  for (const Instr& in : program) {
    const int m = in.micro;
    switch (in.op) {
      case Op::kRecvAct:
      case Op::kRecvGrad: {
        LH_RETURN_IF_ERROR(flush_sends());
        const proto::TensorKind kind = in.op == Op::kRecvAct ? proto::ACTIVATION : proto::GRADIENT;
        LH_ASSIGN_OR_RETURN((in.op == Op::kRecvAct ? inputs : grads_in)[m],
                            channel_.Receive(kind, it, m, &result.wait_seconds));
        break;
      }
      case Op::kForward: {
        // A stage 0 of GPipe runs its forwards back to back: a stopped version (a recovery under
        // way) is left here, between them, not after all of them. A stage without hooks stops
        // only here.
        LH_RETURN_IF_ERROR(channel_.Stopped());
        const int64_t t0 = Timeline::NowMicros();
        const double waited_before = result.wait_seconds;
        pull_waited_ = &result.wait_seconds;
        LH_ASSIGN_OR_RETURN(const float loss, stage_.Forward(m % slots, mbs[m], first_ ? nullptr : inputs[m].data()));
        LH_RETURN_IF_ERROR(TakeHookStatus());
        if (pull_pending_ >= 0) {  // the shards no block asked for (none, where every one holds a block)
          LH_RETURN_IF_ERROR(channel_.PullParameters(pull_pending_, stage_, &result.wait_seconds, SIZE_MAX));
          if (on_deferred_pull_) on_deferred_pull_(pull_pending_);
          pull_pending_ = -1;
        }
        channel_.Recycle(std::move(inputs[m]));
        if (last_) result.loss += loss / micro_batches_;
        computed(absl::StrCat("F", m), m, t0, result.wait_seconds - waited_before);
        LH_RETURN_IF_ERROR(flush_sends());
        break;
      }
      case Op::kBackward: {
        LH_RETURN_IF_ERROR(channel_.Stopped());
        const int64_t t0 = Timeline::NowMicros();
        if (push_early && m == micro_batches_ - 1) push_early_ = it, push_group_ = last_group;
        const absl::Status backward = stage_.Backward(m % slots, mbs[m], last_ ? nullptr : grads_in[m].data(),
                                                      1.0f / static_cast<float>(group_));
        push_early_ = -1;
        LH_RETURN_IF_ERROR(backward);
        LH_RETURN_IF_ERROR(TakeHookStatus());
        if (pushes && (m + 1) % group_ == 0 && m + 1 < micro_batches_) {
          LH_RETURN_IF_ERROR(channel_.PushGradients(it, stage_, 0, m / group_));
          LH_RETURN_IF_ERROR(stage_.ZeroGrads());
        }
        channel_.Recycle(std::move(grads_in[m]));
        computed(absl::StrCat("B", m), m, t0);
        LH_RETURN_IF_ERROR(flush_sends());
        break;
      }
      case Op::kSendAct:
      case Op::kSendGrad:
        if (stage_.queues_work()) {
          deferred.push_back(in);
        } else {
          LH_RETURN_IF_ERROR(send(in));
        }
        break;
      case Op::kPushGrads: {
        LH_RETURN_IF_ERROR(flush_sends());
        LH_RETURN_IF_ERROR(channel_.PushGradients(it, stage_, 0, last_group));
        break;
      }
      case Op::kReduceNorm:
        LH_RETURN_IF_ERROR(flush_sends());
        LH_RETURN_IF_ERROR(channel_.ReduceNorm(it, &result.wait_seconds));
        break;
      case Op::kStep: {
        LH_ASSIGN_OR_RETURN(const OptimizerStepResult step, channel_.Step(it));
        if (!stepped_locally) result.step = step;
        break;
      }
      case Op::kLocalStep: {
        const int64_t t0 = Timeline::NowMicros();
        LH_ASSIGN_OR_RETURN(result.step, stage_.Step(it));
        stepped_locally = true;
        computed("local step", -1, t0);
        break;
      }
      case Op::kPullParams:
        LH_RETURN_IF_ERROR(flush_sends());
        if (hooked_ && defer_pull) {
          pull_pending_ = it;
        } else {
          LH_RETURN_IF_ERROR(channel_.PullParameters(it, stage_, &result.wait_seconds, SIZE_MAX));
        }
        break;
    }
  }
  LH_RETURN_IF_ERROR(flush_sends());
  LH_RETURN_IF_ERROR(channel_.Flush(it));
  return result;
}

absl::Status Executor::TakeHookStatus() { return std::exchange(hook_status_, absl::OkStatus()); }

absl::StatusOr<double> Executor::Evaluate(int64_t it, const std::vector<MicroBatch>& mbs) {
  double waited = 0;
  if (pull_pending_ >= 0) {
    // The report of `it` then carries these parameters' CRC itself: no deferred-pull callback.
    LH_RETURN_IF_ERROR(channel_.PullParameters(pull_pending_, stage_, &waited, SIZE_MAX));
    pull_pending_ = -1;
  }
  const int64_t t0 = Timeline::NowMicros();
  double loss_sum = 0;
  // Sent from copies: the next forward overwrites the slot's output before the sends are done.
  std::vector<std::vector<float>> outputs(mbs.size());
  for (size_t m = 0; m < mbs.size(); ++m) {
    const int micro = static_cast<int>(m);
    std::vector<float> input;
    if (!first_) {
      LH_ASSIGN_OR_RETURN(input, channel_.Receive(proto::EVAL_ACTIVATION, it, micro, &waited));
    }
    LH_ASSIGN_OR_RETURN(const float loss, stage_.Forward(0, mbs[m], first_ ? nullptr : input.data()));
    LH_RETURN_IF_ERROR(TakeHookStatus());
    if (!first_) channel_.Recycle(std::move(input));
    if (last_) {
      loss_sum += loss;
      continue;
    }
    LH_ASSIGN_OR_RETURN(const float* out, stage_.Output(0));
    outputs[m].assign(out, out + boundary_);
    channel_.Send(proto::EVAL_ACTIVATION, it, micro, outputs[m].data(), boundary_);
  }
  LH_RETURN_IF_ERROR(channel_.Flush(it));
  timeline_.Add("validation", Track::kCompute, t0, Timeline::NowMicros(), it, -1);
  return loss_sum;
}

}  // namespace longhaul
