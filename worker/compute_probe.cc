#include "worker/compute_probe.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_format.h"
#include "data/batch_sampler.h"
#include "util/hash.h"
#include "util/median.h"
#include "util/status_macros.h"
#include "worker/job_setup.h"
#include "worker/stage_factory.h"

namespace longhaul {
namespace {

using Clock = std::chrono::steady_clock;

// One micro-batch of random tokens from the job's vocabulary.
MicroBatch RandomMicroBatch(const JobConfig& cfg) {
  std::vector<uint16_t> tokens(static_cast<size_t>(cfg.train.micro_batch_size) * cfg.train.seq_len + 1);
  Rng rng(cfg.train.seed + 17);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng.Next() % cfg.model.vocab_size);
  BatchSampler sampler({cfg.train.micro_batch_size, cfg.train.seq_len, cfg.train.seed, cfg.model.attention}, tokens);
  return sampler.Sample(0, 0);
}

// A stage of `spec` alone on `device`, timed on the job's micro-batch.
absl::StatusOr<StageTimes> TimeProbeStage(const JobConfig& cfg, int device, const StageSpec& spec) {
  LH_RETURN_IF_ERROR(CheckProbeStageMemory(cfg, spec, omp_get_max_threads(), device));
  StageRequest r = StageRequestFor(cfg, 0, device, 1);
  r.spec = spec;
  r.init_from.clear();  // timed, never trained: the seed's parameters do
  LH_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, MakeStage(r));
  return TimeStage(*stage, RandomMicroBatch(cfg), cfg.model.d_model, {.warmups = 1, .rounds = 3, .enough_s = 2.0});
}

}  // namespace

absl::StatusOr<StageTimes> TimeStage(Stage& stage, const MicroBatch& mb, int d_model, const TimingRounds& rounds) {
  const StageSpec& spec = stage.spec();
  Rng rng(17);
  std::vector<float> boundary(static_cast<size_t>(mb.B) * mb.T * d_model);
  for (float& x : boundary) x = static_cast<float>(rng.Uniform() - 0.5);
  const float* input = spec.has_embedding ? nullptr : boundary.data();
  const float* grad_out = spec.has_head ? nullptr : boundary.data();
  std::vector<double> fwd, bwd;
  for (int round = 0; round < rounds.warmups + rounds.rounds; ++round) {
    LH_RETURN_IF_ERROR(stage.ZeroGrads());
    LH_RETURN_IF_ERROR(stage.Synchronize());
    const Clock::time_point t0 = Clock::now();
    LH_RETURN_IF_ERROR(stage.Forward(0, mb, input).status());
    if (!spec.has_head) LH_RETURN_IF_ERROR(stage.Output(0).status());
    LH_RETURN_IF_ERROR(stage.Synchronize());
    const Clock::time_point t1 = Clock::now();
    LH_RETURN_IF_ERROR(stage.Backward(0, mb, grad_out, 1.0f));
    if (!spec.has_embedding) LH_RETURN_IF_ERROR(stage.InputGrad(0).status());
    LH_RETURN_IF_ERROR(stage.Synchronize());
    const Clock::time_point t2 = Clock::now();
    if (round < rounds.warmups) continue;
    fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
    bwd.push_back(std::chrono::duration<double>(t2 - t1).count());
    if (fwd.back() + bwd.back() > rounds.enough_s) break;
  }
  return StageTimes{Median(fwd), Median(bwd)};
}

absl::StatusOr<proto::ComputeProfile> MeasureCompute(const JobConfig& cfg, int device) {
  // Workers that share a machine time themselves one after another, each with the machine to
  // itself: timed together, workers that share cores would each measure the others' compute as
  // their own (and the placement search would price them so). The lock goes with the descriptor,
  // whatever way this returns.
  // One lock per user (another's file may not be ours to open); a probe that hangs holds the
  // others back a minute at most, then they time themselves anyway.
  const std::string path = absl::StrFormat("%s-%d.lock", kComputeProbeLock, getuid());
  const int lock = open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
  for (int waited_ms = 0; lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) != 0 && waited_ms < 60000; waited_ms += 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  absl::Cleanup unlock = [lock] {
    if (lock >= 0) close(lock);
  };
  const StageSpec block{0, 1, false, false};
  // With a tied head the head must sit beside the embedding (whose cost is a lookup).
  const StageSpec block_and_head{0, 1, cfg.model.tied_head, true};
  LH_ASSIGN_OR_RETURN(const StageTimes b, TimeProbeStage(cfg, device, block));
  LH_ASSIGN_OR_RETURN(const StageTimes bh, TimeProbeStage(cfg, device, block_and_head));
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
