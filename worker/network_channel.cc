#include "worker/network_channel.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "format/wire_dtype.h"
#include "util/status_macros.h"

namespace longhaul {

NetworkChannel::NetworkChannel(int stage, int replica, int groups, std::vector<proto::ShardPlacement> stage_shards,
                               std::vector<NormHost> norm_hosts, const ParamLayout& layout, Mailbox& mailbox,
                               PeerDirectory& peers, Timeline& timeline)
    : stage_(stage), replica_(replica), groups_(groups), stage_shards_(std::move(stage_shards)),
      norm_hosts_(std::move(norm_hosts)), layout_(layout), mailbox_(mailbox), peers_(peers), timeline_(timeline),
      feedback_(groups), group_grads_(groups - 1) {
  for (int g = 0; g < groups_; ++g)
    for (const proto::ShardPlacement& sp : stage_shards_)
      feedback_[g].emplace_back(peers_.WireTo(stage_, sp.owner_replica(), proto::GRAD_PUSH, g, sp.shard()));
}

std::vector<float> NetworkChannel::Residuals(int group) const {
  std::vector<float> all(layout_.total(), 0.0f);
  for (size_t k = 0; k < stage_shards_.size(); ++k) {
    const std::vector<float>& r = feedback_[group][k].residual();
    const size_t begin = layout_.Range(stage_shards_[k].first_tensor(), stage_shards_[k].end_tensor()).first;
    std::copy(r.begin(), r.end(), all.begin() + begin);
  }
  return all;
}

void NetworkChannel::SetResiduals(int group, const float* residuals) {
  for (size_t k = 0; k < stage_shards_.size(); ++k) {
    if (!IsLossy(feedback_[group][k].dtype())) continue;
    const auto [begin, end] = layout_.Range(stage_shards_[k].first_tensor(), stage_shards_[k].end_tensor());
    feedback_[group][k].SetResidual(residuals + begin, end - begin);
  }
}

absl::StatusOr<std::vector<float>> NetworkChannel::Take(proto::TensorKind kind, int64_t it, int micro, int from_stage,
                                                        int from_replica, int shard, double* waited) {
  const int64_t t0 = Timeline::NowMicros();
  auto got = mailbox_.Take({kind, it, micro, from_stage, from_replica, shard}, peers_.transport().timeout);
  const int64_t t1 = Timeline::NowMicros();
  *waited += (t1 - t0) * 1e-6;
  static const char* names[] = {"?",           "wait act",   "wait grad", "wait grad push",
                                "wait params", "wait probe", "wait norm", "wait validation act"};
  if (t1 - t0 > 20) {
    const bool boundary = kind <= proto::GRADIENT || kind == proto::EVAL_ACTIVATION;
    timeline_.Add(names[kind], boundary ? Track::kCompute : Track::kParams, t0, t1, it, boundary ? micro : -1);
  }
  if (!got.ok()) {
    return absl::Status(got.status().code(), absl::StrCat(got.status().message(), " [peer ",
                                                          peers_.AddressOf(from_stage, from_replica), "]"));
  }
  return got;
}

namespace {

// A boundary tensor of the forward (to the next stage), else of the backward (to the previous).
bool Forward(proto::TensorKind kind) { return kind == proto::ACTIVATION || kind == proto::EVAL_ACTIVATION; }

}  // namespace

absl::StatusOr<std::vector<float>> NetworkChannel::Receive(proto::TensorKind kind, int64_t it, int micro,
                                                           double* waited) {
  return Take(kind, it, micro, Forward(kind) ? stage_ - 1 : stage_ + 1, replica_, 0, waited);
}

void NetworkChannel::Send(proto::TensorKind kind, int64_t it, int micro, const float* data, size_t n) {
  peers_.Send(Forward(kind) ? stage_ + 1 : stage_ - 1, replica_, kind, it, micro, 0, data, n);
}

void NetworkChannel::RoundAsSent(proto::TensorKind kind, int micro, float* data, size_t n) {
  RoundThroughWire(data, data, n, peers_.WireTo(Forward(kind) ? stage_ + 1 : stage_ - 1, replica_, kind, micro, 0));
}

void NetworkChannel::SendToSelf(proto::TensorKind kind, int64_t it, int micro, int shard, const float* data,
                                size_t n, WireDtype dtype) {
  std::vector<float> own = mailbox_.Acquire(n);
  RoundThroughWire(data, own.data(), n,
                   dtype != WireDtype::kAuto ? dtype : peers_.WireTo(stage_, replica_, kind, micro, shard));
  mailbox_.Put({kind, it, micro, stage_, replica_, shard}, std::move(own));
}

void NetworkChannel::SendParams(int64_t it, int replica, int shard, const float* data, size_t n, WireDtype dtype) {
  if (replica == replica_) return SendToSelf(proto::PARAMS, it, 0, shard, data, n, dtype);
  peers_.Send(stage_, replica, proto::PARAMS, it, 0, shard, data, n, dtype);
}

absl::Status NetworkChannel::PushGradients(int64_t it, Stage& stage, size_t from, int group) {
  if (group < 0 || group >= groups_) {
    return absl::InternalError(absl::StrFormat("a push of group %d; this replica runs %d", group, groups_));
  }
  if (it != push_it_ || group != push_group_) {
    push_it_ = it;
    push_group_ = group;
    pushed_.assign(stage_shards_.size(), false);
  }
  // What goes to the shards: the gradients, or with local updates the change since the last pull.
  const float* grads = nullptr;
  if (pulled_.empty()) {
    LH_ASSIGN_OR_RETURN(grads, stage.Grads());
    if (group + 1 < groups_) {
      if (from > 0) return absl::InternalError("a group before the last is pushed after its backwards, whole");
      group_grads_[group].assign(grads, grads + layout_.total());
      grads = group_grads_[group].data();
    }
  } else {
    if (from > 0) return absl::InternalError("local updates push their change after the local step, not during backward");
    LH_ASSIGN_OR_RETURN(const float* params, stage.Params());
    change_.resize(pulled_.size());
    for (size_t i = 0; i < pulled_.size(); ++i) change_[i] = pulled_[i] - params[i];
    grads = change_.data();
  }
  for (size_t k = 0; k < stage_shards_.size(); ++k) {
    const proto::ShardPlacement& sp = stage_shards_[k];
    const auto [begin, end] = layout_.Range(sp.first_tensor(), sp.end_tensor());
    if (pushed_[k] || begin < from) continue;
    pushed_[k] = true;
    ErrorFeedback& feedback = feedback_[group][k];
    const float* push =
        IsLossy(feedback.dtype()) ? feedback.Apply(grads + begin, end - begin) : grads + begin;
    if (sp.owner_replica() == replica_) {
      SendToSelf(proto::GRAD_PUSH, it, group, sp.shard(), push, end - begin);
    } else {
      // A quantized send encodes before it returns: the feedback's buffer may change after.
      peers_.Send(stage_, sp.owner_replica(), proto::GRAD_PUSH, it, group, sp.shard(), push, end - begin);
    }
  }
  return absl::OkStatus();
}

absl::Status NetworkChannel::ReduceNorm(int64_t it, double* waited) {
  const int64_t t0 = Timeline::NowMicros();
  ps_waited_ = 0;
  absl::Status s = ps_host_ != nullptr ? ps_host_->ReduceNorm(it) : absl::OkStatus();
  *waited += ps_waited_;
  timeline_.Add("reduce norm", Track::kParams, t0, Timeline::NowMicros(), it);
  return s;
}

absl::StatusOr<double> NetworkChannel::ReduceNormAmongHosts(int64_t it, const std::vector<ShardSquares>& own) {
  std::map<std::pair<int, int>, double> squares;
  for (const ShardSquares& sq : own) squares[{sq.stage, sq.shard}] = sq.sum_squares;
  // Ours in the order our NormHost entry lists our shards, which is how the others read them.
  for (const NormHost& h : norm_hosts_) {
    if (h.stage != stage_ || h.replica != replica_) continue;
    std::vector<double> sums;
    for (int shard : h.shards) sums.push_back(squares.at({stage_, shard}));
    norm_out_ = EncodeSquares(sums);
  }
  for (const NormHost& h : norm_hosts_) {
    if (h.stage == stage_ && h.replica == replica_) continue;
    peers_.Send(h.stage, h.replica, proto::NORM, it, 0, 0, norm_out_.data(), norm_out_.size());
  }
  for (const NormHost& h : norm_hosts_) {
    if (h.stage == stage_ && h.replica == replica_) continue;
    LH_ASSIGN_OR_RETURN(std::vector<float> got, Take(proto::NORM, it, 0, h.stage, h.replica, 0, &ps_waited_));
    const std::vector<double> sums = DecodeSquares(got);
    mailbox_.Recycle(std::move(got));
    for (size_t k = 0; k < h.shards.size(); ++k) squares[{h.stage, h.shards[k]}] = sums[k];
  }
  return GlobalNorm(squares);
}

absl::StatusOr<OptimizerStepResult> NetworkChannel::Step(int64_t it) {
  if (ps_host_ == nullptr) return OptimizerStepResult{};
  const int64_t t0 = Timeline::NowMicros();
  absl::StatusOr<OptimizerStepResult> step = ps_host_->Step(it);
  timeline_.Add("ps step", Track::kParams, t0, Timeline::NowMicros(), it);
  return step;
}

absl::Status NetworkChannel::PullParameters(int64_t it, Stage& stage, double* waited, size_t upto) {
  return Pull(it, stage, waited, upto, false);
}

absl::Status NetworkChannel::LandParameters(int64_t it, Stage& stage, double* waited) {
  if (pulled_.empty() || change_.size() != pulled_.size()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("iteration %d's parameters land with no change of this stage pushed before them", it + 1));
  }
  return Pull(it, stage, waited, SIZE_MAX, true);
}

absl::Status NetworkChannel::Pull(int64_t it, Stage& stage, double* waited, size_t upto, bool land) {
  if (it != pull_it_) {
    pull_it_ = it;
    shards_pulled_ = 0;
  }
  const int64_t t0 = Timeline::NowMicros();
  const size_t before = shards_pulled_;
  // Shards in the stage's order, so the ones a forward needs first come first.
  for (; shards_pulled_ < stage_shards_.size(); ++shards_pulled_) {
    const proto::ShardPlacement& sp = stage_shards_[shards_pulled_];
    const size_t begin = layout_.Range(sp.first_tensor(), sp.end_tensor()).first;
    if (begin >= upto) break;
    LH_ASSIGN_OR_RETURN(std::vector<float> p,
                        Take(proto::PARAMS, it, 0, stage_, sp.owner_replica(), sp.shard(), waited));
    held_ = -1;
    const bool as_change = whole_ && !whole_(it);
    if ((as_change || land) && pulled_.size() < begin + p.size()) {
      return absl::InternalError(as_change ? "a change of parameters never pulled whole"
                                           : "a landing past the stage's parameters");
    }
    const float* now = nullptr;
    if (land) {
      LH_ASSIGN_OR_RETURN(now, stage.Params());
    }
    if (!pulled_.empty()) {
      for (size_t i = 0; i < p.size(); ++i) {
        const float before = pulled_[begin + i];
        // As their change since the last exchange: added to the parameters as last pulled, as the
        // shard's host added it.
        pulled_[begin + i] = as_change ? before + p[i] : p[i];
        // A landing adds what the stage stepped since its push: where it is, less where it was
        // then (the parameters as pulled before, less the change it pushed); or mixes where it is
        // with the new parameters.
        if (!land) {
          p[i] = pulled_[begin + i];
        } else if (land_mix_ > 0) {
          p[i] = land_mix_ * now[begin + i] + (1 - land_mix_) * pulled_[begin + i];
        } else {
          p[i] = pulled_[begin + i] + (now[begin + i] - (before - change_[begin + i]));
        }
      }
    }
    LH_RETURN_IF_ERROR(stage.SetParams(begin, p.data(), p.size()));
    mailbox_.Recycle(std::move(p));
  }
  // A landing leaves the stage with what it stepped since: not the parameters of any iteration.
  if (shards_pulled_ == stage_shards_.size() && !land) held_ = it;
  if (shards_pulled_ > before) timeline_.Add("pull params", Track::kParams, t0, Timeline::NowMicros(), it);
  return absl::OkStatus();
}

absl::Status NetworkChannel::PlaceShard(Stage& stage, size_t begin, const float* params, size_t n) {
  std::vector<float> as_pulled(n);
  RoundThroughWire(params, as_pulled.data(), n, peers_.WireTo(stage_, replica_, proto::PARAMS, 0, 0));
  return stage.SetParams(begin, as_pulled.data(), n);
}

void NetworkChannel::Held(int64_t it, const float* params) {
  held_ = pull_it_ = it;
  shards_pulled_ = stage_shards_.size();
  if (!pulled_.empty()) std::copy(params, params + pulled_.size(), pulled_.begin());
}

}  // namespace longhaul
