// The source experiment's table (../shared/seeds/001_eca194845db01511.txt) predicted by the
// planner's simulator at full scale: GPT-3 XL (24 blocks, d_model 2048, 16 heads, seq 2048) on 12
// V100 stages of 2 blocks, GPipe, 64 micro-batches of 1, a central parameter server per stage, DP
// 1 and 4, under the five network settings (netem/scenarios/source-*.toml).
//
// One figure is fitted: the V100's efficiency, from the default setting's DP1 time (15.16 s). Every
// other cell is a prediction from that efficiency, the scenario's delay and rate, and the sizes.
//
// How the source's job maps onto the model:
//  - fp32 compute and wire: the seed's micro-batch is 16 MB, 2048 x 2048 fp32 numbers.
//  - The seed fine-tunes on QQP: its first stage embeds bert-base-cased's 28996 tokens (that, plus
//    the positions, is exactly the seed's 626 MB against 400 MB for a stage of two blocks), and its
//    last stage ends in a light classification loss. ModelConfig has one vocab_size for both, so
//    the compute is priced with a 2-class head and the first stage's parameter-server shard with
//    the 28996-row embedding.
//  - Central PS: replica 0's worker of each stage hosts the stage's parameters; the other replicas
//    push to it over their own links and get the parameters back the same way. The source shaped
//    each pair of hosts with tc (its own delay and rate per destination), which is what the
//    simulator's per-pair links are: the three pushes into one host do not share a NIC.
//  - No gradient clipping (the source does not mention any): shards step as soon as all replicas
//    are in, without the norm's exchange among the shard hosts.
//  - Iteration time on stage 0 of replica 0 (the seed reports its rank-0 node), steady state.
//
// The cell outside 10% (delay 50 ms, 1 Gbit/s, DP1: predicted 0.80 of the seed): the model puts a
// 16 MiB message on a 100 ms round trip at the full 1 Gbit/s, which needs 12.5 MB in flight. The
// source's transport evidently kept less in flight (a TCP window or its library's buffers); the
// scenario does not say how much, and fitting it to this one cell would be fudging. The bench
// prints, as a diagnosis only, the window that would close the gap (about 10 MB, which binds on
// no other setting: a window limits a link only when the round trip exceeds window / bandwidth).
// The seed has no DP4 figure for that setting.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scenario/scenario.h"
#include "plan/simulator.h"

namespace longhaul {
namespace {

struct Cell {
  const char* setting;
  const char* scenario;
  double dp1, dp4;  // seconds per iteration in the seed; 0: not measured there
};

constexpr Cell kSeed[] = {
    {"default (0.1 ms, 10 Gbit/s)", "source-default", 15.16, 16.17},
    {"delay 1 ms, 5 Gbit/s", "source-1ms-5gbit", 15.49, 17.55},
    {"delay 5 ms, 2 Gbit/s", "source-5ms-2gbit", 16.80, 21.99},
    {"delay 10 ms, 1 Gbit/s", "source-10ms-1gbit", 22.90, 33.39},
    {"delay 50 ms, 1 Gbit/s", "source-50ms-1gbit", 29.08, 0},
};

constexpr int kStages = 12, kMicroBatches = 64;

ModelConfig Gpt3Xl(int vocab) {
  ModelConfig m;
  m.n_layer = 24, m.d_model = 2048, m.n_head = 16, m.max_seq_len = 2048, m.vocab_size = vocab;
  return m;
}

// The source's job as it ran, or (defaults) as longhaul runs it by default: transport.wire_dtype
// "auto" (a GPU job: bf16 on the 10 Gbit/s links, int8 on the slower ones, parameters bf16),
// sharded parameter servers, and the global norm reduced among the shard hosts.
absl::StatusOr<SimulationReport> Predict(double efficiency, const netem::Scenario& scenario, int replicas,
                                         double window_bytes = 0, bool defaults = false) {
  Simulation sim;
  Layout& L = sim.layout;
  L.stages = kStages, L.replicas = replicas, L.micro_batches = kMicroBatches;
  L.schedule = ScheduleKind::kGpipe;
  L.work.model = Gpt3Xl(2);  // the last stage's QQP classifier
  L.work.seq_len = 2048, L.work.micro_batch = 1, L.work.precision = Precision::kFp32;
  L.wire = defaults ? WireDtype::kAuto : WireDtype::kF32;
  L.fast_wire = WireDtype::kBf16;
  sim.placement = DefaultPlacement(L, /*central_ps=*/!defaults);
  sim.placement.clip_norm = defaults;
  // The first stage's shards hold bert-base-cased's embedding, not the 2-row one priced above.
  const double embedding = StageParamCount(Gpt3Xl(28996), L.Spec(0)) / StageParamCount(Gpt3Xl(2), L.Spec(0));
  for (ShardPlacement& sh : sim.placement.shards)
    if (sh.stage == 0) sh.params *= embedding;
  auto v100 = DeviceCost::Named("v100", Precision::kFp32, efficiency);
  if (!v100.ok()) return v100.status();
  sim.devices = {*v100};
  sim.network = NetworkCost::FromScenario(scenario, window_bytes);
  return Simulate(sim);
}

// The x in [lo, hi] where f(x) crosses `target`, f monotone.
template <typename F>
double Solve(F f, double lo, double hi, double target) {
  const bool rising = f(hi) > f(lo);
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    ((f(mid) < target) == rising ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

int Main() {
  std::vector<netem::Scenario> scenarios;
  for (const Cell& c : kSeed) {
    auto s = netem::LoadScenario(absl::StrCat(LONGHAUL_SOURCE_DIR, "/netem/scenarios/", c.scenario, ".toml"));
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    scenarios.push_back(*s);
  }
  auto time_of = [&](double efficiency, int cell, int replicas, double window = 0, bool defaults = false) {
    auto r = Predict(efficiency, scenarios[cell], replicas, window, defaults);
    return r.ok() ? r->iteration_s : -1;
  };
  if (auto r = Predict(0.5, scenarios[0], 1); !r.ok()) {
    std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  const double eff = Solve([&](double e) { return time_of(e, 0, 1); }, 0.01, 1.0, kSeed[0].dp1);
  std::printf("seed 001: GPT-3 XL, 12 V100 stages x 2 blocks, GPipe, 64 micro-batches of 1 (seq 2048), fp32, central PS\n");
  std::printf("calibrated on the default setting's DP1 time only (%.2f s): V100 fp32 efficiency %.3f = %.2f TFLOP/s "
              "per block [BlockFlops 72·B·s·h²·(1+s/6h) / time]\n\n",
              kSeed[0].dp1, eff, eff * 15.7);
  std::printf("%-28s %4s %10s %8s %7s %10s   %s\n", "network setting", "DP", "predicted", "seed", "ratio", "sim time",
              "longhaul defaults predicted, and / the same DP's default setting (seed's / its default setting)");
  int outside = 0;
  for (size_t c = 0; c < std::size(kSeed); ++c) {
    for (int replicas : {1, 4}) {
      const double seed = replicas == 1 ? kSeed[c].dp1 : kSeed[c].dp4;
      const auto t0 = std::chrono::steady_clock::now();
      auto r = Predict(eff, scenarios[c], replicas);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!r.ok()) {
        std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
        return 1;
      }
      const bool calibration = c == 0 && replicas == 1;
      const double ours = time_of(eff, static_cast<int>(c), replicas, 0, true),
                   ours0 = time_of(eff, 0, replicas, 0, true);
      const double seed0 = replicas == 1 ? kSeed[0].dp1 : kSeed[0].dp4;
      const std::string defaults =
          absl::StrFormat("   %7.2fs  %5.2fx (%s)", ours, ours / ours0,
                          seed > 0 ? absl::StrFormat("%.2fx", seed / seed0) : std::string("-"));
      if (seed > 0) {
        const double ratio = r->iteration_s / seed;
        const bool off = !calibration && (ratio < 0.9 || ratio > 1.1);
        outside += off;
        std::printf("%-28s %4d %9.2fs %7.2fs %7.3f %8.1fms%s%s\n", kSeed[c].setting, replicas, r->iteration_s, seed,
                    ratio, ms, defaults.c_str(), calibration ? "  (calibration)" : off ? "  OUTSIDE 10%" : "");
      } else {
        std::printf("%-28s %4d %9.2fs %8s %7s %8.1fms%s  (not in the seed)\n", kSeed[c].setting, replicas,
                    r->iteration_s, "-", "-", ms, defaults.c_str());
      }
    }
  }
  std::printf("\n%d predicted cell(s) outside 10%%.\n", outside);
  // Diagnosis only, not used above: the window per connection that would make the 50 ms cell match.
  const double window = Solve([&](double w) { return time_of(eff, 4, 1, w); }, 1e6, 1e9, kSeed[4].dp1);
  int changed = 0;
  for (int c = 0; c < 4; ++c)
    for (int replicas : {1, 4}) changed += std::abs(time_of(eff, c, replicas, window) - time_of(eff, c, replicas)) > 1e-9;
  std::printf("diagnosis: at 50 ms one-way the seed's %.2f s needs a window of %.1f MB per connection "
              "(%.0f Mbit/s over the 100 ms round trip); the model has none. That window would change %d of the "
              "other 8 cells.\n",
              kSeed[4].dp1, window / 1e6, window / 0.1 * 8 / 1e6, changed);
  return 0;
}

}  // namespace
}  // namespace longhaul

int main() { return longhaul::Main(); }
