#include "worker/executor.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/wire_dtype.h"
#include "model/low_rank_method.h"
#include "util/status_macros.h"

namespace longhaul {

static_assert(kDirectionsPiece % kWirePiece == 0, "shared directions must end where a wire format's blocks do");

Executor::Executor(Stage& stage, Channel& channel, Timeline& timeline, std::vector<Instr> schedule, int stage_index,
                   int stages, int micro_batches, int group, float weight, BoundaryShape acts, BoundaryShape grads)
    : stage_(stage), channel_(channel), timeline_(timeline), schedule_(std::move(schedule)),
      first_(stage_index == 0), last_(stage_index == stages - 1), micro_batches_(micro_batches), group_(group),
      weight_(weight), acts_(acts), grads_(grads), grads_out_(micro_batches), acts_out_(micro_batches) {
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
  device_low_rank_ = stage_.EncodeLowRank(acts_, grads_);
}

Executor::~Executor() {
  if (hooked_) stage_.SetExchangeHooks(nullptr);
}

absl::StatusOr<IterationResult> Executor::Run(int64_t it, const std::vector<MicroBatch>& mbs, IterationEnd end,
                                              bool defer_pull) {
  if (static_cast<int>(mbs.size()) != micro_batches_ || group_ < 1 || micro_batches_ % group_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%d micro-batches for a schedule of %d in groups of %d",
                                                      mbs.size(), micro_batches_, group_));
  }
  Pass pass(it, mbs, defer_pull);
  hook_status_ = absl::OkStatus();
  LH_RETURN_IF_ERROR(stage_.ZeroGrads());
  const bool exchanges = end == IterationEnd::kExchange || end == IterationEnd::kLocalStepThenExchange;
  const auto listed = programs_.find(end);
  if (!exchanges && listed == programs_.end()) {
    return absl::InternalError(absl::StrFormat("iteration %d ends in a way this executor has no schedule for", it + 1));
  }
  const std::vector<Instr>& program = exchanges ? schedule_ : listed->second;
  // A group's gradients are complete in its last backward (schedules run them in ascending
  // micro-batch order); with local updates what is pushed is the change after the local step
  // instead. Only the first stage pushes the last group during that backward: a later one would
  // encode its pushes on the critical path of the previous stage, which waits for its input
  // gradient. An earlier group is pushed after its last backward, and the next starts from zero.
  pass.pushes = std::find(program.begin(), program.end(), Instr{Op::kPushGrads}) != program.end();
  pass.push_early = hooked_ && first_ && programs_.empty() && pass.pushes;
  pass.last_group = micro_batches_ / group_ - 1;
  for (const Instr& in : program) LH_RETURN_IF_ERROR(Execute(pass, in));
  LH_RETURN_IF_ERROR(FlushSends(pass));
  const bool in_flight = end == IterationEnd::kLocalStepThenPush || end == IterationEnd::kLocalStepThenOuterStep ||
                         end == IterationEnd::kLocalStepInFlight;
  LH_RETURN_IF_ERROR(in_flight ? channel_.FlushOverlapped(it) : channel_.Flush(it));
  return pass.result;
}

absl::Status Executor::Execute(Pass& pass, const Instr& in) {
  const int m = in.micro;
  switch (in.op) {
    case Op::kRecvAct:
    case Op::kRecvGrad: {
      LH_RETURN_IF_ERROR(FlushSends(pass));
      const proto::TensorKind kind = in.op == Op::kRecvAct ? proto::ACTIVATION : proto::GRADIENT;
      LH_ASSIGN_OR_RETURN(std::vector<float> got, channel_.Receive(kind, pass.it, m, &pass.result.wait_seconds));
      const BoundaryShape& shape = in.op == Op::kRecvAct ? acts_ : grads_;
      LH_ASSIGN_OR_RETURN((in.op == Op::kRecvAct ? pass.inputs : pass.grads_in)[m],
                          Incoming(shape, std::move(got), kind, m));
      return absl::OkStatus();
    }
    case Op::kForward:
      return Forward(pass, m);
    case Op::kBackward:
      return Backward(pass, m);
    case Op::kSendAct:
    case Op::kSendGrad:
      if (!stage_.queues_work()) return Send(pass, in);
      pass.deferred.push_back(in);
      return absl::OkStatus();
    case Op::kPushGrads:
      LH_RETURN_IF_ERROR(FlushSends(pass));
      return channel_.PushGradients(pass.it, stage_, 0, pass.last_group);
    case Op::kReduceNorm:
      LH_RETURN_IF_ERROR(FlushSends(pass));
      return channel_.ReduceNorm(pass.it - in.back, &pass.result.wait_seconds);
    case Op::kStep: {
      LH_ASSIGN_OR_RETURN(const OptimizerStepResult step, channel_.Step(pass.it - in.back));
      if (!pass.stepped_locally) pass.result.step = step;
      return absl::OkStatus();
    }
    case Op::kLocalStep: {
      // Timed apart from the blocks' compute: the planner prices a step by the bytes it streams,
      // whatever the micro-batches.
      const int64_t t0 = Timeline::NowMicros();
      LH_ASSIGN_OR_RETURN(pass.result.step, stage_.Step(pass.it));
      pass.stepped_locally = true;
      const int64_t t1 = Timeline::NowMicros();
      // A device backend returns once the step is queued: its time is not the step's.
      if (!stage_.queues_work()) pass.result.step_seconds = (t1 - t0) * 1e-6;
      timeline_.Add("local step", Track::kCompute, t0, t1, pass.it, -1);
      return absl::OkStatus();
    }
    case Op::kPullParams:
      LH_RETURN_IF_ERROR(FlushSends(pass));
      if (in.back > 0) return channel_.LandParameters(pass.it - in.back, stage_, &pass.result.wait_seconds);
      if (hooked_ && pass.defer_pull) {
        pull_pending_ = pass.it;
        return absl::OkStatus();
      }
      return channel_.PullParameters(pass.it, stage_, &pass.result.wait_seconds, SIZE_MAX);
  }
  return absl::OkStatus();
}

absl::Status Executor::Forward(Pass& pass, int m) {
  // A stage 0 of GPipe runs its forwards back to back: a stopped version (a recovery under way) is
  // left here, between them, not after all of them. A stage without hooks stops only here.
  LH_RETURN_IF_ERROR(channel_.Stopped());
  const int64_t t0 = Timeline::NowMicros();
  const double waited_before = pass.result.wait_seconds;
  pull_waited_ = &pass.result.wait_seconds;
  DeviceDirections(proto::ACTIVATION, m);
  LH_ASSIGN_OR_RETURN(const float loss, stage_.Forward(m % stage_.slots(), pass.mbs[m],
                                                       first_ ? nullptr : pass.inputs[m].data()));
  LH_RETURN_IF_ERROR(TakeHookStatus());
  if (pull_pending_ >= 0) {  // the shards no block asked for (none, where every one holds a block)
    LH_RETURN_IF_ERROR(channel_.PullParameters(pull_pending_, stage_, &pass.result.wait_seconds, SIZE_MAX));
    if (on_deferred_pull_) on_deferred_pull_(pull_pending_);
    pull_pending_ = -1;
  }
  Release(acts_, std::move(pass.inputs[m]));
  if (last_) pass.result.loss += loss / micro_batches_;
  Computed(pass, absl::StrCat("F", m), m, t0, pass.result.wait_seconds - waited_before);
  return FlushSends(pass);
}

absl::Status Executor::Backward(Pass& pass, int m) {
  LH_RETURN_IF_ERROR(channel_.Stopped());
  const int64_t t0 = Timeline::NowMicros();
  if (pass.push_early && m == micro_batches_ - 1) push_early_ = pass.it, push_group_ = pass.last_group;
  const absl::Status backward = stage_.Backward(m % stage_.slots(), pass.mbs[m],
                                                last_ ? nullptr : pass.grads_in[m].data(),
                                                weight_);
  push_early_ = -1;
  LH_RETURN_IF_ERROR(backward);
  LH_RETURN_IF_ERROR(TakeHookStatus());
  if (pass.pushes && (m + 1) % group_ == 0 && m + 1 < micro_batches_) {
    LH_RETURN_IF_ERROR(channel_.PushGradients(pass.it, stage_, 0, m / group_));
    LH_RETURN_IF_ERROR(stage_.ZeroGrads());
  }
  Release(grads_, std::move(pass.grads_in[m]));
  Computed(pass, absl::StrCat("B", m), m, t0);
  return FlushSends(pass);
}

absl::Status Executor::Send(Pass& pass, const Instr& in) {
  const int m = in.micro;
  if (in.op == Op::kSendAct) {
    LH_ASSIGN_OR_RETURN(const float* out, stage_.Output(m % stage_.slots()));
    size_t n = acts_.sent(m == 0);  // shared directions travel with micro-batch 0
    if (HostRecodes(acts_)) {
      LH_RETURN_IF_ERROR(Outgoing(acts_, out, acts_out_[m], pass.mbs[m], proto::ACTIVATION, m));
      out = acts_out_[m].data(), n = acts_out_[m].size();
    }
    channel_.Send(proto::ACTIVATION, pass.it, m, out, n);
    return absl::OkStatus();
  }
  LH_ASSIGN_OR_RETURN(const float* grad, stage_.InputGrad(m % stage_.slots()));
  LH_RETURN_IF_ERROR(Outgoing(grads_, grad, grads_out_[m], pass.mbs[m], proto::GRADIENT, m));
  channel_.Send(proto::GRADIENT, pass.it, m, grads_out_[m].data(), grads_.sent());
  return absl::OkStatus();
}

absl::Status Executor::Outgoing(const BoundaryShape& shape, const float* full, std::vector<float>& out,
                                const MicroBatch& mb, proto::TensorKind kind, int micro) {
  const bool gradient = kind == proto::GRADIENT;
  const bool draws = shape.shared && !gradient && (micro == 0 || kind == proto::EVAL_ACTIVATION);
  out.resize(shape.sent(draws));
  if (!HostRecodes(shape)) {
    std::copy_n(full, out.size(), out.data());
    return absl::OkStatus();
  }
  if (!shape.low_rank()) {
    shape.Keep(full, out.data());
    return absl::OkStatus();
  }
  const float* kept = full;
  if (shape.narrowed()) {
    kept_.resize(shape.kept_floats());
    shape.Keep(full, kept_.data());
    kept = kept_.data();
  }
  if (!shape.shared) {
    return low_rank_.Encode(kept, shape.rows, shape.kept, shape.rank, LowRankSeed(mb, gradient), out.data());
  }
  const size_t directions = shape.directions();
  if (draws) {
    sent_directions_.assign(directions, 0.0f);
    LH_RETURN_IF_ERROR(low_rank_.Directions(kept, shape.rows, shape.kept, shape.rank, LowRankSeed(mb, false),
                                            sent_directions_.data()));
    channel_.RoundAsSent(kind, micro, sent_directions_.data(), directions);
    std::copy(sent_directions_.begin(), sent_directions_.end(), out.begin());
  }
  const std::vector<float>& in = gradient ? received_directions_ : sent_directions_;
  if (in.size() != directions) {
    return absl::InternalError(absl::StrFormat("a boundary's %s of micro-batch %d leaves before its directions came",
                                               gradient ? "gradient" : "activation", micro));
  }
  return cpu::LowRankCodec::Project(kept, shape.rows, shape.kept, shape.rank, in.data(),
                                    out.data() + (draws ? directions : 0));
}

absl::StatusOr<std::vector<float>> Executor::Incoming(const BoundaryShape& shape, std::vector<float> sent,
                                                     proto::TensorKind kind, int micro) {
  if (!HostRecodes(shape)) return sent;
  const bool gradient = kind == proto::GRADIENT;
  const float* coords = sent.data();
  if (shape.shared && (kind == proto::EVAL_ACTIVATION || (kind == proto::ACTIVATION && micro == 0))) {
    received_directions_.assign(sent.begin(), sent.begin() + static_cast<long>(shape.directions()));
    coords += shape.directions();
  }
  const std::vector<float>& directions = gradient ? sent_directions_ : received_directions_;
  if (shape.shared && directions.size() != shape.directions()) {
    return absl::InternalError("a boundary tensor in shared directions came before them");
  }
  std::vector<float> full;
  if (!widened_.empty()) {
    full = std::move(widened_.back());
    widened_.pop_back();
  }
  full.resize(shape.floats());
  if (shape.low_rank()) {
    float* kept = full.data();
    if (shape.narrowed()) kept_.resize(shape.kept_floats()), kept = kept_.data();
    LH_RETURN_IF_ERROR(shape.shared ? cpu::LowRankCodec::Decode(coords, directions.data(), shape.rows, shape.kept,
                                                                shape.rank, kept)
                                    : cpu::LowRankCodec::Decode(sent.data(), shape.rows, shape.kept, shape.rank, kept));
    if (shape.narrowed()) shape.Restore(kept, full.data());
  } else {
    shape.Restore(sent.data(), full.data());
  }
  channel_.Recycle(std::move(sent));
  return full;
}

void Executor::DeviceDirections(proto::TensorKind kind, int micro) {
  if (!device_low_rank_ || !acts_.shared) return;
  const bool fresh = kind == proto::EVAL_ACTIVATION || micro == 0;
  stage_.NextDirections(fresh, fresh,
                        [this, kind, micro](float* d, size_t n) { channel_.RoundAsSent(kind, micro, d, n); });
}

void Executor::Release(const BoundaryShape& shape, std::vector<float> read) {
  if (HostRecodes(shape)) {
    widened_.push_back(std::move(read));
  } else {
    channel_.Recycle(std::move(read));
  }
}

absl::Status Executor::FlushSends(Pass& pass) {
  for (const Instr& in : pass.deferred) LH_RETURN_IF_ERROR(Send(pass, in));
  pass.deferred.clear();
  return absl::OkStatus();
}

void Executor::Computed(Pass& pass, const std::string& name, int m, int64_t t0, double waited) {
  const int64_t t1 = Timeline::NowMicros();
  pass.result.compute_seconds += (t1 - t0) * 1e-6 - waited;
  timeline_.Add(name, Track::kCompute, t0, t1, pass.it, m);
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
      LH_ASSIGN_OR_RETURN(std::vector<float> got, channel_.Receive(proto::EVAL_ACTIVATION, it, micro, &waited));
      LH_ASSIGN_OR_RETURN(input, Incoming(acts_, std::move(got), proto::EVAL_ACTIVATION, micro));
    }
    DeviceDirections(proto::EVAL_ACTIVATION, micro);
    LH_ASSIGN_OR_RETURN(const float loss, stage_.Forward(0, mbs[m], first_ ? nullptr : input.data()));
    LH_RETURN_IF_ERROR(TakeHookStatus());
    if (!first_) Release(acts_, std::move(input));
    if (last_) {
      loss_sum += loss;
      continue;
    }
    LH_ASSIGN_OR_RETURN(const float* out, stage_.Output(0));
    LH_RETURN_IF_ERROR(Outgoing(acts_, out, outputs[m], mbs[m], proto::EVAL_ACTIVATION, micro));
    channel_.Send(proto::EVAL_ACTIVATION, it, micro, outputs[m].data(), outputs[m].size());
  }
  LH_RETURN_IF_ERROR(channel_.Flush(it));
  timeline_.Add("validation", Track::kCompute, t0, Timeline::NowMicros(), it, -1);
  return loss_sum;
}

}  // namespace longhaul
