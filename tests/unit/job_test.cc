// The coordinator's job without its gRPC layer: workers join and the first plan places them; an
// iteration completes once every worker reported it; a checkpoint completes once every shard is
// in; a lost worker's place goes to a spare in a new version from the last checkpoint; a version
// that failed with every worker alive starts again; a placed worker's early "done" is refused and
// its failure stops the job; and the supervisor ends a finished job with its records written.
#include "coordinator/job.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "coordinator/joining.h"
#include "coordinator/recovery.h"
#include "coordinator/reports.h"
#include "coordinator/supervisor.h"
#include "layout/plan_layout.h"
#include "transport/identity.h"
#include "transport/tensor_transport.h"
#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A job of 2 stages x 1 replica of 2 micro-batches, 4 steps with a checkpoint every 2, links not
// probed; the first two workers to register run it.
class JobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("job_test_" + std::to_string(::getpid()) + "_" +
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
                                         std::nullopt, "token", nullptr});
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

TEST_F(JobTest, TheFirstPlanPlacesTheFirstWorkersOnceEachReportedItsProfile) {
  EXPECT_EQ(Join(), 0);
  EXPECT_EQ(Plan().version(), 0u);
  EXPECT_EQ(Join(), 1);
  const proto::Plan plan = Plan();
  ASSERT_EQ(plan.version(), 1u);
  EXPECT_EQ(WorkerAt(plan, 0, 0), 0);
  EXPECT_EQ(WorkerAt(plan, 1, 0), 1);
  EXPECT_EQ(Join(), 2);  // a spare
  absl::MutexLock lock(&job->mu);
  proto::PlanRequest req;
  req.set_worker_id(1);
  proto::Plan sent;
  ASSERT_TRUE(PlanFor(*job, req, sent).ok());
  EXPECT_EQ(sent.run_dir_token(), "token");
  EXPECT_EQ(job->Spares(), std::vector<int>{2});
  EXPECT_TRUE(fs::exists(JobStatePath(dir.string())));
}

TEST_F(JobTest, IterationsAndCheckpointsCompleteOnceEveryWorkerReported) {
  Join(), Join();
  ASSERT_TRUE(ReportIteration(0, 0).ok());
  {
    absl::MutexLock lock(&job->mu);
    EXPECT_EQ(job->progress.completed_through(), -1);
  }
  EXPECT_EQ(ReportIteration(0, 0).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(ReportIteration(1, 0).ok());
  ASSERT_TRUE(ReportIteration(0, 1).ok());
  ASSERT_TRUE(ReportIteration(1, 1).ok());
  ASSERT_EQ(ReportCheckpoint(0, 2), absl::OkStatus());
  {
    absl::MutexLock lock(&job->mu);
    EXPECT_EQ(job->progress.completed_through(), 1);
    EXPECT_EQ(job->checkpoints.latest_step(), 0);  // stage 1's shard is not in yet
  }
  ASSERT_EQ(ReportCheckpoint(1, 2), absl::OkStatus());
  EXPECT_EQ(ReportCheckpoint(1, 2).code(), absl::StatusCode::kInvalidArgument);  // already reported
  absl::MutexLock lock(&job->mu);
  EXPECT_EQ(job->checkpoints.latest_step(), 2);
  EXPECT_EQ(*ReadWholeFile((dir / "checkpoints" / "latest").string()), CheckpointName(2) + "\n");
}

TEST_F(JobTest, ALostWorkersPlaceGoesToASpareFromTheLastCheckpoint) {
  Join(), Join(), Join();
  Run(0, 2);
  ASSERT_TRUE(ReportIteration(0, 2).ok());  // iteration 3 under way
  absl::MutexLock lock(&job->mu);
  LoseWorker(*job, {.id = 1, .silent_s = 20});
  EXPECT_EQ(job->recovery.vacant.size(), 1u);
  FillVacancies(*job);
  const proto::Plan& plan = job->plans.current();
  EXPECT_EQ(plan.version(), 2u);
  EXPECT_EQ(WorkerAt(plan, 1, 0), 2);
  EXPECT_EQ(plan.start_iteration(), 2);
  EXPECT_EQ(job->progress.redone(), 1);
  EXPECT_TRUE(job->recovery.vacant.empty());
  ASSERT_EQ(job->recovery.events.size(), 1u);
  const nlohmann::json& event = job->recovery.events[0];
  EXPECT_EQ(event["worker"], 1);
  EXPECT_EQ(event["spare"], 2);
  EXPECT_EQ(event["new_plan_version"], 2);
  EXPECT_EQ(event["rollback_to_step"], 2);
  EXPECT_EQ(job->members.Check(1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobTest, AVersionThatFailedWithEveryWorkerAliveStartsAgain) {
  Join(), Join();
  {
    absl::MutexLock lock(&job->mu);
    proto::SuspectReport suspect;
    suspect.set_worker_id(1);
    suspect.set_plan_version(1);
    suspect.set_stage(0);
    suspect.set_failure("connection reset by peer");
    ASSERT_TRUE(TakeSuspect(*job, suspect).ok());
    ASSERT_TRUE(job->recovery.restart);
  }
  // Every worker is heard from a heartbeat period after the report: nobody died.
  std::this_thread::sleep_for(kRestartGrace + std::chrono::milliseconds(20));
  absl::MutexLock lock(&job->mu);
  for (int id : {0, 1}) {
    proto::HeartbeatRequest hb;
    hb.set_worker_id(id);
    proto::HeartbeatReply reply;
    ASSERT_TRUE(Heartbeat(*job, hb, reply).ok());
  }
  MaybeRestart(*job);
  EXPECT_EQ(job->plans.version(), 2u);
  EXPECT_EQ(WorkerAt(job->plans.current(), 1, 0), 1);
  EXPECT_FALSE(job->recovery.restart);
  EXPECT_EQ(job->recovery.events[0]["restart"], true);
  EXPECT_EQ(job->recovery.events[0]["reporter"], 1);
}

TEST_F(JobTest, APlacedWorkersEarlyDoneIsRefusedAndItsFailureStopsTheJob) {
  Join(), Join();
  absl::MutexLock lock(&job->mu);
  proto::DoneReport done;
  done.set_worker_id(0);
  done.set_ok(true);
  EXPECT_EQ(TakeDone(*job, done).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(job->abort.empty());
  done.set_ok(false);
  done.set_error("out of memory");
  ASSERT_TRUE(TakeDone(*job, done).ok());
  EXPECT_EQ(job->abort, "worker 0 failed: out of memory");
}

// A worker that failed to bring in the checkpoint its plan resumes from stops the job; once it
// ended, the stop reason names the last intact checkpoint, where the one resumed from is broken.
TEST_F(JobTest, AFailureInTheResumedCheckpointNamesTheLastIntactOne) {
  const std::string root = (dir / "checkpoints").string();
  const ParamLayout whole(cfg_.model, StageSpec::Whole(cfg_.model));
  const std::vector<float> params(whole.total(), 0.5f);
  for (int64_t step : {1, 2}) {
    ASSERT_TRUE(SaveCheckpoint(root, {step, EffectiveConfigJson(cfg_)}, whole, params.data(), nullptr, nullptr).ok());
  }
  fs::resize_file(dir / "checkpoints" / "step_00000002" / "model.safetensors", 10);
  Start(2, "step_00000002");
  Join(), Join();
  EXPECT_EQ(Plan().resume_checkpoint(), "step_00000002");
  {
    absl::MutexLock lock(&job->mu);
    proto::DoneReport done;
    done.set_worker_id(0);
    done.set_ok(false);
    done.set_error("model.safetensors is truncated");
    done.set_resumed_checkpoint("step_00000001");  // not the plan's: no name taken from it
    ASSERT_TRUE(TakeDone(*job, done).ok());
    EXPECT_TRUE(job->failed_checkpoint.empty());
    job->abort.clear();
    done.set_resumed_checkpoint("step_00000002");
    ASSERT_TRUE(TakeDone(*job, done).ok());
    EXPECT_EQ(job->failed_checkpoint, "step_00000002");
    done.set_worker_id(1);
    ASSERT_TRUE(TakeDone(*job, done).ok());
  }
  const absl::Status stopped = Supervise(*job);
  const std::string latest = (dir / "checkpoints" / "latest").string();
  EXPECT_EQ(stopped.message(), "worker 0 failed: model.safetensors is truncated; step_00000002 is broken, the last "
                               "intact checkpoint is step_00000001: write step_00000001 into " +
                                   latest + ", then resume with --set train.resume=true");
  std::ifstream summary(dir / "summary.json");
  EXPECT_EQ(nlohmann::json::parse(summary)["reason"].get<std::string>(), stopped.message());
}

TEST_F(JobTest, TheSupervisorEndsAFinishedJobWithItsRecords) {
  Join(), Join();
  Run(0, 4);
  {
    absl::MutexLock lock(&job->mu);
    EXPECT_TRUE(job->finished);
    for (int id : {0, 1}) {
      proto::DoneReport done;
      done.set_worker_id(id);
      done.set_ok(true);
      ASSERT_TRUE(TakeDone(*job, done).ok());
    }
  }
  ASSERT_TRUE(Supervise(*job).ok());
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
  EXPECT_FALSE(fs::exists(JobStatePath(dir.string())));  // a coordinator started here starts anew
}

}  // namespace
}  // namespace longhaul
