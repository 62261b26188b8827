#pragma once
// Test fixture: the coordinator's job (coordinator/job.h) without its gRPC layer, with helpers
// that speak for its workers as the service's handlers would (joining.h, reports.h), for the
// tests of the coordinator's rooms.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

#include "coordinator/job.h"
#include "coordinator/joining.h"
#include "coordinator/reports.h"
#include "layout/plan_layout.h"
#include "transport/identity.h"
#include "transport/tensor_transport.h"

namespace longhaul::testing {
namespace fs = std::filesystem;

// A job of 2 stages x 1 replica of 2 micro-batches, 4 steps with a checkpoint every 2, links not
// probed; the first two workers to register run it.
class CoordinatorJob : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("coordinator_job_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir / "checkpoints");  // as the coordinator's start-up makes it
    absl::StatusOr<JobConfig> cfg = ParseJobConfig(
        "[model]\nn_layer = 2\nd_model = 16\nn_head = 2\n[cluster]\njob_id = \"j\"\nstages = 2\nlink_probe = \"off\"\n"
        "heartbeat_s = 0.01\n[train]\nmicro_batches = 2\nsteps = 4\ncheckpoint_every = 2\neval_every = 0\n",
        "job.toml", {"train.out_dir=\"" + dir.string() + "\""});
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg_ = *cfg;
    Start(0, "");
  }
  // The job anew, from step `start` of checkpoint `resume_name` (empty: none).
  void Start(int64_t start, const std::string& resume_name) {
    job.reset();
    absl::StatusOr<MetricsLog> metrics = MetricsLog::Create((dir / "metrics.csv").string());
    absl::StatusOr<SampleAudit> samples = SampleAudit::Open((dir / "samples.csv").string(), 2, 0);
    ASSERT_TRUE(metrics.ok() && samples.ok());
    job = std::make_unique<Job>(JobStart{cfg_, start, resume_name, 0, *std::move(metrics), *std::move(samples),
                                         std::nullopt, "token", nullptr, std::nullopt});
  }
  void TearDown() override {
    job.reset();  // its state writer's last files first
    fs::remove_all(dir);
  }

  int Join() {
    proto::RegisterRequest req;
    req.set_job_id("j");
    req.set_protocol_version(kProtocolVersion);
    req.set_address("127.0.0.1:1");
    req.set_public_key(std::string(kPublicKeyBytes, 'k'));
    proto::RegisterReply reply;
    absl::MutexLock lock(&job->mu);
    EXPECT_TRUE(Register(*job, req, reply).ok());
    proto::ProfileReport profile;
    profile.set_worker_id(reply.worker_id());
    profile.mutable_compute()->set_block_forward_s(0.001);
    profile.mutable_compute()->set_block_backward_s(0.002);
    EXPECT_TRUE(TakeProfile(*job, profile).ok());
    return reply.worker_id();
  }
  proto::Plan Plan() {
    absl::MutexLock lock(&job->mu);
    return job->plans.current();
  }
  absl::Status ReportIteration(int worker, int64_t it) {
    absl::MutexLock lock(&job->mu);
    const proto::Assignment* a = AssignmentOf(job->plans.current(), worker);
    EXPECT_NE(a, nullptr);
    proto::IterationReport r;
    r.set_worker_id(worker);
    r.set_iteration(it);
    r.set_plan_version(job->plans.version());
    r.set_stage(a->stage());
    r.set_replica(a->replica());
    r.set_seconds(0.01);
    r.set_loss(2.5);
    r.add_micro_batches(0);
    r.add_micro_batches(1);
    return TakeIterationReport(*job, r);
  }
  absl::Status ReportCheckpoint(int worker, int64_t step) {
    absl::MutexLock lock(&job->mu);
    const proto::Assignment* a = AssignmentOf(job->plans.current(), worker);
    proto::CheckpointReport r;
    r.set_worker_id(worker);
    r.set_plan_version(job->plans.version());
    r.set_step(step);
    r.set_stage(a->stage());
    r.set_shard(0);
    return TakeCheckpointReport(*job, r);
  }
  // Both placed workers report iterations [from, to) and the checkpoints due on the way.
  void Run(int64_t from, int64_t to) {
    const proto::Plan plan = Plan();
    for (int64_t it = from; it < to; ++it) {
      for (const proto::Assignment& a : plan.assignments()) ASSERT_EQ(ReportIteration(a.worker_id(), it), absl::OkStatus());
      if ((it + 1) % 2 == 0) {
        for (const proto::Assignment& a : plan.assignments()) ASSERT_TRUE(ReportCheckpoint(a.worker_id(), it + 1).ok());
      }
    }
  }

  fs::path dir;
  JobConfig cfg_;
  std::unique_ptr<Job> job;
};

}  // namespace longhaul::testing
