// Failures recovered without a person: a 2 x 2 job with one spare on loopback, its processes
// started as a supervisor would (a coordinator at a fixed port, workers that find it), killed with
// SIGKILL at random moments: workers (each hosts a parameter-server shard), a second worker while
// the first one's recovery is under way, and the coordinator, which the supervisor starts again.
// A killed worker is started again too and joins as the next spare. The run must end as the
// uninterrupted one does, bitwise, and the audit of every committed step's (stage, micro-batch)
// pairs must show none lost and none repeated.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.h"
#include "longhaul.pb.h"
#include "metrics/metrics_log.h"
#include "tests/support/checkpoint_params.h"
#include "tests/support/processes.h"
#include "tests/support/recoveries.h"
#include "tests/support/shell.h"
#include "tests/support/tiny_model.h"
#include "transport/job_secret.h"
#include "layout/plan_layout.h"
#include "util/ports.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;
using testing::Sh;
using testing::ShResult;
using testing::Spawn;
using testing::WaitFor;

constexpr int kSteps = 1200;

// The tests' tiny model (tiny_model.h); a checkpoint every 10 steps bounds what a failure costs to 10
// iterations. dead_after_s bounds how long the workers wait for a restarted coordinator.
// Stragglers keep their places and blocks but in the tests about them (RunWithAStraggler): on
// shared cores beside a busy neighbour a worker may be named one, and blocks moved off it with no
// spare waiting move the rounding of a bf16 or int8 wire at the stage boundary, in the
// uninterrupted run as in the other (a CI run beside a build ended 1.2e-3 apart so).
constexpr char kJob[] = R"(
[train]
steps = 1200
seq_len = 16
micro_batch_size = 2
micro_batches = 2
lr = 3e-3
warmup_steps = 20
log_every = 100
eval_every = 0
threads = 1
checkpoint_every = 10
keep_checkpoints = 3
[cluster]
job_id = "chaos"
stages = 2
replicas = 2
heartbeat_s = 0.2
dead_after_s = 6
spare_wait_s = 60
replace_stragglers = false
)";

fs::path Dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("chaos_" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string Read(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// deploy/gpu_check.sh runs these tests from a packed bundle on a GPU machine: LONGHAUL_BIN names
// the packed binary, and LONGHAUL_CHAOS_SET adds config overrides (key=value, space-separated,
// e.g. train.backend=cuda:0) to every job after the test's own.
std::string Binary() {
  const char* bin = std::getenv("LONGHAUL_BIN");
  return bin != nullptr && *bin != '\0' ? bin : LONGHAUL_BINARY;
}

std::vector<std::string> WithEnvironmentSets(std::vector<std::string> sets) {
  const char* extra = std::getenv("LONGHAUL_CHAOS_SET");
  if (extra == nullptr) return sets;
  for (absl::string_view kv : absl::StrSplit(extra, ' ', absl::SkipEmpty())) sets.emplace_back(kv);
  return sets;
}

// A job's processes, started and restarted as a supervisor would; everything is killed at the end.
class Supervisor {
 public:
  // `sets`: the coordinator's --set overrides of the job config, and flags of its own (those that
  // begin with "--", e.g. --scenario=FILE). `own_disks`: each worker writes to a
  // run directory of its own (--out-dir), as on machines that share no filesystem.
  Supervisor(fs::path out, std::vector<std::string> sets, bool own_disks = false)
      : out_(std::move(out)), sets_(WithEnvironmentSets(std::move(sets))), own_disks_(own_disks), port_(FreeLoopbackPort()) {
    std::ofstream(out_ / "job.toml") << testing::kTinyModelToml << kJob;
  }
  ~Supervisor() {
    for (pid_t p : all_) kill(p, SIGKILL), waitpid(p, nullptr, WNOHANG);
  }

  void StartCoordinator() {
    const fs::path log = out_ / absl::StrCat("coordinator_", ++coordinators_, ".txt");
    std::vector<std::string> args = {Binary(), "coordinator", "-c", (out_ / "job.toml").string(), "--set",
                                     "train.out_dir=" + out_.string(), "--listen", absl::StrCat("127.0.0.1:", port_)};
    for (const std::string& s : sets_) {
      if (absl::StartsWith(s, "--")) {
        args.push_back(s);
      } else {
        args.insert(args.end(), {"--set", s});
      }
    }
    coordinator_ = Spawn(args, log);
    all_.push_back(coordinator_);
  }
  void StartWorker() {
    const fs::path log = out_ / absl::StrCat("worker_process_", ++workers_, ".txt");
    std::vector<std::string> args = {Binary(), "worker", "--coordinator", absl::StrCat("127.0.0.1:", port_),
                                     "--listen", "127.0.0.1:0", "--threads", "1"};
    if (own_disks_) {
      const fs::path disk = out_ / absl::StrCat("disk_", workers_);
      LeaveAnotherJobsPieces(disk / "checkpoints");
      args.insert(args.end(), {"--out-dir", disk.string()});
    }
    all_.push_back(Spawn(args, log));
  }
  // What another job left on a machine's disk: a corrupt piece at every step and place this job's
  // checkpoints take. A worker must read none of it (a piece it did not write or fetch itself).
  static void LeaveAnotherJobsPieces(const fs::path& checkpoints) {
    for (int step = 10; step <= kSteps; step += 10)
      for (int stage = 0; stage < 2; ++stage)
        for (int k = 0; k < 2; ++k)
          for (const std::string& piece : {ShardCheckpointRoot("", stage, k), ResidualCheckpointRoot("", stage, k)}) {
            const fs::path dir = checkpoints / piece / CheckpointName(step);
            fs::create_directories(dir);
            std::ofstream(dir / "state.json") << "left by another job";
          }
  }
  pid_t coordinator() const { return coordinator_; }
  // Every coordinator's output so far, in order.
  std::string CoordinatorLogs() const {
    std::string all;
    for (int i = 1; i <= coordinators_; ++i) all += Read(out_ / absl::StrCat("coordinator_", i, ".txt"));
    return all;
  }
  // The coordinator's job state (its plan and workers), when one is on disk and whole.
  std::optional<proto::JobState> State() const {
    proto::JobState state;
    if (!state.ParseFromString(Read(out_ / "job_state.pb")) || state.plan().version() == 0) return std::nullopt;
    return state;
  }
  // Rows in metrics.csv now (a rollback takes some back).
  size_t Steps() const {
    auto rows = ReadMetrics((out_ / "metrics.csv").string());
    return rows.ok() ? rows->size() : 0;
  }
  // Waits until `done` holds, checking every `poll`, for `limit` at most.
  template <typename F>
  bool Await(F done, std::chrono::seconds limit,
             std::chrono::milliseconds poll = std::chrono::milliseconds(20)) const {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(poll);
    }
    return true;
  }

 private:
  const fs::path out_;
  const std::vector<std::string> sets_;
  const bool own_disks_;
  const int port_;
  int coordinators_ = 0, workers_ = 0;
  pid_t coordinator_ = -1;
  std::vector<pid_t> all_;
};

// A worker the current plan places (not `not_worker`), chosen by `rng`.
struct Victim {
  int worker = -1;
  pid_t pid = -1;
  int stage = 0, replica = 0;
};
Victim Choose(const proto::JobState& state, std::mt19937& rng, int not_worker = -1) {
  std::vector<Victim> placed;
  for (const proto::Assignment& a : state.plan().assignments()) {
    if (a.worker_id() == not_worker) continue;
    for (const proto::WorkerRecord& r : state.workers())
      if (r.id() == a.worker_id()) placed.push_back({a.worker_id(), r.registration().pid(), a.stage(), a.replica()});
  }
  return placed[std::uniform_int_distribution<size_t>(0, placed.size() - 1)(rng)];
}

// Whether the worker at (stage, replica) hosts a parameter-server shard in `plan`.
bool HostsAShard(const proto::Plan& plan, const Victim& v) {
  for (const proto::ShardPlacement& sp : plan.shards())
    if (sp.stage() == v.stage && sp.owner_replica() == v.replica) return true;
  return false;
}

// SIGKILLs a worker the current plan places, chosen at random, and says which.
void KillAWorker(Supervisor& sup) {
  std::mt19937 rng(std::random_device{}());
  const Victim v = Choose(*sup.State(), rng);
  ASSERT_EQ(kill(v.pid, SIGKILL), 0);
  waitpid(v.pid, nullptr, 0);
  std::cout << "killed worker " << v.worker << " (stage " << v.stage << ", replica " << v.replica << ") at step "
            << sup.Steps() << "\n";
}

// Runs the job with `spares` workers beyond the `placed` its layout places (`sets` override its
// config); `chaos` meanwhile does what it does to the supervisor's processes. Returns the final
// coordinator's wait status.
template <typename Chaos>
int RunJob(const fs::path& out, int spares, Chaos chaos, const std::vector<std::string>& sets = {}, int placed = 4,
           bool own_disks = false) {
  Supervisor sup(out, sets, own_disks);
  sup.StartCoordinator();
  for (int i = 0; i < placed + spares; ++i) sup.StartWorker();
  chaos(sup);
  // The killed coordinators were reaped; the one running now ends the job.
  return WaitFor(sup.coordinator(), std::chrono::seconds(300));
}

// Every process of the test's jobs reads this job secret.
void UseNewSecret() {
  const std::string secret = (Dir("") / "secret").string();
  ASSERT_TRUE(JobSecret::WriteNew(secret).ok());
  setenv("LONGHAUL_SECRET_FILE", secret.c_str(), 1);
}

// `out` ended as the uninterrupted `calm` did: `steps` steps, each with the same loss, and the
// same final parameters, bit for bit.
void ExpectTheSameRun(const fs::path& calm, const fs::path& out, size_t steps) {
  const auto a = ReadMetrics((calm / "metrics.csv").string()), b = ReadMetrics((out / "metrics.csv").string());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), steps);
  ASSERT_EQ(b->size(), steps);
  for (size_t i = 0; i < steps; ++i) {
    ASSERT_EQ((*b)[i].step, static_cast<int64_t>(i + 1));
    ASSERT_EQ((*a)[i].loss, (*b)[i].loss) << "step " << i + 1;
  }
  const auto want = testing::LatestParams(calm), got = testing::LatestParams(out);
  ASSERT_FALSE(want.empty());
  EXPECT_TRUE(got == want) << "the final parameters differ from the uninterrupted run's";
}

// The job of `sets` run undisturbed, then again with a spare and a worker killed once `after`
// steps are in; both completed.
struct OneFailure {
  fs::path calm, out;
  std::string log;  // the second run's coordinator's
};
OneFailure RunWithOneFailure(const std::string& name, const std::vector<std::string>& sets, size_t after,
                             bool own_disks = false) {
  OneFailure run{Dir(name + "_calm"), Dir(name), ""};
  EXPECT_EQ(RunJob(run.calm, 0, [](Supervisor&) {}, sets), 0) << Read(run.calm / "coordinator_1.txt");
  const int status = RunJob(
      run.out, 1,
      [&](Supervisor& sup) {
        ASSERT_TRUE(
            sup.Await([&] { return sup.State().has_value() && sup.Steps() >= after; }, std::chrono::seconds(120)))
            << sup.CoordinatorLogs();
        KillAWorker(sup);
      },
      sets, 4, own_disks);
  run.log = Read(run.out / "coordinator_1.txt");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << run.log;
  return run;
}

TEST(Chaos, KilledWorkersAndCoordinatorAreRecoveredAndTheRunEndsBitwiseAsTheUninterruptedOne) {
  UseNewSecret();
  // Tensors in bf16: a resumed version's stages must hold the checkpoint's parameters as a pull
  // gives them, rounded, or the replicas part from the uninterrupted run.
  const std::vector<std::string> sets = {"transport.wire_dtype=\"bf16\""};

  const fs::path calm = Dir("uninterrupted");
  ASSERT_EQ(RunJob(calm, 0, [](Supervisor&) {}, sets), 0) << Read(calm / "coordinator_1.txt");

  const char* seed_env = std::getenv("LONGHAUL_CHAOS_SEED");
  const unsigned seed = seed_env != nullptr ? static_cast<unsigned>(std::atoi(seed_env)) : std::random_device()();
  std::cout << "chaos seed " << seed << " (LONGHAUL_CHAOS_SEED repeats a run)\n";
  std::mt19937 rng(seed);
  const fs::path out = Dir("chaos");
  std::vector<std::string> events;
  std::set<int> killed;  // the workers the test killed: every other one must live to the end
  const int status = RunJob(out, 1, [&](Supervisor& sup) {
    auto recovered = [&] { return Count(sup.CoordinatorLogs(), "coordinator: recovered:"); };
    // A while into the run: 15 to 80 more steps than now.
    auto run_a_while = [&] {
      const size_t target = sup.Steps() + std::uniform_int_distribution<size_t>(15, 80)(rng);
      ASSERT_TRUE(sup.Await([&] { return sup.Steps() >= target; }, std::chrono::seconds(120)))
          << sup.CoordinatorLogs();
    };
    auto kill_worker = [&](const proto::Plan& plan, const Victim& v, const char* when) {
      ASSERT_EQ(kill(v.pid, SIGKILL), 0) << "worker " << v.worker;
      waitpid(v.pid, nullptr, 0);
      killed.insert(v.worker);
      events.push_back(absl::StrCat("killed worker ", v.worker, " (stage ", v.stage, ", replica ", v.replica,
                                    HostsAShard(plan, v) ? ", a shard owner) " : ") ", when, " at step ", sup.Steps()));
      sup.StartWorker();  // the supervisor starts it again: it joins as a spare
    };
    ASSERT_TRUE(sup.Await([&] { return sup.State().has_value() && sup.Steps() > 0; }, std::chrono::seconds(120)))
        << sup.CoordinatorLogs();
    for (const char* what : {"worker", "worker, then another during its recovery", "coordinator", "worker", "worker"}) {
      run_a_while();
      if (::testing::Test::HasFatalFailure()) return;
      const size_t before = recovered();
      const std::string kind = what;
      if (kind == "coordinator") {
        ASSERT_EQ(kill(sup.coordinator(), SIGKILL), 0);
        waitpid(sup.coordinator(), nullptr, 0);
        events.push_back(absl::StrCat("killed the coordinator at step ", sup.Steps()));
        std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 1500)(rng)));
        sup.StartCoordinator();
      } else {
        const proto::JobState state = *sup.State();
        const Victim first = Choose(state, rng);
        kill_worker(state.plan(), first, "mid-run");
        if (kind != "worker") {
          // Once the new plan version is out the recovery is under way: the detection took a
          // millisecond or two, and the new version's set-up and first iteration take 10 ms or more.
          // The coordinator says so as it publishes the version; its job state is written a few
          // milliseconds later, off its lock, which would eat into that window. A survivor of the
          // version before holds its place in the new one (a spare takes the lost one's).
          const std::string published = absl::StrFormat("coordinator: plan v%d:", state.plan().version() + 1);
          ASSERT_TRUE(sup.Await([&] { return absl::StrContains(sup.CoordinatorLogs(), published); },
                                std::chrono::seconds(60), std::chrono::milliseconds(1)))
              << sup.CoordinatorLogs();
          std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 3)(rng)));
          ASSERT_EQ(recovered(), before) << "the recovery finished before the second kill";
          kill_worker(state.plan(), Choose(state, rng, first.worker), "during the recovery from that");
        }
      }
      ASSERT_TRUE(sup.Await([&] { return recovered() > before; }, std::chrono::seconds(120))) << sup.CoordinatorLogs();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }, sets);
  const std::string log = Read(out / "coordinator_2.txt");
  for (const std::string& e : events) std::cout << e << "\n";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << log;

  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << log;
  EXPECT_EQ(summary["status"], "completed");
  const nlohmann::json& recoveries = summary["recoveries"];
  ASSERT_GE(recoveries.size(), 6u) << summary.dump(2);
  for (const std::string& e : events) {
    if (e.rfind("killed worker", 0) == 0) {
      EXPECT_NE(e.find("a shard owner"), std::string::npos) << e;
    }
  }
  for (const nlohmann::json& r : recoveries) {
    std::cout << "recovery: " << r.dump() << "\n";
    EXPECT_TRUE(r.contains("stall_s")) << r.dump();
    // A straggler moved off (on these shared cores a worker the kills left behind may compute
    // slower than its stage's other replica) is alive and waits as a spare: no death to explain.
    if (r.contains("worker") && !r.value("straggler", false)) {
      EXPECT_TRUE(killed.count(r["worker"].get<int>())) << "a worker the test did not kill died\n" << log;
    }
  }
  EXPECT_EQ(summary["audit"]["lost"], 0);
  EXPECT_EQ(summary["audit"]["repeated"], 0);
  EXPECT_EQ(summary["audit"]["steps"], kSteps);

  // The audit file itself: every step's every stage ran micro-batches 0..3 once each.
  std::map<std::pair<int64_t, int>, std::multiset<int64_t>> ran;
  std::ifstream audit(out / "samples.csv");
  std::string line;
  std::getline(audit, line);
  while (std::getline(audit, line)) {
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    ASSERT_EQ(cells.size(), 6u) << line;
    int64_t step = 0;
    int stage = 0;
    ASSERT_EQ(cells[1], "2") << line;
    ASSERT_TRUE(absl::SimpleAtoi(cells[0], &step) && absl::SimpleAtoi(cells[2], &stage)) << line;
    for (absl::string_view g : absl::StrSplit(cells[5], ' ', absl::SkipEmpty())) {
      int64_t index = 0;
      ASSERT_TRUE(absl::SimpleAtoi(g, &index)) << line;
      ran[{step, stage}].insert(index);
    }
  }
  ASSERT_EQ(ran.size(), 2u * kSteps);
  for (const auto& [at, mbs] : ran)
    ASSERT_EQ(mbs, (std::multiset<int64_t>{0, 1, 2, 3})) << "step " << at.first << " stage " << at.second;

  ExpectTheSameRun(calm, out, kSteps);
}

// A worker killed before the job's first checkpoint (train.checkpoint_every = 0: only at the end)
// sends the run back to its start: the survivors' stages, trained by then, must not become the
// shards' starting point; the run ends bitwise as the uninterrupted one.
TEST(Chaos, AFailureBeforeTheFirstCheckpointStartsTheRunOverFromItsInitialParameters) {
  UseNewSecret();
  const OneFailure run = RunWithOneFailure("no_checkpoint", {"train.checkpoint_every=0", "train.steps=150"}, 40);
  EXPECT_NE(run.log.find("back to step 0"), std::string::npos) << run.log;
  ExpectTheSameRun(run.calm, run.out, 150);
}

// Tensors in int8 (transport.wire_dtype): each gradient push carries error feedback, whose
// residuals every checkpoint keeps beside the shards. A worker killed mid-run sends every worker
// back to the last checkpoint's residuals (the spare loads the dead one's), so the run still ends
// bitwise as the uninterrupted one; a run that restarted its residuals from zero would not.
TEST(Chaos, AnInt8RunGoesBackToTheCheckpointsErrorFeedbackAndEndsBitwise) {
  UseNewSecret();
  const OneFailure run = RunWithOneFailure("int8", {"transport.wire_dtype=int8", "train.steps=150"}, 55);
  EXPECT_NE(run.log.find("takes stage"), std::string::npos) << run.log;
  for (int stage = 0; stage < 2; ++stage)
    for (int replica = 0; replica < 2; ++replica) {
      const fs::path kept = fs::path(ResidualCheckpointRoot((run.out / "checkpoints").string(), stage, replica));
      EXPECT_TRUE(fs::exists(kept / "step_00000150" / "model.safetensors")) << kept;
    }
  ExpectTheSameRun(run.calm, run.out, 150);
}

// Overlapped local updates with a topk exchange (int4 at the boundaries): the shards send their
// parameters' change with error feedback, whose residual each checkpoint keeps with the shard,
// beside the pushes' residuals; the rounds between checkpoints land two iterations late. A worker
// killed mid-run, its round's exchange in flight, sends every worker back to the last checkpoint's
// (a synchronous round), so the run ends bitwise as the uninterrupted one.
TEST(Chaos, AnOverlappedLocalUpdatesRunWithATopKExchangeGoesBackToTheCheckpointAndEndsBitwise) {
  UseNewSecret();
  const OneFailure run = RunWithOneFailure(
      "local_topk", {"transport.wire_dtype=int4", "transport.exchange_dtype=topk", "train.local_steps=5",
                     "train.overlap_outer=true", "train.steps=150"}, 55);
  EXPECT_NE(run.log.find("takes stage"), std::string::npos) << run.log;
  ExpectTheSameRun(run.calm, run.out, 150);
}

// Workers on machines that share no filesystem: each writes its checkpoint pieces to a disk of its
// own, and ships each to the coordinator before reporting it; the spare that takes a killed
// worker's place finds none of the dead one's shards or residuals on its own disk and fetches them
// from the coordinator's run directory, so the run still ends bitwise as the uninterrupted one.
// Every disk also holds another job's corrupt pieces under this job's names, which nobody reads.
// Tensors travel in int4, whose pushes carry error feedback as int8's do, and the boundaries'
// gradients in int2, rounded stochastically: a resend after the recovery carries the same bits.
TEST(Chaos, WithoutASharedDiskTheLostWorkersCheckpointComesFromTheCoordinator) {
  UseNewSecret();
  const OneFailure run = RunWithOneFailure(
      "own_disks", {"transport.wire_dtype=int4", "transport.gradient_dtype=int2", "train.steps=150"}, 55,
      /*own_disks=*/true);
  EXPECT_NE(run.log.find("takes stage"), std::string::npos) << run.log;
  std::string workers;
  for (int i = 1; i <= 5; ++i) workers += Read(run.out / absl::StrCat("worker_process_", i, ".txt"));
  EXPECT_NE(workers.find("checkpoint pieces fetched from the coordinator"), std::string::npos) << workers;
  // Every worker wrote to its own disk; the coordinator's run directory holds every piece shipped.
  for (int i = 1; i <= 5; ++i) {
    std::error_code ec;
    const fs::path disk = run.out / absl::StrCat("disk_", i) / "checkpoints";
    EXPECT_TRUE(fs::exists(disk, ec)) << disk;
  }
  ExpectTheSameRun(run.calm, run.out, 150);
}

// The summary.json of the job run in `out`, whose coordinator ended with `status`: the job
// completed with every sample once; its plan changes are printed. Discarded where there is none.
nlohmann::json CompletedSummary(const fs::path& out, int status) {
  const std::string log = Read(out / "coordinator_1.txt");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << log;
  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  EXPECT_FALSE(summary.is_discarded()) << log;
  if (summary.is_discarded()) return summary;
  EXPECT_EQ(summary["status"], "completed");
  EXPECT_EQ(summary["audit"]["lost"], 0);
  EXPECT_EQ(summary["audit"]["repeated"], 0);
  for (const nlohmann::json& r : summary["recoveries"]) std::cout << "plan change: " << r.dump() << "\n";
  return summary;
}

// A job of `sets` (`placed` workers, no spare) run undisturbed, then again with a worker killed
// once `kill_after` steps are in: the coordinator logs `changed`; `rejoin_after` steps later a
// worker is started again, which it logs as `rejoined`. Both runs complete; the second's summary
// has `steps` steps, its audit clean.
struct ChangedRun {
  fs::path calm, out;
  nlohmann::json summary;
};
ChangedRun RunWithoutASpare(const std::string& name, const std::vector<std::string>& sets, int placed,
                            size_t kill_after, const std::string& changed, size_t rejoin_after,
                            const std::string& rejoined, int64_t steps) {
  ChangedRun run{Dir(name + "_calm"), Dir(name), nlohmann::json()};
  EXPECT_EQ(RunJob(run.calm, 0, [](Supervisor&) {}, sets, placed), 0) << Read(run.calm / "coordinator_1.txt");
  const int status = RunJob(
      run.out, 0,
      [&](Supervisor& sup) {
        auto logged = [&](const std::string& what) {
          return sup.Await([&] { return Count(sup.CoordinatorLogs(), what) > 0; }, std::chrono::seconds(120));
        };
        ASSERT_TRUE(sup.Await([&] { return sup.State().has_value() && sup.Steps() >= kill_after; },
                              std::chrono::seconds(120)))
            << sup.CoordinatorLogs();
        KillAWorker(sup);
        ASSERT_TRUE(logged(changed)) << sup.CoordinatorLogs();
        const size_t changed_at = sup.Steps();
        ASSERT_TRUE(sup.Await([&] { return sup.Steps() >= changed_at + rejoin_after; }, std::chrono::seconds(120)));
        sup.StartWorker();
        ASSERT_TRUE(logged(rejoined)) << sup.CoordinatorLogs();
        std::cout << "grew back by step " << sup.Steps() << "\n";
      },
      sets, placed);
  run.summary = CompletedSummary(run.out, status);
  if (!run.summary.is_discarded()) {
    EXPECT_EQ(run.summary["audit"]["steps"], steps);
  }
  return run;
}

// The tensor port of the worker `state`'s plan places at (stage, replica).
std::string TensorPort(const proto::JobState& state, int stage, int replica) {
  for (const proto::Assignment& a : state.plan().assignments())
    if (a.stage() == stage && a.replica() == replica) return a.address().substr(a.address().rfind(':') + 1);
  return "";
}

// A connection between two live workers reset mid-run, as a middlebox or a NAT closing it would
// (here the kernel's own socket destroy, `ss -K`, which needs root): the version of the worker
// that sends on it fails at once, and nobody is lost, so once every worker's port answers the
// coordinator's dial it starts the same layout again from the last checkpoint. The run ends
// bitwise as the uninterrupted one, every sample once. Before, the sender waited for a plan that never came and
// the job failed.
TEST(Chaos, AConnectionResetBetweenLiveWorkersCostsARestartNotTheJob) {
  if (geteuid() != 0) GTEST_SKIP() << "resetting a connection (ss -K) needs root";
  UseNewSecret();
  const fs::path calm = Dir("reset_calm"), out = Dir("reset");
  ASSERT_EQ(RunJob(calm, 0, [](Supervisor&) {}), 0) << Read(calm / "coordinator_1.txt");
  std::string destroyed;
  const int status = RunJob(out, 0, [&](Supervisor& sup) {
        std::optional<proto::JobState> state;
        ASSERT_TRUE(sup.Await([&] { return sup.Steps() >= 100 && (state = sup.State()).has_value(); },
                              std::chrono::seconds(120)))
            << sup.CoordinatorLogs();
        // Every connection to stage 1 replica 0's tensor port: its activations from stage 0, and
        // the pushes and parameters of stage 1 replica 1.
        destroyed = Sh("ss -K -H -t state established dst 127.0.0.1:" + TensorPort(*state, 1, 0)).output;
        std::cout << "ss -K destroyed:\n" << destroyed;
      });
  const std::string log = Read(out / "coordinator_1.txt");
  if (destroyed.find("127.0.0.1:" ) == std::string::npos) {
    GTEST_SKIP() << "ss -K destroyed no socket here (a kernel without CONFIG_INET_DIAG_DESTROY?): " << destroyed;
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << log;
  EXPECT_NE(log.find("failed with every worker alive"), std::string::npos) << log;
  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << log;
  EXPECT_EQ(summary["status"], "completed");
  EXPECT_EQ(summary["audit"]["lost"], 0);
  EXPECT_EQ(summary["audit"]["repeated"], 0);
  ASSERT_GE(summary["recoveries"].size(), 1u) << summary.dump(2);
  for (const nlohmann::json& r : summary["recoveries"]) {
    std::cout << "plan change: " << r.dump() << "\n";
    EXPECT_TRUE(r.value("restart", false)) << "nobody was lost: " << r.dump();
  }
  ExpectTheSameRun(calm, out, kSteps);
}

// A link that breaks again whenever the layout starts again (here every segment carrying data into
// stage 1 replica 0's tensor port answered with a reset, as a firewall or a broken middlebox
// would; connecting still works, so its port answers the coordinator's dial): three restarts of
// the same layout, each failing before an iteration completes, and the fourth failure stops the
// job with a reason that names the link to check, instead of restarting forever or waiting for a
// death that never comes.
TEST(Chaos, ALinkThatKeepsBreakingStopsTheJobAfterThreeRestartsNamingIt) {
  if (geteuid() != 0) GTEST_SKIP() << "an iptables rule needs root";
  // Segments of 100 bytes and more (a header and data; not the handshake's, not a bare
  // acknowledgement or FIN) on loopback into `port`, answered with a reset.
  auto rule = [](const std::string& port) {
    return "-o lo -p tcp --dport " + port +
           " -m conntrack --ctstate ESTABLISHED -m length --length 100:65535 -j REJECT --reject-with tcp-reset";
  };
  // The same rule, once on a port nothing uses: a container without the capability or a kernel
  // without these matches skips here rather than failing mid-run.
  const std::string unused = std::to_string(FreeLoopbackPort());
  if (const ShResult tried = Sh("iptables -I OUTPUT " + rule(unused)); tried.status != 0) {
    GTEST_SKIP() << "iptables cannot insert the test's rule here: " << tried.output;
  }
  ASSERT_EQ(Sh("iptables -D OUTPUT " + rule(unused)).status, 0);
  UseNewSecret();
  const fs::path out = Dir("link_keeps_breaking");
  std::string inserted;  // iptables' arguments after -I / -D OUTPUT, once inserted
  const auto started = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point broken;
  const int status = RunJob(out, 0, [&](Supervisor& sup) {
    std::optional<proto::JobState> state;
    ASSERT_TRUE(sup.Await([&] { return sup.Steps() >= 50 && (state = sup.State()).has_value(); },
                          std::chrono::seconds(120)))
        << sup.CoordinatorLogs();
    const std::string r = rule(TensorPort(*state, 1, 0));
    const ShResult done = Sh("iptables -I OUTPUT " + r);
    ASSERT_EQ(done.status, 0) << done.output;
    inserted = r;
    broken = std::chrono::steady_clock::now();
    std::cout << "every data segment into stage 1 replica 0's port reset from step " << sup.Steps() << "\n";
  });
  if (!inserted.empty()) {
    EXPECT_EQ(Sh("iptables -D OUTPUT " + inserted).status, 0) << "the test's rule stays: " << inserted;
  }
  ASSERT_FALSE(inserted.empty());
  const double stopped_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - broken).count();
  std::cout << "the job stopped " << stopped_after << " s after the link broke ("
            << std::chrono::duration<double>(broken - started).count() << " s into the run)\n";
  const std::string log = Read(out / "coordinator_1.txt");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "status " << status << "\n" << log;
  std::ifstream sf(out / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sf, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << log;
  EXPECT_EQ(summary["status"], "failed");
  const std::string reason = summary.value("reason", "");
  std::cout << "reason: " << reason << "\n";
  EXPECT_NE(reason.find("4 versions in a row with no iteration completed"), std::string::npos) << reason;
  EXPECT_NE(reason.find("check the network between them"), std::string::npos) << reason;
  int restarts = 0;
  for (const nlohmann::json& r : summary["recoveries"]) {
    std::cout << "plan change: " << r.dump() << "\n";
    EXPECT_TRUE(r.value("restart", false)) << "nobody was lost: " << r.dump();
    restarts += r.value("restart", false) ? 1 : 0;
  }
  EXPECT_EQ(restarts, 3) << summary.dump(2);
  // Well before a silent worker would be declared dead (dead_after_s = 6): the restarts follow
  // the failures, not a timeout.
  EXPECT_LT(stopped_after, 6.0);
  EXPECT_EQ(summary["audit"]["lost"], 0);
  EXPECT_EQ(summary["audit"]["repeated"], 0);
}

// No spare waits (cluster.spare_wait_s = 0): a killed worker's 2 x 2 job shrinks to one replica of
// 4 micro-batches, and the broken replica's survivor waits as a spare. A worker started later
// makes a whole replica with it, and at the next checkpoint the job grows back to 2 x 2. The run
// completes with every (step, stage, micro-batch) once and ends with the uninterrupted run's
// parameters bit for bit (the shrunk replica pushes each job replica's gradients on its own, each
// in the dtype of that replica's stream with its error feedback); the losses of the shrunk steps
// differ only in the order the report sums its micro-batches' losses. The coordinator plans for
// links of 10 ms and 1 Gbit/s (its --scenario; the workers talk over loopback), so the default
// "auto" wire sends int8 between workers and fp32 to a worker's own shards: the shrunk replica's
// pushes to the shards it now hosts keep int8 where the job's layout had them cross a link.
TEST(Chaos, WithoutASpareTheLayoutShrinksAndGrowsBackWhenASpareJoins) {
  UseNewSecret();
  const std::string scenario = std::string(LONGHAUL_SOURCE_DIR) + "/netem/scenarios/source-10ms-1gbit.toml";
  const ChangedRun run =
      RunWithoutASpare("shrink", {"cluster.spare_wait_s=0", "--scenario=" + scenario}, 4, 100,
                       "1 replicas of 4 micro-batches each instead of 2", 100,
                       "2 spares join: 2 replicas of 2 micro-batches each instead of 1", kSteps);
  ASSERT_FALSE(run.summary.is_discarded());
  const std::string log = Read(run.out / "coordinator_1.txt");
  // The fast links' dtype is the compute's (fp32, or bf16 where LONGHAUL_CHAOS_SET names a GPU).
  EXPECT_NE(log.find("; int8 on 8 links slower than 10 Gbit/s"), std::string::npos) << log;
  std::vector<std::string> changes;
  for (const nlohmann::json& r : run.summary["recoveries"]) {
    if (r.contains("shrunk_to_replicas")) changes.push_back("shrunk to " + r["shrunk_to_replicas"].dump());
    if (r.contains("grown_to_replicas")) changes.push_back("grown to " + r["grown_to_replicas"].dump());
  }
  EXPECT_EQ(changes, (std::vector<std::string>{"shrunk to 1", "grown to 2"})) << run.summary.dump(2);

  auto before = ReadMetrics((run.calm / "metrics.csv").string());
  auto after = ReadMetrics((run.out / "metrics.csv").string());
  ASSERT_TRUE(before.ok() && after.ok());
  ASSERT_EQ(after->size(), before->size());
  double worst = 0;
  for (size_t i = 0; i < after->size(); ++i) {
    worst = std::max(worst, std::abs((*after)[i].loss - (*before)[i].loss) / (*before)[i].loss);
  }
  std::cout << "losses within " << worst << " (relative) of the uninterrupted run's; final " << after->back().loss
            << " against " << before->back().loss << "\n";
  EXPECT_LT(worst, 1e-12);
  EXPECT_TRUE(testing::LatestParams(run.out) == testing::LatestParams(run.calm))
      << "the final parameters differ from the uninterrupted run's";
}

// A pipeline of 3 stages and one replica, no spare (cluster.spare_wait_s = 0): a killed worker's
// place is taken by nobody, so the two left run the model cut anew into 2 stages (of 4 blocks), each stage
// reading its tensors from the last checkpoint's shards of the old cut by name. A worker started
// later waits as a spare, and at the next checkpoint the pipeline grows back into the job's 3
// stages. A pipeline sums every gradient in the one process's order at any cut, so the run ends
// with the uninterrupted run's losses and parameters bit for bit, and every (step, stage,
// micro-batch) of the plan that ran the step once.
TEST(Chaos, WithoutASpareAPipelineIsCutAnewAndGrowsBackWhenASpareJoins) {
  UseNewSecret();
  const ChangedRun run = RunWithoutASpare(
      "recut",
      {"cluster.stages=3", "cluster.replicas=1", "train.micro_batches=4", "cluster.spare_wait_s=0", "train.steps=300"},
      3, 55, "the model cut anew into 2 stages instead of 3", 60,
      "1 spares join: the job's 3 stages again instead of 2", 300);
  ASSERT_FALSE(run.summary.is_discarded());
  // Blocks moved off a straggler (on these shared cores one of the workers left may compute slower
  // for a while) change no stage count.
  nlohmann::json changes = nlohmann::json::array();
  for (const nlohmann::json& r : testing::WithoutRestarts(run.summary["recoveries"]))
    if (!r.value("straggler", false)) changes.push_back(r);
  ASSERT_EQ(changes.size(), 2u) << run.summary.dump(2);
  // The 4 blocks over 2 stages: evenly, or as the two workers' measured compute balances them
  // (on these shared cores a tiny model's profiles may differ enough).
  const nlohmann::json cut = changes[0]["blocks_per_stage"];
  ASSERT_TRUE(cut.is_array() && cut.size() == 2u) << run.summary.dump(2);
  EXPECT_EQ(cut[0].get<int>() + cut[1].get<int>(), 4) << cut;
  std::cout << "cut anew as " << cut.dump() << "\n";
  EXPECT_EQ(changes[1]["grown_to_stages"], 3) << run.summary.dump(2);
  // Steps ran under 3 stages, then 2, then 3 again, each audited with its plan's.
  std::set<std::string> stage_counts;
  std::ifstream audit(run.out / "samples.csv");
  std::string line, last;
  std::getline(audit, line);
  while (std::getline(audit, line)) {
    const std::vector<std::string> cells = absl::StrSplit(line, ',');
    ASSERT_EQ(cells.size(), 6u) << line;
    stage_counts.insert(cells[1]);
    last = line;
  }
  EXPECT_EQ(stage_counts, (std::set<std::string>{"2", "3"}));
  EXPECT_EQ(last.substr(0, 6), "300,3,") << last;
  ExpectTheSameRun(run.calm, run.out, 300);
}

// The job of `sets` (the model big enough that computing is most of what each worker does) with
// `placed` workers run undisturbed, then again with `spares` more, and from step 25 stage 0
// replica 0's worker stopped 15 ms of every 16 ms (SIGSTOP, SIGCONT), as a noisy neighbour or a
// throttled instance would, until the coordinator logs `moved`. Its compute stays over 1.5x its
// start for 20 iterations, so it straggles: it runs 1 ms at a time, so even on a fast machine
// nearly every pass of an iteration (4 micro-batches forward and back, each under a millisecond at
// one block) is stopped, and a median of them cannot dodge the stops. Unless `back` is empty, the
// worker is stopped so 30 steps longer, then no more, and the test waits for the coordinator to
// log `back`. Both runs complete and end bitwise alike,
// every sample once; returns the plan changes, the first of which must be the straggler's.
nlohmann::json RunWithAStraggler(const std::string& name, std::vector<std::string> sets, int placed, int spares,
                                 const std::string& moved, const std::string& back = "", int steps = 120) {
  sets.insert(sets.end(), {absl::StrCat("train.steps=", steps), "train.micro_batches=4", "model.d_model=128", "model.max_seq_len=64",
                           "train.seq_len=64", "cluster.replace_stragglers=true"});
  const fs::path calm = Dir(name + "_calm"), out = Dir(name);
  EXPECT_EQ(RunJob(calm, 0, [](Supervisor&) {}, sets, placed), 0) << Read(calm / "coordinator_1.txt");
  const int status = RunJob(
      out, spares,
      [&](Supervisor& sup) {
        std::optional<proto::JobState> state;
        ASSERT_TRUE(sup.Await([&] { return sup.Steps() >= 25 && (state = sup.State()).has_value(); },
                              std::chrono::seconds(120)))
            << sup.CoordinatorLogs();
        pid_t victim = -1;
        for (const proto::WorkerRecord& r : state->workers())
          if (r.id() == WorkerAt(state->plan(), 0, 0)) victim = r.registration().pid();
        ASSERT_GT(victim, 0);
        std::cout << "throttling stage 0 replica 0's worker from step " << sup.Steps() << "\n";
        // Until the move; with `back`, 30 steps past it too, so that the pace the straggler
        // starts from under the new cut is its slow one.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        size_t until = std::numeric_limits<size_t>::max();
        while (sup.Steps() < until && std::chrono::steady_clock::now() < deadline) {
          kill(victim, SIGSTOP);
          std::this_thread::sleep_for(std::chrono::milliseconds(15));
          kill(victim, SIGCONT);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          if (until == std::numeric_limits<size_t>::max() && Count(sup.CoordinatorLogs(), moved) > 0) {
            until = back.empty() ? 0 : sup.Steps() + 30;
          }
        }
        std::cout << "stopped throttling at step " << sup.Steps() << "\n";
        if (back.empty()) return;
        ASSERT_TRUE(sup.Await([&] { return Count(sup.CoordinatorLogs(), back) > 0; }, std::chrono::seconds(120)))
            << sup.CoordinatorLogs();
        std::cout << "\"" << back << "\" by step " << sup.Steps() << "\n";
      },
      sets, placed);
  const std::string log = Read(out / "coordinator_1.txt");
  EXPECT_NE(log.find(moved), std::string::npos) << log;
  const nlohmann::json summary = CompletedSummary(out, status);
  if (summary.is_discarded()) return nlohmann::json::array({nlohmann::json::object()});
  EXPECT_GE(summary["recoveries"].size(), 1u) << summary.dump(2);
  if (summary["recoveries"].empty()) return nlohmann::json::array({nlohmann::json::object()});
  const nlohmann::json first = summary["recoveries"][0];
  EXPECT_TRUE(first.value("straggler", false)) << first.dump();
  EXPECT_EQ(first["stage"], 0) << first.dump();
  EXPECT_EQ(first["replica"], 0) << first.dump();
  ExpectTheSameRun(calm, out, steps);
  return summary["recoveries"];
}

// A 2 x 2 job with a spare: the straggler gives its place to the spare, from the last checkpoint,
// and waits as a spare itself.
TEST(Chaos, AStragglerGivesItsPlaceToASpareAndTheRunEndsBitwise) {
  UseNewSecret();
  const nlohmann::json change =
      RunWithAStraggler("straggler_spare", {}, 4, 1, "a spare takes its place and it waits as a spare")[0];
  EXPECT_EQ(change["spare"], 4) << change.dump();
}

// A 2 x 2 job with no spare: both replicas run the model cut anew with one block of 4 on stage 0,
// every parameter-server shard where it was, from the last checkpoint. Once the straggler is no
// longer stopped it computes over 1.5x as fast as since the move, and the blocks move back, as
// far as the paces then say: [2, 2] on quiet cores, [3, 1] once beside two busy loops, which
// slowed stage 1's workers more.
TEST(Chaos, WithoutASpareAStragglersBlocksMoveToTheOtherStageInEveryReplicaAndBack) {
  UseNewSecret();
  const nlohmann::json changes = RunWithAStraggler("straggler_replicas", {"cluster.spare_wait_s=0"}, 4, 0,
                                                   "no spare waits: blocks move off it", "blocks move back", 200);
  ASSERT_EQ(changes.size(), 2u) << changes.dump(2);
  EXPECT_EQ(changes[0]["blocks_per_stage"], nlohmann::json::parse("[1, 3]")) << changes.dump();
  EXPECT_EQ(changes[1]["worker"], changes[0]["worker"]) << changes.dump();
  EXPECT_TRUE(changes[1].value("fast_again", false)) << changes.dump();
  EXPECT_GE(changes[1]["blocks_per_stage"][0], 2) << changes.dump();
}

// A pipeline of 3 stages and one replica, no spare: the same workers run the model cut anew ([2,
// 1, 1] of 4 blocks becomes a cut that gives stage 0 one), from the last checkpoint.
TEST(Chaos, WithoutASpareAStragglersBlocksMoveToTheOtherStages) {
  UseNewSecret();
  const nlohmann::json change = RunWithAStraggler(
      "straggler_recut", {"cluster.stages=3", "cluster.replicas=1", "cluster.spare_wait_s=0"},
      3, 0, "no spare waits: blocks move off it")[0];
  ASSERT_TRUE(change["blocks_per_stage"].is_array() && change["blocks_per_stage"].size() == 3u) << change.dump();
  EXPECT_EQ(change["blocks_per_stage"][0], 1) << change.dump();
}

}  // namespace
}  // namespace longhaul
