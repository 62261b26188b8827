#include "cli/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/job_config.h"
#include "metrics/metrics_log.h"
#include "netem/emulated_network.h"
#include "netem/netns.h"
#include "scenario/scenario.h"
#include "netem/tcp_proxy.h"
#include "util/ports.h"
#include "transport/job_secret.h"
#include "worker/job_setup.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

// Ctrl-C and SIGTERM received so far: the first stops the job in order, the second kills it.
volatile sig_atomic_t g_interrupts = 0;
void OnSignal(int) { g_interrupts = g_interrupts + 1; }

// After Ctrl-C, how long the coordinator has to stop the workers (they hear it through their next
// heartbeat), wait for their timelines (5 s at most) and write the records before being killed.
constexpr auto kStopGrace = std::chrono::seconds(20);

pid_t Spawn(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // a killed launcher takes its processes with it
    // Out of the terminal's process group: a Ctrl-C reaches the launcher alone, which asks the
    // coordinator to stop the job, instead of killing every worker before it reports.
    setpgid(0, 0);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::perror("longhaul local: exec");
    _exit(127);
  }
  return pid;
}

// Proxy mode: worker j listens on a fixed loopback port; worker i dials j through route (i, j) of
// one proxy process, which carries that pair's delay and rate. Returns the proxy's pid.
absl::StatusOr<pid_t> StartProxies(const std::string& self_exe, const netem::Scenario& s, int workers,
                                   const std::string& dir, std::vector<int>& worker_ports) {
  // The workers' ports first, then one per route: all distinct, or two listeners would clash.
  const std::vector<int> ports = FreeLoopbackPorts(workers * workers);
  worker_ports.assign(ports.begin(), ports.begin() + workers);
  auto next_via = ports.begin() + workers;
  std::vector<netem::ProxyRoute> routes;
  for (int i = 0; i < workers; ++i) {
    std::ofstream map(fs::path(dir) / absl::StrCat(".dial_map_", i), std::ios::trunc);
    for (int j = 0; j < workers; ++j) {
      if (i == j) continue;
      const std::string target = absl::StrCat("127.0.0.1:", worker_ports[j]);
      const std::string via = absl::StrCat("127.0.0.1:", *next_via++);
      routes.push_back({via, target, s.Between(i, j)});
      map << target << " " << via << "\n";
    }
  }
  const std::string file = (fs::path(dir) / ".proxy_routes").string();
  if (absl::Status st = netem::WriteRoutesFile(file, routes); !st.ok()) return st;
  return Spawn({self_exe, "netem", "proxy", "--routes", file});
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return "unknown status";
}

}  // namespace

int RunLocalCluster(const std::string& self_exe, const std::string& config_path,
                    const std::vector<std::string>& overrides, int64_t stop_at, const std::string& scenario_path,
                    const std::string& emulation, bool worker_disks) {
  auto cfg = LoadJobConfig(config_path, overrides);
  if (!cfg.ok()) {
    std::cerr << "longhaul: error: " << cfg.status().message() << "\n";
    return 2;
  }
  if (absl::Status s = CheckLocalClusterMemory(*cfg); !s.ok()) {
    std::cerr << "longhaul: error: " << s.message() << "\n";
    return 2;
  }
  const int workers = cfg->cluster.stages * cfg->cluster.replicas;
  std::error_code ec;
  fs::create_directories(cfg->train.out_dir, ec);
  if (ec) {
    std::cerr << "longhaul: error: cannot create train.out_dir " << cfg->train.out_dir << ": " << ec.message()
              << ": give train.out_dir a directory this user may write\n";
    return 2;
  }
  const std::string port_file = (fs::path(cfg->train.out_dir) / ".coordinator_port").string();
  fs::remove(port_file, ec);
  // Every port of the run is authenticated: a fresh secret per run where the user gave none, which
  // the coordinator and workers read from the environment they inherit.
  // (`longhaul experiment` runs several clusters from one process: each gets its own.)
  static std::string made_here;
  const char* given_secret = std::getenv("LONGHAUL_SECRET_FILE");
  if (given_secret == nullptr || *given_secret == '\0' || given_secret == made_here) {
    const std::string secret_file = made_here = (fs::path(cfg->train.out_dir) / ".secret").string();
    fs::remove(secret_file, ec);
    if (absl::Status s = JobSecret::WriteNew(secret_file); !s.ok()) {
      std::cerr << "longhaul: error: " << s.message() << "\n";
      return 2;
    }
    setenv("LONGHAUL_SECRET_FILE", secret_file.c_str(), /*overwrite=*/1);
  }
  // Several processes share the cores: split them, and let idle OpenMP threads sleep instead of
  // spinning, or the processes starve each other.
  setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / workers);

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::unique_ptr<netem::EmulatedNetwork> net;
  std::vector<int> worker_ports;  // proxy mode: fixed, so the proxy's routes can name them
  std::vector<pid_t> helpers;     // the proxy
  if (!scenario_path.empty()) {
    auto scenario = netem::LoadScenario(scenario_path);
    if (!scenario.ok()) {
      std::cerr << "longhaul: error: " << scenario.status().message() << "\n";
      return 2;
    }
    std::string why;
    const bool kernel = emulation == "kernel" || (emulation == "auto" && netem::CanCreateNamespaces(&why));
    if (!kernel) {
      if (emulation == "auto") std::cout << "longhaul local: no kernel-level emulation (" << why << "): using the proxy\n";
      auto setup = StartProxies(self_exe, *scenario, workers, cfg->train.out_dir, worker_ports);
      if (!setup.ok()) {
        std::cerr << "longhaul: error: " << setup.status().message() << "\n";
        return 1;
      }
      helpers.push_back(*setup);
    }
    auto n = kernel ? netem::EmulatedNetwork::Create(*scenario, workers, {self_exe})
                    : absl::StatusOr<std::unique_ptr<netem::EmulatedNetwork>>(nullptr);
    if (!n.ok()) {
      std::cerr << "longhaul: error: " << n.status().message() << "\n";
      return 1;
    }
    net = std::move(*n);
    const netem::Link l = scenario->Between(0, workers > 1 ? 1 : 0);
    std::cout << absl::StrFormat("longhaul local: %d emulated hosts (%s), scenario %s (%s); host 0 -> 1: %g ms one-way, "
                                 "%g Mbit/s\n",
                                 workers, net ? "network namespaces" : "userspace proxy", scenario->name,
                                 scenario->description, l.delay_ms, l.rate_mbit);
  }
  auto in_host = [&](int w, std::vector<std::string> args) {
    if (!net) return args;
    std::vector<std::string> full = w < 0 ? net->ExecInRouter() : net->Exec(w);
    full.insert(full.end(), args.begin(), args.end());
    return full;
  };
  std::vector<std::string> coord = in_host(-1, {self_exe, "coordinator", "-c", config_path, "--listen",
                                                net ? "0.0.0.0:0" : "127.0.0.1:0", "--port-file", port_file,
                                                "--metrics-listen", "127.0.0.1:0"});
  for (const std::string& o : overrides) coord.insert(coord.end(), {"--set", o});
  if (!scenario_path.empty()) coord.insert(coord.end(), {"--scenario", scenario_path});
  if (stop_at > 0) coord.insert(coord.end(), {"--stop-at", std::to_string(stop_at)});
  std::vector<pid_t> children = {Spawn(coord)};
  std::cout << absl::StrFormat("longhaul local: coordinator (pid %d) and %d workers of %d threads each; Ctrl-C stops "
                               "them all\n",
                               children[0], workers, threads)
            << std::flush;

  int port = 0;
  for (int i = 0; i < 300 && port == 0 && g_interrupts == 0; ++i) {
    std::ifstream f(port_file);
    if (!(f >> port)) {
      int status;
      if (waitpid(children[0], &status, WNOHANG) == children[0]) {
        // A coordinator that succeeds without listening had nothing to run, and said why.
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
        std::cerr << "longhaul local: the coordinator exited (" << Describe(status) << ") before listening\n";
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (port == 0) {
    kill(children[0], SIGTERM);
    if (g_interrupts > 0) return 130;
    std::cerr << "longhaul local: the coordinator did not start listening within 30 s\n";
    return 1;
  }
  for (int w = 0; w < workers; ++w) {
    const std::string coordinator = absl::StrCat(net ? netem::EmulatedNetwork::GatewayOf(w) : "127.0.0.1", ":", port);
    // Worker w runs in emulated host w and takes slot w, so a scenario's sites hold known stages.
    std::vector<std::string> args = {self_exe, "worker", "--coordinator", coordinator, "--slot", std::to_string(w), "--threads",
                                     std::to_string(threads), "--job-id", cfg->cluster.job_id, "--listen"};
    if (net) {
      args.push_back(netem::EmulatedNetwork::Address(w) + ":0");
    } else if (!worker_ports.empty()) {
      args.insert(args.end(), {absl::StrCat("127.0.0.1:", worker_ports[w]), "--dial-map",
                               (fs::path(cfg->train.out_dir) / absl::StrCat(".dial_map_", w)).string()});
    } else {
      args.push_back("127.0.0.1:0");
    }
    if (worker_disks) {
      args.insert(args.end(),
                  {"--out-dir", (fs::path(cfg->train.out_dir) / "worker_disks" / absl::StrCat("w", w)).string()});
    }
    children.push_back(Spawn(in_host(w, args)));
  }

  // The coordinator's exit ends the run; a worker that dies makes the coordinator stop the job.
  int result = 1;
  std::vector<bool> running(children.size(), true);
  auto stop_all = [&](int sig) {
    for (size_t i = 0; i < children.size(); ++i)
      if (running[i]) kill(children[i], sig);
  };
  auto deadline = std::chrono::steady_clock::time_point::max();
  int interrupts_handled = 0;
  std::optional<std::pair<pid_t, std::chrono::steady_clock::time_point>> failed_worker;  // pid, when it ended
  auto stop_run = [&](const std::string& why) {
    std::cerr << "longhaul local: " << why << ": stopping the run\n";
    if (running[0]) kill(children[0], SIGTERM);
    result = 1;
    deadline = std::min(deadline, std::chrono::steady_clock::now() + kStopGrace);
  };
  while (std::count(running.begin(), running.end(), true) > 0) {
    if (g_interrupts > interrupts_handled) {
      interrupts_handled = g_interrupts;
      if (result != 130) {
        // The coordinator stops the workers and writes metrics.csv, loss.svg, timeline.json and
        // summary.json; without it, nobody is left to wait for.
        std::cout << "\nlonghaul local: interrupted: the coordinator stops the workers and writes the records "
                     "(Ctrl-C again kills every process at once)\n"
                  << std::flush;
        if (running[0]) {
          kill(children[0], SIGTERM);
        } else {
          stop_all(SIGTERM);
        }
        result = 130;
        deadline = std::min(deadline, std::chrono::steady_clock::now() + kStopGrace);
      } else {
        std::cout << "\nlonghaul local: interrupted again: killing every process\n" << std::flush;
        stop_all(SIGKILL);
      }
    }
    if (net && result != 130 && deadline == std::chrono::steady_clock::time_point::max()) {
      if (absl::Status d = net->CheckDaemon(); !d.ok()) {
        std::cerr << "longhaul local: error: " << d.message() << "\n";
        stop_all(SIGTERM);
        result = 1;
        deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop_all(SIGKILL);
      deadline = std::chrono::steady_clock::time_point::max();
    }
    // A worker that failed of its own error told the coordinator, which stops the job at once; one
    // that failed before it registered leaves the coordinator waiting for it, and nobody else here
    // starts a worker.
    if (failed_worker && running[0] && result != 130 &&
        std::chrono::steady_clock::now() > failed_worker->second + kStopGrace) {
      stop_run(absl::StrFormat("worker process %d failed and the coordinator still waits for it", failed_worker->first));
      failed_worker.reset();
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (auto h = std::find(helpers.begin(), helpers.end(), pid); h != helpers.end()) {
      helpers.erase(h);
      // Without the proxy no worker reaches another.
      if (running[0] && result != 130)
        stop_run(absl::StrFormat("the link emulation proxy (pid %d) ended with %s", pid, Describe(status)));
    }
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i] != pid) continue;
      running[i] = false;
      if (i == 0) {
        if (result != 130) result = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
        // Workers finish on their own right after the coordinator; give them a moment.
        if (deadline == std::chrono::steady_clock::time_point::max())
          deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && result != 130) {
        std::cerr << absl::StrFormat("longhaul local: worker process %d ended with %s\n", pid, Describe(status));
        if (WIFEXITED(status)) failed_worker = {pid, std::chrono::steady_clock::now()};
      }
    }
  }
  for (pid_t h : helpers) {
    kill(h, SIGTERM);
    waitpid(h, nullptr, 0);
  }
  fs::remove(port_file, ec);
  return result;
}

namespace {

// While a job's output goes to a log, its progress for the terminal (`fd`): " 10%" to " 90%" on
// the caller's line as metrics.csv passes each tenth of train.steps, so a run of many minutes is
// seen to move. A metrics.csv older than the call is an earlier run's and is not read.
void ShowTenths(const std::string& config_path, const std::vector<std::string>& overrides, int fd,
                const std::atomic<bool>& ended) {
  const absl::StatusOr<JobConfig> cfg = LoadJobConfig(config_path, overrides);
  if (!cfg.ok() || cfg->train.steps <= 0) return;  // RunLocalCluster reports a bad config
  const std::string csv = (fs::path(cfg->train.out_dir) / "metrics.csv").string();
  const auto start = fs::file_time_type::clock::now();
  int64_t shown = 0;  // tenths written
  for (bool last = false; !last;) {
    last = ended;  // one more look after the run, so a run shorter than a look shows its tenths too
    if (!last) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::error_code ec;
    const auto written = fs::last_write_time(csv, ec);
    if (ec || written < start) continue;
    const absl::StatusOr<std::vector<MetricsRow>> rows = ReadMetrics(csv);
    if (!rows.ok() || rows->empty()) continue;
    const int64_t tenths = std::min<int64_t>(9, rows->back().step * 10 / cfg->train.steps);
    for (; shown < tenths; ++shown) {
      const std::string text = absl::StrFormat(" %d%%", (shown + 1) * 10);
      if (write(fd, text.data(), text.size()) < 0) return;
    }
  }
}

}  // namespace

int RunLocalClusterLogged(const std::string& log, const std::string& self_exe, const std::string& config_path,
                          const std::vector<std::string>& overrides, const std::string& scenario,
                          const std::string& emulation) {
  std::cout << std::flush;
  const int saved = dup(STDOUT_FILENO);
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (saved < 0 || fd < 0) {
    std::cerr << "longhaul: error: cannot write " << log << ": " << std::strerror(errno) << "\n";
    if (saved >= 0) close(saved);
    return 1;
  }
  dup2(fd, STDOUT_FILENO);
  std::atomic<bool> ended = false;
  std::thread progress([&] { ShowTenths(config_path, overrides, saved, ended); });
  const int rc = RunLocalCluster(self_exe, config_path, overrides, 0, scenario, emulation);
  ended = true;
  progress.join();
  std::cout << std::flush;
  dup2(saved, STDOUT_FILENO);
  close(saved), close(fd);
  return rc;
}

}  // namespace longhaul
