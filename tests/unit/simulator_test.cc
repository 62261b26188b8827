#include "plan/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "model/param_layout.h"

namespace longhaul {
namespace {

// A device whose block takes exactly 10 ms forward and 20 ms backward, whose head is all but free
// (so every stage costs the same), and whose PS step is all but free unless a test slows it.
DeviceCost TestDevice(double memory_bandwidth_gbs = 1e9, const char* backend = "cuda") {
  const std::string text = std::string("backend = \"") + backend + "\"\nmemory_bandwidth_gbs = " +
                           std::to_string(memory_bandwidth_gbs) + R"(
[[block]]
d_model = 64
n_head = 4
seq_len = 16
micro_batch = 1
forward_ms = 10
backward_ms = 20
[[head]]
d_model = 64
vocab_size = 64
seq_len = 16
micro_batch = 1
forward_ms = 1e-9
backward_ms = 1e-9
)";
  auto d = DeviceCost::ParseProfile(text, "test");
  EXPECT_TRUE(d.ok()) << d.status();
  return *d;
}

constexpr double kF = 0.010, kB = 0.020, kEps = 1e-6;

Simulation Make(int stages, int replicas, int micro, double latency_s = 0, double bandwidth = 0,
                ScheduleKind kind = ScheduleKind::kGpipe, bool central_ps = false) {
  Simulation sim;
  Layout& L = sim.layout;
  L.stages = stages, L.replicas = replicas, L.micro_batches = micro, L.schedule = kind;
  L.work.model.n_layer = stages, L.work.model.d_model = 64, L.work.model.n_head = 4;
  L.work.model.vocab_size = 64, L.work.model.max_seq_len = 16;
  L.work.seq_len = 16;
  sim.placement = DefaultPlacement(L, central_ps);
  sim.devices = {TestDevice()};
  sim.network = NetworkCost::Uniform({latency_s, bandwidth, 0});
  return sim;
}

SimulationReport Simulated(const Simulation& sim) {
  auto r = Simulate(sim);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimulationReport{};
}

double LinkBytes(const SimulationReport& r, int from, int to) {
  for (const LinkReport& l : r.links)
    if (l.from_host == from && l.to_host == to) return l.bytes;
  return 0;
}

TEST(Simulator, OneStageIsMicroBatchesTimesForwardAndBackwardPlusTheStep) {
  Simulation sim = Make(1, 1, 8);
  sim.devices = {TestDevice(0.001)};  // 1 MB/s: the step takes seconds
  const double params = sim.placement.shards[0].params;
  const double step = sim.devices[0].StepSeconds(params, 1);
  EXPECT_GT(step, 1.0);
  const SimulationReport r = Simulated(sim);
  EXPECT_NEAR(r.iteration_s, 8 * (kF + kB) + step, kEps);
  EXPECT_NEAR(r.workers[0].busy_s, 8 * (kF + kB), kEps);
  EXPECT_NEAR(r.workers[0].waiting_s, 0, kEps);  // the worker steps its shard itself (Step)
  EXPECT_NEAR(r.workers[0].ps_busy_s, step, kEps);
  EXPECT_TRUE(r.links.empty());
}

// Local updates: between exchanges an iteration is the compute and the stage's own step; the
// exchange over a slow link costs once per round, so the mean iteration falls towards the local
// one as the round grows, and a round of H is ((H - 1) local iterations + one exchange) / H.
TEST(Simulator, LocalUpdatesPayTheExchangeOncePerRound) {
  Simulation sim = Make(1, 2, 4, /*latency_s=*/0.05, /*bandwidth=*/1e6);
  const double sync = Simulated(sim).iteration_s;
  const double step = sim.devices[0].StepSeconds(sim.placement.shards[0].params + sim.placement.shards[1].params, 1);
  const double local = 4 * (kF + kB) + step;
  std::vector<double> mean;
  for (int h : {2, 4, 16, 1000}) {
    sim.layout.local_steps = h;
    const SimulationReport r = Simulated(sim);
    mean.push_back(r.iteration_s);
    // The exchange: its iteration pays what the round saves on the others.
    const double exchange = h * r.iteration_s - (h - 1) * local;
    EXPECT_GT(exchange, local + 2 * 0.05) << "H = " << h << ": a push and a broadcast, one latency each";
    EXPECT_LT(exchange, sync + step + kEps) << "H = " << h;
  }
  EXPECT_LT(mean[0], sync);
  for (size_t i = 1; i < mean.size(); ++i) EXPECT_LT(mean[i], mean[i - 1]);
  EXPECT_NEAR(mean.back(), local, 0.01 * (sync - local)) << "a long round costs about the local iteration";
}

// Overlapped (train.overlap_outer), a round's exchange travels under the next two iterations'
// compute: where it takes less than they do, a round costs its local iterations alone; where it
// takes more, what is left over shows, and the round still costs less than without overlap.
TEST(Simulator, AnOverlappedExchangeHidesUnderTheNextTwoIterations) {
  for (const double bandwidth : {1e9, 1e6}) {
    Simulation sim = Make(1, 2, 4, /*latency_s=*/0.001, bandwidth);
    const double step =
        sim.devices[0].StepSeconds(sim.placement.shards[0].params + sim.placement.shards[1].params, 1);
    const double local = 4 * (kF + kB) + step;
    sim.layout.local_steps = 8;
    const double plain = Simulated(sim).iteration_s;
    sim.layout.overlap_outer = true;
    const double overlapped = Simulated(sim).iteration_s;
    if (bandwidth > 1e8) {
      EXPECT_NEAR(overlapped, local, 0.002 * local) << "the exchange is hidden";
      EXPECT_GT(plain, local + 2 * 0.001 / 8) << "a push and a broadcast, one latency each, once a round";
    } else {
      EXPECT_GT(overlapped, local * 1.01) << "an exchange longer than two iterations shows";
    }
    EXPECT_LT(overlapped, plain) << bandwidth << " B/s";
  }
}

// train.overlap_steps: an exchange longer than two iterations hides under as many as it is given,
// each more costing no more than the one before.
TEST(Simulator, ALongerOverlapHidesALongerExchange) {
  Simulation sim = Make(1, 2, 4, /*latency_s=*/0.001, 1e6);
  const double step = sim.devices[0].StepSeconds(sim.placement.shards[0].params + sim.placement.shards[1].params, 1);
  const double local = 4 * (kF + kB) + step;
  sim.layout.local_steps = 8;
  sim.layout.overlap_outer = true;
  std::vector<double> by_steps;
  for (int tau = 2; tau <= 7; ++tau) {
    sim.layout.overlap_steps = tau;
    by_steps.push_back(Simulated(sim).iteration_s);
    if (tau > 2) {
      EXPECT_LE(by_steps.back(), by_steps[by_steps.size() - 2] + kEps) << tau << " steps";
    }
  }
  EXPECT_GT(by_steps.front(), local * 1.01) << "over two iterations the exchange shows";
  EXPECT_NEAR(by_steps.back(), local, 0.002 * local) << "over seven it is hidden";
}

TEST(Simulator, AShardOnAWorkerThatRunsNoStageIsRefused) {
  Simulation sim = Make(1, 1, 2);
  sim.placement.host.push_back(1);  // worker 1: placed nowhere, so it runs no exchange either
  sim.placement.shards[0].worker = 1;
  const auto r = Simulate(sim);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("worker 1, which runs no stage"), std::string::npos) << r.status();
}

TEST(Simulator, GpipeWithFreeLinksFollowsTheBubbleFormula) {
  for (int P : {2, 4, 6})
    for (int M : {1, 4, 16}) {
      const SimulationReport r = Simulated(Make(P, 1, M));
      EXPECT_NEAR(r.iteration_s, (M + P - 1) * (kF + kB), kEps) << P << " stages, " << M << " micro-batches";
      // Every stage computes M·(f+b) and waits out the bubble.
      for (const WorkerReport& w : r.workers) EXPECT_NEAR(w.busy_s, M * (kF + kB), kEps);
      EXPECT_NEAR(r.workers[P - 1].waiting_s, (P - 1) * (kF + kB), kEps);
    }
}

TEST(Simulator, OneFOneBTakesAsLongAsGpipeWithFreeLinks) {
  for (int P : {2, 3, 5})
    for (int M : {1, 3, 8}) {
      const double gpipe = Simulated(Make(P, 1, M, 0, 0, ScheduleKind::kGpipe)).iteration_s;
      const double ofob = Simulated(Make(P, 1, M, 0, 0, ScheduleKind::k1F1B)).iteration_s;
      EXPECT_NEAR(ofob, gpipe, kEps) << P << " stages, " << M << " micro-batches";
    }
}

TEST(Simulator, LatencyAddsTwoCrossingsPerStageBoundaryToTheCriticalPath) {
  const double latency = 0.007;
  const int P = 4, M = 8;
  const double gpipe = Simulated(Make(P, 1, M, latency)).iteration_s;
  EXPECT_NEAR(gpipe, (M + P - 1) * (kF + kB) + 2 * (P - 1) * latency, kEps);
  // 1F1B keeps at most P - s micro-batches in flight, too few to cover the round trips latency
  // adds, so every steady-state forward-backward pair waits: it loses to GPipe here.
  const double ofob = Simulated(Make(P, 1, M, latency, 0, ScheduleKind::k1F1B)).iteration_s;
  EXPECT_GT(ofob, gpipe + latency);
}

TEST(Simulator, BandwidthBoundSendsSerializeOnTheLink) {
  // Each activation takes 60 ms on the wire, longer than the forward (10) and backward (20): the
  // second stage receives one every 60 ms, and the gradients come back one every 60 ms.
  Simulation sim = Make(2, 1, 8);
  const double tau = 0.060, boundary = sim.layout.BoundaryBytes();
  sim.network = NetworkCost::Uniform({0, boundary / tau, 0});
  const SimulationReport r = Simulated(sim);
  EXPECT_NEAR(r.iteration_s, 2 * 8 * tau + 2 * (kF + kB), kEps);
  // Unlimited links would have taken (M + 1)·(f + b).
  EXPECT_GT(r.iteration_s, 3 * 9 * (kF + kB));
  // 16 floats × 64 channels per micro-batch, eight of them each way; the PS stays on each worker.
  EXPECT_DOUBLE_EQ(boundary, 16 * 64 * 4);
  EXPECT_DOUBLE_EQ(LinkBytes(r, 0, 1), 8 * boundary);
  EXPECT_DOUBLE_EQ(LinkBytes(r, 1, 0), 8 * boundary);
  EXPECT_EQ(r.links.size(), 2u);
}

// An int4 boundary is encoded by the connection's thread as it is written: each message (here one
// part) holds the link for its encoding and its bytes (a gradient's stochastic rounding costs
// more), and the last of each direction arrives one decoding later.
TEST(Simulator, ANarrowBoundaryHoldsTheLinkForItsEncodingAndArrivesOneDecodingLater) {
  Simulation sim = Make(2, 1, 8);
  sim.layout.wire = WireDtype::kInt4;
  const double tau = 0.060, boundary = sim.layout.BoundaryElements(false);
  const double rate = WireBytes(static_cast<size_t>(boundary), WireDtype::kInt4) / tau;
  sim.network = NetworkCost::Uniform({0, rate, 0});
  const CodecSeconds act = HostCodecSeconds(boundary, WireDtype::kInt4, false);
  const CodecSeconds grad = HostCodecSeconds(boundary, WireDtype::kInt4, true);
  EXPECT_GT(grad.encode_s, act.encode_s);
  const double want =
      8 * (tau + act.encode_s) + 8 * (tau + grad.encode_s) + act.decode_s + grad.decode_s + 2 * (kF + kB);
  EXPECT_NEAR(Simulated(sim).iteration_s, want, kEps);
  // Cards that do not bind price it alike, as messages that share them.
  sim.network.SetCards(std::vector<double>(2, 10 * rate), std::vector<double>(2, 10 * rate));
  EXPECT_NEAR(Simulated(sim).iteration_s, want, kEps);
  // fp32 is written from the tensor itself: no encoding.
  EXPECT_EQ(HostCodecSeconds(boundary, WireDtype::kF32, false).encode_s, 0);
}

TEST(Simulator, WireDtypeHalvesTheBytes) {
  Simulation sim = Make(2, 1, 4, 0, 1e6);
  sim.layout.wire = WireDtype::kBf16;
  const SimulationReport r = Simulated(sim);
  EXPECT_DOUBLE_EQ(LinkBytes(r, 0, 1), 4 * 16 * 64 * 2);
}

// Boundaries in low rank (16 tokens of 64 values: activations rank 4, gradients rank 2) carry
// rank x (16 + 64) floats a micro-batch each way, and the stages compute the codec besides: a CPU
// at its block's rate; a GPU worker on the device, in fp32 at its block's rate too, and the
// Cholesky pivots one after another; a subspace model's narrowed boundary on a GPU worker's host,
// whose BLAS is far faster than the test CPU's block rate.
TEST(Simulator, ALowRankBoundaryCarriesItsFactorsAndComputesTheCodecWhereItRuns) {
  Simulation sim = Make(2, 1, 4, 0, 1e6);
  const double whole = Simulated(Make(2, 1, 4)).iteration_s;
  sim.layout.boundary_rank_divisor = 16, sim.layout.gradient_rank_divisor = 32;
  const SimulationReport r = Simulated(sim);
  EXPECT_DOUBLE_EQ(LinkBytes(r, 0, 1), 4 * 4 * (16 + 64) * 4);
  EXPECT_DOUBLE_EQ(LinkBytes(r, 1, 0), 4 * 2 * (16 + 64) * 4);
  sim.network = Make(2, 1, 4).network;
  const double on_gpu = Simulated(sim).iteration_s;
  EXPECT_GT(on_gpu, whole) << "the codec's time, on links that cost nothing";
  sim.devices = {TestDevice(1e9, "cpu")};
  const double on_cpu = Simulated(sim).iteration_s;
  EXPECT_GT(on_cpu, whole);
  EXPECT_GT(on_gpu, on_cpu) << "the same products at the same rate, and the pivots besides";
  sim.layout.work.model.subspace_divisor = 2, sim.layout.boundary_rank_divisor = 8;
  sim.layout.gradient_rank_divisor = 16;
  const double narrowed_on_cpu = Simulated(sim).iteration_s;
  sim.devices = {TestDevice()};
  EXPECT_LT(Simulated(sim).iteration_s, narrowed_on_cpu) << "the host's BLAS, kHostLowRankFlops";
}

// Shared directions (rank 4 of 64 values, 16 tokens, 4 micro-batches) carry each micro-batch's
// coordinates, 4 x 16 floats each way, and the directions once an iteration (4 x 64, padded to
// 4096 floats); each encoding multiplies once, the first micro-batch's range finder shared out,
// so the codec costs less than each micro-batch's own product on the same device.
TEST(Simulator, SharedDirectionsCarryCoordinatesAndTheDirectionsOnce) {
  Simulation sim = Make(2, 1, 4, 0, 1e6);
  sim.layout.boundary_rank_divisor = 16, sim.layout.shared_directions = true;
  const SimulationReport r = Simulated(sim);
  EXPECT_DOUBLE_EQ(LinkBytes(r, 0, 1), (4 * 4 * 16 + 4096) * 4);
  EXPECT_DOUBLE_EQ(LinkBytes(r, 1, 0), 4 * 4 * 16 * 4);
  sim.network = Make(2, 1, 4).network;
  const double shared = Simulated(sim).iteration_s;
  sim.layout.shared_directions = false;
  EXPECT_LT(shared, Simulated(sim).iteration_s) << "one product a micro-batch, not a range finder each";
}

TEST(Simulator, DataParallelAddsPushAndPullTransfers) {
  const int M = 2;
  const double rate = 1e6;  // 1 MB/s: the exchange dominates
  for (bool central : {false, true}) {
    Simulation sim = Make(1, 2, M, 0, rate, ScheduleKind::kGpipe, central);
    const double params = StageParamCount(sim.layout.work.model, sim.layout.Spec(0));
    const double fb = [&] {
      const ComputeTimes t = *sim.devices[0].Stage(sim.layout.work, sim.layout.Spec(0));
      return t.forward_s + t.backward_s;
    }();
    // The runtime's shards (whole tensors, so uneven): replica 0 hosts `own`, the larger sets the pace.
    const std::vector<ParamLayout::PsShardCut> shards =
        ParamLayout(sim.layout.work.model, sim.layout.Spec(0)).PsShards(2, central);
    ASSERT_EQ(shards.size(), central ? 1u : 2u);
    const double own = static_cast<double>(shards[0].floats);
    const double larger = central ? params : std::max(own, params - own);
    if (!central) {
      EXPECT_NE(own, params / 2) << "a test of uneven shards wants a stage that splits unevenly";
    }
    const SimulationReport r = Simulated(sim);
    // Sharded: each worker sends the other's shard of its gradient, then gets that shard's
    // parameters back, both directions at once. Central: replica 1 sends all of it and gets all of
    // it back.
    const double moved = 4 * larger;
    const double step = sim.devices[0].StepSeconds(larger, 2);
    EXPECT_NEAR(r.iteration_s, M * fb + 2 * moved / rate + step, kEps) << (central ? "central" : "sharded");
    // Either way each direction carries one shard's gradient and the other's parameters (sharded)
    // or the whole gradient one way and the whole parameters the other (central): 4 bytes each.
    EXPECT_DOUBLE_EQ(LinkBytes(r, 1, 0), 4 * params);
    EXPECT_DOUBLE_EQ(LinkBytes(r, 0, 1), 4 * params);
    EXPECT_NEAR(r.workers[0].ps_bytes, 16 * own, 1e-6);
  }
}

// Replicas of unequal shares each compute their own micro-batches; a step waits for the largest
// share, and each replica's worker is busy for its own.
TEST(Simulator, ReplicasOfUnequalSharesComputeTheirOwnAndTheStepWaitsForTheLargest) {
  Simulation uneven = Make(1, 3, 3, 0, 1e9), even = Make(1, 3, 3, 0, 1e9), one = Make(1, 3, 1, 0, 1e9);
  uneven.layout.replica_micro_batches = {3, 1, 2};
  const SimulationReport r = Simulated(uneven);
  EXPECT_NEAR(r.iteration_s, Simulated(even).iteration_s, kEps);
  EXPECT_GT(r.iteration_s, Simulated(one).iteration_s + 2 * (kF + kB) - kEps);
  for (const WorkerReport& w : r.workers) {
    EXPECT_NEAR(w.busy_s, uneven.layout.replica_micro_batches[w.replica] * (kF + kB), kEps) << "replica " << w.replica;
  }
  uneven.layout.replica_micro_batches = {3, 1};
  EXPECT_FALSE(Simulate(uneven).ok()) << "one share per replica";
}

// A CPU worker's exchange overlaps compute block by block: the last backward pushes the later
// shard once its blocks are done, and the next forward computes the earlier shard's blocks while
// the later one's parameters are still on their way. It can hide at most one forward and one
// backward; on free links there is nothing to hide, and a GPU worker exchanges whole iterations.
TEST(Simulator, OverlapHidesPartOfTheExchangeOnCpuWorkersOnly) {
  const int M = 2;
  // One stage of 4 blocks over 2 replicas: each replica hosts the shard of about half the blocks.
  auto four_blocks = [](Simulation sim) {
    sim.layout.work.model.n_layer = 4;
    sim.placement = DefaultPlacement(sim.layout, false);
    return sim;
  };
  auto iteration = [&](const char* backend, double rate, bool overlap, double latency = 0.002) {
    Simulation sim = four_blocks(Make(1, 2, M, latency, rate));
    sim.devices = {TestDevice(1e9, backend)};
    sim.layout.overlap = overlap;
    sim.iterations = 4;
    return Simulated(sim).iteration_s;
  };
  const double rate = 1e6;
  const double off = iteration("cpu", rate, false), on = iteration("cpu", rate, true);
  const Simulation shape = four_blocks(Make(1, 2, M));
  const ComputeTimes t = *TestDevice(1e9, "cpu").Stage(shape.layout.work, shape.layout.Spec(0));
  EXPECT_LT(on, off - 0.1 * (t.forward_s + t.backward_s)) << "overlapped " << on << " s, not " << off << " s";
  EXPECT_GE(on, off - (t.forward_s + t.backward_s) - kEps);
  EXPECT_NEAR(iteration("cuda", rate, true), iteration("cuda", rate, false), kEps);
  EXPECT_NEAR(iteration("cuda", rate, true), off, kEps) << "the same device but for the backend";
  EXPECT_NEAR(iteration("cpu", 0, true, 0), iteration("cpu", 0, false, 0), kEps) << "free links leave nothing to hide";
}

TEST(Simulator, CentralPsTakesEachReplicaOnItsOwnLink) {
  // Four replicas push to replica 0's worker over three host pairs at once (no card: each pair
  // its own capacity), and get the parameters back the same way: one transfer time each way.
  const double rate = 1e6;
  Simulation sim = Make(1, 4, 1, 0, rate, ScheduleKind::kGpipe, /*central_ps=*/true);
  const double params = sim.placement.shards[0].params;
  const ComputeTimes t = *sim.devices[0].Stage(sim.layout.work, sim.layout.Spec(0));
  const SimulationReport r = Simulated(sim);
  EXPECT_NEAR(r.iteration_s, t.forward_s + t.backward_s + 2 * 4 * params / rate + sim.devices[0].StepSeconds(params, 4),
              kEps);
  for (int w = 1; w < 4; ++w) EXPECT_DOUBLE_EQ(LinkBytes(r, 0, w), 4 * params);
}

// With a card as fast as one link on every host, the three pushes into the central host share its
// card on the way in and its parameters share it on the way out: three transfers each way, not one.
TEST(Simulator, CentralPsShardsItsCardAmongTheReplicas) {
  const double rate = 1e6;
  Simulation sim = Make(1, 4, 1, 0, rate, ScheduleKind::kGpipe, /*central_ps=*/true);
  sim.network.SetCards(std::vector<double>(4, rate), std::vector<double>(4, rate));
  const double params = sim.placement.shards[0].params;
  const ComputeTimes t = *sim.devices[0].Stage(sim.layout.work, sim.layout.Spec(0));
  EXPECT_NEAR(Simulated(sim).iteration_s,
              t.forward_s + t.backward_s + 2 * 3 * 4 * params / rate + sim.devices[0].StepSeconds(params, 4), kEps);
  // A card ten times the link's passes the three in less than one link's time: the links bind.
  sim.network.SetCards(std::vector<double>(4, 10 * rate), std::vector<double>(4, 10 * rate));
  EXPECT_NEAR(Simulated(sim).iteration_s,
              t.forward_s + t.backward_s + 2 * 4 * params / rate + sim.devices[0].StepSeconds(params, 4), kEps);
  EXPECT_TRUE(sim.network.HasCards());
  EXPECT_FALSE(sim.network.WithoutCards().HasCards());
}

// The norm's partials go from every shard host to every other, one latency: a host steps once the
// last partial to reach it is in, and a host alone waits for nobody.
TEST(Simulator, ClippingWaitsOneLatencyForTheOtherHostsNormPartials) {
  const double latency = 0.004;
  Simulation sim = Make(1, 2, 2, latency);  // links of unbounded rate: both hosts' partials leave at once
  const SimulationReport clipped = Simulated(sim);
  sim.placement.clip_norm = false;
  const SimulationReport unclipped = Simulated(sim);
  EXPECT_NEAR(clipped.iteration_s - unclipped.iteration_s, latency, 1e-4 * latency + kEps)
      << "pushes and broadcasts are the same; the partials add one latency";
  Simulation alone = Make(1, 1, 2, latency);
  const double step = alone.devices[0].StepSeconds(alone.placement.shards[0].params, 1);
  EXPECT_NEAR(Simulated(alone).iteration_s, 2 * (kF + kB) + step, kEps);
}

TEST(Simulator, ScenarioLinksPriceEachHop) {
  auto s = netem::LoadScenario(LONGHAUL_SOURCE_DIR "/netem/scenarios/source-10ms-1gbit.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  Simulation sim = Make(3, 1, 1);
  sim.network = NetworkCost::FromScenario(*s);
  const double hop = 0.010 + sim.layout.BoundaryBytes() / 125e6;
  // One micro-batch: every stage in turn, two hops forward, two back.
  EXPECT_NEAR(Simulated(sim).iteration_s, 3 * (kF + kB) + 4 * hop, kEps);
}

TEST(Simulator, UnevenStagesAddUpWithOneMicroBatch) {
  Simulation sim = Make(2, 1, 1);
  sim.layout.work.model.n_layer = 4;
  sim.layout.blocks_per_stage = {3, 1};
  sim.placement = DefaultPlacement(sim.layout, false);
  EXPECT_NEAR(Simulated(sim).iteration_s, 4 * (kF + kB), kEps);
  sim.layout.blocks_per_stage = {3, 2};
  EXPECT_EQ(Simulate(sim).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Simulator, MemoryFollowsTheScheduleActivationSlots) {
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::k1F1B}) {
    Simulation sim = Make(4, 2, 8, 0, 0, kind);
    sim.devices = {TestDevice(1e9, "cpu")};
    const SimulationReport r = Simulated(sim);
    for (int s = 0; s < 4; ++s) {
      const MemoryEstimate want =
          sim.devices[0].StageMemory(sim.layout.work, sim.layout.Spec(s), ActivationSlots(kind, 4, s, 8));
      EXPECT_DOUBLE_EQ(r.workers[s].memory.total(), want.total()) << ScheduleName(kind) << " stage " << s;
      EXPECT_TRUE(r.workers[s].fits);
    }
  }
  // GPipe holds all eight micro-batches on stage 0, 1F1B four.
  Simulation g = Make(4, 1, 8, 0, 0, ScheduleKind::kGpipe), o = Make(4, 1, 8, 0, 0, ScheduleKind::k1F1B);
  g.devices = o.devices = {TestDevice(1e9, "cpu")};
  EXPECT_GT(Simulated(g).workers[0].memory.bytes("activations"), Simulated(o).workers[0].memory.bytes("activations"));
}

TEST(Simulator, SixtyFourWorkersAndMicroBatchesInMilliseconds) {
  Simulation sim = Make(8, 8, 64, 0.005, 1e8);
  const auto t0 = std::chrono::steady_clock::now();
  const SimulationReport r = Simulated(sim);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.workers.size(), 64u);
  EXPECT_GT(r.iteration_s, (64 + 7) * (kF + kB));
  EXPECT_LT(ms, 200) << r.events << " events";
  std::printf("64 workers x 64 micro-batches x 2 iterations: %lld events in %.1f ms\n",
              static_cast<long long>(r.events), ms);
}

}  // namespace
}  // namespace longhaul
