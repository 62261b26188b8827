// Memory checks of `train`, a worker and `longhaul local`: a job that does not fit is refused with
// the figures and the fix before anything is allocated.
#include "worker/job_setup.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

#include "model/param_layout.h"

namespace longhaul {
namespace {

JobConfig Config(const std::vector<std::string>& overrides) {
  auto c = ParseJobConfig("[model]\nn_layer = 4\nd_model = 64\nn_head = 4\n", "job.toml", overrides);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

const MemoryLimit kOneGiB{1.0 * (1 << 30), "a test's limit"};

TEST(MemoryCheck, AModelTooBigForMemoryIsRefusedWithTheFigureAndTheFix) {
  const JobConfig big = Config({"model.d_model=16384"});
  absl::Status s = CheckTrainerMemory(big, kOneGiB);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  const std::string m(s.message());
  EXPECT_NE(m.find("this model needs about "), std::string::npos) << m;
  EXPECT_NE(m.find("parameters 48.1 GiB"), std::string::npos) << m;  // 4 x 12 x 16384^2 floats and a few more
  EXPECT_NE(m.find("but 1.0 GiB is available (a test's limit)"), std::string::npos) << m;
  EXPECT_NE(m.find("lower train.micro_batch_size or train.seq_len, set train.recompute = true"), std::string::npos) << m;
  EXPECT_TRUE(CheckTrainerMemory(Config({}), kOneGiB).ok());
}

TEST(MemoryCheck, RecomputeShrinksActivations) {
  const JobConfig plain = Config({"train.seq_len=256", "model.max_seq_len=256"});
  const JobConfig recompute = Config({"train.seq_len=256", "model.max_seq_len=256", "train.recompute=true"});
  EXPECT_LT(TrainerMemory(recompute, 1).bytes("activations"), 0.2 * TrainerMemory(plain, 1).bytes("activations"));
}

TEST(MemoryCheck, WorkerCountsItsScheduleSlotsAndItsShard) {
  const JobConfig gpipe = Config({"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=4"});
  const JobConfig one_f_one_b = Config({"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=4",
                                        "cluster.schedule=1f1b"});
  // Stage 0 holds 4 micro-batches under GPipe, 2 under 1F1B.
  EXPECT_NEAR(WorkerMemory(gpipe, 0, 0, 1).bytes("activations"),
              2 * WorkerMemory(one_f_one_b, 0, 0, 1).bytes("activations"), 1);
  const double stage_floats = StageParamCount(gpipe.model, gpipe.Stage(0));
  EXPECT_EQ(HostedPsFloats(gpipe, 0, 0) + HostedPsFloats(gpipe, 0, 1), stage_floats);
  EXPECT_EQ(WorkerMemory(gpipe, 0, HostedPsFloats(gpipe, 0, 1), 1).bytes("parameter-server shards"),
            17 * HostedPsFloats(gpipe, 0, 1));
  // A shrunk layout's replica of two groups: twice the micro-batches, and the first group's
  // gradients kept while the second's backwards run.
  EXPECT_NEAR(WorkerMemory(gpipe, 0, 0, 1, -1, 2).bytes("activations"),
              2 * WorkerMemory(gpipe, 0, 0, 1).bytes("activations"), 1);
  EXPECT_EQ(WorkerMemory(gpipe, 0, 0, 1, -1, 2).bytes("gradients of earlier groups"), 4 * stage_floats);
  EXPECT_EQ(WorkerMemory(gpipe, 0, 0, 1).bytes("gradients of earlier groups"), 0);
  const JobConfig central = Config({"cluster.stages=2", "cluster.replicas=2", "cluster.ps=central"});
  EXPECT_EQ(HostedPsFloats(central, 1, 0), StageParamCount(central.model, central.Stage(1)));
  EXPECT_EQ(HostedPsFloats(central, 1, 1), 0);
  // A plan that moved stage 0's shard 1 to replica 0: replica 0 counts both, replica 1 none.
  proto::Plan moved;
  for (int k = 0; k < 2; ++k) {
    proto::ShardPlacement* sp = moved.add_shards();
    sp->set_stage(0);
    sp->set_shard(k);
    sp->set_owner_replica(0);
  }
  EXPECT_EQ(HostedPsFloats(gpipe, 0, 0, &moved), stage_floats);
  EXPECT_EQ(HostedPsFloats(gpipe, 0, 1, &moved), 0);
  absl::Status s =
      CheckWorkerMemory(Config({"model.d_model=8192", "cluster.stages=2"}), nullptr, 1, 0, 1, -1, kOneGiB);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("stage 1 replica 0 needs about"), std::string::npos) << s;
  EXPECT_NE(s.message().find("more cluster.stages"), std::string::npos) << s;
}

// `local` sums every worker (whatever the shard cuts) and the coordinator.
TEST(MemoryCheck, LocalClusterIsTheSumOfItsWorkers) {
  const JobConfig cfg = Config({"cluster.stages=2", "cluster.replicas=3", "train.micro_batches=2"});
  double sum = 128.0 * (1 << 20);  // the coordinator
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < 3; ++r) sum += WorkerMemory(cfg, s, HostedPsFloats(cfg, s, r), 1).total();
  EXPECT_NEAR(LocalClusterMemory(cfg, 1).total(), sum, 1e-6 * sum);
  absl::Status st = CheckLocalClusterMemory(Config({"model.d_model=4096", "cluster.stages=2"}), kOneGiB);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("`longhaul local` with 2 workers on this machine needs about"), std::string::npos) << st;
}

}  // namespace
}  // namespace longhaul
