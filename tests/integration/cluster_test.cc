// Multi-worker runs as real processes (`longhaul local`: coordinator + workers talking gRPC over
// loopback) against the single-process trainer on the same samples.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "longhaul.grpc.pb.h"
#include "metrics/metrics_log.h"
#include "tests/support/garbage_socket.h"
#include "tests/support/http2_flood.h"
#include "tests/support/http_get.h"
#include "tests/support/process_memory.h"
#include "tests/support/checkpoint_params.h"
#include "tests/support/processes.h"
#include "tests/support/recoveries.h"
#include "tests/support/shell.h"
#include "tests/support/prometheus_parse.h"
#include "tests/support/raw_tensor_peer.h"
#include "tests/support/tiny_model.h"
#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/identity.h"
#include "transport/rpc_auth.h"
#include "transport/socket_io.h"
#include "transport/tensor_transport.h"
#include "util/ports.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

constexpr char kJob[] = R"(
[train]
steps = 6
seq_len = 16
micro_batch_size = 2
lr = 3e-3
warmup_steps = 2
log_every = 1
eval_every = 3
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
    std::ofstream(p) << testing::kTinyModelToml << kJob;
    return p.string();
  }();
  return path;
}

using testing::Spawn;
using testing::WaitFor;

// Starts longhaul with the given subcommand, overrides and further arguments, its output in
// out/log.txt.
pid_t Start(const std::string& sub, const fs::path& out, const std::vector<std::string>& sets,
            const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {LONGHAUL_BINARY, sub, "-c", ConfigFile(), "--set", "train.out_dir=" + out.string()};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  args.insert(args.end(), extra.begin(), extra.end());
  return Spawn(args, out / "log.txt");
}

// The port a process writes to `file` once it listens, or 0 after 30 s.
int PortFrom(const fs::path& file) {
  int port = 0;
  for (int i = 0; i < 300 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream(file) >> port;
  }
  return port;
}

// Kills a launcher's process group when it goes out of scope, whatever failed before: nothing keeps
// running. A test that saw the launcher exit sets `pid` to 0.
struct Reaper {
  pid_t pid;
  ~Reaper() {
    if (pid > 0 && kill(-pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
  }
};

// Rows in the run's metrics.csv once it has `steps` of them, or fewer after a minute.
size_t WaitForSteps(const fs::path& out, size_t steps) {
  size_t reported = 0;
  for (int i = 0; i < 600 && reported < steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto rows = ReadMetrics((out / "metrics.csv").string());
    reported = rows.ok() ? rows->size() : 0;
  }
  return reported;
}

// Runs longhaul to its end; returns the wait status (0: exit status 0).
int Longhaul(const std::string& sub, const fs::path& out, const std::vector<std::string>& sets,
             const std::vector<std::string>& extra = {}) {
  const pid_t pid = Start(sub, out, sets, extra);
  int status = -1;
  if (pid > 0) waitpid(pid, &status, 0);
  return status;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string Log(const fs::path& out) { return ReadFile(out / "log.txt"); }

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

// The validation losses of metrics.csv (-1 where a step was not evaluated).
std::vector<double> ValLosses(const fs::path& out) {
  std::vector<double> losses;
  for (const MetricsRow& r : Metrics(out)) losses.push_back(r.val_loss);
  return losses;
}

struct Reference {
  std::vector<double> losses, val_losses;
  std::map<std::string, std::vector<float>> params;
};

// One process, 4 micro-batches per step: the run every layout below must reproduce.
const Reference& SingleProcess() {
  static const Reference ref = [] {
    const fs::path out = Dir("reference");
    EXPECT_EQ(Longhaul("train", out, {"train.micro_batches=4"}), 0) << Log(out);
    return Reference{Losses(out), ValLosses(out), testing::LatestParams(out)};
  }();
  return ref;
}

struct Layout {
  const char* name;
  std::vector<std::string> sets;
  // Pipeline-only layouts add up every gradient in the one process's order: bitwise equal. With
  // replicas, each replica sums its own micro-batches and the parameter server then sums the
  // replicas, ((g0 + g1) + (g2 + g3)) against one process's (((g0 + g1) + g2) + g3): equal up to
  // fp32 rounding.
  bool bitwise;
};

class Equivalence : public ::testing::TestWithParam<Layout> {};

TEST_P(Equivalence, SameLossesAndParametersAsOneProcess) {
  const Reference& ref = SingleProcess();
  ASSERT_EQ(ref.losses.size(), 6u);
  const fs::path out = Dir(GetParam().name);
  ASSERT_EQ(Longhaul("local", out, GetParam().sets), 0) << Log(out);
  const std::vector<double> losses = Losses(out), val_losses = ValLosses(out);
  ASSERT_EQ(losses.size(), ref.losses.size()) << Log(out);
  // Steps 3 and 6 are evaluated (train.eval_every = 3), on the same validation micro-batches
  // shared out over the replicas.
  ASSERT_EQ(ref.val_losses, (std::vector<double>{-1, -1, ref.val_losses[2], -1, -1, ref.val_losses[5]}));
  ASSERT_GT(ref.val_losses[2], 0);
  const auto params = testing::LatestParams(out);
  ASSERT_EQ(params.size(), ref.params.size());
  double max_loss_diff = 0, num = 0, den = 0;
  for (size_t i = 0; i < losses.size(); ++i) max_loss_diff = std::max(max_loss_diff, std::abs(losses[i] - ref.losses[i]));
  for (auto& [name, want] : ref.params) {
    ASSERT_TRUE(params.count(name)) << name;
    const std::vector<float>& got = params.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) num += (got[i] - want[i]) * (got[i] - want[i]), den += want[i] * want[i];
  }
  std::cout << GetParam().name << (GetParam().bitwise ? " (bitwise)" : "") << ": max |loss - reference| = "
            << max_loss_diff << ", relative L2 distance of parameters after 6 AdamW steps = " << std::sqrt(num / den)
            << "\n";
  if (GetParam().bitwise) {
    EXPECT_EQ(losses, ref.losses);  // as metrics.csv prints them
    EXPECT_EQ(val_losses, ref.val_losses);
    EXPECT_TRUE(params == ref.params) << "parameters differ from the one-process run's";
  } else {
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], ref.losses[i], 2e-5) << "iteration " << i + 1;
      EXPECT_NEAR(val_losses[i], ref.val_losses[i], 2e-5) << "validation after iteration " << i + 1;
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << GetParam().name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Equivalence,
    ::testing::Values(
        Layout{"1x1", {"cluster.stages=1", "cluster.replicas=1", "train.micro_batches=4"}, true},
        Layout{"2x1_gpipe", {"cluster.stages=2", "cluster.replicas=1", "train.micro_batches=4"}, true},
        Layout{"1x2", {"cluster.stages=1", "cluster.replicas=2", "train.micro_batches=2"}, false},
        Layout{"2x2_1f1b", {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "cluster.schedule=1f1b"},
               false},
        Layout{"3x1_uneven_1f1b",
               {"cluster.stages=3", "cluster.replicas=1", "train.micro_batches=4", "cluster.stage_layers=[2,1,1]",
                "cluster.schedule=1f1b"},
               true},
        Layout{"2x2_central_ps", {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "cluster.ps=central"},
               false},
        // Local updates with an outer step of rate 1 and no momentum set the parameters to what
        // one replica's own AdamW reached: the one process's run, up to the rounding of the change.
        Layout{"1x1_local_updates",
               {"cluster.stages=1", "cluster.replicas=1", "train.micro_batches=4", "train.local_steps=3",
                "train.outer_lr=1", "train.outer_momentum=0"},
               false},
        // Replicas sharing the batch unevenly, 3 micro-batches and 1: every micro-batch weighs
        // the same, so the step is the one process's over its 4.
        Layout{"2x2_uneven_replicas_1f1b",
               {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=3", "cluster.replica_micro_batches=[3,1]",
                "cluster.schedule=1f1b"},
               false},
        // The head-only stage has 3 tensors for 4 replicas: one replica hosts no shard.
        Layout{"2x4_head_only_stage",
               {"cluster.stages=2", "cluster.replicas=4", "train.micro_batches=1", "cluster.stage_layers=[4,0]"}, false}),
    [](const auto& info) { return std::string(info.param.name); });

// A subspace model's boundary carries half of each token's values over real TCP, and the second
// stage writes the other half from its fixed embedding: two stages train bitwise as one process.
TEST(Cluster, ASubspaceModelsNarrowBoundaryLosesNothing) {
  const std::vector<std::string> subspace = {"model.subspace_divisor=2", "train.micro_batches=4"};
  const fs::path one = Dir("subspace_one_process"), two = Dir("subspace_2x1");
  ASSERT_EQ(Longhaul("train", one, subspace), 0) << Log(one);
  std::vector<std::string> sets = subspace;
  sets.insert(sets.end(), {"cluster.stages=2", "cluster.replicas=1"});
  ASSERT_EQ(Longhaul("local", two, sets), 0) << Log(two);
  EXPECT_EQ(Losses(two), Losses(one));
  EXPECT_EQ(ValLosses(two), ValLosses(one));
  EXPECT_TRUE(testing::LatestParams(two) == testing::LatestParams(one)) << "parameters differ";
  EXPECT_NE(Losses(one), SingleProcess().losses) << "the constraint changes the model";
}

// A worker hands its own shard's parameters and its own gradient push to itself; they must be
// rounded as its peers receive them, or the replicas train different models. The coordinator
// compares every replica's parameter checksum after every iteration and stops the job on a
// difference; the losses stay near the fp32 run's.
class WireDtypes : public ::testing::TestWithParam<const char*> {};

TEST_P(WireDtypes, ReplicasHoldBitwiseTheSameParametersAfterEveryIteration) {
  const Reference& ref = SingleProcess();
  const std::string dtype = GetParam();
  const fs::path out = Dir("wire_" + dtype);
  // Checkpoints every 2 steps: the checks of iterations no rollback can reach are counted apart.
  ASSERT_EQ(Longhaul("local", out,
                     {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "transport.wire_dtype=" + dtype,
                      "train.checkpoint_every=2"}),
            0)
      << Log(out);
  std::ifstream f(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(out);
  EXPECT_EQ(summary["replica_checks"], 6) << "every iteration's replicas compared";
  const std::vector<double> losses = Losses(out);
  ASSERT_EQ(losses.size(), ref.losses.size());
  double worst = 0;
  for (size_t i = 0; i < losses.size(); ++i) worst = std::max(worst, std::abs(losses[i] - ref.losses[i]));
  std::cout << dtype << " wire: replicas equal after every iteration; max |loss - fp32 one-process loss| = " << worst
            << "\n";
  // Rounding boundary tensors and parameters to 8 (bf16) or 11 (fp16) significant bits, or to
  // 255 (int8) or 15 (int4) levels a block, over 6 steps moves the loss by less than this.
  EXPECT_LT(worst, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WireDtypes, ::testing::Values("fp32", "fp16", "bf16", "int8", "int4"));

// A run stopped at step 3 and resumed matches the uninterrupted run bitwise: synchronous, and with
// local updates, whose workers' own AdamW state the checkpoint carries beside the shards', in
// fp32, over int4, with replicas of unequal shares, and with a topk exchange over an int8 wire.
class Resume : public ::testing::TestWithParam<Layout> {};

TEST_P(Resume, StoppedAndResumedRunMatchesTheUninterruptedOneBitwise) {
  const std::vector<std::string>& layout = GetParam().sets;
  const fs::path full = Dir(std::string("resume_full_") + GetParam().name),
                 split = Dir(std::string("resume_split_") + GetParam().name);
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
  EXPECT_EQ(testing::LatestParams(full), testing::LatestParams(split));
}

INSTANTIATE_TEST_SUITE_P(
    Cluster, Resume,
    ::testing::Values(Layout{"synchronous", {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2"}, true},
                      Layout{"local_updates",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.local_steps=3"},
                             true},
                      // The shards send their parameters' change in int4; its residual is in the
                      // checkpoint with them.
                      Layout{"local_updates_int4",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.local_steps=3",
                              "transport.wire_dtype=\"int4\""},
                             true},
                      // Replicas of 3 micro-batches and 1, each stepping on its own.
                      Layout{"local_updates_uneven_replicas",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=3",
                              "cluster.replica_micro_batches=[3,1]", "train.local_steps=3"},
                             true},
                      // Pushes and the change in topk, the boundaries in int8.
                      Layout{"local_updates_topk",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.local_steps=3",
                              "transport.wire_dtype=\"int8\"", "transport.exchange_dtype=\"topk\""},
                             true},
                      // Pushes and the change as signs (int1h), the boundaries in int8.
                      Layout{"local_updates_int1h",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.local_steps=3",
                              "transport.wire_dtype=\"int8\"", "transport.exchange_dtype=\"int1h\""},
                             true},
                      // A subspace model: half of each token's values cross in int4 (gradients in
                      // int3h), the rest rebuilt from the fixed embedding, which the resumed
                      // stages draw again.
                      Layout{"subspace_int4",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2",
                              "model.subspace_divisor=2", "transport.wire_dtype=\"int4\"",
                              "transport.gradient_dtype=\"int3h\""},
                             true},
                      // Boundaries in shared directions (rank 8 of 32), rounded to int4 as the
                      // link sends them, drawn again alike by the resumed run.
                      Layout{"low_rank_shared_int4",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2",
                              "transport.boundary_rank_divisor=4", "transport.shared_directions=true",
                              "transport.wire_dtype=\"int4\""},
                             true},
                      // Boundaries as low-rank factors (activations rank 8 of 32 values a token,
                      // gradients rank 4), drawn again alike by the resumed run.
                      Layout{"low_rank",
                             {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2",
                              "transport.boundary_rank_divisor=4", "transport.gradient_rank_divisor=8"},
                             true}),
    [](const auto& info) { return std::string(info.param.name); });

// A checkpoint resumes under another cut of the model: a 2-stage pipeline stopped after step 2
// goes on as 3 stages to step 4, then as one process to the end. Each stage reads its tensors (and
// the one process its moments too) by name from the shards that hold them, and a pipeline sums
// every gradient in the one process's order at any cut: the run is the one process's, bitwise.
TEST(Cluster, AResumedRunMayCutTheModelAnew) {
  const Reference& ref = SingleProcess();
  const fs::path out = Dir("resume_recut");
  ASSERT_EQ(Longhaul("local", out, {"cluster.stages=2", "train.micro_batches=4"}, {"--stop-at", "2"}), 0) << Log(out);
  ASSERT_EQ(Longhaul("local", out, {"cluster.stages=3", "train.micro_batches=4", "train.resume=true"}, {"--stop-at", "4"}),
            0)
      << Log(out);
  EXPECT_NE(Log(out).find("3 stages x 1 replicas"), std::string::npos) << Log(out);
  ASSERT_EQ(Longhaul("train", out, {"train.micro_batches=4", "train.resume=true"}), 0) << Log(out);
  EXPECT_EQ(Losses(out), ref.losses);
  const std::vector<double> val = ValLosses(out);  // each leg also evaluates where it stops
  ASSERT_EQ(val.size(), 6u);
  EXPECT_EQ(val[2], ref.val_losses[2]);
  EXPECT_EQ(val[5], ref.val_losses[5]);
  EXPECT_TRUE(testing::LatestParams(out) == ref.params) << "parameters differ from the one-process run's";
}

// Workers on disks of their own (`local --worker-disks`): every piece they write reaches the
// coordinator's run directory, a resumed run's new processes fetch what they read from there (not
// the pieces an earlier process left on their disks), and one process resumes from that directory
// alone: the run is bitwise the one-process run. Their timelines reach it too, and merge.
TEST(Cluster, WorkersOnDisksOfTheirOwnLeaveEveryCheckpointWholeAtTheCoordinator) {
  const Reference& ref = SingleProcess();
  const fs::path out = Dir("worker_disks");
  ASSERT_EQ(Longhaul("local", out, {"cluster.stages=2", "train.micro_batches=4"}, {"--stop-at", "2", "--worker-disks"}),
            0)
      << Log(out);
  for (const char* disk : {"w0", "w1"}) {
    EXPECT_TRUE(fs::exists(out / "worker_disks" / disk / "checkpoints")) << disk;
  }
  ASSERT_EQ(Longhaul("local", out, {"cluster.stages=2", "train.micro_batches=4", "train.resume=true"},
                     {"--stop-at", "4", "--worker-disks"}),
            0)
      << Log(out);
  EXPECT_NE(Log(out).find("checkpoint pieces fetched from the coordinator"), std::string::npos) << Log(out);
  // Each worker's timeline came to the coordinator's run directory too, into the merged one.
  std::ifstream tf(out / "timeline.json");
  const nlohmann::json timeline = nlohmann::json::parse(tf, nullptr, false);
  ASSERT_FALSE(timeline.is_discarded()) << Log(out);
  std::set<int> traced;
  for (const nlohmann::json& e : timeline["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "F0") traced.insert(e["pid"].get<int>());
  EXPECT_EQ(traced, (std::set<int>{0, 1})) << Log(out);
  for (int w = 0; w < 2; ++w) {
    const std::string name = "worker_" + std::to_string(w) + ".json";
    const fs::path own = out / "worker_disks" / ("w" + std::to_string(w)) / "timeline" / name;
    ASSERT_TRUE(fs::exists(own)) << own;
    ASSERT_TRUE(fs::exists(out / "timeline" / name)) << "worker " << w << "'s timeline was not shipped";
    EXPECT_EQ(ReadFile(out / "timeline" / name), ReadFile(own)) << "one kernel: one clock, the same events";
  }
  ASSERT_EQ(Longhaul("train", out, {"train.micro_batches=4", "train.resume=true"}), 0) << Log(out);
  EXPECT_EQ(Losses(out), ref.losses);
  EXPECT_TRUE(testing::LatestParams(out) == ref.params) << "parameters differ from the one-process run's";
}

// Local updates: the replicas train apart for train.local_steps iterations, then exchange their
// changes, and hold the same parameters again after every exchange (the coordinator compares them
// there, and only there); each worker's timeline shows its own steps.
TEST(Cluster, LocalUpdatesExchangeEveryLocalStepsAndTheReplicasAgreeThere) {
  const fs::path out = Dir("local_updates");
  ASSERT_EQ(Longhaul("local", out,
                     {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.local_steps=2",
                      "train.steps=5"}),
            0)
      << Log(out);
  std::ifstream f(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(out);
  EXPECT_EQ(summary["replica_checks"], 3) << "exchanges after steps 2, 4 and the last, 5";
  const std::vector<double> losses = Losses(out);
  ASSERT_EQ(losses.size(), 5u);
  EXPECT_LT(losses.back(), losses.front()) << Log(out);
  std::ifstream tf(out / "timeline.json");
  const nlohmann::json timeline = nlohmann::json::parse(tf, nullptr, false);
  ASSERT_FALSE(timeline.is_discarded());
  std::map<int, int> local_steps, pulls;
  for (const nlohmann::json& e : timeline["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["name"] == "local step") ++local_steps[e["pid"].get<int>()];
    if (e["name"] == "pull params") ++pulls[e["pid"].get<int>()];
  }
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(local_steps[w], 5) << "worker " << w;
    EXPECT_EQ(pulls[w], 4) << "worker " << w << ": the initial parameters and 3 exchanges";
  }
}

// The steps metrics.csv has a validation loss for.
std::vector<int64_t> EvaluatedSteps(const fs::path& out) {
  std::vector<int64_t> steps;
  for (const MetricsRow& r : Metrics(out))
    if (r.val_loss >= 0) steps.push_back(r.step);
  return steps;
}

// Worker 0's local steps, parameter-server steps and parameter pulls in the run's timeline, in
// order, as "name iteration".
std::vector<std::string> ExchangeOrder(const fs::path& out) {
  std::ifstream f(out / "timeline.json");
  const nlohmann::json timeline = nlohmann::json::parse(f, nullptr, false);
  EXPECT_FALSE(timeline.is_discarded());
  std::vector<std::string> order;
  if (timeline.is_discarded()) return order;
  for (const nlohmann::json& e : timeline["traceEvents"]) {
    if (e["ph"] != "X" || e["pid"] != 0) continue;
    const std::string name = e["name"];
    if (name == "local step" || name == "ps step" || name == "pull params") {
      order.push_back(name + " " + std::to_string(e["args"]["iteration"].get<int>()));
    }
  }
  return order;
}

// The run of `sets` stopped after step `stop_at` in `split` and resumed ends as the uninterrupted
// run in `full` did: every step's loss and the last parameters bitwise.
void ExpectResumeBitwise(const fs::path& full, const fs::path& split, const std::vector<std::string>& sets,
                         const std::string& stop_at) {
  ASSERT_EQ(Longhaul("local", split, sets, {"--stop-at", stop_at}), 0) << Log(split);
  std::vector<std::string> resume = sets;
  resume.push_back("train.resume=true");
  ASSERT_EQ(Longhaul("local", split, resume), 0) << Log(split);
  const std::vector<MetricsRow> a = Metrics(full), b = Metrics(split);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
  EXPECT_EQ(testing::LatestParams(full), testing::LatestParams(split));
}

// Overlapped local updates (train.overlap_outer): a round's exchange lands two iterations into the
// next round, so each worker's timeline has a round's outer step one local step after its push
// and its pull one after that; the replicas agree where each exchange lands (and at the
// checkpoint's and the last round, which stay synchronous), an overlapped round's validation loss
// is reported where its exchange lands, and a run stopped at the checkpoint and resumed is the
// uninterrupted run, bitwise.
TEST(Cluster, OverlappedOuterStepsLandTwoIterationsLaterAndResumeBitwise) {
  const std::vector<std::string> sets = {"cluster.stages=2",    "cluster.replicas=2",       "train.micro_batches=2",
                                         "train.local_steps=3", "train.overlap_outer=true", "train.steps=12",
                                         "train.checkpoint_every=6"};
  const fs::path full = Dir("overlap_full"), split = Dir("overlap_split");
  ASSERT_EQ(Longhaul("local", full, sets), 0) << Log(full);
  std::ifstream f(full / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(full);
  EXPECT_EQ(summary["replica_checks"], 4) << "exchanges after steps 3 (landing after 5), 6, 9 (after 11) and 12";
  EXPECT_EQ(EvaluatedSteps(full), (std::vector<int64_t>{5, 6, 11, 12}));

  const std::vector<std::string> order = ExchangeOrder(full);  // worker 0 hosts a shard
  auto at = [&](const std::string& event) { return std::find(order.begin(), order.end(), event) - order.begin(); };
  ASSERT_LT(at("pull params 2"), static_cast<long>(order.size())) << ::testing::PrintToString(order);
  EXPECT_EQ(at("ps step 2"), at("local step 3") + 1) << ::testing::PrintToString(order);
  EXPECT_EQ(at("pull params 2"), at("local step 4") + 1) << ::testing::PrintToString(order);
  EXPECT_EQ(at("pull params 5"), at("local step 5") + 2) << "synchronous at the checkpoint: "
                                                         << ::testing::PrintToString(order);
  ExpectResumeBitwise(full, split, sets, "6");
}

// train.overlap_steps = 3: an overlapped exchange is stepped two iterations after its push and
// lands three after it, its pushes and parameters held in between while the workers step on; the
// replicas agree where it lands, its validation loss is reported there, and a resume from the
// checkpoint is bitwise.
TEST(Cluster, AnExchangeOverlappedThreeStepsLandsThreeIterationsLater) {
  const std::vector<std::string> sets = {"cluster.stages=1",         "cluster.replicas=2",    "train.local_steps=4",
                                         "train.overlap_outer=true", "train.overlap_steps=3", "train.steps=16",
                                         "train.checkpoint_every=8", "train.eval_every=4"};
  const fs::path full = Dir("overlap3_full"), split = Dir("overlap3_split");
  ASSERT_EQ(Longhaul("local", full, sets), 0) << Log(full);
  std::ifstream f(full / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(full);
  EXPECT_EQ(summary["replica_checks"], 4) << "exchanges after steps 4 (landing after 7), 8, 12 (after 15) and 16";
  EXPECT_EQ(EvaluatedSteps(full), (std::vector<int64_t>{7, 8, 15, 16}));

  const std::vector<std::string> order = ExchangeOrder(full);
  auto at = [&](const std::string& event) { return std::find(order.begin(), order.end(), event) - order.begin(); };
  ASSERT_LT(at("pull params 3"), static_cast<long>(order.size())) << ::testing::PrintToString(order);
  EXPECT_EQ(at("ps step 3"), at("local step 5") + 1) << ::testing::PrintToString(order);
  EXPECT_EQ(at("pull params 3"), at("local step 6") + 1) << ::testing::PrintToString(order);
  ExpectResumeBitwise(full, split, sets, "8");
}

// train.overlap_mix = 0.5: an overlapped exchange lands as half each worker's own parameters and
// half the new ones, not as the new ones plus its steps since the push: the losses match the
// carried landing's up to it and part after it, and a resume from the checkpoint is bitwise.
TEST(Cluster, AMixedLandingPartsFromTheCarriedOneAndResumesBitwise) {
  const std::vector<std::string> carried = {"cluster.stages=1",         "cluster.replicas=2",
                                            "train.local_steps=4",      "train.overlap_outer=true",
                                            "train.overlap_steps=3",    "train.steps=16",
                                            "train.checkpoint_every=8", "train.eval_every=4"};
  std::vector<std::string> mixed = carried;
  mixed.push_back("train.overlap_mix=0.5");
  const fs::path carry = Dir("mix_carried"), full = Dir("mix_full"), split = Dir("mix_split");
  ASSERT_EQ(Longhaul("local", carry, carried), 0) << Log(carry);
  ASSERT_EQ(Longhaul("local", full, mixed), 0) << Log(full);
  const std::vector<MetricsRow> a = Metrics(carry), b = Metrics(full);
  ASSERT_EQ(b.size(), a.size());
  ASSERT_GE(a.size(), 8u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1 << ", before the first landing";
  EXPECT_NE(a[7].loss, b[7].loss) << "step 8 trains on what landed after step 7";
  ExpectResumeBitwise(full, split, mixed, "8");
}

// cluster.communication = "auto" over links of 10 ms (the scenario's, through the userspace
// proxy): the coordinator prices each setting of a penalties file on the workers' measured compute
// and those links and runs the one fastest to the same loss, here local steps (each exchange of
// this tiny model waits a round trip that its compute cannot hide), writes the choice with every
// candidate's figures to cluster.json and the chosen keys into the config the workers ran; a
// setting its checkpoints rule out is named with the reason. The replicas agree after every
// exchange, and a resume with "auto" keeps the checkpoint's choice.
TEST(Cluster, CommunicationAutoRunsTheSettingFastestToTheSameLoss) {
  const fs::path out = Dir("communication_auto");
  const fs::path penalties = out / "penalties.toml";
  std::ofstream(penalties) << R"(tokens = 1000.0
[[setting]]
name = "exact"
set = []
choosable = true
penalty = 0.0
[[setting]]
name = "local_steps 3"
set = ["train.local_steps=3"]
choosable = true
penalty = 0.01
[[setting]]
name = "local_steps 4"
set = ["train.local_steps=4"]
choosable = true
penalty = 0.01
)";
  const std::string scenario = std::string(LONGHAUL_SOURCE_DIR) + "/netem/scenarios/source-10ms-1gbit.toml";
  const std::vector<std::string> sets = {"cluster.replicas=2", "train.micro_batches=2", "train.steps=6",
                                         "train.checkpoint_every=3", "cluster.communication=\"auto\"",
                                         "cluster.penalties=\"" + penalties.string() + "\""};
  ASSERT_EQ(Longhaul("local", out, sets, {"--scenario", scenario, "--emulation", "proxy", "--stop-at", "3"}), 0)
      << Log(out);
  std::ifstream cf(out / "cluster.json");
  const nlohmann::json cluster = nlohmann::json::parse(cf, nullptr, false);
  ASSERT_TRUE(cluster.contains("communication")) << cluster.dump(1);
  const nlohmann::json& c = cluster["communication"];
  EXPECT_EQ(c["chosen"], "local_steps 3") << c.dump(1);
  ASSERT_EQ(c["candidates"].size(), 3u) << c.dump(1);
  EXPECT_GT(c["candidates"][0]["predicted_iteration_seconds"].get<double>(),
            c["candidates"][1]["predicted_iteration_seconds"].get<double>())
      << c.dump(1);
  EXPECT_NE(c["candidates"][2]["why_not"].get<std::string>().find("train.checkpoint_every = 3 is not a multiple"),
            std::string::npos)
      << c.dump(1);
  EXPECT_NE(Log(out).find("communication by time to the same loss (cluster.communication = \"auto\"): local_steps 3"),
            std::string::npos)
      << Log(out);
  std::ifstream f(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(out);
  EXPECT_EQ(summary["replica_checks"], 1) << "one exchange, after step 3";
  // The resumed leg runs on with local steps 3, the checkpoint's (a config of 1 would be refused
  // as another train.local_steps), and chooses nothing anew.
  std::vector<std::string> resume = sets;
  resume.push_back("train.resume=true");
  ASSERT_EQ(Longhaul("local", out, resume, {"--scenario", scenario, "--emulation", "proxy"}), 0) << Log(out);
  EXPECT_EQ(Log(out).find("communication by time to the same loss"), std::string::npos) << Log(out);
  EXPECT_EQ(Losses(out).size(), 6u) << Log(out);
}

TEST(Cluster, InterruptedRunWritesEveryRecord) {
  const fs::path out = Dir("interrupted");
  const pid_t launcher = Start(
      "local", out, {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.steps=100000"});
  ASSERT_GT(launcher, 0);
  Reaper reaper{launcher};
  ASSERT_GE(WaitForSteps(out, 5), 5u) << Log(out);

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

TEST(Cluster, ResumeWithAnotherReplicaCountIsRefusedAsALayoutChange) {
  const fs::path out = Dir("resume_layout");
  ASSERT_EQ(Longhaul("local", out, {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2"}, {"--stop-at", "2"}),
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

// cluster.json of a run in progress, once the coordinator wrote it (null after 15 s).
nlohmann::json WaitForCluster(const fs::path& out) {
  nlohmann::json cluster;
  for (int i = 0; i < 300 && cluster.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f(out / "cluster.json");
    cluster = nlohmann::json::parse(f, nullptr, false);
    if (cluster.is_discarded()) cluster = nullptr;
  }
  return cluster;
}

// ... and the coordinator's metrics, scraped while the run goes on and in metrics.prom at its end,
// count the refusals per worker.
TEST(Cluster, StrangerAndGarbageAreRefusedWhileTheRunGoesOn) {
  const fs::path out = Dir("intruders");
  auto run = std::async(std::launch::async, [&] {
    return Longhaul("local", out, {"cluster.stages=2", "cluster.replicas=1", "train.micro_batches=4", "train.steps=400"});
  });
  const nlohmann::json cluster = WaitForCluster(out);
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

  // A peer of this job that does not hold the run's secret (`longhaul local` made one): refused
  // before its tensor is read.
  TransportOptions no_secret;
  no_secret.job_id = "equivalence";
  no_secret.timeout = std::chrono::milliseconds(10000);
  s = TensorClient(victim, no_secret).Send(h, x.data(), x.size())->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("does not hold this job's secret"), std::string::npos) << s;
  EXPECT_NE(s.message().find("nothing was sent"), std::string::npos) << s;

  // Bytes that are not longhaul's protocol: the worker closes that connection.
  const std::string other = cluster["workers"][0]["address"];
  EXPECT_TRUE(testing::GarbageConnectionIsClosed(other));

  // Scraped until every worker has reported a step: the refusals above may all land before the
  // first one does.
  std::string metrics_address;
  std::ifstream(out / ".metrics_address") >> metrics_address;
  std::string scrape;
  absl::StatusOr<std::map<std::string, double>> live;
  for (int i = 0; i < 500; ++i) {
    scrape = testing::HttpExchange(metrics_address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_EQ(scrape.rfind("HTTP/1.1 200 OK", 0), 0u) << "the endpoint answers while the run goes on: " << scrape;
    live = testing::ParsePrometheusText(scrape.substr(scrape.find("\r\n\r\n") + 4));
    ASSERT_TRUE(live.ok()) << live.status() << "\n" << scrape;
    if (live->at("longhaul_step") > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(live->at("longhaul_step"), 0) << scrape;
  EXPECT_GT(live->at(R"(longhaul_link_sent_bytes_total{from="0",to="1"})"), 0) << scrape;

  ASSERT_EQ(run.get(), 0) << Log(out);
  EXPECT_EQ(Losses(out).size(), 400u) << "the run went on to the end";
  std::ifstream f(out / "metrics.prom");
  auto last = testing::ParsePrometheusText(std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->at("longhaul_step"), 400);
  double refused_by_1 = 0, refused_by_0 = 0;
  for (const auto& [key, value] : *last) {
    if (key.rfind("longhaul_worker_refused_tensor_total{worker=\"1\"", 0) == 0) refused_by_1 = value;
    if (key.rfind("longhaul_worker_refused_tensor_total{worker=\"0\"", 0) == 0) refused_by_0 = value;
  }
  EXPECT_EQ(refused_by_1, 2) << "the stranger and the peer without the secret";
  EXPECT_EQ(refused_by_0, 1) << "the garbage";
}

// The 2 x 2 job of `steps` steps the tests below disturb.
std::vector<std::string> TwoByTwo(int steps) {
  return {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.steps=" + std::to_string(steps)};
}

// The losses of TwoByTwo(steps) run undisturbed, run once per test process.
const std::vector<double>& CalmLosses(int steps) {
  static std::map<int, std::vector<double>> runs;
  auto [it, first] = runs.try_emplace(steps);
  if (first) {
    const fs::path out = Dir("calm_" + std::to_string(steps));
    EXPECT_EQ(Longhaul("local", out, TwoByTwo(steps)), 0) << Log(out);
    it->second = Losses(out);
  }
  return it->second;
}

// The worker of `cluster` (cluster.json) at (stage, replica).
nlohmann::json WorkerAt(const nlohmann::json& cluster, int stage, int replica) {
  for (const nlohmann::json& w : cluster["workers"])
    if (w["stage"] == stage && w["replica"] == replica) return w;
  return nullptr;
}

// Worker `id`'s compute profile, as a worker reports it once registered: a plan may then place it.
proto::ProfileReport Profiled(int id) {
  proto::ProfileReport profile;
  profile.set_worker_id(id);
  profile.mutable_compute()->set_block_forward_s(0.01);
  profile.mutable_compute()->set_block_backward_s(0.02);
  profile.mutable_compute()->set_memory_bytes(1e10);
  return profile;
}

// A holder of the run's secret registered with its coordinator as a spare, with a key of its own,
// heartbeating so as to stay one: a member of the job that no plan places (it reports no profile).
// What it says on a tensor port it signs as that worker (speaker()).
class Spare {
 public:
  Spare(const fs::path& out, const JobSecret& secret, const std::string& address = "127.0.0.1:1")
      : key_(std::make_shared<const WorkerKey>(WorkerKey::Generate().value())) {
    int port = 0;
    std::ifstream(out / ".coordinator_port") >> port;
    auto channel = CoordinatorChannel(absl::StrCat("127.0.0.1:", port), secret, TlsFiles(), grpc::ChannelArguments(),
                                      key_);
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (!channel.ok()) return;
    stub_ = proto::Coordinator::NewStub(*channel);
    proto::RegisterRequest reg;
    reg.set_protocol_version(kProtocolVersion);
    reg.set_address(address);
    reg.set_public_key(key_->public_key());
    grpc::ClientContext ctx;
    proto::RegisterReply reply;
    const grpc::Status st = stub_->Register(&ctx, reg, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    id_ = reply.worker_id();
    heartbeats_ = std::thread([this] {
      while (!stop_) {
        grpc::ClientContext beat_ctx;
        beat_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        proto::HeartbeatRequest beat;
        beat.set_worker_id(id_);
        proto::HeartbeatReply beat_reply;
        (void)stub_->Heartbeat(&beat_ctx, beat, &beat_reply);
        for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  ~Spare() {
    stop_ = true;
    if (heartbeats_.joinable()) heartbeats_.join();
  }
  int id() const { return id_; }
  testing::Speaker speaker() const { return {id_, key_}; }
  // Reports a compute profile, as a worker does once registered: a plan may then place it.
  grpc::Status ReportProfile() const {
    grpc::ClientContext ctx;
    proto::Empty empty;
    return stub_->ReportProfile(&ctx, Profiled(id_), &empty);
  }
  // Its channel to the coordinator, each call signed with its own key.
  proto::Coordinator::Stub& coordinator() const { return *stub_; }

 private:
  const std::shared_ptr<const WorkerKey> key_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
  int id_ = -1;
  std::atomic<bool> stop_{false};
  std::thread heartbeats_;
};

// A header of job "equivalence" as a peer at (stage, replica) of plan `version` would send it, of
// `elements` fp32 values in one part.
proto::TensorHeader CraftedHeader(proto::TensorKind kind, uint64_t version, int64_t iteration, int micro, int stage,
                                  int replica, uint64_t elements, int shard = 0) {
  proto::TensorHeader h;
  h.set_job_id("equivalence");
  h.set_protocol_version(kProtocolVersion);
  h.set_plan_version(version);
  h.set_kind(kind);
  h.set_iteration(iteration);
  h.set_micro_batch(micro);
  h.set_from_stage(stage);
  h.set_from_replica(replica);
  h.set_shard(shard);
  h.set_dtype(proto::F32);
  h.set_total_elements(elements);
  h.set_part_offset(0);
  h.set_part_elements(elements);
  return h;
}

// What a crafted peer, a member of the job with no place (a spare with a key of its own), sends a
// live worker (stage 1 of replica 0 in a 2 x 2 run): whatever its headers say of sizes, offsets,
// dtypes, iterations and kinds, each claims another worker's place, or one the plan does not have,
// and is refused as such before the plan's checks of what that place may send
// (tensor_admission_test checks each of those) and before anything is reserved or allocated. A
// link probe after the plan is refused, a version never published is refused after a moment, and
// a part of a version the worker left is dropped. The worker's memory stays flat, and the run
// trains to its end.
TEST(Cluster, CraftedTensorHeadersAreRefusedByALiveWorkerWhoseMemoryStaysFlat) {
  constexpr int kSteps = 4000;  // long enough to outlast what the test sends
  const fs::path out = Dir("crafted");
  auto run = std::async(std::launch::async, [&] { return Longhaul("local", out, TwoByTwo(kSteps)); });
  const nlohmann::json cluster = WaitForCluster(out);
  ASSERT_FALSE(cluster.is_null()) << Log(out);
  const nlohmann::json victim = WorkerAt(cluster, 1, 0);
  ASSERT_FALSE(victim.is_null()) << cluster.dump();
  const std::string address = victim["address"];
  const int pid = victim["pid"];
  const absl::StatusOr<JobSecret> secret = JobSecret::Load((out / ".secret").string());
  ASSERT_TRUE(secret.ok()) << secret.status();
  const Spare spare(out, *secret);
  const int64_t rss_before = testing::ResidentBytes(pid);
  ASSERT_GT(rss_before, 0);

  const uint64_t boundary = 2 * 16 * 32;  // micro_batch_size x seq_len x d_model
  // Stage 0 replica 0's activation of iteration 1, `n` of `total` elements from `offset`.
  auto header = [&](uint64_t total, uint64_t offset, uint64_t n) {
    proto::TensorHeader h = CraftedHeader(proto::ACTIVATION, 1, 1, 0, 0, 0, total);
    h.set_part_offset(offset);
    h.set_part_elements(n);
    return h;
  };
  struct Case {
    const char* what;
    proto::TensorHeader h;
  };
  std::vector<Case> cases = {
      {"offset that wraps around", header(boundary, std::numeric_limits<uint64_t>::max(), 2)},
      {"2^34 elements", header(uint64_t{1} << 34, 0, uint64_t{1} << 34)},
      {"more than the boundary", header(boundary + 1, 0, boundary + 1)},
  };
  proto::TensorHeader h = header(boundary, 0, boundary);
  h.set_from_stage(5);
  cases.push_back({"a stage the plan does not have", h});
  h = header(boundary, 0, boundary);
  h.set_dtype(proto::BF16);
  cases.push_back({"another wire dtype", h});
  h = header(boundary, 0, boundary);
  h.set_iteration(1'000'000'000);
  cases.push_back({"an iteration far ahead", h});
  h = header(boundary, 0, boundary);
  h.set_micro_batch(2);
  cases.push_back({"a micro-batch the plan does not have", h});
  // Replica 1's gradient pushes to the shard this worker hosts.
  h = header(boundary, 0, boundary);
  h.set_kind(proto::GRAD_PUSH);
  h.set_from_stage(1);
  h.set_from_replica(1);
  h.set_micro_batch(1);
  cases.push_back({"a push of a second group", h});
  h = header(uint64_t{1} << 34, 0, uint64_t{1} << 34);
  h.set_kind(proto::GRAD_PUSH);
  h.set_from_stage(1);
  h.set_from_replica(1);
  cases.push_back({"a push of 2^34 elements", h});
  // Another parameter-server host's norm partials.
  h = header(uint64_t{1} << 34, 0, uint64_t{1} << 34);
  h.set_kind(proto::NORM);
  cases.push_back({"a norm of 2^34 elements", h});
  // Validation activations (train.eval_every = 3).
  h = header(uint64_t{1} << 34, 0, uint64_t{1} << 34);
  h.set_kind(proto::EVAL_ACTIVATION);
  cases.push_back({"a validation activation of 2^34 elements", h});
  h = header(boundary, 0, boundary);
  h.set_kind(proto::EVAL_ACTIVATION);
  h.set_micro_batch(2);
  cases.push_back({"a validation micro-batch beyond the replica's share", h});
  h = header(boundary, 0, boundary);
  h.set_kind(proto::EVAL_ACTIVATION);
  h.set_dtype(proto::INT8);
  cases.push_back({"a validation activation in int8", h});
  h = header(boundary, 0, boundary);
  h.set_kind(proto::LINK_PROBE);
  cases.push_back({"a link probe after the plan", h});

  // A version the coordinator never published waits a moment (a peer may hear of a new one sooner
  // than this worker), then is refused; meanwhile the rounds below go on.
  testing::RawPeer future(address, "equivalence", *secret, spare.speaker());
  ASSERT_TRUE(future.hello().ok()) << future.hello();
  h = header(boundary, 0, boundary);
  h.set_plan_version(7);
  future.Write(testing::HeaderFrame(h));
  for (int round = 0; round < 20; ++round) {
    for (const Case& c : cases) {
      // Header only, held open, as the streams that took a worker to 3.4 GB did; each on a
      // connection of its own, one after another (a member holds a few at once).
      testing::RawPeer peer(address, "equivalence", *secret, spare.speaker());
      ASSERT_TRUE(peer.hello().ok()) << peer.hello();
      peer.Write(testing::HeaderFrame(c.h));
      const absl::Status s = peer.Ack(std::chrono::seconds(10));
      const bool probe = c.h.kind() == proto::LINK_PROBE;
      EXPECT_EQ(s.code(), probe ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kPermissionDenied)
          << c.what << ": " << s.message();
      if (!probe) {
        EXPECT_NE(s.message().find(absl::StrCat("worker ", spare.id(), " sends")), std::string::npos) << s;
      }
      if (round == 0) std::cout << c.what << ": " << s.message() << "\n";
    }
  }
  const absl::Status s = future.Ack(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  std::cout << "a plan version never published: " << s.message() << "\n";
  // A part of a plan version the worker has left (a peer's send from before it heard of the new
  // one): read and dropped, and the connection stays for the next, here another such part.
  {
    testing::RawPeer old(address, "equivalence", *secret, spare.speaker());
    ASSERT_TRUE(old.hello().ok()) << old.hello();
    h = header(boundary, 0, boundary);
    h.set_plan_version(0);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(old.Write(testing::PartFrame(h, std::vector<float>(boundary, 0.5f))));
      const absl::Status dropped = old.Ack(std::chrono::seconds(10));
      EXPECT_EQ(dropped.code(), absl::StatusCode::kAborted) << dropped;
      EXPECT_NE(dropped.message().find("dropped"), std::string::npos) << dropped;
      if (i == 0) std::cout << "a part of an older plan version: " << dropped.message() << "\n";
    }
  }
  const int64_t rss_after = testing::ResidentBytes(pid);
  std::cout << "victim worker resident memory: " << rss_before / (1 << 20) << " MiB before, " << rss_after / (1 << 20)
            << " MiB after " << 20 * cases.size() << " crafted streams\n";
  ASSERT_GT(rss_after, 0) << "the run ended before the test did";
  EXPECT_LT(rss_after - rss_before, 32 << 20);
  ASSERT_EQ(run.get(), 0) << Log(out);
  EXPECT_EQ(Losses(out).size(), static_cast<size_t>(kSteps)) << "the run went on to the end";
}

// A member of the job (a holder of its secret registered as a spare, with a key of its own) speaks
// only from its own place. Against a live 2 x 2 run, it sends stage 1 replica 0 the headers alone
// of stage 0 replica 0's next activations under the run's plan version and the next three (frames
// that had the real ones refused as "already arriving on another stream", and the layout started
// again at each version until the job stopped), a whole activation of that place with a valid
// checksum, and a gradient push and parameters of stage 1 replica 1's place: each is refused,
// naming both workers, before anything is reserved. Hellos signed with a key the job never
// registered, or with another key than a placed worker's, are refused in the hello. The run ends
// as the undisturbed one, loss for loss, without a recovery, and the worker's memory stays flat.
TEST(Cluster, AMemberSendsOnlyFromItsOwnPlace) {
  constexpr int kSteps = 4000;  // long enough to outlast what the test sends
  const std::vector<double>& calm = CalmLosses(kSteps);
  ASSERT_EQ(calm.size(), static_cast<size_t>(kSteps));
  const fs::path out = Dir("spoofed");
  auto run = std::async(std::launch::async, [&] { return Longhaul("local", out, TwoByTwo(kSteps)); });
  const nlohmann::json cluster = WaitForCluster(out);
  ASSERT_FALSE(cluster.is_null()) << Log(out);
  const nlohmann::json victim = WorkerAt(cluster, 1, 0), sender = WorkerAt(cluster, 0, 0),
                       other = WorkerAt(cluster, 1, 1);
  ASSERT_FALSE(victim.is_null() || sender.is_null() || other.is_null()) << cluster.dump();
  const std::string address = victim["address"];
  const int pid = victim["pid"];
  const absl::StatusOr<JobSecret> secret = JobSecret::Load((out / ".secret").string());
  ASSERT_TRUE(secret.ok()) << secret.status();
  const Spare spare(out, *secret);
  ASSERT_GE(spare.id(), 4);
  const int64_t rss_before = testing::ResidentBytes(pid);
  ASSERT_GT(rss_before, 0);
  const uint64_t boundary = 2 * 16 * 32;  // micro_batch_size x seq_len x d_model
  // Refused naming the spare and the worker whose place it claims.
  auto expect_spoof_refused = [&](const char* what, const absl::Status& s, const nlohmann::json& owner) {
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << what << ": " << s;
    EXPECT_NE(s.message().find(absl::StrCat("worker ", spare.id())), std::string::npos) << what << ": " << s;
    EXPECT_NE(s.message().find(absl::StrCat("worker ", owner["worker"].get<int>())), std::string::npos)
        << what << ": " << s;
  };

  // (a) The headers alone, each held open on a connection of its own: one of each later version
  // (they wait a moment, as a version a peer heard of sooner would), then the run's version's
  // for the next iterations, one after another (a member holds a few connections at once).
  const int64_t next = static_cast<int64_t>(Metrics(out).size());
  std::vector<std::unique_ptr<testing::RawPeer>> later;
  for (uint64_t version = 2; version <= 4; ++version) {
    later.push_back(std::make_unique<testing::RawPeer>(address, "equivalence", *secret, spare.speaker()));
    ASSERT_TRUE(later.back()->hello().ok()) << later.back()->hello();
    later.back()->Write(testing::HeaderFrame(CraftedHeader(proto::ACTIVATION, version, next, 0, 0, 0, boundary)));
  }
  int frames = static_cast<int>(later.size());
  for (int64_t it = next; it < next + 3; ++it)
    for (int m = 0; m < 2; ++m, ++frames) {
      testing::RawPeer peer(address, "equivalence", *secret, spare.speaker());
      ASSERT_TRUE(peer.hello().ok()) << peer.hello();
      peer.Write(testing::HeaderFrame(CraftedHeader(proto::ACTIVATION, 1, it, m, 0, 0, boundary)));
      const absl::Status s = peer.Ack(std::chrono::seconds(10));
      expect_spoof_refused("the header of another worker's activation", s, sender);
      if (frames == 3) std::cout << "plan version 1: " << s << "\n";
    }
  for (size_t i = 0; i < later.size(); ++i) {
    const absl::Status s = later[i]->Ack(std::chrono::seconds(10));
    // Of a version the worker does not run: refused once it did not come.
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    std::cout << "plan version " << i + 2 << ": " << s << "\n";
  }

  // (b) A whole activation of that place, with a valid checksum.
  {
    testing::RawPeer forged(address, "equivalence", *secret, spare.speaker());
    ASSERT_TRUE(forged.hello().ok()) << forged.hello();
    forged.Write(testing::PartFrame(CraftedHeader(proto::ACTIVATION, 1, next + 2, 0, 0, 0, boundary),
                                    std::vector<float>(boundary, 0.25f)));
    const absl::Status s = forged.Ack(std::chrono::seconds(10));
    expect_spoof_refused("a forged activation", s, sender);
    std::cout << "a forged activation with a valid checksum: " << s << "\n";
  }
  // (c) Parameter-server traffic of stage 1 replica 1's place: its push to the shard this worker
  // hosts, and the parameters of the shard it hosts.
  for (auto [what, kind, shard] : {std::tuple{"another worker's push", proto::GRAD_PUSH, 0},
                                   std::tuple{"another worker's parameters", proto::PARAMS, 1}}) {
    testing::RawPeer forged(address, "equivalence", *secret, spare.speaker());
    ASSERT_TRUE(forged.hello().ok()) << forged.hello();
    forged.Write(testing::HeaderFrame(CraftedHeader(kind, 1, next + 2, 0, 1, 1, boundary, shard)));
    const absl::Status s = forged.Ack(std::chrono::seconds(10));
    expect_spoof_refused(what, s, other);
    std::cout << what << ": " << s << "\n";
  }
  // Hellos of an identity the job does not have: a worker id nobody registered, and a placed
  // worker's id with a key other than its own.
  for (const testing::Speaker& as :
       {testing::Speaker{1000, nullptr}, testing::Speaker{sender["worker"].get<int>(), nullptr}}) {
    testing::RawPeer stranger(address, "equivalence", *secret, as);
    EXPECT_EQ(stranger.hello().code(), absl::StatusCode::kPermissionDenied) << stranger.hello();
    EXPECT_NE(stranger.hello().message().find(absl::StrCat("worker ", as.worker)), std::string::npos)
        << stranger.hello();
    std::cout << "a hello as worker " << as.worker << " with a key of its own: " << stranger.hello() << "\n";
  }
  const int64_t rss_after = testing::ResidentBytes(pid);
  std::cout << "victim worker resident memory: " << rss_before / (1 << 20) << " MiB before, " << rss_after / (1 << 20)
            << " MiB after " << frames + 5 << " spoofed connections\n";
  ASSERT_GT(rss_after, 0) << "the run ended before the test did";
  EXPECT_LT(rss_after - rss_before, 32 << 20);
  ASSERT_EQ(run.get(), 0) << Log(out);
  EXPECT_EQ(Losses(out), calm) << "the losses differ from the undisturbed run's";
  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(out);
  EXPECT_TRUE(summary["recoveries"].empty()) << summary["recoveries"].dump(2);
}

// A member of the job placed by the plan (registered with a key of its own and profiled, so the
// coordinator gives it a stage of a 2 x 1 run; it computes nothing) sends its neighbour boundary
// headers from its own place, for each wire format and both directions (it registers first, as
// stage 0 sending activations, or second, as stage 1 sending gradients): the whole tensor where
// the plan sends fewer values (low-rank factors, a subspace model's kept columns; elsewhere twice
// it), one value more than the plan's, 2^34, and the plan's count in another dtype. The live
// worker refuses each, naming the plan's count or dtype, before anything is reserved.
TEST(Cluster, APlacedPeerIsHeldToThePlansSizeAndDtypeInEveryWireFormat) {
  const uint64_t whole = 2 * 16 * 32;  // micro_batch_size x seq_len x d_model
  struct Format {
    const char* what;
    std::vector<std::string> sets;
    proto::WireDtype dtype[2];  // activations, gradients
    uint64_t count[2];
  };
  const std::vector<Format> formats = {
      {"int4 activations, int3h gradients",
       {"transport.wire_dtype=\"int4\"", "transport.gradient_dtype=\"int3h\""},
       {proto::INT4, proto::INT3H},
       {whole, whole}},
      // Rank 32 / 8 = 4 forward and 32 / 4 = 8 backward, each sending rank x (32 tokens + 32 values).
      {"low rank /8 activations, /4 gradients, int8",
       {"transport.wire_dtype=\"int8\"", "transport.boundary_rank_divisor=8", "transport.gradient_rank_divisor=4"},
       {proto::INT8, proto::INT8},
       {4 * 64, 8 * 64}},
      // Coordinates of 32 / 8 = 4 shared directions for each of the 32 tokens both ways; the
      // first micro-batch's activations (the one sent here) carry the directions too, 4 x 32
      // floats padded to 4096.
      {"low rank /8 in shared directions, int4",
       {"transport.wire_dtype=\"int4\"", "transport.boundary_rank_divisor=8", "transport.shared_directions=true"},
       {proto::INT4, proto::INT4},
       {4 * 32 + 4096, 4 * 32}},
      // The first 32 / 4 = 8 values of each of the 32 tokens.
      {"subspace /4, int8", {"transport.wire_dtype=\"int8\"", "model.subspace_divisor=4"}, {proto::INT8, proto::INT8},
       {32 * 8, 32 * 8}},
  };
  int job = 0;
  for (const Format& f : formats) {
    for (int gradient : {0, 1}) {
      const fs::path out = Dir("placed_peer_" + std::to_string(job++));
      const std::string secret_path = (out / ".secret").string();
      ASSERT_TRUE(JobSecret::WriteNew(secret_path).ok());
      const absl::StatusOr<JobSecret> secret = JobSecret::Load(secret_path);
      ASSERT_TRUE(secret.ok()) << secret.status();
      std::vector<std::string> sets = f.sets;
      sets.insert(sets.end(),
                  {"cluster.stages=2", "cluster.replicas=1", "cluster.link_probe=\"off\"", "train.steps=100"});
      Reaper coordinator{Start("coordinator", out, sets,
                               {"--listen", "127.0.0.1:0", "--port-file", (out / ".coordinator_port").string(),
                                "--secret-file", secret_path})};
      const int port = PortFrom(out / ".coordinator_port");
      ASSERT_GT(port, 0) << Log(out);
      // The member's tensor port: connections wait in its backlog, unread.
      std::string member_address;
      const absl::StatusOr<int> listener = ListenTcp("127.0.0.1:0", &member_address);
      ASSERT_TRUE(listener.ok()) << listener.status();
      const absl::Cleanup close_listener = [fd = *listener] { close(fd); };
      auto start_worker = [&] {
        return Spawn({LONGHAUL_BINARY, "worker", "--coordinator", absl::StrCat("127.0.0.1:", port), "--secret-file",
                      secret_path, "--threads", "1", "--listen", "127.0.0.1:0"},
                     out / "worker.txt");
      };
      // Registration order is placement order here (one address, no links to plan with).
      std::unique_ptr<Reaper> worker;
      if (gradient) {
        worker.reset(new Reaper{start_worker()});
        for (int i = 0; i < 300 && Log(out).find("registered from") == std::string::npos; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        ASSERT_NE(Log(out).find("registered from"), std::string::npos) << Log(out);
      }
      const Spare member(out, *secret, member_address);
      ASSERT_TRUE(member.ReportProfile().ok());
      if (!gradient) worker.reset(new Reaper{start_worker()});
      // The plan, asked for again while the coordinator answers that it has none yet.
      proto::Plan plan;
      grpc::Status got;
      for (int i = 0; i < 30 && plan.version() == 0; ++i) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        proto::PlanRequest request;
        request.set_worker_id(member.id());
        got = member.coordinator().GetPlan(&ctx, request, &plan);
      }
      ASSERT_NE(plan.version(), 0u) << got.error_message() << "\n" << Log(out);
      std::string victim;
      for (const proto::Assignment& a : plan.assignments()) {
        if (a.worker_id() == member.id()) {
          ASSERT_EQ(a.stage(), gradient) << f.what << ": " << plan.DebugString();
        } else {
          victim = a.address();
        }
      }
      // Once every worker is ready, the victim admits by the plan.
      {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        proto::ReadyRequest ready;
        ready.set_worker_id(member.id());
        ready.set_plan_version(plan.version());
        proto::ReadyReply reply;
        ASSERT_TRUE(member.coordinator().Ready(&ctx, ready, &reply).ok()) << Log(out);
        ASSERT_FALSE(reply.abort()) << reply.reason();
      }
      const uint64_t count = f.count[gradient];
      const proto::WireDtype dtype = f.dtype[gradient];
      auto send = [&](uint64_t elements, proto::WireDtype as) {
        proto::TensorHeader h = CraftedHeader(gradient ? proto::GRADIENT : proto::ACTIVATION, plan.version(),
                                              plan.start_iteration(), 0, gradient, 0, elements);
        h.set_dtype(as);
        testing::RawPeer peer(victim, "equivalence", *secret, member.speaker());
        EXPECT_TRUE(peer.hello().ok()) << peer.hello();
        peer.Write(testing::HeaderFrame(h));
        return peer.Ack(std::chrono::seconds(10));
      };
      const std::string says = absl::StrFormat("the plan has %d", count);
      for (uint64_t elements : {count == whole ? 2 * whole : whole, count + 1, uint64_t{1} << 34}) {
        const absl::Status s = send(elements, dtype);
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << f.what << ", " << elements << ": " << s;
        EXPECT_NE(s.message().find(says), std::string::npos) << f.what << ", " << elements << ": " << s;
        if (elements == count + 1) std::cout << f.what << ": " << s.message() << "\n";
      }
      const absl::Status s = send(count, proto::F32);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << f.what << ": " << s;
      EXPECT_NE(s.message().find("in wire dtype fp32; the plan's for it is"), std::string::npos) << f.what << ": " << s;
      std::cout << f.what << ": " << s.message() << "\n";
    }
  }
}

// A member's idle connections leave the placed peers theirs. Against a live 2 x 2 run, the spare
// proves itself on 520 connections to stage 1 replica 0, more than the 512 a worker serves at once,
// and holds them idle: the worker holds a member's share of them and refuses the others, naming
// the share; hellos signed with keys the job never registered are refused too. Then (as root)
// every connection of the placed peers to that worker is reset, as a middlebox would: they connect
// again (the layout starting again from its last checkpoint where a send was under way, else
// without a restart), and the run ends as the undisturbed one, loss for loss. The worker's memory
// stays flat.
TEST(Cluster, AMembersIdleConnectionsDoNotCrowdOutThePlacedPeers) {
  constexpr int kSteps = 4000, kConnections = 520;  // steps enough to outlast what the test sends
  const std::vector<double>& calm = CalmLosses(kSteps);
  ASSERT_EQ(calm.size(), static_cast<size_t>(kSteps));
  const fs::path out = Dir("idle");
  auto run = std::async(std::launch::async, [&] { return Longhaul("local", out, TwoByTwo(kSteps)); });
  const nlohmann::json cluster = WaitForCluster(out);
  ASSERT_FALSE(cluster.is_null()) << Log(out);
  const nlohmann::json victim = WorkerAt(cluster, 1, 0);
  ASSERT_FALSE(victim.is_null()) << cluster.dump();
  const std::string address = victim["address"];
  const int pid = victim["pid"];
  const absl::StatusOr<JobSecret> secret = JobSecret::Load((out / ".secret").string());
  ASSERT_TRUE(secret.ok()) << secret.status();
  const Spare spare(out, *secret);
  ASSERT_GE(spare.id(), 4);
  const int64_t rss_before = testing::ResidentBytes(pid);
  ASSERT_GT(rss_before, 0);
  // From 127.0.0.2, so that the reset below spares them.
  std::vector<std::unique_ptr<testing::RawPeer>> held;
  absl::Status refusal;
  int refused = 0;
  for (int i = 0; i < kConnections; ++i) {
    auto peer = std::make_unique<testing::RawPeer>(address, "equivalence", *secret, spare.speaker(), "127.0.0.2");
    if (peer->hello().ok()) {
      held.push_back(std::move(peer));
    } else {
      ++refused;
      refusal = peer->hello();
    }
  }
  std::cout << kConnections << " connections of the spare: " << held.size() << " held, " << refused
            << " refused; the last: " << refusal << "\n";
  EXPECT_GT(held.size(), 0u);
  EXPECT_LE(held.size(), 16u) << "a member holds more than its share";
  EXPECT_EQ(refusal.code(), absl::StatusCode::kResourceExhausted) << refusal;
  EXPECT_NE(refusal.message().find("share"), std::string::npos) << refusal;
  // Keys the job never registered, at once, each in its hello for a moment.
  std::vector<std::future<absl::Status>> strangers;
  for (int i = 0; i < 16; ++i) {
    strangers.push_back(std::async(std::launch::async, [&, i] {
      return testing::RawPeer(address, "equivalence", *secret, {2000 + i, nullptr}, "127.0.0.2").hello();
    }));
  }
  for (auto& s : strangers) {
    const absl::Status hello = s.get();
    EXPECT_EQ(hello.code(), absl::StatusCode::kPermissionDenied) << hello;
  }
  bool reset = false;
  int attempts = kConnections + static_cast<int>(strangers.size());
  if (geteuid() == 0) {
    ASSERT_LT(Metrics(out).size(), static_cast<size_t>(kSteps)) << "the run ended before the reset";
    const std::string destroyed =
        testing::Sh("ss -K -H -t state established dst " + address + " src 127.0.0.1").output;
    std::cout << "ss -K reset the placed peers' connections:\n" << destroyed;
    reset = destroyed.find("127.0.0.1:") != std::string::npos;
    // The spare goes on connecting while they connect again, as one that means to take every
    // connection they free would.
    for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
         std::chrono::steady_clock::now() < until; ++attempts) {
      auto peer = std::make_unique<testing::RawPeer>(address, "equivalence", *secret, spare.speaker(), "127.0.0.2");
      if (peer->hello().ok()) held.push_back(std::move(peer));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::cout << "after the reset the spare holds " << held.size() << " connections\n";
    EXPECT_LE(held.size(), 16u) << "a member holds more than its share";
  }
  const int64_t rss_after = testing::ResidentBytes(pid);
  std::cout << "victim worker resident memory: " << rss_before / (1 << 20) << " MiB before, " << rss_after / (1 << 20)
            << " MiB after " << attempts << " connections\n";
  ASSERT_GT(rss_after, 0) << "the run ended before the test did";
  EXPECT_LT(rss_after - rss_before, 32 << 20);
  if (!reset) std::cout << "the placed peers' connections were not reset (ss -K needs root and the kernel's socket destroy)\n";
  ASSERT_EQ(run.get(), 0) << Log(out);
  EXPECT_EQ(Losses(out), calm) << "the losses differ from the undisturbed run's";
  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(out);
  for (const nlohmann::json& r : summary["recoveries"]) std::cout << "plan change: " << r.dump() << "\n";
  if (reset) std::cout << summary["recoveries"].size() << " restarts after the reset\n";
}

// What a crafted peer tells a live coordinator: calls without the secret or replayed; a holder of
// the secret speaking for a worker of the plan (its failure, its end, its lifeline, its reports),
// refused by that worker's key; its own reports where it has no place; worker ids nobody
// registered, a registration of a key the caller does not hold or beyond the job's workers. Each
// is refused with the reason, and the run trains to its end with every step recorded once.
TEST(Cluster, CraftedControlMessagesAreRefusedByALiveCoordinator) {
  const fs::path out = Dir("crafted_control");
  auto run = std::async(std::launch::async, [&] {
    // Long enough to outlast every crafted call below (the coordinator's memory is measured live).
    return Longhaul("local", out, {"cluster.stages=2", "cluster.replicas=2", "train.micro_batches=2", "train.steps=1000"});
  });
  ASSERT_FALSE(WaitForCluster(out).is_null()) << Log(out);
  int port = 0;
  std::ifstream(out / ".coordinator_port") >> port;
  ASSERT_GT(port, 0) << Log(out);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto expect_refused = [](const char* what, const grpc::Status& s, grpc::StatusCode code,
                           const std::string& says = "") {
    EXPECT_EQ(s.error_code(), code) << what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(says), std::string::npos) << what << ": " << s.error_message();
    std::cout << what << ": " << s.error_message() << "\n";
  };
  // Calls without the run's secret (`longhaul local` made one) are refused before they are read: a
  // plain gRPC client is cut off at the gate, a client of another secret leaves it; past the gate,
  // an unsigned call, a signed call replayed, one signed long ago, and a signature moved onto
  // another request are refused by the call's check.
  const absl::StatusOr<JobSecret> secret = JobSecret::Load((out / ".secret").string());
  ASSERT_TRUE(secret.ok()) << secret.status();
  const std::string other_path = (out / "other.secret").string();
  ASSERT_TRUE(JobSecret::WriteNew(other_path).ok());
  const absl::StatusOr<JobSecret> other = JobSecret::Load(other_path);
  ASSERT_TRUE(other.ok()) << other.status();
  proto::HeartbeatRequest beat;
  beat.set_worker_id(-7);  // passes the secret's check, then fails as a worker nobody registered
  proto::HeartbeatReply beat_reply;
  {
    grpc::ClientContext raw_ctx;
    expect_refused("a plain gRPC client",
                   proto::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))
                       ->Heartbeat(&raw_ctx, beat, &beat_reply),
                   grpc::StatusCode::UNAVAILABLE);
    auto wrong = CoordinatorChannel(address, *other, TlsFiles(), grpc::ChannelArguments());
    ASSERT_TRUE(wrong.ok());
    grpc::ClientContext ctx2;
    expect_refused("a client of another secret",
                   proto::Coordinator::NewStub(*wrong)->Heartbeat(&ctx2, beat, &beat_reply),
                   grpc::StatusCode::UNAUTHENTICATED, "holds another job secret");
    auto through_gate = UnsignedCoordinatorChannel(address, *secret, TlsFiles(), grpc::ChannelArguments());
    ASSERT_TRUE(through_gate.ok());
    auto plain = proto::Coordinator::NewStub(*through_gate);
    grpc::ClientContext ctx;
    expect_refused("an unsigned call", plain->Heartbeat(&ctx, beat, &beat_reply), grpc::StatusCode::UNAUTHENTICATED,
                   "carries no proof");
    const std::string method = "/longhaul.proto.Coordinator/Heartbeat";
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    const std::string signed_now = SignCall(*secret, method, beat, now_ms, std::string(kNonceBytes, 'a'));
    for (grpc::StatusCode code : {grpc::StatusCode::NOT_FOUND, grpc::StatusCode::UNAUTHENTICATED}) {
      grpc::ClientContext c;
      c.AddMetadata(kRpcAuthKey, signed_now);
      expect_refused(code == grpc::StatusCode::NOT_FOUND ? "a signed call" : "the same call replayed",
                     plain->Heartbeat(&c, beat, &beat_reply), code);
    }
    grpc::ClientContext old_ctx;
    old_ctx.AddMetadata(kRpcAuthKey, SignCall(*secret, method, beat, now_ms - 400'000, std::string(kNonceBytes, 'b')));
    expect_refused("a call signed 400 s ago", plain->Heartbeat(&old_ctx, beat, &beat_reply),
                   grpc::StatusCode::UNAUTHENTICATED);
    proto::HeartbeatRequest moved = beat;
    moved.set_worker_id(0);
    grpc::ClientContext moved_ctx;
    moved_ctx.AddMetadata(kRpcAuthKey, SignCall(*secret, method, beat, now_ms, std::string(kNonceBytes, 'c')));
    expect_refused("a signature moved onto another request", plain->Heartbeat(&moved_ctx, moved, &beat_reply),
                   grpc::StatusCode::UNAUTHENTICATED);
  }
  // From here a holder of the secret with a key of its own, registered as a spare (the rogue): it
  // speaks for itself only. Whatever it says for a worker of the plan is refused by that worker's
  // key; what it says for itself is checked as any worker's word.
  const auto rogue_key = std::make_shared<const WorkerKey>(*WorkerKey::Generate());
  auto channel = CoordinatorChannel(address, *secret, TlsFiles(), grpc::ChannelArguments(), rogue_key);
  ASSERT_TRUE(channel.ok());
  auto coordinator = proto::Coordinator::NewStub(*channel);
  proto::Empty empty;
  auto registration = [&](const std::string& address_text) {
    proto::RegisterRequest reg;
    reg.set_protocol_version(kProtocolVersion);
    reg.set_address(address_text);
    reg.set_public_key(rogue_key->public_key());
    return reg;
  };
  int rogue = -1;
  {
    grpc::ClientContext ctx;
    proto::RegisterReply reply;
    const grpc::Status st = coordinator->Register(&ctx, registration("127.0.0.1:1"), &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
    rogue = reply.worker_id();
    ASSERT_GE(rogue, 4);
  }
  const std::string forged = "is not signed with the key worker";
  {
    // Worker 0's lifeline, held by the rogue, would cut worker 0 off when it closes.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    proto::LifelineRequest req;
    req.set_worker_id(0);
    auto lifeline = coordinator->Lifeline(&ctx, req);
    proto::LifelineNews news;
    EXPECT_FALSE(lifeline->Read(&news));
    expect_refused("worker 0's lifeline held by another", lifeline->Finish(), grpc::StatusCode::UNAUTHENTICATED,
                   "speaks for worker 0 but " + forged);
  }
  // A worker's report that it is done (with a timeline of `timeline_bytes`), refused with `code`.
  auto done_refused = [&](const char* what, int id, bool ok, uint64_t timeline_bytes, grpc::StatusCode code,
                          const std::string& says = "") {
    grpc::ClientContext ctx;
    proto::DoneReport done;
    done.set_worker_id(id);
    done.set_ok(ok);
    done.set_error("forged");
    done.set_timeline_bytes(timeline_bytes);
    expect_refused(what, coordinator->ReportDone(&ctx, done, &empty), code, says);
  };
  // Reports about a worker's own state come from that worker alone: a failure or an end said for
  // worker 1 would stop the job, a heartbeat keep a dead one in it.
  done_refused("worker 1's failure, reported by another", 1, false, 0, grpc::StatusCode::UNAUTHENTICATED,
               "speaks for worker 1 but " + forged);
  done_refused("worker 1 done mid-run, said by another", 1, true, 0, grpc::StatusCode::UNAUTHENTICATED, forged);
  {
    grpc::ClientContext ctx;
    proto::HeartbeatRequest hb;
    hb.set_worker_id(2);
    proto::HeartbeatReply reply;
    expect_refused("worker 2's heartbeat, sent by another", coordinator->Heartbeat(&ctx, hb, &reply),
                   grpc::StatusCode::UNAUTHENTICATED, forged);
  }
  for (int id : {0, 3}) {
    grpc::ClientContext ctx;
    proto::IterationReport rep;
    rep.set_worker_id(id);
    rep.set_plan_version(1);
    rep.set_iteration(2);
    expect_refused("a placed worker's iteration, reported by another", coordinator->ReportIteration(&ctx, rep, &empty),
                   grpc::StatusCode::UNAUTHENTICATED, forged);
  }
  {
    grpc::ClientContext ctx;
    proto::CheckpointReport ck;
    ck.set_worker_id(0);
    ck.set_plan_version(1);
    ck.set_step(2);
    expect_refused("worker 0's checkpoint, reported by another", coordinator->ReportCheckpoint(&ctx, ck, &empty),
                   grpc::StatusCode::UNAUTHENTICATED, forged);
  }
  {
    // A peer's suspicion may come from any worker of the plan, never from one outside it, and only
    // makes the coordinator check (a false one costs nothing: see the run's end below).
    grpc::ClientContext ctx;
    proto::SuspectReport suspect;
    suspect.set_worker_id(rogue);
    suspect.set_stage(1);
    suspect.set_plan_version(1);
    suspect.set_failure("connection reset by peer");
    expect_refused("a spare's report of a placed worker", coordinator->ReportSuspect(&ctx, suspect, &empty),
                   grpc::StatusCode::FAILED_PRECONDITION, "has no place in plan version 1");
  }
  done_refused("done report of worker 1000", 1000, false, 0, grpc::StatusCode::NOT_FOUND);
  {
    grpc::ClientContext ctx;
    proto::HeartbeatRequest hb;
    hb.set_worker_id(-5);
    proto::HeartbeatReply reply;
    expect_refused("heartbeat of worker -5", coordinator->Heartbeat(&ctx, hb, &reply), grpc::StatusCode::NOT_FOUND);
  }
  // The rogue's word for itself: the checks of its content run as for any worker (each one's every
  // case against crafted reports in report_checks_test, checkpoint_index_test and job_test).
  {
    grpc::ClientContext ctx;
    proto::IterationReport rep;
    rep.set_worker_id(rogue);
    rep.set_plan_version(1);
    rep.set_iteration(2);
    expect_refused("a spare's report of an iteration", coordinator->ReportIteration(&ctx, rep, &empty),
                   grpc::StatusCode::FAILED_PRECONDITION, "has no place in plan version 1");
  }
  done_refused("a timeline of 1 TiB", rogue, true, uint64_t{1} << 40, grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext ctx;
    proto::CheckpointReport ck;
    ck.set_worker_id(rogue);
    ck.set_plan_version(1);
    ck.set_step(2);
    expect_refused("a spare's checkpoint", coordinator->ReportCheckpoint(&ctx, ck, &empty),
                   grpc::StatusCode::FAILED_PRECONDITION, "has no place in plan version 1");
  }
  // What every file shipped in parts is checked for (the coordinator's CheckPart and ReceivePart):
  // `chunk`, a whole file of 4 bytes, grown to 1 TiB; its part at byte 4 with none before; a part
  // longer than its file. `ship` sends each and expects the code.
  auto refuse_bad_parts = [](const std::string& what, const auto& chunk, const auto& ship) {
    auto c = chunk;
    c.set_file_bytes(uint64_t{1} << 40);
    ship(("a " + what + " of 1 TiB").c_str(), c, grpc::StatusCode::RESOURCE_EXHAUSTED);
    c = chunk;
    c.set_file_bytes(8);
    c.set_offset(4);
    ship(("a " + what + "'s part after one never sent").c_str(), c, grpc::StatusCode::FAILED_PRECONDITION);
    c = chunk;
    c.set_data(std::string(8, 'x'));
    ship(("a " + what + "'s part longer than its file").c_str(), c, grpc::StatusCode::INVALID_ARGUMENT);
  };
  {
    // Checkpoint pieces shipped into the run directory: each part is checked against the plan
    // before a byte is written.
    proto::CheckpointChunk chunk;
    chunk.set_worker_id(rogue);
    chunk.set_plan_version(1);
    chunk.set_step(2);
    chunk.set_piece("stage_0_shard_0");
    chunk.set_file("model.safetensors");
    chunk.set_file_bytes(4);
    chunk.set_data("abcd");
    auto ship = [&](const char* what, proto::CheckpointChunk c, grpc::StatusCode code, const std::string& says = "") {
      grpc::ClientContext ctx;
      expect_refused(what, coordinator->ShipCheckpoint(&ctx, c, &empty), code, says);
    };
    // The coordinator's memory stays flat under parts it refuses, each of 3 MiB (a part is at most
    // 1 MiB): after 20 of them (gRPC's and the allocator's buffers for such messages), 200 more,
    // which a coordinator keeping even half of each would grow by 300 MiB. The bound leaves room
    // for what the training beside them and the allocator's per-thread arenas take: gRPC's
    // threads each keep freed 3 MiB buffers for the next, and the full suite's load spreads the
    // calls over more threads (what arenas keep is bounded by the threads, not by the parts).
    pid_t coordinator_pid = 0;
    {
      const std::string log = Log(out), mark = "coordinator (pid ";
      const size_t at = log.find(mark);
      ASSERT_NE(at, std::string::npos) << log;
      coordinator_pid = std::stoi(log.substr(at + mark.size()));
    }
    proto::CheckpointChunk big = chunk;
    big.set_file_bytes(3 << 20);
    big.set_data(std::string(3 << 20, 'x'));
    ship("a part of 3 MiB", big, grpc::StatusCode::FAILED_PRECONDITION, "has no place in plan version 1");
    int64_t rss_before = 0;
    for (int i = 0; i < 220; ++i) {
      if (i == 20) rss_before = testing::ResidentBytes(coordinator_pid);
      grpc::ClientContext ctx;
      ASSERT_EQ(coordinator->ShipCheckpoint(&ctx, big, &empty).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    }
    const int64_t rss_after = testing::ResidentBytes(coordinator_pid);
    std::cout << "coordinator resident memory: " << rss_before / (1 << 20) << " MiB after 20 refused parts of 3 MiB, "
              << rss_after / (1 << 20) << " MiB after 200 more\n";
    EXPECT_LT(rss_after - rss_before, 128 << 20);
    proto::CheckpointChunk c = chunk;
    c.set_piece("../../../../tmp/stage_0_shard_0");
    ship("a piece outside the run directory", c, grpc::StatusCode::INVALID_ARGUMENT);
    c = chunk;
    c.set_worker_id(0);
    ship("worker 0's shard, shipped by another", c, grpc::StatusCode::UNAUTHENTICATED, forged);
    EXPECT_FALSE(fs::exists(out / "checkpoints" / "stage_0_shard_0" / "step_00000002")) << "a refused part was written";
    grpc::ClientContext ctx;
    proto::CheckpointFetch fetch;
    fetch.set_worker_id(rogue);
    fetch.set_plan_version(1);
    fetch.set_piece("stage_0_shard_0");
    fetch.set_file("model.safetensors");
    proto::CheckpointChunk reply;
    expect_refused("a fetch by a spare under a plan that resumes from no checkpoint",
                   coordinator->FetchCheckpoint(&ctx, fetch, &reply), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    // A timeline shipped by a worker off the run directory: into a file the coordinator names,
    // within a size bound, part after part.
    proto::TimelineChunk chunk;
    chunk.set_worker_id(rogue);
    chunk.set_file_bytes(4);
    chunk.set_data("{}  ");
    auto ship = [&](const char* what, const proto::TimelineChunk& c, grpc::StatusCode code) {
      grpc::ClientContext ctx;
      expect_refused(what, coordinator->ShipTimeline(&ctx, c, &empty), code);
    };
    proto::TimelineChunk c = chunk;
    c.set_worker_id(77);
    ship("a timeline of worker 77", c, grpc::StatusCode::NOT_FOUND);
    c.set_worker_id(0);
    ship("worker 0's timeline, shipped by another", c, grpc::StatusCode::UNAUTHENTICATED);
    refuse_bad_parts("timeline", chunk, ship);
    // A file's second part, of 1 MiB, shipped eight times at once (a call and its retries): one is
    // written, the others are refused, and the file holds each byte once.
    const fs::path timeline = out / "timeline" / absl::StrFormat("worker_%d.json", rogue);
    for (int trial = 0; trial < 10; ++trial) {
      proto::TimelineChunk first = chunk, second = chunk;
      const std::string spaces(1 << 20, ' ');
      first.set_file_bytes(2 + spaces.size());
      first.set_data("{}");
      second.set_file_bytes(2 + spaces.size());
      second.set_offset(2);
      second.set_data(spaces);
      grpc::ClientContext ctx;
      ASSERT_TRUE(coordinator->ShipTimeline(&ctx, first, &empty).ok());
      std::atomic<int> written{0};
      std::vector<std::thread> retries;
      for (int i = 0; i < 8; ++i) {
        retries.emplace_back([&] {
          grpc::ClientContext ctx;
          proto::Empty none;
          if (coordinator->ShipTimeline(&ctx, second, &none).ok()) ++written;
        });
      }
      for (std::thread& t : retries) t.join();
      EXPECT_EQ(written.load(), 1) << "trial " << trial;
      std::ifstream f(timeline, std::ios::binary);
      EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "{}" + spaces) << "trial " << trial;
    }
    EXPECT_FALSE(fs::exists(timeline.string() + ".part")) << "a refused part was written";
  }
  {
    grpc::ClientContext ctx;
    proto::ProfileReport profile;
    profile.set_worker_id(77);
    profile.mutable_compute()->set_block_forward_s(std::nan(""));
    expect_refused("a profile of worker 77", coordinator->ReportProfile(&ctx, profile, &empty),
                   grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    proto::ProfileReport profile;
    profile.set_worker_id(rogue);
    profile.mutable_compute()->set_block_forward_s(-1);
    expect_refused("a spare's profile of a negative time", coordinator->ReportProfile(&ctx, profile, &empty),
                   grpc::StatusCode::INVALID_ARGUMENT, "reports a compute time of -1 s");
  }
  {
    grpc::ClientContext ctx;
    proto::LinkReport links;
    links.set_worker_id(rogue);
    proto::LinkMeasurement* m = links.add_links();
    m->set_to_worker(1);
    m->set_round_trip_s(-3);
    expect_refused("links after the plan", coordinator->ReportLinks(&ctx, links, &empty),
                   grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    proto::LinkReport links;
    links.set_worker_id(-4);
    expect_refused("links of worker -4", coordinator->ReportLinks(&ctx, links, &empty), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    proto::RegisterRequest reg = registration("127.0.0.1:1");
    reg.set_slot(99);
    proto::RegisterReply reply;
    expect_refused("a fifth worker for slot 99", coordinator->Register(&ctx, reg, &reply),
                   grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext ctx;
    proto::RegisterRequest reg = registration("127.0.0.1:1");
    reg.set_public_key(std::string(kPublicKeyBytes, 'k'));
    proto::RegisterReply reply;
    expect_refused("a registration of a key the caller does not hold", coordinator->Register(&ctx, reg, &reply),
                   grpc::StatusCode::UNAUTHENTICATED, "not signed with the key it registers");
  }
  {
    // Spares, up to cluster.spares (4, the rogue among them); they never report a profile, so none
    // takes a place, and once silent they are dropped without touching the run.
    proto::RegisterReply reply;
    for (int i = 0; i < 3; ++i) {
      grpc::ClientContext ctx;
      EXPECT_TRUE(coordinator->Register(&ctx, registration("127.0.0.1:1"), &reply).ok()) << "spare " << i;
    }
    grpc::ClientContext ctx;
    expect_refused("a fifth spare", coordinator->Register(&ctx, registration("127.0.0.1:1"), &reply),
                   grpc::StatusCode::RESOURCE_EXHAUSTED);
    // The plan's barrier counts the workers it places: a spare's word would open it early, or
    // (the workers in) never.
    grpc::ClientContext ready_ctx;
    proto::ReadyRequest ready;
    ready.set_worker_id(reply.worker_id());
    ready.set_plan_version(1);
    proto::ReadyReply ready_reply;
    expect_refused("a spare ready for the plan", coordinator->Ready(&ready_ctx, ready, &ready_reply),
                   grpc::StatusCode::FAILED_PRECONDITION, "has no place in plan version 1");
  }
  {
    grpc::ClientContext ctx;
    proto::RegisterReply reply;
    expect_refused("a registration with a 1 MiB address",
                   coordinator->Register(&ctx, registration("127.0.0.1:" + std::string(1 << 20, '7')), &reply),
                   grpc::StatusCode::INVALID_ARGUMENT);
  }
  for (auto [what, reporter, stage, version, code] :
       {std::tuple{"a suspect report from worker 1000", 1000, 1, 1, grpc::StatusCode::NOT_FOUND},
        std::tuple{"a suspect report of stage 7 by a spare", rogue, 7, 1, grpc::StatusCode::FAILED_PRECONDITION},
        std::tuple{"a suspect report under plan version 9", rogue, 1, 9, grpc::StatusCode::FAILED_PRECONDITION}}) {
    grpc::ClientContext ctx;
    proto::SuspectReport suspect;
    suspect.set_worker_id(reporter);
    suspect.set_stage(stage);
    suspect.set_plan_version(version);
    expect_refused(what, coordinator->ReportSuspect(&ctx, suspect, &empty), code);
  }
  ASSERT_EQ(run.get(), 0) << Log(out);
  const std::vector<MetricsRow> rows = Metrics(out);
  ASSERT_EQ(rows.size(), 1000u) << Log(out);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].step, static_cast<int64_t>(i + 1));
}

// A coordinator awaiting its workers' link probes refuses a link report of a negative, NaN or
// absurd card egress or link, and takes the honest one; once planned it takes no more.
TEST(Cluster, CraftedLinkReportsAreRefusedByACoordinatorAwaitingLinks) {
  const fs::path out = Dir("crafted_links");
  const std::string secret_path = (out / ".secret").string();
  ASSERT_TRUE(JobSecret::WriteNew(secret_path).ok());
  const absl::StatusOr<JobSecret> secret = JobSecret::Load(secret_path);
  ASSERT_TRUE(secret.ok()) << secret.status();
  const fs::path port_file = out / "port";
  Reaper coordinator_process{Start("coordinator", out, {"cluster.stages=2", "cluster.link_probe=\"on\""},
                                   {"--listen", "127.0.0.1:0", "--port-file", port_file.string(), "--secret-file",
                                    secret_path})};
  const int port = PortFrom(port_file);
  ASSERT_GT(port, 0) << Log(out);
  // Two workers at two addresses, each speaking with a key of its own, both profiled: the
  // coordinator now waits for their links.
  std::vector<std::unique_ptr<proto::Coordinator::Stub>> as;
  std::vector<int> ids;
  for (const char* address : {"127.0.0.1:1", "127.0.0.2:1"}) {
    const auto key = std::make_shared<const WorkerKey>(*WorkerKey::Generate());
    auto channel = CoordinatorChannel(absl::StrCat("127.0.0.1:", port), *secret, TlsFiles(),
                                      grpc::ChannelArguments(), key);
    ASSERT_TRUE(channel.ok()) << channel.status();
    as.push_back(proto::Coordinator::NewStub(*channel));
    proto::RegisterRequest reg;
    reg.set_protocol_version(kProtocolVersion);
    reg.set_address(address);
    reg.set_public_key(key->public_key());
    proto::RegisterReply reply;
    grpc::ClientContext ctx;
    const grpc::Status st = as.back()->Register(&ctx, reg, &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_TRUE(reply.probe_links());
    ids.push_back(reply.worker_id());
  }
  proto::Empty empty;
  for (int k = 0; k < 2; ++k) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(as[k]->ReportProfile(&ctx, Profiled(ids[k]), &empty).ok());
  }
  auto report = [&](int k, double egress, double round_trip_s, double bytes_per_s, bool card_to_come = false) {
    proto::LinkReport links;
    links.set_worker_id(ids[k]);
    links.set_egress_bytes_per_s(egress);
    links.set_card_to_come(card_to_come);
    proto::LinkMeasurement* m = links.add_links();
    m->set_to_worker(ids[1 - k]);
    m->set_round_trip_s(round_trip_s);
    m->set_bytes_per_s(bytes_per_s);
    grpc::ClientContext ctx;
    return as[k]->ReportLinks(&ctx, links, &empty);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Crafted {
    const char* what;
    double egress, round_trip_s, bytes_per_s;
    const char* says;
  };
  for (const Crafted& c : std::vector<Crafted>{
           {"a negative card egress", -1e8, 0.02, 1.25e8, "reports an egress of -1e+08 bytes/s"},
           {"a NaN card egress", nan, 0.02, 1.25e8, "reports an egress of nan bytes/s"},
           {"an endless card egress", 1e300, 0.02, 1.25e8, "reports an egress of 1e+300 bytes/s"},
           {"a NaN round trip", 0, nan, 1.25e8, "round trips must be positive"},
           {"a link of no rate", 0, 0.02, 0, "rates positive and finite"}}) {
    const grpc::Status st = report(0, c.egress, c.round_trip_s, c.bytes_per_s);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(c.says), std::string::npos) << c.what << ": " << st.error_message();
  }
  // The barrier between the probes' phases: worker 0's links all at once, its card to come, hold
  // GetPeers with after_links until worker 1 reports too, and the plan until worker 0's card does
  // (worker 1 may still report: no plan yet). The honest reports (worker 0 saw its card, worker 1
  // none) make the plan; a report after it is refused as late.
  auto peers_after_links = [&](int k) {
    proto::PeersRequest req;
    req.set_worker_id(ids[k]);
    req.set_after_links(true);
    proto::Peers peers;
    grpc::ClientContext ctx;
    return as[k]->GetPeers(&ctx, req, &peers);
  };
  EXPECT_TRUE(report(0, 0, 0.02, 1.0e8, /*card_to_come=*/true).ok());
  const grpc::Status early = peers_after_links(0);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::NOT_FOUND) << early.error_message();
  EXPECT_NE(early.error_message().find("not every worker has reported its links"), std::string::npos)
      << early.error_message();
  EXPECT_TRUE(report(1, 0, 0.02, 1.25e8).ok());
  const grpc::Status released = peers_after_links(0);
  EXPECT_TRUE(released.ok()) << released.error_message();
  EXPECT_TRUE(report(1, 0, 0.02, 1.25e8).ok()) << "no plan before worker 0's card";
  EXPECT_TRUE(report(0, 1.0e8, 0.02, 1.25e8).ok());
  const grpc::Status late = report(0, 1.0e8, 0.02, 1.25e8);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << late.error_message();
  EXPECT_NE(late.error_message().find("after the plan was made"), std::string::npos) << late.error_message();
}

// Every live attack of the tests above at once, against one 2 x 2 run: a stranger's HTTP/2 on the
// coordinator's port (an endless CONTINUATION chain, 100 large unsigned calls, 200 connections of
// header floods) and garbage on every worker's tensor port; members of the job (spares with keys of
// their own) sending as other workers' places (activations, a whole one with a valid checksum, a
// gradient push), holding more idle connections than their share, saying hello with keys the job
// never registered, and speaking to the coordinator for placed workers (worker 0's failure, worker
// 1's end, worker 2's heartbeat, worker 3's iteration and lifeline). Each is refused, and the run
// ends with the undisturbed run's losses, bitwise.
TEST(Cluster, EveryLiveAttackAtOnceLeavesTheLossesBitwiseTheUndisturbedRuns) {
  constexpr int kSteps = 4000;  // long enough to outlast every attack (each one's full measure is its own test's)
  const std::vector<double>& calm = CalmLosses(kSteps);
  ASSERT_EQ(calm.size(), static_cast<size_t>(kSteps));
  const fs::path out = Dir("besieged");
  auto run = std::async(std::launch::async, [&] { return Longhaul("local", out, TwoByTwo(kSteps)); });
  const nlohmann::json cluster = WaitForCluster(out);
  ASSERT_FALSE(cluster.is_null()) << Log(out);
  const nlohmann::json victim = WorkerAt(cluster, 1, 0), sender = WorkerAt(cluster, 0, 0),
                       other = WorkerAt(cluster, 1, 1);
  ASSERT_FALSE(victim.is_null() || sender.is_null() || other.is_null()) << cluster.dump();
  const std::string address = victim["address"];
  const absl::StatusOr<JobSecret> secret = JobSecret::Load((out / ".secret").string());
  ASSERT_TRUE(secret.ok()) << secret.status();
  // One member sends as others, one holds idle connections: each has a share of its own.
  const Spare spare(out, *secret), hog(out, *secret);
  ASSERT_GE(spare.id(), 4);
  ASSERT_GE(hog.id(), 4);
  int port = 0;
  std::ifstream(out / ".coordinator_port") >> port;
  const std::string coordinator = "127.0.0.1:" + std::to_string(port);
  const std::string log = Log(out), mark = "coordinator (pid ";
  ASSERT_NE(log.find(mark), std::string::npos) << log;
  const pid_t coordinator_pid = std::stoi(log.substr(log.find(mark) + mark.size()));
  const int64_t rss_before = testing::ResidentBytes(coordinator_pid);
  const uint64_t boundary = 2 * 16 * 32;  // micro_batch_size x seq_len x d_model
  const int64_t next = static_cast<int64_t>(Metrics(out).size());
  std::cout << "the attacks start at step " << next << "\n";

  std::atomic<int> refused{0};
  std::atomic<bool> attacking{true};
  std::atomic<int64_t> rss_peak{rss_before};
  std::vector<std::unique_ptr<testing::RawPeer>> held;  // the member's idle connections, to the end
  testing::h2::FloodResult chain, calls, headers;
  std::vector<std::thread> attacks;
  attacks.emplace_back([&] { chain = testing::h2::ContinuationChain(coordinator, 100 << 20); });
  attacks.emplace_back([&] {
    calls = testing::h2::LargeCalls(coordinator, "/longhaul.proto.Coordinator/ShipCheckpoint", 100, 4000000);
  });
  attacks.emplace_back([&] {
    headers = testing::h2::HeadersFlood(coordinator, 200, 25, 20, 200,
                                        [] { std::this_thread::sleep_for(std::chrono::seconds(1)); });
  });
  attacks.emplace_back([&] {
    for (int round = 0; round < 5; ++round)
      for (const nlohmann::json& w : cluster["workers"]) {
        EXPECT_TRUE(testing::GarbageConnectionIsClosed(w["address"])) << w.dump();
        ++refused;
      }
  });
  attacks.emplace_back([&] {  // another place's tensors, each refused naming both workers
    for (int64_t it = next; it < next + 8; ++it) {
      for (auto [kind, stage, replica, owner] :
           {std::tuple{proto::ACTIVATION, 0, 0, &sender}, std::tuple{proto::GRAD_PUSH, 1, 1, &other}}) {
        testing::RawPeer peer(address, "equivalence", *secret, spare.speaker());
        EXPECT_TRUE(peer.hello().ok()) << peer.hello();
        const proto::TensorHeader h = CraftedHeader(kind, 1, it, 0, stage, replica, boundary);
        peer.Write(kind == proto::ACTIVATION ? testing::PartFrame(h, std::vector<float>(boundary, 0.25f))
                                             : testing::HeaderFrame(h));
        const absl::Status s = peer.Ack(std::chrono::seconds(10));
        EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
        EXPECT_NE(s.message().find(absl::StrCat("worker ", (*owner)["worker"].get<int>())), std::string::npos) << s;
        ++refused;
      }
    }
  });
  attacks.emplace_back([&] {  // idle connections beyond the member's share
    for (int i = 0; i < 64; ++i) {
      auto peer = std::make_unique<testing::RawPeer>(address, "equivalence", *secret, hog.speaker(), "127.0.0.2");
      if (peer->hello().ok()) {
        held.push_back(std::move(peer));
      } else {
        EXPECT_EQ(peer->hello().code(), absl::StatusCode::kResourceExhausted) << peer->hello();
        ++refused;
      }
    }
  });
  attacks.emplace_back([&] {  // hellos of keys the job never registered, each waited on a moment, at once
    std::vector<std::future<absl::Status>> strangers;
    for (int i = 0; i < 16; ++i) {
      strangers.push_back(std::async(std::launch::async, [&, i] {
        return testing::RawPeer(address, "equivalence", *secret, {2000 + i, nullptr}).hello();
      }));
    }
    for (auto& hello : strangers) {
      const absl::Status s = hello.get();
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
      ++refused;
    }
  });
  attacks.emplace_back([&] {  // the member's word for placed workers, refused by their keys
    proto::Coordinator::Stub& stub = spare.coordinator();
    proto::Empty empty;
    auto expect_forged = [&](const char* what, const grpc::Status& st) {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << what << ": " << st.error_message();
      EXPECT_NE(st.error_message().find("is not signed with the key worker"), std::string::npos)
          << what << ": " << st.error_message();
      ++refused;
    };
    for (int round = 0; round < 8; ++round) {
      for (auto [id, ok] : {std::pair{0, false}, std::pair{1, true}}) {
        grpc::ClientContext ctx;
        proto::DoneReport done;
        done.set_worker_id(id);
        done.set_ok(ok);
        done.set_error("forged");
        expect_forged("another worker's done report", stub.ReportDone(&ctx, done, &empty));
      }
      {
        grpc::ClientContext ctx;
        proto::HeartbeatRequest beat;
        beat.set_worker_id(2);
        proto::HeartbeatReply reply;
        expect_forged("worker 2's heartbeat", stub.Heartbeat(&ctx, beat, &reply));
      }
      {
        grpc::ClientContext ctx;
        proto::IterationReport rep;
        rep.set_worker_id(3);
        rep.set_plan_version(1);
        rep.set_iteration(next + round);
        expect_forged("worker 3's iteration", stub.ReportIteration(&ctx, rep, &empty));
      }
      {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        proto::LifelineRequest req;
        req.set_worker_id(3);
        auto lifeline = stub.Lifeline(&ctx, req);
        proto::LifelineNews news;
        EXPECT_FALSE(lifeline->Read(&news));
        expect_forged("worker 3's lifeline", lifeline->Finish());
      }
    }
  });
  std::thread sampler([&] {
    while (attacking) {
      rss_peak = std::max(rss_peak.load(), testing::ResidentBytes(coordinator_pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  for (std::thread& t : attacks) t.join();
  attacking = false;
  sampler.join();
  const size_t steps_during = Metrics(out).size();
  std::cout << refused << " crafted connections and calls refused; the member holds " << held.size()
            << " idle connections; the stranger wrote "
            << (chain.sent + calls.sent + headers.sent) / (1 << 20) << " MiB on "
            << chain.connections + calls.connections + headers.connections
            << " connections; the coordinator's resident memory " << rss_before / (1 << 20) << " MiB before, "
            << rss_peak / (1 << 20) << " MiB at the peak; the run was at step " << steps_during << "\n";
  EXPECT_LT(steps_during, static_cast<size_t>(kSteps)) << "the run ended before the attacks did";
  EXPECT_LE(held.size(), 16u) << "a member holds more than its share";
  held.clear();
  ASSERT_EQ(run.get(), 0) << Log(out);
  EXPECT_EQ(Losses(out), calm) << "the losses differ from the undisturbed run's";
  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << Log(out);
  for (const nlohmann::json& r : summary["recoveries"]) std::cout << "plan change: " << r.dump() << "\n";
}

// A worker that dies is named with the evidence (its tensor port refuses connections once its
// lifeline closed, or its silence), and where no layout can run without it (a one-worker job, no
// spare) the job's message does not promise a checkpoint that was never written.
TEST(Cluster, ADeadWorkerIsNamedAndTheAdviceFitsTheCheckpoints) {
  const fs::path out = Dir("dead");
  auto run = std::async(std::launch::async, [&] {
    return Longhaul("local", out,
                    {"cluster.stages=1", "cluster.replicas=1", "train.micro_batches=4", "train.steps=100000",
                     "cluster.heartbeat_s=0.5", "cluster.dead_after_s=3", "cluster.spare_wait_s=0"});
  });
  const nlohmann::json cluster = WaitForCluster(out);
  ASSERT_FALSE(cluster.is_null()) << Log(out);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(cluster["workers"][0]["pid"].get<int>(), SIGKILL), 0);
  EXPECT_NE(run.get(), 0);
  const std::string log = Log(out);
  EXPECT_NE(log.find("worker 0 (stage 0, replica 0 at"), std::string::npos) << log;
  EXPECT_NE(log.find("the layout cannot shrink (no worker is left of the 1 stages"), std::string::npos) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("its tensor port refuses connections|sent no heartbeat"))) << log;
  EXPECT_NE(log.find("start the job again from the beginning: no checkpoint was written yet"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("resume from the last checkpoint"), std::string::npos) << log;
}

// A worker killed mid-run is named within a few heartbeats, long before the silence that loses any
// worker (cluster.dead_after_s, here 600 s): its lifeline to the coordinator and the connections it
// had opened to its peers close (the peers report it), and its silence since confirms it. No spare
// waits (cluster.spare_wait_s = 0): the layout shrinks to one replica of 4 micro-batches, the run
// goes back to its last checkpoint (a shard of the lost worker read by another) and completes with
// every global micro-batch of every step run once. The one replica pushes each of the two job
// replicas' gradients on its own, so the final parameters are the uninterrupted run's bit for bit;
// so are the losses up to the rollback, and after it up to the order the report sums its
// micro-batches' losses in.
TEST(Cluster, AKilledWorkerIsNamedByTheConnectionsItClosedAndWithoutASpareTheLayoutShrinks) {
  const std::vector<std::string> sets = {"cluster.stages=2",       "cluster.replicas=2",        "train.micro_batches=2",
                                         "train.steps=60",         "train.checkpoint_every=5",  "cluster.dead_after_s=600",
                                         "transport.timeout_s=600", "cluster.spare_wait_s=0"};
  const fs::path calm = Dir("killed_calm"), out = Dir("killed");
  ASSERT_EQ(Longhaul("local", calm, sets), 0) << Log(calm);
  const pid_t launcher = Start("local", out, sets);
  ASSERT_GT(launcher, 0);
  Reaper reaper{launcher};
  const nlohmann::json cluster = WaitForCluster(out);
  ASSERT_FALSE(cluster.is_null()) << Log(out);
  WaitForSteps(out, 12);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(cluster["workers"][3]["pid"].get<int>(), SIGKILL), 0);
  const int status = WaitFor(launcher, std::chrono::seconds(120));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = Log(out);
  ASSERT_NE(status, -1) << "still running 120 s after a worker was killed\n" << log;
  reaper.pid = 0;
  std::cout << "the job completed " << took << " s after worker 3 was killed\n";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  const std::regex named(
      R"(worker 3 \(stage \d+, replica \d+ at [^)]*\) closed its connection to (worker \d+ mid-run|the coordinator))");
  EXPECT_TRUE(std::regex_search(log, named)) << log;
  EXPECT_NE(log.find("1 replicas of 4 micro-batches each instead of 2"), std::string::npos) << log;

  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << log;
  EXPECT_EQ(summary["status"], "completed") << summary.dump(2);
  EXPECT_EQ(summary["audit"]["steps"], 60) << summary.dump(2);
  EXPECT_EQ(summary["audit"]["lost"], 0) << summary.dump(2);
  EXPECT_EQ(summary["audit"]["repeated"], 0) << summary.dump(2);
  const nlohmann::json changes = testing::WithoutRestarts(summary["recoveries"]);
  ASSERT_EQ(changes.size(), 1u) << summary.dump(2);
  const nlohmann::json& event = changes[0];
  EXPECT_EQ(event["worker"], 3) << event.dump();
  EXPECT_EQ(event["shrunk_to_replicas"], 1) << event.dump();
  const int64_t rollback = event["rollback_to_step"].get<int64_t>();
  EXPECT_GE(rollback, 10) << event.dump();

  const std::vector<MetricsRow> before = Metrics(calm), after = Metrics(out);
  ASSERT_EQ(before.size(), 60u);
  ASSERT_EQ(after.size(), 60u) << log;
  for (int64_t i = 0; i < rollback; ++i) EXPECT_EQ(after[i].loss, before[i].loss) << "step " << i + 1;
  double worst = 0;
  for (size_t i = rollback; i < after.size(); ++i) {
    worst = std::max(worst, std::abs(after[i].loss - before[i].loss) / before[i].loss);
  }
  std::cout << "after the shrink at step " << rollback << " the losses differ from the uninterrupted run's by "
            << worst << " (relative) at most; final " << after.back().loss << " against " << before.back().loss
            << "\n";
  EXPECT_LT(worst, 1e-12);
  EXPECT_TRUE(testing::LatestParams(out) == testing::LatestParams(calm))
      << "the final parameters differ from the uninterrupted run's";
}

// A stop reaches every worker within a heartbeat and cancels its sends: a worker whose sends
// cannot reach their peer does not wait out transport.timeout_s once the job is stopped. Here
// worker 0 (replica 0, the central parameter server) dials replica 1 at a port where nobody
// listens, so its first parameter broadcast waits for the peer; then the coordinator is stopped.
TEST(Cluster, AStopEndsAWorkerBlockedOnSendsWithinAHeartbeat) {
  const fs::path out = Dir("stop");
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const int replica1_port = ports[0], nowhere = ports[1];
  std::ofstream(out / "dial_map") << "127.0.0.1:" << replica1_port << " 127.0.0.1:" << nowhere << "\n";
  const std::string port_file = (out / "port").string();
  const pid_t coordinator = Start("coordinator", out,
                                  {"cluster.replicas=2", "cluster.ps=central", "train.steps=100000",
                                   "cluster.heartbeat_s=0.5", "cluster.dead_after_s=3", "transport.timeout_s=60"},
                                  {"--listen", "127.0.0.1:0", "--port-file", port_file});
  int port = 0;
  for (int i = 0; i < 100 && !(std::ifstream(port_file) >> port); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GT(port, 0) << Log(out);
  const std::string at = "127.0.0.1:" + std::to_string(port);
  const pid_t w0 = Spawn({LONGHAUL_BINARY, "worker", "--coordinator", at, "--dial-map", (out / "dial_map").string()},
                         out / "worker0.txt");
  for (int i = 0; i < 100 && Log(out).find("worker 0 registered") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t w1 = Spawn({LONGHAUL_BINARY, "worker", "--coordinator", at, "--listen",
                          "127.0.0.1:" + std::to_string(replica1_port)},
                         out / "worker1.txt");
  std::this_thread::sleep_for(std::chrono::seconds(3));  // both set up; worker 0 waits on its send
  ASSERT_EQ(WaitFor(w0, std::chrono::seconds(0)), -1) << "worker 0 should still be running";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(coordinator, SIGTERM), 0);
  const int status = WaitFor(w0, std::chrono::seconds(50));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (pid_t p : {w0, w1, coordinator}) kill(p, SIGKILL), waitpid(p, nullptr, 0);
  std::ifstream f(out / "worker0.txt");
  const std::string w0_log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::cout << "worker 0 ended " << took << " s after the coordinator was stopped (heartbeat 0.5 s, "
            << "transport.timeout_s 60)\n";
  ASSERT_NE(status, -1) << "worker 0 still waits on its send\n" << w0_log;
  EXPECT_LT(took, 10) << w0_log;
  EXPECT_NE(w0_log.find("the coordinator stopped the job: interrupted"), std::string::npos) << w0_log;
  EXPECT_EQ(w0_log.find("Deadline Exceeded"), std::string::npos) << w0_log;
}

// With mutual TLS on the coordinator's port (certificates from deploy/make_certs.sh) and a job
// secret on every port, a coordinator and two workers started by hand train to the end; a plaintext
// client, and a TLS client without a certificate the CA signed, do not get a call through.
TEST(Cluster, MutualTlsAndASecretOnEveryPortTrainToTheEnd) {
  const fs::path out = Dir("tls");
  std::ofstream(out / "hosts") << "127.0.0.1\n";
  const fs::path certs = out / "certs";
  const std::string make = std::string("bash ") + LONGHAUL_SOURCE_DIR + "/deploy/make_certs.sh " +
                           (out / "hosts").string() + " " + certs.string() + " >/dev/null";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "deploy/make_certs.sh could not make certificates (openssl?)";
  const std::string secret = (out / "job.secret").string();
  ASSERT_TRUE(JobSecret::WriteNew(secret).ok());
  const std::string cert = (certs / "127.0.0.1.pem").string(), key = (certs / "127.0.0.1.key").string(),
                    ca = (certs / "ca.pem").string();
  const std::vector<std::string> tls = {"--secret-file", secret, "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca};
  std::vector<std::string> coord_args = {"--listen", "127.0.0.1:0", "--port-file", (out / "port").string()};
  coord_args.insert(coord_args.end(), tls.begin(), tls.end());
  const pid_t coordinator = Start("coordinator", out, {"cluster.stages=2", "train.steps=30"}, coord_args);
  int port = 0;
  for (int i = 0; i < 100 && !(std::ifstream(out / "port") >> port); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GT(port, 0) << Log(out);
  const std::string at = "127.0.0.1:" + std::to_string(port);

  proto::HeartbeatRequest beat;
  proto::HeartbeatReply reply;
  grpc::ClientContext plain_ctx;
  plain_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status plain = proto::Coordinator::NewStub(grpc::CreateChannel(at, grpc::InsecureChannelCredentials()))
                                 ->Heartbeat(&plain_ctx, beat, &reply);
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  std::cout << "plaintext client: " << plain.error_message() << "\n";
  const absl::StatusOr<JobSecret> job_secret = JobSecret::Load(secret);
  ASSERT_TRUE(job_secret.ok()) << job_secret.status();
  TlsFiles no_client_cert;
  no_client_cert.ca = ca;
  auto anonymous = CoordinatorChannel(at, *job_secret, no_client_cert, grpc::ChannelArguments());
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  grpc::ClientContext anon_ctx;
  anon_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status anon = proto::Coordinator::NewStub(*anonymous)->Heartbeat(&anon_ctx, beat, &reply);
  EXPECT_EQ(anon.error_code(), grpc::StatusCode::UNAVAILABLE) << anon.error_message();
  std::cout << "TLS client without a certificate: " << anon.error_message() << "\n";

  std::vector<pid_t> workers;
  for (int w = 0; w < 2; ++w) {
    std::vector<std::string> args = {LONGHAUL_BINARY, "worker", "--coordinator", at, "--threads", "1"};
    args.insert(args.end(), tls.begin(), tls.end());
    workers.push_back(Spawn(args, out / ("worker" + std::to_string(w) + ".txt")));
  }
  const int status = WaitFor(coordinator, std::chrono::seconds(120));
  for (pid_t p : workers) WaitFor(p, std::chrono::seconds(10)), kill(p, SIGKILL), waitpid(p, nullptr, 0);
  if (status == -1) kill(coordinator, SIGKILL), waitpid(coordinator, nullptr, 0);
  ASSERT_EQ(status, 0) << Log(out);
  EXPECT_EQ(Losses(out).size(), 30u) << Log(out);
}

// A worker waiting for its plan is alive, however long the last worker takes to register; the
// coordinator names the worker ids nobody has taken yet.
// The job state is what a coordinator started again resumes from: a job whose state cannot be
// written stops at its first plan version, naming the file, rather than train on with nothing to
// resume from (its write goes aside first, to job_state.pb.tmp, here a directory).
TEST(Cluster, AJobStateThatCannotBeWrittenStopsTheJobNamingTheFile) {
  const fs::path out = Dir("unwritable_state");
  fs::create_directories(out / "job_state.pb.tmp");
  EXPECT_NE(Longhaul("local", out, {"cluster.stages=2", "train.steps=200"}), 0);
  const std::string log = Log(out);
  EXPECT_NE(log.find("cannot keep the job state, which a coordinator started again resumes from: cannot write " +
                     (out / "job_state.pb.tmp").string()),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("give train.out_dir a writable disk with room"), std::string::npos) << log;
  EXPECT_LT(Losses(out).size(), 200u) << log;
}

// A coordinator started again goes on from the job state its predecessor left. One it cannot
// trust (damaged, of another directory, or without the checkpoint its plan went on from) is
// refused, naming the problem, before anything is indexed by it or the run's records rewritten.
TEST(Cluster, ARestartedCoordinatorRefusesAJobStateItCannotTrust) {
  const fs::path out = Dir("untrusted_state");
  Reaper reaper{Start("local", out,
                      {"cluster.stages=2", "cluster.replicas=2", "train.steps=100000", "train.checkpoint_every=5"})};
  ASSERT_GE(WaitForSteps(out, 12), 12u) << Log(out);
  // The coordinator dies as a crash kills it (the launcher's death would stop it gently): every
  // process whose command line names the run directory, until none is left.
  for (int i = 0; i < 500; ++i) {
    bool any = false;
    for (const fs::directory_entry& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      if (ReadFile(e.path() / "cmdline").find("train.out_dir=" + out.string()) == std::string::npos) continue;
      any = kill(std::stoi(name), SIGKILL) == 0 || any;
    }
    waitpid(reaper.pid, nullptr, WNOHANG);
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-reaper.pid, SIGKILL);
  waitpid(reaper.pid, nullptr, 0);
  reaper.pid = 0;
  const std::string pristine = ReadFile(out / "job_state.pb"), latest = ReadFile(out / "checkpoints" / "latest");
  proto::JobState state;
  ASSERT_TRUE(state.ParseFromString(pristine)) << "no job state left: " << Log(out);
  const std::string metrics = ReadFile(out / "metrics.csv");
  auto write = [](const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; };
  // The coordinator on `dir` stops at once, saying `expected`, and leaves out's records as they were.
  auto refused = [&](const std::string& change, const fs::path& dir, const std::string& expected,
                     const std::vector<std::string>& sets = {}) {
    const pid_t pid = Start("coordinator", dir, sets, {"--listen", "127.0.0.1:0"});
    const int status = testing::WaitFor(pid, std::chrono::seconds(60));
    if (status < 0) kill(-pid, SIGKILL), waitpid(pid, nullptr, 0);
    const std::string log = Log(dir);
    EXPECT_TRUE(status > 0 && WIFEXITED(status)) << change << ": " << log;
    EXPECT_NE(log.find(expected), std::string::npos) << change << ": " << log;
    if (sets.empty()) {
      EXPECT_EQ(log.find("is not applied"), std::string::npos) << change << ": " << log;
    }
    EXPECT_EQ(ReadFile(out / "metrics.csv"), metrics) << change;
    write(out / "job_state.pb", pristine);
    write(out / "checkpoints" / "latest", latest);
  };
  proto::JobState bad = state;
  bad.mutable_plan()->mutable_assignments(0)->set_replica(100000);
  write(out / "job_state.pb", bad.SerializeAsString());
  refused("a worker placed at replica 100000", out, "is damaged (plan version");
  bad = state;
  bad.mutable_plan()->set_version(~uint64_t{0});
  write(out / "job_state.pb", bad.SerializeAsString());
  refused("plan version 2^64 - 1", out, "is damaged (plan version 18446744073709551615)");
  bad = state;
  bad.clear_workers();
  write(out / "job_state.pb", bad.SerializeAsString());
  refused("no worker records", out, "which it does not record");
  write(out / "checkpoints" / "latest", "garbage\n");
  refused("latest naming no step", out, "names \"garbage\", not a checkpoint directory");
  // A --set that would change the job's config is said not to apply (the state's config holds)
  // where a worker of the job may still run: here something answers at worker 0's port.
  write(out / "checkpoints" / "latest", "garbage\n");
  {
    std::string bound;
    const absl::StatusOr<int> alive = ListenTcp(state.workers(0).registration().address(), &bound);
    ASSERT_TRUE(alive.ok()) << alive.status();
    refused("a --set on a restart", out, "--set train.steps=5000 is not applied", {"train.steps=5000"});
    close(*alive);
  }
  write(out / "checkpoints" / "latest", "step_99999999\n");
  refused("latest beyond the job's steps", out, "names step_99999999, beyond the job's 100000 steps");
  fs::remove(out / "checkpoints" / "latest");
  bad = state;
  bad.mutable_plan()->set_start_iteration(10);
  write(out / "job_state.pb", bad.SerializeAsString());
  refused("latest missing after a resume", out, "is missing, yet the job state's plan went on from step 10");
  fs::remove(out / "job_state.pb");
  fs::create_directories(out / "job_state.pb");
  refused("job_state.pb a directory", out, "cannot read " + (out / "job_state.pb").string());
  fs::remove(out / "job_state.pb");
  write(out / "job_state.pb", pristine);
  const fs::path copy = Dir("untrusted_state_copy");
  fs::copy(out, copy, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  refused("a copied run directory", copy, "a run directory copied or moved elsewhere goes on from its checkpoints");
  // The state as the killed job left it is trusted, and every worker of it is gone: the coordinator
  // takes the job over under the state's config (whose train.steps no --set repeats here), from
  // its last checkpoint, and waits for workers.
  {
    const pid_t pid = Start("coordinator", out, {}, {"--listen", "127.0.0.1:0"});
    Reaper resumed{pid};
    bool resuming = false;
    for (int i = 0; i < 300 && !resuming; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      resuming = Log(out).find("none of whose 4 workers runs any more") != std::string::npos &&
                 Log(out).find("waiting for 4 workers") != std::string::npos;
    }
    EXPECT_TRUE(resuming) << Log(out);
    EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "the coordinator did not wait for its workers: " << Log(out);
  }
}

TEST(Cluster, AWorkerThatRegistersLateDoesNotKillTheJob) {
  const fs::path out = Dir("late");
  const std::string bin = LONGHAUL_BINARY, port = (out / "port").string();
  const std::string sets = " -c " + ConfigFile() + " --set train.out_dir=" + out.string() +
                           " --set cluster.stages=2 --set cluster.heartbeat_s=0.5 --set cluster.dead_after_s=3";
  const std::string script =
      bin + " coordinator" + sets + " --listen 127.0.0.1:0 --port-file " + port + " > " + (out / "log.txt").string() +
      " 2>&1 & c=$!; while [ ! -s " + port + " ]; do sleep 0.1; done; a=127.0.0.1:$(cat " + port + "); " + bin +
      " worker --coordinator $a > " + (out / "w0.txt").string() + " 2>&1 & sleep 7; " + bin +
      " worker --coordinator $a > " + (out / "w1.txt").string() + " 2>&1; wait $c";
  ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0) << Log(out);
  const std::string log = Log(out);
  EXPECT_NE(log.find("waiting for workers, 1/2 registered; not yet worker ids 1"), std::string::npos)
      << log;
  EXPECT_EQ(log.find("sent no heartbeat"), std::string::npos) << log;
  EXPECT_EQ(Losses(out).size(), 6u) << log;
}

}  // namespace
}  // namespace longhaul
