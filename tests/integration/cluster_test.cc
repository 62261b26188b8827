// Multi-worker runs as real processes (`longhaul local`: coordinator + workers talking gRPC over
// loopback) against the single-process trainer on the same samples.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "checkpoint/safetensors.h"
#include "metrics/metrics_log.h"
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

// Starts longhaul with the given subcommand, overrides and further arguments, its output in
// out/log.txt, in a process group of its own as a shell starts a job; returns its pid.
pid_t Start(const std::string& sub, const fs::path& out, const std::vector<std::string>& sets,
            const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {LONGHAUL_BINARY, sub, "-c", ConfigFile(), "--set", "train.out_dir=" + out.string()};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = (out / "log.txt").string();
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &files, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&files);
  EXPECT_EQ(rc, 0) << "cannot start " << LONGHAUL_BINARY << ": " << std::strerror(rc);
  return rc == 0 ? pid : -1;
}

// The wait status of `pid` once it exits, or -1 if it still runs after `limit`.
int WaitFor(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// Runs longhaul to its end; returns the wait status (0: exit status 0).
int Longhaul(const std::string& sub, const fs::path& out, const std::vector<std::string>& sets,
             const std::vector<std::string>& extra = {}) {
  const pid_t pid = Start(sub, out, sets, extra);
  int status = -1;
  if (pid > 0) waitpid(pid, &status, 0);
  return status;
}

std::string Log(const fs::path& out) {
  std::ifstream f(out / "log.txt");
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<MetricsRow> Metrics(const fs::path& out) {
  auto rows = ReadMetrics((out / "metrics.csv").string());
  EXPECT_TRUE(rows.ok()) << rows.status();
  return rows.ok() ? *rows : std::vector<MetricsRow>{};
}

std::vector<double> Losses(const fs::path& out) {
  std::vector<double> losses;
  for (const MetricsRow& r : Metrics(out)) losses.push_back(r.loss);
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
  ASSERT_EQ(Longhaul("local", split, layout, {"--stop-at", "3"}), 0) << Log(split);
  const std::vector<MetricsRow> first = Metrics(split);
  ASSERT_EQ(first.size(), 3u);
  std::vector<std::string> resume = layout;
  resume.push_back("train.resume=true");
  ASSERT_EQ(Longhaul("local", split, resume), 0) << Log(split);
  EXPECT_NE(Log(split).find("resuming at step 3"), std::string::npos) << Log(split);
  // metrics.csv holds the whole run: the first run's 3 rows as it wrote them, then the resumed run's.
  const std::vector<MetricsRow> a = Metrics(full), b = Metrics(split);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], first[i]) << "step " << i + 1;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(b[i].step, static_cast<int64_t>(i + 1));
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
  }
  EXPECT_EQ(Params(full), Params(split));
}

TEST(Cluster, InterruptedRunWritesEveryRecord) {
  const fs::path out = Dir("interrupted");
  const pid_t launcher = Start(
      "local", out, {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.steps=100000"});
  ASSERT_GT(launcher, 0);
  struct Reaper {  // whatever fails below, nothing keeps running
    pid_t pid;
    ~Reaper() {
      if (pid > 0 && kill(-pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
    }
  } reaper{launcher};
  size_t reported = 0;
  for (int i = 0; i < 600 && reported < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto rows = ReadMetrics((out / "metrics.csv").string());
    reported = rows.ok() ? rows->size() : 0;
  }
  ASSERT_GE(reported, 5u) << Log(out);

  // What a terminal's Ctrl-C does: SIGINT to the whole foreground process group.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(-launcher, SIGINT), 0);
  const int status = WaitFor(launcher, std::chrono::seconds(60));
  ASSERT_NE(status, -1) << "still running 60 s after Ctrl-C\n" << Log(out);
  reaper.pid = 0;
  std::cout << "Ctrl-C to exit: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s\n";
  const std::string log = Log(out);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << "status " << status << "\n" << log;

  // Every iteration the coordinator printed is in metrics.csv, in order.
  int64_t last_printed = 0;
  const std::regex progress(R"(iter +(\d+)/)");
  for (auto m = std::sregex_iterator(log.begin(), log.end(), progress); m != std::sregex_iterator(); ++m) {
    last_printed = std::max<int64_t>(last_printed, std::stoll((*m)[1]));
  }
  const std::vector<MetricsRow> rows = Metrics(out);
  ASSERT_GE(last_printed, 5) << log;
  ASSERT_GE(static_cast<int64_t>(rows.size()), last_printed) << log;
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].step, static_cast<int64_t>(i + 1));
  EXPECT_TRUE(fs::exists(out / "loss.svg")) << log;

  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << log;
  EXPECT_EQ(summary["status"], "interrupted") << summary.dump(2);
  EXPECT_EQ(summary["last_step"], rows.back().step) << summary.dump(2);
  EXPECT_NEAR(summary["final_loss"].get<double>(), rows.back().loss, 1e-6) << summary.dump(2);
  EXPECT_EQ(summary["workers"].size(), 4u) << summary.dump(2);

  std::ifstream tf(out / "timeline.json");
  const nlohmann::json timeline = nlohmann::json::parse(tf, nullptr, false);
  ASSERT_FALSE(timeline.is_discarded()) << log;
  std::set<int> workers;
  for (const nlohmann::json& e : timeline["traceEvents"])
    if (e["ph"] == "X") workers.insert(e["pid"].get<int>());
  EXPECT_EQ(workers, (std::set<int>{0, 1, 2, 3})) << "the merged timeline has events of every worker\n" << log;
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
