#pragma once
// Convergence penalties: what a setting that changes the numerics (a narrower wire, local updates,
// a larger global batch, later compressions) costs in tokens to reach the loss the exact path
// (synchronous, fp32) reaches with the same tokens, measured on real text by `longhaul
// convergence`, and the file that carries them to the planner, which ranks settings by time to
// the same loss (../shared/DESIGN.md, "Communication at GPU pace") and takes a penalty as it was
// measured, at the size it was measured.
//
// Per seed s, the target is the exact path's final validation loss with seed s (the same initial
// parameters, data order and validation windows as the setting's run with seed s). A setting that
// reaches it within its tokens T: its tokens to reach it, read off its validation curve (linear
// between evaluations), / T - 1 (0 or below). One that ends above it (a final gap: its last loss -
// the target) would need more tokens than it had, which its run cannot show (its learning rate has
// decayed by then): the penalty is estimated as T / the tokens the exact path took to reach the
// setting's final loss - 1, which is the same number where the setting learns as the exact path
// does at a constant fraction of the pace. A setting whose final loss the exact path never passed
// after its first evaluation has no penalty and is not choosable. The exact path's own penalty is
// 0. A setting is choosable where every seed has a penalty; its penalty is the seeds' mean, with
// their range beside it.
//
// A setting of `batch_scale` k trains the global batch x k on the same tokens: steps, warmup and
// the evaluation interval / k, and the learning rates x sqrt(k) (Adam's rule: the gradient's noise
// falls as the square root of the batch). The bench measures it so, and the planner writes it so.
//
// The file (TOML), one table per setting, the exact path first:
//   model = "..."          corpus = "..."        measured_on = "..."     command = "..."
//   tokens = 1048576       # per run, the same for every setting
//   seeds = [1, 2]
//   exact_final_loss = [1.61, 1.62]
//   exact_spread = 0.01    # the exact path's seed-to-seed spread of final losses
//   [[setting]]
//   name = "int8 wire"
//   set = ["transport.wire_dtype=\"int8\""]   # what makes it from the exact path, as --set takes it
//   batch_scale = 1        # and the global batch x this (fewer steps, the same tokens)
//   choosable = true       # every seed reached its target
//   penalty = 0.012        # mean over seeds (where choosable)
//   penalty_min = 0.004    penalty_max = 0.020
//   final_gap = -0.003     # mean over seeds of final loss - target
//   final_loss = [1.60, 1.63]
//   final_spread = 0.03    # max - min of final_loss
//   iteration_s = 0.05     # the emulated iteration time it was priced at
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "format/wire_dtype.h"
#include "metrics/loss_curve.h"

namespace longhaul {

// The --set overrides that divide `cfg`'s steps, warmup and evaluation interval by k, each
// rounded up where k does not divide it.
std::vector<std::string> ScheduleDividedOverrides(const JobConfig& cfg, int k);
// The --set overrides that make `cfg` train its global batch x `batch_scale` on the same tokens
// (above): its schedule divided by k (ScheduleDividedOverrides), more micro-batches, lr x sqrt(k).
std::vector<std::string> BatchScaleOverrides(const JobConfig& cfg, int batch_scale);

// The penalties file of this repository's machine under the source tree, which `longhaul plan`
// and cluster.communication = "auto" charge unless told otherwise: beside the binary's build
// directory, else under the working directory; nullopt where neither holds it.
inline constexpr char kShippedPenalties[] = "runtime/plan/penalties/cpu-bytes-python-docs.toml";
std::optional<std::string> ShippedPenaltiesPath();

// The tokens at which `curve` (points of tokens and loss, in increasing tokens) first reaches
// `target` or below, interpolated linearly from the point before; nullopt if it never does.
std::optional<double> TokensToReach(const std::vector<LossPoint>& curve, double target);

struct SettingPenalty {
  std::string name;
  std::vector<std::string> overrides;  // config keys that make it from the exact path (--set syntax)
  int batch_scale = 1;                 // and its global batch x this, at the same tokens
  // The pipeline stages its runs trained with: with one, no activation or its gradient crossed a
  // boundary, so the penalty says nothing of a lossy wire's effect on them.
  int stages = 1;
  std::vector<double> final_loss;      // per seed
  std::vector<std::optional<double>> tokens_to_target;  // per seed; nullopt: not reached in its run
  bool choosable = false;
  double penalty = 0, penalty_min = 0, penalty_max = 0;  // where choosable
  double final_gap = 0;
  double final_spread = 0;
  double iteration_s = 0;
};

// `runs[s]` and `exact[s]`: the setting's and the exact path's validation curves of seed s;
// `tokens`: the exact path's tokens per run.
SettingPenalty MeasurePenalty(const std::vector<std::vector<LossPoint>>& runs,
                              const std::vector<std::vector<LossPoint>>& exact, double tokens);

struct PenaltyTable {
  std::string model, corpus, measured_on, command;
  double tokens = 0;
  std::vector<uint64_t> seeds;
  std::vector<double> exact_final_loss;
  std::vector<SettingPenalty> settings;  // the exact path first

  double ExactSpread() const;
};

absl::Status WritePenaltyTable(const std::string& path, const PenaltyTable& table);
// The file WritePenaltyTable wrote, checked: every setting named, with its `set` keys, a
// batch_scale of at least 1, and a penalty where it is choosable; the exact path first.
absl::StatusOr<PenaltyTable> LoadPenaltyTable(const std::string& path);

// The --set overrides that make `job` run setting `p`: p's keys but the layout it was measured on
// (cluster.stages, which `stages` records), every other CommunicationKeys()
// key as the bench's exact path has it (synchronous, the compute's own dtype on every wire, the
// default outer step) whatever `job` set, and where p's batch_scale > 1 its BatchScaleOverrides.
std::vector<std::string> SettingOverrides(const JobConfig& job, const SettingPenalty& p);
// Whether p's penalty says nothing of what `transport` (its wire_dtype and gradient_dtype, its
// boundaries' ranks) does at a pipeline boundary: its bench runs had one stage and a boundary may
// be lossy there.
bool BoundaryUnmeasured(const SettingPenalty& p, const TransportConfig& transport);
inline constexpr char kBoundaryUnmeasured[] =
    "its bench runs had one stage: no penalty measured for a pipeline boundary in its format";
// The keys p changes outside CommunicationKeys() ("train.micro_batches" and the schedule's for a
// larger batch).
std::vector<std::string> KeysBeyondCommunication(const SettingPenalty& p);

}  // namespace longhaul
