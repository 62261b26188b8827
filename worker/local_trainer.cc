#include "worker/local_trainer.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/run_model.h"
#include "checkpoint/resume_check.h"
#include "metrics/flops.h"
#include "schedule/schedule.h"
#include "worker/job_setup.h"
#include "worker/stage_factory.h"
#include "util/status_macros.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

// Set from a signal handler: lock-free, and read once per step.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

std::string CheckpointRoot(const JobConfig& cfg) { return (fs::path(cfg.train.out_dir) / "checkpoints").string(); }

// One stage and one replica: nothing crosses a network, and the stage steps its own parameters.
class LocalChannel final : public Channel {
 public:
  explicit LocalChannel(Stage& stage) : stage_(stage) {}
  absl::StatusOr<std::vector<float>> Receive(proto::TensorKind, int64_t, int, double*) override {
    return absl::InternalError("a one-stage schedule receives nothing");
  }
  void Recycle(std::vector<float>) override {}
  void Send(proto::TensorKind, int64_t, int, const float*, size_t) override {}
  absl::Status PushGradients(int64_t, Stage&, size_t, int) override { return absl::OkStatus(); }
  // The stage's attached optimizer reduces its own norm and steps in place.
  absl::Status ReduceNorm(int64_t, double*) override { return absl::OkStatus(); }
  absl::StatusOr<OptimizerStepResult> Step(int64_t it) override { return stage_.Step(it); }
  absl::Status PullParameters(int64_t, Stage&, double*, size_t) override { return absl::OkStatus(); }
  absl::Status Flush(int64_t) override { return absl::OkStatus(); }

 private:
  Stage& stage_;
};

}  // namespace

void LocalTrainer::RequestStop() { g_stop_requested = true; }

absl::StatusOr<std::unique_ptr<LocalTrainer>> LocalTrainer::Create(const JobConfig& job) {
  // One process is one stage and one replica, whatever [cluster] says (that is for `local`).
  JobConfig cfg = job;
  cfg.cluster.stages = cfg.cluster.replicas = 1;
  cfg.cluster.stage_layers.clear();
  cfg.cluster.stage_backends.clear();
  // One process computes on train.backend alone: without the stages' backends, ask again.
  LH_RETURN_IF_ERROR(CheckPrecisionHasAGpu(cfg));
  cfg.cluster.central_ps = false;
  cfg.as_json = EffectiveConfigJson(cfg);
  LH_RETURN_IF_ERROR(CheckTrainerMemory(cfg));
  std::unique_ptr<LocalTrainer> t(new LocalTrainer(cfg));
  if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
  LH_ASSIGN_OR_RETURN(TokenDataset data, LoadDataset(cfg));
  t->data_ = std::move(data);
  // 1F1B over one stage is gradient accumulation: each micro-batch's backward right after its
  // forward, so one activation slot serves.
  StageRequest request = StageRequestFor(cfg, 0, cfg.train.backend_device, 1);
  request.optimizer = true;
  if (cfg.train.resume) request.init_from.clear();  // the checkpoint's parameters replace them
  LH_ASSIGN_OR_RETURN(t->stage_, MakeStage(request));
  const TrainConfig& tc = cfg.train;
  LH_RETURN_IF_ERROR(t->stage_->AttachOptimizer(
      {tc.adamw, LrSchedule{tc.lr, tc.min_lr, tc.warmup_steps, tc.steps}, tc.grad_clip}));
  t->channel_ = std::make_unique<LocalChannel>(*t->stage_);
  t->executor_ = std::make_unique<Executor>(*t->stage_, *t->channel_, t->timeline_,
                                            MakeSchedule(ScheduleKind::k1F1B, 1, 0, tc.micro_batches, true), 0, 1,
                                            tc.micro_batches, tc.micro_batches, 1.0f / static_cast<float>(tc.micro_batches),
                                            cfg.boundary(false), cfg.boundary(true));
  SamplerConfig sc{cfg.train.micro_batch_size, cfg.train.seq_len, cfg.train.seed, cfg.model.attention};
  t->train_sampler_ = std::make_unique<BatchSampler>(sc, t->data_->train());
  t->val_sampler_ = std::make_unique<BatchSampler>(sc, t->data_->val());
  LH_RETURN_IF_ERROR(t->train_sampler_->Check("training"));
  if (cfg.train.eval_every > 0) LH_RETURN_IF_ERROR(t->val_sampler_->Check("validation"));
  if (cfg.train.resume) LH_RETURN_IF_ERROR(t->Resume());
  std::error_code ec;
  fs::create_directories(cfg.train.out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create train.out_dir ", cfg.train.out_dir, ": ", ec.message()));
  const std::string csv = (fs::path(cfg.train.out_dir) / "metrics.csv").string();
  LH_ASSIGN_OR_RETURN(t->metrics_, cfg.train.resume ? MetricsLog::Resume(csv, t->step_) : MetricsLog::Create(csv));
  return t;
}

absl::Status LocalTrainer::Resume() {
  LH_ASSIGN_OR_RETURN(std::string dir, LatestCheckpoint(CheckpointRoot(cfg_)));
  const std::string name = fs::path(dir).filename().string();
  const std::string state_dir = CheckpointStateDir(CheckpointRoot(cfg_), name);
  LH_RETURN_IF_ERROR(CheckCheckpointResumable(state_dir, cfg_));
  // A cluster's checkpoint too: its shards hold the stages' tensors, and their owners' moments.
  LH_ASSIGN_OR_RETURN(const std::vector<CheckpointPiece> pieces, CheckpointPieces(CheckpointRoot(cfg_), name));
  State s = EmptyState();
  LH_RETURN_IF_ERROR(LoadFromPieces(pieces, stage_->layout(), s.params.data(), s.m.data(), s.v.data()));
  LH_RETURN_IF_ERROR(SetState(s));
  LH_ASSIGN_OR_RETURN(step_, CheckpointStep(dir));
  return absl::OkStatus();
}

absl::StatusOr<double> LocalTrainer::EvalLoss() {
  double sum = 0;
  for (int i = 0; i < cfg_.train.eval_batches; ++i) {
    LH_ASSIGN_OR_RETURN(const float loss, stage_->Forward(0, val_sampler_->Sample(0, i), nullptr));
    sum += loss;
  }
  return sum / cfg_.train.eval_batches;
}

LocalTrainer::State LocalTrainer::EmptyState() const {
  const size_t n = stage_->num_params();
  return {std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
}

absl::StatusOr<LocalTrainer::State> LocalTrainer::GetState() {
  State s = EmptyState();
  LH_ASSIGN_OR_RETURN(const float* params, stage_->Params());
  std::copy(params, params + s.params.size(), s.params.begin());
  LH_RETURN_IF_ERROR(stage_->GetOptimizerState(s.m.data(), s.v.data()));
  return s;
}

absl::Status LocalTrainer::SetState(const State& s) {
  LH_RETURN_IF_ERROR(stage_->SetParams(0, s.params.data(), s.params.size()));
  return stage_->SetOptimizerState(s.m.data(), s.v.data());
}

absl::Status LocalTrainer::SaveCheckpointNow() {
  LH_ASSIGN_OR_RETURN(State s, GetState());
  return SaveCheckpoint(CheckpointRoot(cfg_), {step_, cfg_.as_json}, stage_->layout(), s.params.data(), s.m.data(),
                        s.v.data());
}

absl::Status LocalTrainer::WriteFigures() const {
  LH_RETURN_IF_ERROR(metrics_->DrawLossCurve((fs::path(cfg_.train.out_dir) / "loss.svg").string()));
  return timeline_.Write((fs::path(cfg_.train.out_dir) / "timeline.json").string(), 0, "longhaul train").status();
}

absl::Status LocalTrainer::Run(std::ostream& out, int64_t stop_at) {
  const TrainConfig& tc = cfg_.train;
  const int M = tc.micro_batches;
  const double flops = ModelFlopsPerIteration(cfg_.model, static_cast<int64_t>(tc.micro_batch_size) * M, tc.seq_len,
                                              tc.recompute);
  out << absl::StrFormat("longhaul train: %s, %d parameters, %s\n", data_->description(), stage_->num_params(),
                         stage_->Describe());
  out << absl::StrFormat("  %d layers, d_model %d, %d heads, seq %d, %d x %d sequences per step (%d tokens), %s mask\n",
                         cfg_.model.n_layer, cfg_.model.d_model, cfg_.model.n_head, tc.seq_len, M, tc.micro_batch_size,
                         cfg_.tokens_per_step(), AttentionMaskName(cfg_.model.attention));
  out << absl::StrFormat("  TFLOPs = %s / iteration time / 1 worker; floor = entropy of the source (nats/token)\n",
                         FlopsFormulaName(tc.recompute));
  if (step_ > 0) out << absl::StrFormat("  resumed from step %d\n", step_);
  out.flush();

  double timed_seconds = 0;
  int64_t timed_steps = 0;
  const int64_t first_step = step_;
  const int64_t end = stop_at > 0 ? std::min(stop_at, tc.steps) : tc.steps;
  while (step_ < end) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<MicroBatch> batch;
    MetricsRow rec;
    double floor_sum = 0;
    for (int m = 0; m < M; ++m) {
      batch.push_back(train_sampler_->Sample(step_, m));
      floor_sum += EntropyFloor(*data_, batch.back());
    }
    rec.floor = data_->source() ? floor_sum / M : -1;
    LH_ASSIGN_OR_RETURN(const IterationResult r, executor_->Run(step_, batch));
    const OptimizerStepResult& opt = r.step;
    rec.loss = r.loss;
    rec.grad_norm = opt.grad_norm;
    rec.lr = opt.lr;
    rec.skipped = opt.skipped;
    if (!rec.skipped && (!std::isfinite(rec.grad_norm) || !std::isfinite(rec.loss))) {
      return absl::InternalError(absl::StrFormat(
          "step %d: loss %g, gradient norm %g is not finite: lower train.lr or set train.grad_clip", step_ + 1, rec.loss,
          rec.grad_norm));
    }
    ++step_;
    rec.step = step_;
    rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rec.tokens_per_s = cfg_.tokens_per_step() / rec.seconds;
    if (step_ > first_step + 1) timed_seconds += rec.seconds, ++timed_steps;

    const bool last = step_ == end;
    if (tc.EvalDue(step_, end)) {
      LH_ASSIGN_OR_RETURN(rec.val_loss, EvalLoss());
    }
    LH_RETURN_IF_ERROR(metrics_->Append(rec));
    if (step_ % tc.log_every == 0 || last || step_ == first_step + 1) {
      const double sec = timed_steps > 0 ? timed_seconds / timed_steps : rec.seconds;
      std::string line = absl::StrFormat("step %*d/%d | loss %.4f", static_cast<int>(std::to_string(tc.steps).size()),
                                         step_, tc.steps, rec.loss);
      if (rec.floor >= 0) absl::StrAppend(&line, absl::StrFormat(" (floor %.4f)", rec.floor));
      if (rec.val_loss >= 0) absl::StrAppend(&line, absl::StrFormat(" | val %.4f", rec.val_loss));
      if (rec.skipped) {
        absl::StrAppend(&line, absl::StrFormat(" | fp16 overflow: step skipped, loss scale now %g", opt.loss_scale));
      }
      absl::StrAppend(&line, absl::StrFormat(" | lr %.2e | norm %.3f | %.0f tok/s | %.3f s/it | %.3f TFLOPs | ETA %s",
                                             rec.lr, rec.grad_norm, cfg_.tokens_per_step() / sec, sec,
                                             flops / sec / 1e12, FormatDuration(sec * (end - step_))));
      out << line << "\n";
      out.flush();
      LH_RETURN_IF_ERROR(metrics_->DrawLossCurve((fs::path(tc.out_dir) / "loss.svg").string()));
    }
    const bool stop = g_stop_requested.exchange(false) && !last;
    if ((tc.checkpoint_every > 0 && step_ % tc.checkpoint_every == 0) || last || stop) {
      LH_RETURN_IF_ERROR(SaveCheckpointNow());
      LH_RETURN_IF_ERROR(PruneCheckpoints(CheckpointRoot(cfg_), step_, tc.keep_checkpoints));
    }
    if (stop) {
      LH_RETURN_IF_ERROR(WriteFigures());
      return absl::CancelledError(absl::StrFormat(
          "interrupted after step %d of %d: checkpoint %s/%s and the records in %s are written; resume with --set "
          "train.resume=true",
          step_, tc.steps, CheckpointRoot(cfg_), CheckpointName(step_), tc.out_dir));
    }
  }
  LH_RETURN_IF_ERROR(WriteFigures());
  if (timed_steps > 0) {
    const double sec = timed_seconds / timed_steps, tps = cfg_.tokens_per_step() / sec;
    out << absl::StrFormat(
        "done: %d steps | final loss %.4f | iteration time %.3f s (mean after the first) | %.0f tokens/s | %.3f TFLOPs "
        "per worker [%s] | %.1f days per 100B tokens\n",
        step_, history().back().loss, sec, tps, flops / sec / 1e12, FlopsFormulaName(tc.recompute),
        DaysFor100BTokens(tps));
  }
  out << absl::StrFormat("records: %s/metrics.csv, loss curve %s/loss.svg, timeline %s/timeline.json, checkpoint %s\n",
                         tc.out_dir, tc.out_dir, tc.out_dir, CheckpointRoot(cfg_));
  return absl::OkStatus();
}

}  // namespace longhaul
