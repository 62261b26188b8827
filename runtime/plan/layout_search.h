#pragma once
// The layout search behind `longhaul plan`: for one model, global batch, device and network, every
// layout of up to `workers` devices (pipeline stages P × data-parallel replicas D, micro-batch size
// and counts adding up to the global batch, each replica's within one of the others'
// (ReplicaShares), GPipe or 1F1B, recompute on or off, sharded or central parameter servers),
// checked for memory stage by stage (DeviceCost::StageMemory), simulated (Simulate on
// DefaultPlacement, or with `place` on the placement the coordinator would run: ChoosePlacement
// over worker w on host w) and ranked by iteration time.
//
// Answering in seconds: a candidate is simulated only where it can still enter the ranking. Its
// lower bound is the busiest stage's compute, M × (forward + backward): every stage's whole
// iteration lies between two ends of stage 0's iterations (stage 0's last backward waits for every
// stage's last backward), so no network or schedule makes it faster. Candidates go in order of
// that bound and the search stops once the bound reaches the K-th best time simulated. Recompute is
// not tried where the same layout fits without it: it only adds compute. A split and micro-batch
// size that fits under no schedule and recompute setting is listed once, by its variant closest
// to fitting (sharded PS), so the layouts that do not fit say what memory rules out.
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/memory_estimate.h"
#include "plan/cost_model.h"
#include "plan/placement.h"
#include "plan/simulator.h"

namespace longhaul {

// `micro_batches` shared out over `replicas` (at most as many) as evenly as whole micro-batches
// allow, the larger shares first: 64 over 12 is 6 × 4 and 5 × 8.
std::vector<int> ReplicaShares(int micro_batches, int replicas);

struct LayoutSearchRequest {
  ModelConfig model;
  int seq_len = 1;
  int global_batch = 1;  // sequences per optimizer step, over every replica
  Precision precision = Precision::kFp32;
  // Layout's wire, fast_wire, exchange and gradient, and its boundaries' rank divisors
  WireDtype wire = WireDtype::kF32, fast_wire = WireDtype::kF32;
  WireDtype exchange = WireDtype::kAuto, gradient = WireDtype::kAuto;
  int boundary_rank_divisor = 1, gradient_rank_divisor = 0;
  bool shared_directions = false;  // transport.shared_directions
  bool clip_norm = true;  // every step waits for the norm's exchange (simulator.h's Placement)
  int local_steps = 1;    // train.local_steps: every layout exchanges every local_steps-th iteration
  bool overlap_outer = false;  // train.overlap_outer
  int overlap_steps = 2;       // train.overlap_steps
  bool overlap = true;    // cluster.overlap_exchange
  int workers = 1;        // devices available; a layout may use fewer
  DeviceCost device;      // every worker's
  NetworkCost network;    // worker w on host w (DefaultPlacement)
  int top = 10;           // fitting layouts to rank
  int top_unfit = 5;      // splits and micro-batch sizes that do not fit to rank
  bool exhaustive = false;  // simulate every candidate (no bound): for checking the pruning
  // Rank each candidate on the coordinator's placement of it (ChoosePlacement: the search, kept
  // where it beats registration order), not on registration order; only candidates that can
  // still enter the ranking are searched.
  bool place = false;
  // Only layouts of this many stages and replicas (0: any).
  int only_stages = 0, only_replicas = 0;
};

struct RankedLayout {
  Layout layout;
  bool central_ps = false;
  // Memory: the stage that needs the most, and what it needs.
  bool fits = true;
  int peak_stage = 0;
  MemoryEstimate peak_memory;
  std::string why_not;  // where it does not fit: the stage, its need, the device's memory, the excess
  double lower_bound_s = 0;
  // Simulated, and the figures derived from it (metrics/flops.h).
  double iteration_s = 0;
  double tokens_per_s = 0;
  double tflops_per_device = 0;  // ModelFlopsPerIteration (recompute counted) / (time × P·D)
  double mfu = 0;                // model FLOPs (no recompute) / (time × P·D × peak); 0: peak unknown
  double days_per_100b_tokens = 0;
  // With `place`: the coordinator's placement of it, and the time of registration order beside.
  std::optional<ChosenPlacement> placement;

  int devices() const { return layout.stages * layout.replicas; }
};

struct LayoutSearchResult {
  std::vector<RankedLayout> fitting;  // fastest first, at most `top`
  std::vector<RankedLayout> unfit;    // fastest first, at most `top_unfit`
  int candidates = 0;                 // layouts enumerated
  int simulated = 0;                  // of them, simulated
  int placed = 0;                     // of them, placed by the search (`place`)
};

absl::StatusOr<LayoutSearchResult> SearchLayouts(const LayoutSearchRequest& r);

}  // namespace longhaul
