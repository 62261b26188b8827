#pragma once
// Training in one process: one stage holding the whole model on the backend train.backend names,
// run by the same executor as a worker's (a one-stage schedule: forward and backward of each
// micro-batch in turn, gradients accumulating), the stage stepping its own parameters; progress
// lines, evaluation, checkpoints, a loss curve and a timeline. This is the 1 stage × 1 replica
// case of the distributed runtime and its reference for equivalence.
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "metrics/metrics_log.h"
#include "metrics/timeline.h"
#include "model/stage.h"
#include "worker/executor.h"

namespace longhaul {

class LocalTrainer {
 public:
  static absl::StatusOr<std::unique_ptr<LocalTrainer>> Create(const JobConfig& cfg);

  // Trains from the current step to train.steps, or to step `stop_at` when it is positive (the
  // schedule still spans train.steps, so a later resume continues the same run), printing
  // progress to `out` and checkpointing where it stops. After RequestStop it stops at the end of
  // the step under way, checkpointed and recorded, and returns Cancelled saying how to resume.
  absl::Status Run(std::ostream& out, int64_t stop_at = 0);
  // Async-signal-safe: what SIGINT and SIGTERM call.
  static void RequestStop();
  // Mean loss over train.eval_batches fixed validation micro-batches.
  absl::StatusOr<double> EvalLoss();

  // Every step of the run: those before a resume as read back from metrics.csv, then this process's.
  const std::vector<MetricsRow>& history() const { return metrics_->rows(); }
  int64_t step() const { return step_; }
  // Parameters and AdamW moments, as a checkpoint would hold them.
  struct State {
    std::vector<float> params, m, v;
  };
  absl::StatusOr<State> GetState();
  absl::Status SetState(const State& s);

 private:
  explicit LocalTrainer(const JobConfig& cfg) : cfg_(cfg) {}
  absl::Status Resume();
  State EmptyState() const;  // buffers sized for the model
  absl::Status SaveCheckpointNow();
  absl::Status WriteFigures() const;  // loss curve and timeline

  JobConfig cfg_;
  std::optional<TokenDataset> data_;
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<Channel> channel_;
  Timeline timeline_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<BatchSampler> train_sampler_, val_sampler_;
  int64_t step_ = 0;
  std::optional<MetricsLog> metrics_;
};

}  // namespace longhaul
