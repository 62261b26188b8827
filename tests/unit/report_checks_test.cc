// The checks a worker's report passes before the coordinator counts it, each refusal with its
// reason: a report of another plan version, of a worker the plan does not place, of an iteration
// outside the run or too far ahead, at another place, with parameter checksums out of turn, times
// no clock measures, micro-batches or validation batches the plan does not give; a checkpoint of a
// piece the worker does not write or at a step where none is due; a shipped part too large.
#include "coordinator/report_checks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"

#include "coordinator/planning.h"

namespace longhaul {
namespace {

JobConfig Config() {
  auto c = ParseJobConfig("[model]\nn_layer = 4\nd_model = 16\nn_head = 2\n[cluster]\nstages = 2\nreplicas = 2\n"
                          "[train]\nmicro_batches = 2\nsteps = 20\ncheckpoint_every = 5\n",
                          "job.toml");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::map<int, proto::RegisterRequest> Workers(int n) {
  std::map<int, proto::RegisterRequest> w;
  for (int i = 0; i < n; ++i) w[i].set_address("10.0.0." + std::to_string(i) + ":7000");
  return w;
}

// A 2 x 2 plan, version 1, iterations [0, 20), none complete; worker k runs stage k % 2 of
// replica k / 2.
class ReportChecks : public ::testing::Test {
 protected:
  RunView View(int64_t completed_through = -1) const { return RunView{plan, cfg, 0, 20, completed_through}; }
  proto::IterationReport Report(int worker, int64_t it) const {
    proto::IterationReport r;
    r.set_worker_id(worker);
    r.set_iteration(it);
    r.set_plan_version(1);
    r.set_stage(worker % 2);
    r.set_replica(worker / 2);
    r.set_seconds(0.1);
    r.set_compute_seconds(0.05);
    r.set_wait_seconds(0.01);
    r.add_micro_batches(2 * (worker / 2));
    r.add_micro_batches(2 * (worker / 2) + 1);
    return r;
  }
  static void ExpectRefused(const absl::Status& st, absl::StatusCode code, const std::string& says) {
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  }

  const JobConfig cfg = Config();
  const proto::Plan plan = MakePlan(cfg, Workers(4), {0, "", 20}, RegistrationOrder(cfg));
};

TEST_F(ReportChecks, AReportOfThePlansPlaceAndTurnPasses) {
  EXPECT_TRUE(CheckIterationReport(Report(3, 0), std::nullopt, View()).ok());
  proto::IterationReport r = Report(1, 5);
  r.add_params()->set_iteration(4);
  r.add_params()->set_iteration(5);
  EXPECT_TRUE(CheckIterationReport(r, 3, View(4)).ok());
}

TEST_F(ReportChecks, PlacementVersionAndRangeAreTheRunningPlans) {
  const proto::Plan none;
  ExpectRefused(CheckPlaced(0, 0, 0, RunView{none, cfg, 0, 20, -1}), absl::StatusCode::kFailedPrecondition,
                "no plan yet");
  ExpectRefused(CheckPlaced(0, 0, 2, View()), absl::StatusCode::kFailedPrecondition,
                "worker 0 reports under plan version 2; the plan is version 1");
  ExpectRefused(CheckPlaced(4, 0, 1, View()), absl::StatusCode::kFailedPrecondition,
                "worker 4 has no place in plan version 1");
  ExpectRefused(CheckPlaced(0, 20, 1, View()), absl::StatusCode::kOutOfRange, "outside this run's [0, 20)");
  ExpectRefused(CheckPlaced(0, -1, 1, View()), absl::StatusCode::kOutOfRange, "outside this run's");
  // No worker runs further ahead than its mailbox's window allows, with room for reports.
  int64_t far = 0;
  while (CheckPlaced(0, far, 1, View()).ok() && far < 20) ++far;
  ASSERT_LT(far, 20) << "the window covers the whole run: no iteration is too far ahead";
  ExpectRefused(CheckPlaced(0, far, 1, View()), absl::StatusCode::kOutOfRange, "past the last complete one, 0");
  EXPECT_TRUE(CheckPlaced(0, far, 1, View(0)).ok());
}

TEST_F(ReportChecks, AnIterationReportSaysItsPlaceAndHonestFigures) {
  proto::IterationReport r = Report(1, 0);
  r.set_replica(1);
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument,
                "worker 1 reports as stage 1 replica 1; the plan has it at stage 1 replica 0");
  r = Report(1, 0);
  r.set_wait_seconds(std::nan(""));
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument,
                "gives a time of nan s");
  r = Report(1, 0);
  r.set_seconds(-1);
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument,
                "gives a time of -1 s");
  r = Report(1, 0);
  r.set_step_seconds(1e300);  // what the planner would divide a step's bytes by
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument,
                "gives a time of 1e+300 s");
  r = Report(1, 0);
  r.add_micro_batches(4);  // the job has 2 replicas x 2 micro-batches
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument,
                "names 3 micro-batches outside its replica's [0, 2) or more than the 2 it runs");
  r = Report(1, 0);
  r.set_micro_batches(0, -1);
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument, "outside its replica's [0, 2)");
  r = Report(3, 0);
  r.set_micro_batches(0, 1);  // replica 0's: replica 1 runs global micro-batches 2 and 3
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument, "outside its replica's [2, 4)");
  r = Report(0, 0);
  r.set_val_batches(1);  // only the last stage evaluates, and only where train.eval_every says
  ExpectRefused(CheckIterationReport(r, std::nullopt, View()), absl::StatusCode::kInvalidArgument,
                "holds 1 validation micro-batches; the plan has 0 there for stage 0 replica 0");
}

TEST_F(ReportChecks, ParameterChecksumsComeOnceInStepOrder) {
  proto::IterationReport r = Report(0, 5);
  for (int i = 0; i < 3; ++i) r.add_params()->set_iteration(5);
  ExpectRefused(CheckIterationReport(r, std::nullopt, View(4)), absl::StatusCode::kInvalidArgument,
                "carries 3 parameter checksums");
  r = Report(0, 5);
  r.add_params()->set_iteration(3);
  ExpectRefused(CheckIterationReport(r, std::nullopt, View(4)), absl::StatusCode::kInvalidArgument,
                "carries the parameters of iteration 4; only this iteration's or the one before may come");
  r = Report(0, 5);
  r.add_params()->set_iteration(5);
  r.add_params()->set_iteration(5);
  ExpectRefused(CheckIterationReport(r, std::nullopt, View(4)), absl::StatusCode::kInvalidArgument,
                "carries the parameters of iteration 6");
  r = Report(0, 5);
  r.add_params()->set_iteration(4);
  ExpectRefused(CheckIterationReport(r, 4, View(4)), absl::StatusCode::kInvalidArgument,
                "worker 0 reports the parameters of iteration 5 again");
  ExpectRefused(CheckIterationReport(r, 5, View(4)), absl::StatusCode::kInvalidArgument,
                "after those of iteration 6");
}

TEST_F(ReportChecks, ACheckpointIsOfAPieceThePlanGivesAtAStepDue) {
  proto::CheckpointReport r;
  r.set_plan_version(1);
  r.set_step(5);
  r.set_stage(1);
  r.set_worker_id(3);  // stage 1 replica 1 hosts stage 1's shard 1
  r.set_shard(1);
  EXPECT_TRUE(CheckCheckpointReport(r, View(3)).ok());
  r.set_shard(0);
  ExpectRefused(CheckCheckpointReport(r, View(3)), absl::StatusCode::kInvalidArgument,
                "worker 3 reports a checkpoint of shard 0 of stage 1 at step 5, which the plan does not give it");
  r.set_shard(1);
  r.set_step(4);
  ExpectRefused(CheckCheckpointReport(r, View(3)), absl::StatusCode::kInvalidArgument,
                "where none is due (train.checkpoint_every = 5");
  r.set_step(5);
  r.set_residual_replica(2);  // residuals come only with int8 pushes, which this job has not
  ExpectRefused(CheckCheckpointReport(r, View(3)), absl::StatusCode::kInvalidArgument,
                "replica 1's error-feedback residuals of stage 1 at step 5, which the plan does not give it");
  EXPECT_EQ(ReportedPiece(r).kind, CheckpointPieceRoot::Kind::kResidual);
  EXPECT_EQ(ReportedPiece(r).index, 1);
}

TEST_F(ReportChecks, AShippedPartIsOfTheWorkersPieceAndNoLargerThanItsTensors) {
  proto::CheckpointChunk c;
  c.set_worker_id(0);
  c.set_plan_version(1);
  c.set_step(5);
  c.set_piece("stage_0_shard_0");
  c.set_file("model.safetensors");
  c.set_file_bytes(100);
  c.set_data(std::string(100, 'x'));
  const CheckpointPieceRoot mine{CheckpointPieceRoot::Kind::kShard, 0, 0};
  EXPECT_TRUE(CheckShippedPart(c, mine, View(3)).ok());
  ExpectRefused(CheckShippedPart(c, {CheckpointPieceRoot::Kind::kShard, 0, 1}, View(3)),
                absl::StatusCode::kInvalidArgument, "which plan version 1 does not give it");
  c.set_file_bytes(uint64_t{1} << 40);
  ExpectRefused(CheckShippedPart(c, mine, View(3)), absl::StatusCode::kResourceExhausted, "takes at most");
  c.set_file_bytes(100);
  c.set_offset(50);
  ExpectRefused(CheckShippedPart(c, mine, View(3)), absl::StatusCode::kInvalidArgument,
                "a part of 100 bytes at 50 of a 100-byte file");
  c.set_offset(0);
  c.set_file("../../etc/passwd");
  EXPECT_EQ(CheckShippedPart(c, mine, View(3)).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace longhaul
