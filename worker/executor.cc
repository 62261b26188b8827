#include "worker/executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace longhaul {

Executor::Executor(Stage& stage, Channel& channel, Timeline& timeline, std::vector<Instr> schedule, int stage_index,
                   int stages, int micro_batches, size_t boundary)
    : stage_(stage), channel_(channel), timeline_(timeline), schedule_(std::move(schedule)),
      first_(stage_index == 0), last_(stage_index == stages - 1), micro_batches_(micro_batches), boundary_(boundary),
      grads_out_(micro_batches) {}

absl::StatusOr<IterationResult> Executor::Run(int64_t it, const std::vector<MicroBatch>& mbs, bool exchange) {
  if (static_cast<int>(mbs.size()) != micro_batches_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d micro-batches for a schedule of %d", mbs.size(), micro_batches_));
  }
  IterationResult result;
  std::vector<std::vector<float>> inputs(micro_batches_), grads_in(micro_batches_);
  const int slots = stage_.slots();
  // Times one compute instruction and puts it in the timeline. On a stage that queues its work
  // this is the time to queue it; the waits for its results land in the sends.
  auto computed = [&](const std::string& name, int m, int64_t t0) {
    const int64_t t1 = Timeline::NowMicros();
    result.compute_seconds += (t1 - t0) * 1e-6;
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
  LH_RETURN_IF_ERROR(stage_.ZeroGrads());
  bool stepped_locally = false;  // the report then gives the local step's learning rate and norm
  for (const Instr& in : exchange ? schedule_ : local_schedule_) {
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
        const int64_t t0 = Timeline::NowMicros();
        LH_ASSIGN_OR_RETURN(const float loss, stage_.Forward(m % slots, mbs[m], first_ ? nullptr : inputs[m].data()));
        channel_.Recycle(std::move(inputs[m]));
        if (last_) result.loss += loss / micro_batches_;
        computed(absl::StrCat("F", m), m, t0);
        LH_RETURN_IF_ERROR(flush_sends());
        break;
      }
      case Op::kBackward: {
        const int64_t t0 = Timeline::NowMicros();
        LH_RETURN_IF_ERROR(stage_.Backward(m % slots, mbs[m], last_ ? nullptr : grads_in[m].data(),
                                           1.0f / static_cast<float>(micro_batches_)));
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
        LH_RETURN_IF_ERROR(channel_.PushGradients(it, stage_));
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
      case Op::kBroadcast:
        LH_RETURN_IF_ERROR(channel_.Broadcast(it));
        break;
      case Op::kPullParams:
        LH_RETURN_IF_ERROR(flush_sends());
        LH_RETURN_IF_ERROR(channel_.PullParameters(it, stage_, &result.wait_seconds));
        break;
    }
  }
  LH_RETURN_IF_ERROR(flush_sends());
  LH_RETURN_IF_ERROR(channel_.Flush(it));
  return result;
}

}  // namespace longhaul
