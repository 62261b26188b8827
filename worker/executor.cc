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

absl::StatusOr<IterationResult> Executor::Run(int64_t it, const std::vector<MicroBatch>& mbs) {
  if (static_cast<int>(mbs.size()) != micro_batches_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d micro-batches for a schedule of %d", mbs.size(), micro_batches_));
  }
  IterationResult result;
  std::vector<std::vector<float>> inputs(micro_batches_), grads_in(micro_batches_);
  const int slots = stage_.slots();
  const float* input_grad = nullptr;
  // Times one compute instruction and puts it in the timeline.
  auto computed = [&](const char* op, int m, int64_t t0) {
    const int64_t t1 = Timeline::NowMicros();
    result.compute_seconds += (t1 - t0) * 1e-6;
    timeline_.Add(absl::StrCat(op, m), Track::kCompute, t0, t1, it, m);
  };
  LH_RETURN_IF_ERROR(stage_.ZeroGrads());
  for (const Instr& in : schedule_) {
    const int m = in.micro;
    switch (in.op) {
      case Op::kRecvAct: {
        LH_ASSIGN_OR_RETURN(inputs[m], channel_.Receive(proto::ACTIVATION, it, m, &result.wait_seconds));
        break;
      }
      case Op::kForward: {
        const int64_t t0 = Timeline::NowMicros();
        LH_ASSIGN_OR_RETURN(const float loss, stage_.Forward(m % slots, mbs[m], first_ ? nullptr : inputs[m].data()));
        channel_.Recycle(std::move(inputs[m]));
        if (last_) result.loss += loss / micro_batches_;
        computed("F", m, t0);
        break;
      }
      case Op::kSendAct: {
        LH_ASSIGN_OR_RETURN(const float* out, stage_.Output(m % slots));
        channel_.Send(proto::ACTIVATION, it, m, out, boundary_);
        break;
      }
      case Op::kRecvGrad: {
        LH_ASSIGN_OR_RETURN(grads_in[m], channel_.Receive(proto::GRADIENT, it, m, &result.wait_seconds));
        break;
      }
      case Op::kBackward: {
        const int64_t t0 = Timeline::NowMicros();
        LH_ASSIGN_OR_RETURN(input_grad, stage_.Backward(m % slots, mbs[m], last_ ? nullptr : grads_in[m].data(),
                                                        1.0f / static_cast<float>(micro_batches_)));
        channel_.Recycle(std::move(grads_in[m]));
        computed("B", m, t0);
        break;
      }
      case Op::kSendGrad:
        grads_out_[m].resize(boundary_);
        std::copy(input_grad, input_grad + boundary_, grads_out_[m].begin());
        channel_.Send(proto::GRADIENT, it, m, grads_out_[m].data(), boundary_);
        break;
      case Op::kPushGrads: {
        LH_ASSIGN_OR_RETURN(const float* grads, stage_.Grads());
        LH_RETURN_IF_ERROR(channel_.PushGradients(it, grads));
        break;
      }
      case Op::kPullParams: {
        LH_ASSIGN_OR_RETURN(result.step, channel_.PullParameters(it, stage_, &result.wait_seconds));
        break;
      }
    }
  }
  LH_RETURN_IF_ERROR(channel_.Flush(it));
  return result;
}

}  // namespace longhaul
