#include "worker/compute_probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <omp.h>

#include "util/hash.h"
#include "util/status_macros.h"
#include "worker/job_setup.h"
#include "worker/stage_factory.h"

namespace longhaul {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double forward_s = 0, backward_s = 0;
};

// Forward and backward of one micro-batch through a stage of `spec`, timed to their results on the
// host (a device backend queues its work: Output, the loss and InputGrad wait for it).
absl::StatusOr<Timing> TimeStage(const JobConfig& cfg, int device, const StageSpec& spec) {
  LH_RETURN_IF_ERROR(CheckProbeStageMemory(cfg, spec, omp_get_max_threads(), device));
  StageRequest r = StageRequestFor(cfg, 0, device, 1);
  r.spec = spec;
  LH_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, MakeStage(r));
  const int B = r.B, T = r.T, C = cfg.model.d_model;
  MicroBatch mb;
  mb.B = B, mb.T = T;
  Rng rng(cfg.train.seed + 17);
  for (int i = 0; i < B * T; ++i) {
    mb.tokens.push_back(static_cast<int>(rng.Uniform() * cfg.model.vocab_size) % cfg.model.vocab_size);
    mb.targets.push_back(static_cast<int>(rng.Uniform() * cfg.model.vocab_size) % cfg.model.vocab_size);
  }
  mb.loss_weight.assign(static_cast<size_t>(B) * T, 1.0f);
  mb.prefix_len.assign(B, 0);
  std::vector<float> boundary(static_cast<size_t>(B) * T * C);
  for (float& x : boundary) x = static_cast<float>(rng.Uniform() - 0.5);
  const float* input = spec.has_embedding ? nullptr : boundary.data();
  const float* grad_out = spec.has_head ? nullptr : boundary.data();

  std::vector<double> fwd, bwd;
  for (int round = 0; round < 4; ++round) {  // round 0 warms up (allocations, library handles)
    LH_RETURN_IF_ERROR(stage->ZeroGrads());
    const Clock::time_point t0 = Clock::now();
    LH_RETURN_IF_ERROR(stage->Forward(0, mb, input).status());
    if (!spec.has_head) LH_RETURN_IF_ERROR(stage->Output(0).status());
    const Clock::time_point t1 = Clock::now();
    LH_RETURN_IF_ERROR(stage->Backward(0, mb, grad_out, 1.0f));
    // The first stage has no input gradient: its gradients are the result to wait for.
    LH_RETURN_IF_ERROR(spec.has_embedding ? stage->Grads().status() : stage->InputGrad(0).status());
    const Clock::time_point t2 = Clock::now();
    if (round == 0) continue;
    fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
    bwd.push_back(std::chrono::duration<double>(t2 - t1).count());
    if (fwd.back() + bwd.back() > 2.0) break;  // seconds per round: one timed round says enough
  }
  return Timing{Median(fwd), Median(bwd)};
}

}  // namespace

absl::StatusOr<proto::ComputeProfile> MeasureCompute(const JobConfig& cfg, int device) {
  const StageSpec block{0, 1, false, false};
  // With a tied head the head must sit beside the embedding (whose cost is a lookup).
  const StageSpec block_and_head{0, 1, cfg.model.tied_head, true};
  LH_ASSIGN_OR_RETURN(const Timing b, TimeStage(cfg, device, block));
  LH_ASSIGN_OR_RETURN(const Timing bh, TimeStage(cfg, device, block_and_head));
  // The head is what the second stage adds to the block; a small vocabulary's head can cost less
  // than the noise between the two, and a profile's times are positive.
  constexpr double kFloor = 1e-6;
  proto::ComputeProfile p;
  p.set_block_forward_s(std::max(kFloor, b.forward_s));
  p.set_block_backward_s(std::max(kFloor, b.backward_s));
  p.set_head_forward_s(std::max(kFloor, bh.forward_s - b.forward_s));
  p.set_head_backward_s(std::max(kFloor, bh.backward_s - b.backward_s));
  return p;
}

}  // namespace longhaul
