// The coordinator's run log: a metrics row per iteration with the last stage's loss and stage 0
// replica 0's time, per-worker means over the iterations after the first, the records written
// at the end, and a rewind that rewrites metrics.csv only where it forgets steps.
#include "coordinator/run_log.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace longhaul {
namespace {
namespace fs = std::filesystem;

// `micro_batches`: how many the report names.
proto::IterationReport Report(int stage, int replica, double loss, double seconds, int micro_batches = 1) {
  proto::IterationReport r;
  for (int m = 0; m < micro_batches; ++m) r.add_micro_batches(replica * micro_batches + m);
  r.set_stage(stage);
  r.set_replica(replica);
  r.set_loss(loss);
  r.set_floor(-1);
  r.set_seconds(seconds);
  r.set_compute_seconds(seconds / 2);
  r.set_wait_seconds(seconds / 4);
  r.set_step_seconds(seconds / 10);
  r.set_lr(stage == 0 ? 1e-3 : 0);
  r.set_grad_norm(stage == 0 ? 0.5 : 0);
  return r;
}

TEST(RunLog, RowsSummaryAndRecords) {
  const fs::path dir = fs::path(::testing::TempDir()) / "run_log_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto cfg = ParseJobConfig("", "job.toml",
                            {"cluster.stages=2", "cluster.replicas=2", "train.steps=3", "train.out_dir=" + dir.string()});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto metrics = MetricsLog::Create((dir / "metrics.csv").string());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  RunLog log(*cfg, 0, 3, std::move(*metrics));
  const int M = cfg->train.micro_batches;
  for (int it = 0; it < 3; ++it) {
    // Worker id = replica * 2 + stage; stage 0 replica 0 takes 1, 2, 3 s.
    std::map<int, proto::IterationReport> reports = {{0, Report(0, 0, 0, 1.0 + it, M)},
                                                     {1, Report(1, 0, 2.0 - it * 0.5, 10, M)},
                                                     {2, Report(0, 1, 0, 7, M)},
                                                     {3, Report(1, 1, 1.0 - it * 0.5, 10, M)}};
    // In the last iteration stage 1's replica 0 stands for both (a shrunk plan's): its 10 s are
    // of twice the micro-batches.
    if (it == 2) reports[1] = Report(1, 0, 1.0, 10, 2 * M);
    ASSERT_TRUE(log.Record(it, 2, reports).ok());
  }
  const nlohmann::json s = log.Summary("completed", "", 3);
  EXPECT_EQ(s["status"], "completed");
  EXPECT_EQ(s["last_step"], 3);
  EXPECT_DOUBLE_EQ(s["final_loss"].get<double>(), 0.5);  // the last stages' mean of 1.0 and 0.0
  EXPECT_DOUBLE_EQ(s["iteration_seconds"].get<double>(), 2.5);  // 2 and 3 s: the first is not timed
  ASSERT_EQ(s["workers"].size(), 4u);
  EXPECT_EQ(s["workers"][2]["stage"], 0);
  EXPECT_EQ(s["workers"][2]["replica"], 1);
  EXPECT_DOUBLE_EQ(s["workers"][0]["seconds"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(s["workers"][0]["compute_seconds"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(s["workers"][0]["wait_seconds"].get<double>(), 0.625);
  EXPECT_FALSE(s.contains("reason"));
  EXPECT_TRUE(s["predicted_iteration_seconds"].is_null());
  // Stage 0: replica 0 (worker 0) computed 1 and 1.5 s in the timed iterations, replica 1
  // (worker 2) 3.5 s each; stage 1's workers 5 s each, worker 1's last over 2M micro-batches.
  const MeasuredCompute compute = log.MeasuredByWorker();
  ASSERT_EQ(compute.per_micro.size(), 4u);
  EXPECT_DOUBLE_EQ(compute.per_micro[0], 1.25 / M);
  EXPECT_DOUBLE_EQ(compute.per_micro[2], 3.5 / M);
  EXPECT_DOUBLE_EQ(compute.per_micro[3], 5.0 / M);
  EXPECT_DOUBLE_EQ(compute.per_micro[1], (5.0 / M + 2.5 / M) / 2);
  // The workers' own steps, per iteration and not per micro-batch: a tenth of their times.
  ASSERT_EQ(compute.step.size(), 4u);
  EXPECT_DOUBLE_EQ(compute.step[0], 0.25);
  EXPECT_DOUBLE_EQ(compute.step[1], 1.0);
  EXPECT_DOUBLE_EQ(s["workers"][0]["step_seconds"].get<double>(), 0.25);
  log.SetPrediction(2.0);
  EXPECT_DOUBLE_EQ(log.Summary("completed", "", 3)["predicted_iteration_seconds"].get<double>(), 2.0);
  EXPECT_EQ(log.Summary("failed", "worker 3 died", 3)["reason"], "worker 3 died");

  log.Write(s, {});
  std::ifstream summary(dir / "summary.json");
  EXPECT_EQ(nlohmann::json::parse(summary, nullptr, false), s);
  EXPECT_TRUE(fs::exists(dir / "loss.svg"));
  std::ifstream csv(dir / "metrics.csv");
  std::string line;
  int lines = 0;
  while (std::getline(csv, line)) ++lines;
  EXPECT_EQ(lines, 4);  // header and three steps

  // A rewind to the last step leaves metrics.csv as it is (a recovery's, before its plan goes out);
  // one to step 1 forgets steps 2 and 3.
  auto rows = [&] {
    std::ifstream in(dir / "metrics.csv");
    int n = 0;
    for (std::string l; std::getline(in, l);) ++n;
    return n - 1;
  };
  const auto written = fs::last_write_time(dir / "metrics.csv");
  ASSERT_TRUE(log.Rewind(3).ok());
  EXPECT_EQ(fs::last_write_time(dir / "metrics.csv"), written) << "rewritten with nothing to forget";
  EXPECT_EQ(rows(), 3);
  ASSERT_TRUE(log.Rewind(1).ok());
  EXPECT_EQ(rows(), 1);
  EXPECT_EQ(log.Summary("completed", "", 1)["last_step"], 1);
}

}  // namespace
}  // namespace longhaul
