// The coordinator's metrics: what a 2 x 2 job's reports turn into, in Prometheus's text format, its
// replicas running 4 micro-batches and 3.
#include "coordinator/job_metrics.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

#include "scenario/scenario.h"
#include "tests/support/prometheus_parse.h"

namespace longhaul {
namespace {

proto::IterationReport Report(int worker, int stage, int replica, double seconds, double loss) {
  proto::IterationReport r;
  r.set_worker_id(worker);
  r.set_stage(stage);
  r.set_replica(replica);
  r.set_seconds(seconds);
  r.set_compute_seconds(seconds / 2);
  r.set_wait_seconds(seconds / 4);
  r.set_loss(loss);
  r.set_refused(worker);
  for (int m = 0; m < (replica == 0 ? 4 : 3); ++m) r.add_micro_batches(4 * replica + m);
  return r;
}

TEST(JobMetrics, ReportsBecomeWorkerJobAndLinkFigures) {
  auto cfg = ParseJobConfig("", "job.toml", {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=4",
                                             "cluster.replica_micro_batches=[4,3]", "train.seq_len=64",
                                             "train.micro_batch_size=2"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  JobMetrics m(*cfg);
  proto::Plan plan;
  plan.set_stages(2);
  plan.set_replicas(2);
  std::map<int, proto::RegisterRequest> regs;
  for (int w = 0; w < 4; ++w) {
    proto::Assignment* a = plan.add_assignments();
    a->set_worker_id(w);
    a->set_stage(w % 2);
    a->set_replica(w / 2);
    regs[w].set_host(w < 2 ? "east" : "west");
  }
  m.SetPlan(plan, regs);
  m.SetLinks(NetworkCost::Uniform({0.005, 1e8, 0}), "a test's");
  std::map<int, proto::IterationReport> reports;
  for (int w = 0; w < 4; ++w) {
    proto::IterationReport r = Report(w, w % 2, w / 2, 0.5, w % 2 == 1 ? 2.0 + w : 0);
    proto::LinkBytes* l = r.add_sent();
    l->set_stage(1 - w % 2);
    l->set_replica(w / 2);
    l->set_bytes(1000 * (w + 1));
    ASSERT_TRUE(m.Report(r).ok());
    reports[w] = r;
  }
  m.Complete(6, reports);
  ASSERT_TRUE(m.Report(reports[0]).ok());  // a second iteration's bytes add up
  m.WorkerLost();

  const std::string text = m.Render(7);
  auto s = testing::ParsePrometheusText(text);
  ASSERT_TRUE(s.ok()) << s.status() << "\n" << text;
  EXPECT_EQ(s->at("longhaul_step"), 7);
  EXPECT_EQ(s->at("longhaul_loss"), (4 * 3.0 + 3 * 5.0) / 7);  // the last stage's replicas, by their shares
  EXPECT_EQ(s->at("longhaul_tokens_per_second"), 7 * 64 * 2 / 0.5);
  EXPECT_EQ(s->at(R"(longhaul_worker_wait_seconds{worker="3",stage="1",replica="1",host="west"})"), 0.125);
  EXPECT_EQ(s->at(R"(longhaul_worker_tokens_per_second{worker="2",stage="0",replica="1",host="west"})"),
            3 * 64 * 2 / 0.5);
  EXPECT_EQ(s->at(R"(longhaul_worker_refused_tensor_total{worker="3",stage="1",replica="1",host="west"})"), 3);
  EXPECT_EQ(s->at(R"(longhaul_link_sent_bytes_total{from="0",to="1"})"), 2000);
  EXPECT_EQ(s->at(R"(longhaul_link_sent_bytes_total{from="3",to="2"})"), 4000);
  EXPECT_EQ(s->at(R"(longhaul_link_round_trip_seconds{from="2",to="1"})"), 0.01);
  EXPECT_EQ(s->at("longhaul_refused_calls_total"), 7);
  EXPECT_EQ(s->at("longhaul_workers_lost_total"), 1);
  EXPECT_EQ(s->at("longhaul_job_failed"), 0);
  m.Failed();
  EXPECT_EQ(testing::ParsePrometheusText(m.Render(7))->at("longhaul_job_failed"), 1);
}

// Bytes "sent" to a worker the plan does not have are refused whole: nothing of the report counts.
TEST(JobMetrics, AReportNamingAPeerOutsideThePlanIsRefused) {
  auto cfg = ParseJobConfig("", "job.toml", {"cluster.stages=2"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  JobMetrics m(*cfg);
  proto::Plan plan;
  for (int w = 0; w < 2; ++w) {
    proto::Assignment* a = plan.add_assignments();
    a->set_worker_id(w);
    a->set_stage(w);
  }
  m.SetPlan(plan, {});
  proto::IterationReport r = Report(0, 0, 0, 1, 0);
  r.add_sent()->set_stage(1);
  proto::LinkBytes* bad = r.add_sent();
  bad->set_stage(5);
  bad->set_bytes(1u << 30);
  const absl::Status st = m.Report(r);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("stage 5 replica 0"), std::string::npos) << st;
  auto s = testing::ParsePrometheusText(m.Render(0));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->count(R"(longhaul_worker_iteration_seconds{worker="0",stage="0",replica="0",host=""})"), 0u);
  EXPECT_EQ(s->count(R"(longhaul_link_sent_bytes_total{from="0",to="1"})"), 0u);
}

// A pipeline cut anew (3 stages in the config, 2 in the plan): the plan's last stage has the loss.
TEST(JobMetrics, TheLossIsThePlansLastStagesAfterARecut) {
  auto cfg = ParseJobConfig("", "job.toml", {"model.n_layer=4", "cluster.stages=3"});
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  JobMetrics m(*cfg);
  proto::Plan plan;
  plan.set_stages(2);
  plan.set_replicas(1);
  std::map<int, proto::IterationReport> reports;
  for (int w = 0; w < 2; ++w) {
    proto::Assignment* a = plan.add_assignments();
    a->set_worker_id(w);
    a->set_stage(w);
    reports[w] = Report(w, w, 0, 0.5, w == 1 ? 2.5 : 0);
  }
  m.SetPlan(plan, {});
  m.Complete(0, reports);
  EXPECT_EQ(testing::ParsePrometheusText(m.Render(0))->at("longhaul_loss"), 2.5);
}

}  // namespace
}  // namespace longhaul
