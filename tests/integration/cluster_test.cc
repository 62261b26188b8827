// Multi-worker runs as real processes (`longhaul local`: coordinator + workers talking gRPC over
// loopback) against the single-process trainer on the same samples.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/safetensors.h"
#include "tests/support/garbage_socket.h"
#include "transport/tensor_transport.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

constexpr char kConfig[] = R"(
[model]
n_layer = 4
d_model = 32
n_head = 2
max_seq_len = 16
[data]
alphabet = 12
train_tokens = 100000
val_tokens = 1000
[train]
steps = 6
seq_len = 16
micro_batch_size = 2
lr = 3e-3
warmup_steps = 2
log_every = 1
eval_every = 0
threads = 1
[cluster]
job_id = "equivalence"
)";

fs::path Dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("cluster_" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string ConfigFile() {
  static const std::string path = [] {
    fs::path p = Dir("config") / "job.toml";
    std::ofstream(p) << kConfig;
    return p.string();
  }();
  return path;
}

// Runs longhaul with the given subcommand and overrides; returns the exit status.
int Longhaul(const std::string& sub, const fs::path& out, const std::vector<std::string>& sets,
             const std::string& extra = "") {
  std::string cmd = std::string(LONGHAUL_BINARY) + " " + sub + " -c " + ConfigFile() + " --set train.out_dir=" +
                    out.string();
  for (const std::string& s : sets) cmd += " --set " + s;
  cmd += " " + extra + " > " + (out / "log.txt").string() + " 2>&1";
  return std::system(cmd.c_str());
}

std::string Log(const fs::path& out) {
  std::ifstream f(out / "log.txt");
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<double> Losses(const fs::path& out) {
  std::ifstream f(out / "metrics.csv");
  std::string line;
  std::getline(f, line);
  std::vector<double> losses;
  while (std::getline(f, line)) losses.push_back(std::stod(line.substr(line.find(',') + 1)));
  return losses;
}

// Every model.safetensors of the latest checkpoint (one for `train`, one per PS shard for a
// cluster), merged by tensor name.
std::map<std::string, std::vector<float>> Params(const fs::path& out) {
  std::map<std::string, std::vector<float>> params;
  std::string step;
  std::ifstream(out / "checkpoints" / "latest") >> step;
  for (auto& e : fs::recursive_directory_iterator(out / "checkpoints")) {
    if (e.path().filename() != "model.safetensors" || e.path().parent_path().filename() != step) continue;
    auto st = ReadSafetensors(e.path().string());
    EXPECT_TRUE(st.ok()) << st.status();
    for (auto& [name, t] : st->tensors) params[name] = t.data;
  }
  return params;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
};

// One process, 4 micro-batches per step: the run every layout below must reproduce.
const Reference& SingleProcess() {
  static const Reference ref = [] {
    const fs::path out = Dir("reference");
    EXPECT_EQ(Longhaul("train", out, {"train.micro_batches=4"}), 0) << Log(out);
    return Reference{Losses(out), Params(out)};
  }();
  return ref;
}

struct Layout {
  const char* name;
  std::vector<std::string> sets;
};

class Equivalence : public ::testing::TestWithParam<Layout> {};

TEST_P(Equivalence, SameLossesAndParametersAsOneProcess) {
  const Reference& ref = SingleProcess();
  ASSERT_EQ(ref.losses.size(), 6u);
  const fs::path out = Dir(GetParam().name);
  ASSERT_EQ(Longhaul("local", out, GetParam().sets), 0) << Log(out);
  const std::vector<double> losses = Losses(out);
  ASSERT_EQ(losses.size(), ref.losses.size()) << Log(out);
  // Replicas average gradients in a different summation order than one process's accumulation:
  // equal up to fp32 rounding. Losses are printed with 6 decimals.
  double max_loss_diff = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], ref.losses[i], 2e-5) << "iteration " << i + 1;
    max_loss_diff = std::max(max_loss_diff, std::abs(losses[i] - ref.losses[i]));
  }
  const auto params = Params(out);
  ASSERT_EQ(params.size(), ref.params.size());
  double num = 0, den = 0;
  for (auto& [name, want] : ref.params) {
    ASSERT_TRUE(params.count(name)) << name;
    const std::vector<float>& got = params.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  }
  // Relative L2 distance of all parameters after 6 AdamW steps.
  EXPECT_LT(std::sqrt(num / den), 1e-5) << GetParam().name;
  std::cout << GetParam().name << ": max |loss - reference| = " << max_loss_diff
            << ", relative L2 distance of parameters = " << std::sqrt(num / den) << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Equivalence,
    ::testing::Values(
        Layout{"1x1", {"cluster.stages=1", "cluster.replicas=1", "train.micro_batches=4"}},
        Layout{"2x1_gpipe", {"cluster.stages=2", "cluster.replicas=1", "train.micro_batches=4"}},
        Layout{"1x2", {"cluster.stages=1", "cluster.replicas=2", "train.micro_batches=2"}},
        Layout{"2x2_1f1b", {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "cluster.schedule=1f1b"}},
        Layout{"3x1_uneven_1f1b",
               {"cluster.stages=3", "cluster.replicas=1", "train.micro_batches=4", "cluster.stage_layers=[2,1,1]",
                "cluster.schedule=1f1b"}},
        Layout{"2x2_central_ps", {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "cluster.ps=central"}},
        // The head-only stage has 3 tensors for 4 replicas: one replica hosts no shard.
        Layout{"2x4_head_only_stage",
               {"cluster.stages=2", "cluster.replicas=4", "train.micro_batches=1", "cluster.stage_layers=[4,0]"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Cluster, StoppedAndResumedRunMatchesTheUninterruptedOneBitwise) {
  const std::vector<std::string> layout = {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2"};
  const fs::path full = Dir("resume_full"), split = Dir("resume_split");
  ASSERT_EQ(Longhaul("local", full, layout), 0) << Log(full);
  ASSERT_EQ(Longhaul("local", split, layout, "--stop-at 3"), 0) << Log(split);
  std::vector<std::string> resume = layout;
  resume.push_back("train.resume=true");
  fs::rename(split / "metrics.csv", split / "metrics_first.csv");
  ASSERT_EQ(Longhaul("local", split, resume), 0) << Log(split);
  EXPECT_NE(Log(split).find("resuming at step 3"), std::string::npos) << Log(split);
  const auto a = Losses(full), b = Losses(split);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[3 + i], b[i]) << "step " << 4 + i;
  EXPECT_EQ(Params(full), Params(split));
}

TEST(Cluster, ResumeWithAnotherReplicaCountIsRefusedAsALayoutChange) {
  const fs::path out = Dir("resume_layout");
  ASSERT_EQ(Longhaul("local", out, {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2"}, "--stop-at 2"),
            0)
      << Log(out);
  EXPECT_NE(Longhaul("local", out, {"cluster.stages=2", "cluster.replicas=1", "train.micro_batches=2",
                                    "train.resume=true"}),
            0);
  const std::string log = Log(out);
  EXPECT_NE(log.find("for another layout (cluster.replicas = 2, the config has 1): a layout change"), std::string::npos)
      << log;
  EXPECT_NE(log.find("--set cluster.replicas=2"), std::string::npos) << log;
  EXPECT_EQ(log.find("has no tensor"), std::string::npos) << log;
  EXPECT_EQ(log.find("registered"), std::string::npos) << "refused before any worker joined:\n" << log;
}

TEST(Cluster, StrangerAndGarbageAreRefusedWhileTheRunGoesOn) {
  const fs::path out = Dir("intruders");
  auto run = std::async(std::launch::async, [&] {
    return Longhaul("local", out, {"cluster.stages=2", "cluster.replicas=1", "train.micro_batches=4", "train.steps=60"});
  });
  nlohmann::json cluster;
  for (int i = 0; i < 300 && cluster.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(out / "cluster.json");
    cluster = nlohmann::json::parse(f, nullptr, false);
    if (cluster.is_discarded()) cluster = nullptr;
  }
  ASSERT_FALSE(cluster.is_null()) << Log(out);
  const std::string victim = cluster["workers"][1]["address"];

  // A peer of another job sends an activation: refused, naming both jobs.
  TransportOptions stranger;
  stranger.job_id = "intruder";
  stranger.timeout = std::chrono::milliseconds(10000);
  const std::vector<float> x(1000, 1.0f);
  proto::TensorHeader h;
  h.set_kind(proto::ACTIVATION);
  absl::Status s = TensorClient(victim, stranger).Send(h, x.data(), x.size())->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("'intruder'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'equivalence'"), std::string::npos) << s;

  // Bytes that are not HTTP/2: the worker closes that connection.
  const std::string other = cluster["workers"][0]["address"];
  EXPECT_TRUE(testing::GarbageConnectionIsClosed(other));

  ASSERT_EQ(run.get(), 0) << Log(out);
  EXPECT_EQ(Losses(out).size(), 60u) << "the run went on to the end";
}

}  // namespace
}  // namespace longhaul
