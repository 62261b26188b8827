// The planner's prediction from measured compute: on free links it is the schedule's arithmetic
// of the stages' times (one stage: M micro-batches; a GPipe pipeline: M + P - 1 slots of the
// slowest stage), and a link's latency adds to it.
#include "plan/measured_prediction.h"
#include "plan/job_problem.h"
#include "model/param_layout.h"

#include <gtest/gtest.h>

namespace longhaul {
namespace {

JobConfig Config(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"model.n_layer=4", "model.d_model=16", "model.n_head=2", "train.micro_batches=6",
                                  "train.grad_clip=0"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  auto c = ParseJobConfig("", "job.toml", all);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

constexpr double kTolerance = 1e-3;  // the parameter servers' step of a tiny model

TEST(MeasuredPrediction, OneStageIsItsMicroBatchesOneAfterAnother) {
  const auto p = PredictFromMeasuredCompute(Config({}), {{0.1}, {}}, NetworkCost::Uniform({}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(*p, 6 * 0.1, kTolerance);
}

TEST(MeasuredPrediction, APipelineOnFreeLinksFollowsTheBubbleAndLatencyAddsToIt) {
  const JobConfig cfg = Config({"cluster.stages=2"});
  // Equal stages (the head costs nothing more here): GPipe takes (M + P - 1) slots of one stage.
  const auto free = PredictFromMeasuredCompute(cfg, {{0.1, 0.1}, {}}, NetworkCost::Uniform({}));
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_NEAR(*free, (6 + 2 - 1) * 0.1, kTolerance);
  LinkCost slow;
  slow.latency_s = 0.02;
  const auto far = PredictFromMeasuredCompute(cfg, {{0.1, 0.1}, {}}, NetworkCost::Uniform(slow));
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_GT(*far, *free + 2 * 0.02 - kTolerance);
}

TEST(MeasuredPrediction, TheSlowestReplicaSetsThePace) {
  // Two replicas of one stage: the parameter servers wait for both pushes every iteration.
  const JobConfig cfg = Config({"cluster.replicas=2"});
  const auto even = PredictFromMeasuredCompute(cfg, {{0.1, 0.1}, {}}, NetworkCost::Uniform({}));
  const auto uneven = PredictFromMeasuredCompute(cfg, {{0.05, 0.15}, {}}, NetworkCost::Uniform({}));
  ASSERT_TRUE(even.ok() && uneven.ok());
  EXPECT_NEAR(*even, 6 * 0.1, kTolerance);
  EXPECT_NEAR(*uneven, 6 * 0.15, kTolerance);
}

TEST(MeasuredPrediction, TheComputeMustCoverEveryWorker) {
  EXPECT_EQ(PredictFromMeasuredCompute(Config({"cluster.stages=2"}), {{0.1}, {}}, NetworkCost::Uniform({}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The device a run measured, written as a profile and read back, prices the job's block and head
// as the run split them, and a micro-batch twice as large at twice the time.
TEST(MeasuredPrediction, AMeasuredDeviceRoundTripsThroughItsProfileFile) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=2"});
  // Stage 0 (2 blocks) 0.1 s per micro-batch; stage 1 (2 blocks and the head) 0.13 s.
  const auto device = MeasuredComputeDevice(cfg, {{0.1, 0.13, 0.1, 0.13}, {}}, Backend::kCpu, 8e9);
  ASSERT_TRUE(device.ok()) << device.status();
  const auto text = device->ProfileToml("a test's device");
  ASSERT_TRUE(text.ok()) << text.status();
  const auto read = DeviceCost::ParseProfile(*text, "test");
  ASSERT_TRUE(read.ok()) << read.status() << "\n" << *text;
  EXPECT_EQ(read->name(), "CPU, as a run of 4 workers measured it");
  EXPECT_EQ(read->backend(), Backend::kCpu);
  EXPECT_NEAR(read->memory_bytes(), 8e9, 1e4);
  const WorkShape shape = JobWorkShape(cfg);
  const auto block = read->Block(shape);
  const auto head = read->Head(shape);
  ASSERT_TRUE(block.ok() && head.ok());
  EXPECT_NEAR(block->forward_s + block->backward_s, 0.05, 1e-6);
  EXPECT_NEAR(head->forward_s + head->backward_s, 0.03, 1e-6);
  WorkShape twice = shape;
  twice.micro_batch *= 2;
  const auto bigger = read->Block(twice);
  ASSERT_TRUE(bigger.ok());
  EXPECT_NEAR(bigger->forward_s + bigger->backward_s, 0.1, 1e-5);
  EXPECT_FALSE(DeviceCost::Named("v100", Precision::kFp32, 0.5)->ProfileToml("").ok());
}

// Workers that stepped their own stages (local updates) measured the memory bandwidth their steps
// stream at: the profile carries it, and the prediction charges each iteration's step so.
TEST(MeasuredPrediction, MeasuredLocalStepsPriceTheStepsAtTheirBandwidth) {
  const JobConfig cfg = Config({"train.local_steps=4"});
  const double params = static_cast<double>(ParamLayout(cfg.model, cfg.Stage(0)).total());
  const auto device = MeasuredComputeDevice(cfg, {{0.1}, {0.05}}, Backend::kCpu, 0);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_NEAR(device->StepSeconds(params, 1), 0.05, 1e-9);
  const auto read = DeviceCost::ParseProfile(*device->ProfileToml("stepped"), "test");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_NEAR(read->StepSeconds(params, 1), 0.05, 1e-6);
  const auto stepped = PredictFromMeasuredCompute(cfg, {{0.1}, {0.05}}, NetworkCost::Uniform({}));
  const auto unmeasured = PredictFromMeasuredCompute(cfg, {{0.1}, {}}, NetworkCost::Uniform({}));
  ASSERT_TRUE(stepped.ok() && unmeasured.ok());
  // Every iteration's local step, and the round's (4 iterations) outer step on the one shard.
  EXPECT_NEAR(*stepped - *unmeasured, 0.05 * (1 + 1.0 / 4), kTolerance);
  EXPECT_EQ(PredictFromMeasuredCompute(cfg, {{0.1}, {0.05, 0.05}}, NetworkCost::Uniform({})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace longhaul
