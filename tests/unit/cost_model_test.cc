#include "plan/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "metrics/flops.h"

namespace longhaul {
namespace {

WorkShape Gpt3Xl() {
  WorkShape w;
  w.model.n_layer = 24, w.model.d_model = 2048, w.model.n_head = 16, w.model.vocab_size = 50257;
  w.model.max_seq_len = 2048;
  w.seq_len = 2048;
  w.micro_batch = 1;
  return w;
}

TEST(DeviceCost, NamedDevicePricesBlockFlopsAtPeakTimesEfficiency) {
  auto v100 = DeviceCost::Named("v100", Precision::kFp32, 0.5);
  ASSERT_TRUE(v100.ok()) << v100.status();
  const WorkShape w = Gpt3Xl();
  auto t = v100->Block(w);
  ASSERT_TRUE(t.ok()) << t.status();
  const double total = BlockFlops(w.model, 1, 2048, false) / (15.7e12 * 0.5);
  EXPECT_NEAR(t->forward_s + t->backward_s, total, 1e-12);
  EXPECT_NEAR(t->backward_s, 2 * t->forward_s, 1e-12);  // the backward does twice the matmuls
  // fp16 runs on the tensor cores, eight times the fp32 peak.
  auto half = DeviceCost::Named("v100", Precision::kFp16, 0.5);
  ASSERT_TRUE(half.ok());
  EXPECT_NEAR(half->Block(w)->forward_s * 125.0 / 15.7, t->forward_s, 1e-12);
  EXPECT_NEAR(v100->memory_bytes(), 16.0 * (1 << 30), 1);
  // H100 bf16: 989 TFLOP/s.
  EXPECT_NEAR(DeviceCost::Named("h100", Precision::kBf16, 1.0)->flops_per_second(), 989e12, 1);
}

TEST(DeviceCost, RecomputeMakesTheForwardAQuarterOfMoreWork) {
  auto a100 = DeviceCost::Named("a100", Precision::kBf16, 0.4);
  ASSERT_TRUE(a100.ok());
  WorkShape w = Gpt3Xl();
  const ComputeTimes plain = *a100->Block(w);
  w.recompute = true;
  const ComputeTimes re = *a100->Block(w);
  EXPECT_NEAR(re.forward_s, plain.forward_s, 1e-12);  // the forward itself is the same work
  EXPECT_NEAR(re.backward_s, plain.backward_s + plain.forward_s, 1e-12);
}

TEST(DeviceCost, StageAddsTheHeadOnTheLastStageOnly) {
  auto cpu = DeviceCost::Named("cpu:100", Precision::kFp32, 1.0);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->backend(), Backend::kCpu);
  const WorkShape w = Gpt3Xl();
  const ComputeTimes block = *cpu->Block(w);
  const ComputeTimes middle = *cpu->Stage(w, {2, 4, false, false});
  EXPECT_NEAR(middle.forward_s, 2 * block.forward_s, 1e-9);
  const ComputeTimes last = *cpu->Stage(w, {22, 24, false, true});
  // 6·B·s·h·V FLOPs, a third of them forward.
  const double head = 6.0 * 2048 * 2048 * 50257 / 100e9;
  EXPECT_NEAR(last.forward_s + last.backward_s, 2 * (block.forward_s + block.backward_s) + head, 1e-9);
  EXPECT_NEAR(last.forward_s - middle.forward_s, head / 3, 1e-9);
}

TEST(DeviceCost, NamedDeviceErrorsSayWhatToWrite) {
  EXPECT_FALSE(DeviceCost::Named("v100", Precision::kBf16, 0.5).ok());
  EXPECT_FALSE(DeviceCost::Named("cpu:fast", Precision::kFp32, 0.5).ok());
  EXPECT_FALSE(DeviceCost::Named("v100", Precision::kFp32, 0).ok());
  auto unknown = DeviceCost::Named("tpu", Precision::kFp32, 0.5);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("profile"), std::string::npos);
}

constexpr char kProfile[] = R"(
device = "test-gpu"
backend = "cuda"
memory_gib = 16
memory_bandwidth_gbs = 1000
[[block]]
d_model = 2048
n_head = 16
seq_len = 2048
micro_batch = 1
precision = "fp32"
forward_ms = 30
backward_ms = 70
[[head]]
d_model = 2048
vocab_size = 50257
seq_len = 2048
micro_batch = 1
precision = "fp32"
forward_ms = 12
backward_ms = 20
)";

TEST(DeviceCost, ProfileGivesMeasuredTimesAndScalesOthersByFlops) {
  auto p = DeviceCost::ParseProfile(kProfile, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name(), "test-gpu");
  EXPECT_NEAR(p->memory_bytes(), 16.0 * (1 << 30), 1);
  WorkShape w = Gpt3Xl();
  EXPECT_NEAR(p->Block(w)->forward_s, 0.030, 1e-12);
  EXPECT_NEAR(p->Block(w)->backward_s, 0.070, 1e-12);
  EXPECT_NEAR(p->Head(w)->forward_s, 0.012, 1e-12);
  // Two sequences per micro-batch were not timed: twice the FLOPs at the measured rate.
  w.micro_batch = 2;
  EXPECT_NEAR(p->Block(w)->forward_s, 0.060, 1e-12);
  // Nor this head: priced at its shape's block rate, 6·B·s·h·V FLOPs.
  const double rate = BlockFlops(w.model, 2, 2048, false) / 0.200;
  EXPECT_NEAR(p->Head(w)->forward_s + p->Head(w)->backward_s, HeadFlops(w.model, 2, 2048) / rate, 1e-12);
  // No fp16 block was timed at all.
  w.precision = Precision::kFp16;
  EXPECT_EQ(p->Block(w).status().code(), absl::StatusCode::kNotFound);
}

// A profile that times no block with recompute prices it from the block without: the backward
// reruns the forward. One that times one uses it.
TEST(DeviceCost, RecomputeTheProfileDoesNotTimeIsForwardPlusBackward) {
  auto p = DeviceCost::ParseProfile(kProfile, "test");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->PricesRecompute(Precision::kFp32));
  WorkShape w = Gpt3Xl();
  w.recompute = true;
  EXPECT_NEAR(p->Block(w)->forward_s, 0.030, 1e-12);
  EXPECT_NEAR(p->Block(w)->backward_s, 0.100, 1e-12);
  auto timed = DeviceCost::ParseProfile(std::string(kProfile) + R"(
[[block]]
d_model = 2048
n_head = 16
seq_len = 2048
micro_batch = 1
precision = "fp32"
recompute = true
forward_ms = 30
backward_ms = 95
)", "test");
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_FALSE(timed->PricesRecompute(Precision::kFp32));
  EXPECT_NEAR(timed->Block(w)->backward_s, 0.095, 1e-12);
  EXPECT_FALSE(DeviceCost::Named("h100", Precision::kBf16, 0.5)->PricesRecompute(Precision::kBf16));
}

TEST(DeviceCost, ProfileErrorsNameTheEntry) {
  EXPECT_FALSE(DeviceCost::ParseProfile("device = \"x\"\nmemory_bandwidth_gbs = 1\n", "p").ok());  // no blocks
  auto no_bw = DeviceCost::ParseProfile("[[block]]\nd_model = 8\nn_head = 2\nseq_len = 4\nmicro_batch = 1\n"
                                        "forward_ms = 1\nbackward_ms = 2\n",
                                        "p");
  ASSERT_FALSE(no_bw.ok());
  EXPECT_NE(no_bw.status().message().find("memory_bandwidth_gbs"), std::string::npos);
  auto bad = DeviceCost::ParseProfile("memory_bandwidth_gbs = 1\n[[block]]\nd_model = 8\nseq_len = 4\n"
                                      "micro_batch = 1\nforward_ms = 1\nbackward_ms = 2\n",
                                      "p");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("block[0]"), std::string::npos) << bad.status();
  EXPECT_FALSE(DeviceCost::LoadProfile("/nonexistent/profile.toml").ok());
}

TEST(DeviceCost, StepStreamsTheShardAtMemoryBandwidth) {
  auto p = DeviceCost::ParseProfile(kProfile, "test");
  ASSERT_TRUE(p.ok());
  // Four replicas: 5 gradient passes, then 7 AdamW passes, of 4-byte numbers at 1000 GB/s.
  EXPECT_NEAR(p->StepSeconds(1e9, 4), 12 * 4e9 / 1000e9, 1e-12);
}

TEST(DeviceCost, StageMemoryIsTheBackendsEstimate) {
  auto p = DeviceCost::ParseProfile(kProfile, "test");
  ASSERT_TRUE(p.ok());
  const WorkShape w = Gpt3Xl();
  const StageSpec spec{0, 2, true, false};
  StageMemoryRequest r;
  r.model = w.model, r.spec = spec, r.B = 1, r.T = 2048, r.activation_slots = 3, r.backend = Backend::kCuda;
  EXPECT_DOUBLE_EQ(p->StageMemory(w, spec, 3).total(), EstimateStage(r).total());
}

TEST(LinkCost, RateIsTheLesserOfBandwidthAndWindowPerRoundTrip) {
  EXPECT_TRUE(std::isinf(LinkCost{}.Rate()));
  EXPECT_DOUBLE_EQ((LinkCost{0.01, 125e6, 0}.Rate()), 125e6);
  // 1 MB window over a 20 ms round trip: 50 MB/s, below the 125 MB/s link.
  EXPECT_DOUBLE_EQ((LinkCost{0.01, 125e6, 1e6}.Rate()), 50e6);
  EXPECT_DOUBLE_EQ((LinkCost{0.01, 125e6, 1e7}.Rate()), 125e6);
  EXPECT_DOUBLE_EQ((LinkCost{0.01, 125e6, 0}.SerializeSeconds(250e6)), 2.0);
}

TEST(NetworkCost, ReadsTheScenarioBetweenHosts) {
  auto s = netem::LoadScenario(LONGHAUL_SOURCE_DIR "/netem/scenarios/source-10ms-1gbit.toml");
  ASSERT_TRUE(s.ok()) << s.status();
  const NetworkCost net = NetworkCost::FromScenario(*s, 1e6);
  const LinkCost l = net.Between(0, 3);
  EXPECT_DOUBLE_EQ(l.latency_s, 0.010);
  EXPECT_DOUBLE_EQ(l.bandwidth, 125e6);
  EXPECT_DOUBLE_EQ(l.Rate(), 1e6 / 0.020);  // the window limits a 20 ms round trip
  const LinkCost local = net.Between(2, 2);  // two workers on one host
  EXPECT_EQ(local.latency_s, 0);
  EXPECT_TRUE(std::isinf(local.Rate()));
  EXPECT_DOUBLE_EQ(NetworkCost::Uniform({0.001, 1e9, 0}).Between(0, 1).latency_s, 0.001);
  // Host -1 sits beside every host (an emulation's coordinator, on the router).
  for (const NetworkCost& n : {net, NetworkCost::Uniform({0.001, 1e9, 0})}) {
    EXPECT_EQ(n.Between(-1, 3).latency_s, 0);
    EXPECT_TRUE(std::isinf(n.Between(3, -1).Rate()));
  }
}

}  // namespace
}  // namespace longhaul
