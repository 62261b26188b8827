// The memory estimate against what a stage really allocates, and the memory available read from
// /proc/meminfo and cgroup files.
#include "model/memory_estimate.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <omp.h>

#include <filesystem>
#include <fstream>

#include "cpu/gpt_stage.h"
#include "model/param_layout.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

double HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd);  // in use from the arenas, and mmap-ed blocks
}

struct Case {
  const char* name;
  ModelConfig model;
  StageSpec spec;
  int B, T;
  bool recompute;
  int slots;
};

ModelConfig Model(int V, int C, int NH, int L, bool tied) {
  ModelConfig m;
  m.vocab_size = V, m.max_seq_len = 256, m.d_model = C, m.n_head = NH, m.n_layer = L, m.tied_head = tied;
  return m;
}

// A stage is built and given its activation slots; the heap grows by what the estimate says,
// within 0.5% (the allocator rounds each block up and keeps a header per allocation; the layout's
// tensor names are not counted). Measured: within 0.13% for each case.
TEST(MemoryEstimate, MatchesWhatAGptStageAllocates) {
  const ModelConfig a = Model(256, 128, 4, 4, false), b = Model(1024, 96, 3, 6, true);
  const std::vector<Case> cases = {
      {"whole model", a, StageSpec::Whole(a), 4, 64, false, 1},
      {"whole model, recompute, tied head", b, StageSpec::Whole(b), 2, 128, true, 1},
      {"first stage of 3, 4 slots", a, StageSpec::Even(a, 0, 3), 2, 64, false, 4},
      {"middle stage, recompute, 2 slots", b, StageSpec::Even(b, 1, 3), 3, 32, true, 2},
      {"last stage, 3 slots", a, StageSpec::Even(a, 2, 3), 8, 32, false, 3},
  };
  // The first stage of a process also sets up process-wide state (OpenMP, allocator arenas).
  ASSERT_TRUE(GptStage::Create(a, StageSpec::Whole(a), 1, 8, false).ok());
  for (const Case& c : cases) {
    StageMemoryRequest req;
    req.model = c.model, req.spec = c.spec, req.B = c.B, req.T = c.T, req.recompute = c.recompute;
    req.activation_slots = c.slots;
    req.threads = omp_get_max_threads();
    const MemoryEstimate e = EstimateStage(req);
    EXPECT_EQ(e.bytes("parameters"), 4.0 * ParamLayout(c.model, c.spec).total()) << c.name;

    const double before = HeapBytes();
    double measured = 0;
    {
      auto stage = GptStage::Create(c.model, c.spec, c.B, c.T, c.recompute);
      ASSERT_TRUE(stage.ok()) << stage.status();
      std::vector<GptStage::ActivationsPtr> acts;
      for (int i = 0; i < c.slots; ++i) acts.push_back((*stage)->NewActivations());
      measured = HeapBytes() - before;
    }
    std::cout << c.name << ": estimate " << e.total() << " bytes, allocated " << measured << " bytes ("
              << (e.total() / measured - 1) * 100 << "%)\n";
    EXPECT_NEAR(e.total(), measured, 0.005 * measured) << c.name;
  }
}

TEST(MemoryEstimate, ParameterCountMatchesTheLayout) {
  for (const ModelConfig& m : {Model(256, 64, 4, 3, false), Model(50257, 768, 12, 12, true)}) {
    for (const StageSpec& s : {StageSpec::Whole(m), StageSpec::Even(m, 0, 2), StageSpec::Even(m, 1, 2)}) {
      EXPECT_EQ(StageParamCount(m, s), static_cast<double>(ParamLayout(m, s).total()));
    }
  }
}

// Sizes past 2^63 bytes still give a figure, not an overflow.
TEST(MemoryEstimate, HugeShapesGiveAFigure) {
  StageMemoryRequest req;
  req.model = Model(256, 1 << 30, 1, 1 << 20, false);
  req.spec = StageSpec::Whole(req.model);
  const MemoryEstimate e = EstimateStage(req);
  EXPECT_GT(e.total(), 1e25);
  EXPECT_NE(e.ToString().find("EiB"), std::string::npos) << e.ToString();
}

TEST(MemoryEstimate, CudaCountsTheOptimizerOnTheDeviceAndHalvesActivationsInBf16) {
  StageMemoryRequest req;
  req.model = Model(256, 256, 4, 4, false);
  req.spec = StageSpec::Whole(req.model);
  req.B = 8, req.T = 256, req.backend = Backend::kCuda;
  const MemoryEstimate fp32 = EstimateStage(req);
  req.precision = Precision::kBf16;
  const MemoryEstimate bf16 = EstimateStage(req);
  const double P = StageParamCount(req.model, req.spec);
  EXPECT_EQ(fp32.bytes("AdamW moments"), 0) << "a worker's stage leaves the step to the parameter servers";
  req.optimizer = true;  // the one-process trainer's
  EXPECT_EQ(EstimateStage(req).bytes("AdamW moments"), 9 * P);
  EXPECT_EQ(bf16.bytes("parameters"), 6 * P);  // fp32 master weights and a bf16 copy
  EXPECT_LT(bf16.bytes("activations"), 0.6 * fp32.bytes("activations"));
}

// CudaStage allocates every slot's activations (GPipe holds all its micro-batches), and with
// recompute only each block's input per slot plus one block's worth to rebuild into.
TEST(MemoryEstimate, CudaCountsSlotsAndRecompute) {
  StageMemoryRequest req;
  req.model = Model(256, 256, 4, 4, false);
  req.spec = StageSpec::Whole(req.model);
  req.B = 8, req.T = 256, req.backend = Backend::kCuda;
  const MemoryEstimate one = EstimateStage(req);
  req.activation_slots = 4;
  const MemoryEstimate four = EstimateStage(req);
  EXPECT_DOUBLE_EQ(four.bytes("activations"), 4 * one.bytes("activations"));
  req.recompute = true;
  const MemoryEstimate recomputed = EstimateStage(req);
  EXPECT_LT(recomputed.bytes("activations"), 0.2 * four.bytes("activations"));
  EXPECT_GT(recomputed.bytes("backward scratch"), one.bytes("backward scratch"));
}

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

class Available : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("meminfo_" + std::to_string(::getpid()) + "_" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    Write(root_ / "proc/meminfo", "MemTotal:       24684084 kB\nMemFree:         1000 kB\nMemAvailable:   8388608 kB\n");
  }
  fs::path root_;
};

TEST_F(Available, MemAvailableWithoutACgroupLimit) {
  Write(root_ / "proc/self/cgroup", "4:memory:/job\n0::/\n");
  Write(root_ / "sys/fs/cgroup/memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  const MemoryLimit m = HostMemoryAvailable(root_.string());
  EXPECT_EQ(m.bytes, 8.0 * (1 << 30));
  EXPECT_EQ(m.source, "MemAvailable in /proc/meminfo");
}

TEST_F(Available, CgroupV1LimitOfAnAncestorLessItsUsage) {
  Write(root_ / "proc/self/cgroup", "9:pids:/\n4:cpu,memory:/a/b\n");
  Write(root_ / "sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "9223372036854771712\n");
  Write(root_ / "sys/fs/cgroup/memory/a/memory.limit_in_bytes", "3221225472\n");  // 3 GiB
  Write(root_ / "sys/fs/cgroup/memory/a/memory.usage_in_bytes", "1073741824\n");  // 1 GiB
  const MemoryLimit m = HostMemoryAvailable(root_.string());
  EXPECT_EQ(m.bytes, 2.0 * (1 << 30));
  EXPECT_NE(m.source.find("cgroup limit of 3.0 GiB"), std::string::npos) << m.source;
  EXPECT_NE(m.source.find("1.0 GiB in use"), std::string::npos) << m.source;
}

TEST_F(Available, CgroupV2Limit) {
  Write(root_ / "proc/self/cgroup", "0::/user.slice/job\n");
  Write(root_ / "sys/fs/cgroup/user.slice/job/memory.max", "1073741824\n");
  Write(root_ / "sys/fs/cgroup/user.slice/job/memory.current", "268435456\n");
  Write(root_ / "sys/fs/cgroup/user.slice/memory.max", "max\n");
  EXPECT_EQ(HostMemoryAvailable(root_.string()).bytes, 768.0 * (1 << 20));
}

TEST(FormatBytes, PicksTheUnit) {
  EXPECT_EQ(FormatBytes(512), "512 bytes");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3.0 * (1 << 30)), "3.0 GiB");
}

}  // namespace
}  // namespace longhaul
