#include "cli/netem_command.h"

#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "netem/delay_daemon.h"
#include "netem/emulated_network.h"
#include "scenario/scenario.h"
#include "netem/tc_commands.h"
#include "netem/tcp_proxy.h"
#include "transport/tensor_transport.h"

namespace longhaul {
namespace {

struct NetemArgs {
  CLI::App *delayd = nullptr, *tc = nullptr, *clean = nullptr, *check = nullptr, *sink = nullptr, *send = nullptr,
           *proxy = nullptr;
  std::string routes, proxy_to;
  double delay_ms = 0, rate_mbit = 0;
  std::string listen = "0.0.0.0:7099", to;
  int megabytes = 64, repeat = 4;  // probe-send's tensor size, probe-sink's largest
  int kilobytes = 0;               // probe-send: a size in KiB instead of --mb
  double gap_ms = 0;               // probe-send: idle time between transfers
  int connections = 1;             // probe-send: TCP connections each tensor is split over
  int queue = 7;
  std::string links, scenario, hosts, dev = "eth0";
  uint64_t seed = 1;
  int self = 0, host_count = 2;
  bool apply = false, clear = false, delay_daemon = false;
} g;

int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Error(const absl::Status& s, int code) {
  std::cerr << "longhaul netem: error: " << s.message() << "\n";
  return code;
}

}  // namespace

void AddNetemCommands(CLI::App& app) {
  CLI::App* netem = app.add_subcommand("netem", "link emulation: delay daemon, tc for real hosts, checks, cleanup");
  netem->require_subcommand(1);
  g.delayd = netem->add_subcommand("delayd", "the NFQUEUE delay daemon (started by `local --scenario`)");
  g.delayd->add_option("--queue", g.queue)->check(CLI::Range(0, 65535))->capture_default_str();
  g.delayd->add_option("--links", g.links, "links file: src dst delay_ns jitter_ns loss per line")->required();
  g.delayd->add_option("--seed", g.seed)->capture_default_str();

  g.tc = netem->add_subcommand("tc", "print (or --apply) the tc commands that emulate a scenario on a real host");
  g.tc->add_option("--scenario", g.scenario, "scenario file (netem/scenarios/*.toml)")->required();
  g.tc->add_option("--hosts", g.hosts, "every host's address, comma-separated, in placement order")->required();
  g.tc->add_option("--self", g.self, "this host's index in --hosts")->required()->check(CLI::NonNegativeNumber);
  g.tc->add_option("--dev", g.dev, "network device")->capture_default_str();
  g.tc->add_flag("--apply", g.apply, "run the commands instead of printing them");
  g.tc->add_flag("--clear", g.clear, "remove what --apply installed");
  g.tc->add_flag("--delay-daemon", g.delay_daemon,
                 "for kernels without sch_netem (containers on such hosts too): htb for the rates, and iptables "
                 "hands packets to the delay daemon, which this command then runs (with --apply) until stopped");
  g.tc->add_option("--links", g.links,
                   "with --delay-daemon: where to write the daemon's links file (default /tmp/longhaul-delayd-links.txt)");

  g.check = netem->add_subcommand("check", "build an emulated network, measure its round trips, remove it");
  g.check->add_option("--scenario", g.scenario, "scenario file")->required();
  g.check->add_option("--hosts", g.host_count, "emulated hosts")->check(CLI::Range(1, 254))->capture_default_str();

  g.clean = netem->add_subcommand("clean", "remove namespaces left by longhaul processes that died");

  g.proxy = netem->add_subcommand("proxy", "userspace TCP proxy with delay and rate (no root needed; splits TCP)");
  g.proxy->add_option("--routes", g.routes, "routes file: listen target delay_ms rate_mbit per line");
  g.proxy->add_option("--listen", g.listen, "one route: listen here");
  g.proxy->add_option("--to", g.proxy_to, "one route: forward to here");
  g.proxy->add_option("--delay-ms", g.delay_ms, "one route: one-way delay, applied in both directions")
      ->check(CLI::NonNegativeNumber);
  g.proxy
      ->add_option("--rate-mbit", g.rate_mbit,
                   "one route: rate of each direction, shared by its connections (0: unlimited)")
      ->check(CLI::NonNegativeNumber);

  g.sink = netem->add_subcommand("probe-sink", "receive tensors with longhaul's transport (pair with probe-send)");
  g.sink->add_option("--listen", g.listen)->capture_default_str();
  g.sink->add_option("--max-mb", g.megabytes, "largest tensor accepted, MB")->capture_default_str();
  g.send = netem->add_subcommand("probe-send", "time tensors sent with longhaul's transport to a probe-sink");
  g.send->add_option("--to", g.to, "the sink's host:port")->required();
  g.send->add_option("--mb", g.megabytes)->check(CLI::Range(1, 65536))->capture_default_str();
  g.send->add_option("--kb", g.kilobytes, "tensor size in KiB (instead of --mb), as small as an activation")
      ->check(CLI::Range(1, 65536 * 1024));
  g.send->add_option("--gap-ms", g.gap_ms, "idle time between transfers, as between a job's iterations")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  g.send->add_option("--connections", g.connections, "TCP connections each tensor is split over (as transport.connections)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  g.send->add_option("--repeat", g.repeat, "transfers; the first warms the connection up")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

int RunNetemCommand(const std::string& self_exe) {
  if (g.delayd->parsed()) {
    absl::Status s = netem::RunDelayDaemon(g.queue, g.links, g.seed);
    return s.ok() ? 0 : Error(s, 1);
  }
  if (g.tc->parsed()) {
    const std::vector<std::string> hosts = absl::StrSplit(g.hosts, ',', absl::SkipEmpty());
    const netem::DelayBy by = g.delay_daemon ? netem::DelayBy::kDaemon : netem::DelayBy::kNetem;
    if (g.links.empty()) g.links = "/tmp/longhaul-delayd-links.txt";
    std::vector<std::string> cmds;
    if (g.clear) {
      cmds = netem::TcClearCommands(g.dev, by);
    } else {
      auto s = netem::LoadScenario(g.scenario);
      if (!s.ok()) return Error(s.status(), 2);
      if (g.self < 0 || g.self >= static_cast<int>(hosts.size())) {
        return Error(absl::InvalidArgumentError("--self must index --hosts"), 2);
      }
      cmds = netem::TcCommandsForHost(*s, hosts, g.self, g.dev, by);
      if (g.delay_daemon) {
        auto links = netem::DaemonLinksForHost(*s, hosts, g.self);
        if (!links.ok()) return Error(links.status(), 2);
        if (absl::Status w = netem::WriteLinksFile(g.links, *links); !w.ok()) return Error(w, 1);
      }
    }
    for (const std::string& c : cmds) {
      if (!g.apply) {
        std::cout << c << "\n";
      } else if (std::system(c.c_str()) != 0) {
        return Error(absl::InternalError(absl::StrCat(
                         "`", c, "` failed (", g.delay_daemon ? "is this process allowed NET_ADMIN?" : "does this "
                         "kernel have sch_netem and sch_htb? --delay-daemon needs no sch_netem", ")")),
                     1);
      }
    }
    if (!g.delay_daemon || g.clear) return 0;
    if (!g.apply) {
      std::cout << "longhaul netem delayd --queue " << netem::kDelayQueue << " --links " << g.links << "\n";
      return 0;
    }
    // Packets to the peers now wait in the queue (no bypass: without the daemon they would pass
    // undelayed, and an experiment would measure the wrong network); serve it until stopped.
    absl::Status d = netem::RunDelayDaemon(netem::kDelayQueue, g.links, g.seed);
    return d.ok() ? 0 : Error(d, 1);
  }
  if (g.check->parsed()) {
    auto s = netem::LoadScenario(g.scenario);
    if (!s.ok()) return Error(s.status(), 2);
    auto net = netem::EmulatedNetwork::Create(*s, g.host_count, {self_exe});
    if (!net.ok()) return Error(net.status(), 1);
    std::cout << absl::StrFormat("%s: %d hosts; round trips (ms), measured / set:\n", s->name, g.host_count);
    for (int a = 0; a < g.host_count; ++a)
      for (int b = 0; b < g.host_count; ++b) {
        if (a == b) continue;
        auto rtt = (*net)->MeasureRoundTripMs(a, b);
        if (!rtt.ok()) return Error(rtt.status(), 1);
        std::cout << absl::StrFormat("  host %d -> %d: %7.2f / %7.2f   rate %g Mbit/s\n", a, b, *rtt,
                                     s->Between(a, b).delay_ms + s->Between(b, a).delay_ms, s->Between(a, b).rate_mbit);
      }
    return 0;
  }
  if (g.sink->parsed()) {
    // Takes every tensor that arrives and hands its buffer back, until killed.
    Mailbox box;
    const AnyTensorUpTo admission(static_cast<uint64_t>(g.megabytes) << 18);
    auto server = TensorServer::Start(g.listen, "probe", &box, &admission);
    if (!server.ok()) return Error(server.status(), 1);
    std::cout << "listening " << (*server)->address() << std::endl;
    for (int64_t i = 0;; ++i) {
      auto t = box.Take({proto::ACTIVATION, i, 0, 0, 0, 0}, std::chrono::hours(24));
      if (!t.ok()) return Error(t.status(), 1);
      // Monotonic time, shared by every process of the host: the sender's start minus this is the
      // tensor's one-way latency.
      std::cout << absl::StrFormat("received %d at %d ns\n", i, MonotonicNs()) << std::flush;
      box.Recycle(std::move(*t));
    }
  }
  if (g.send->parsed()) {
    TransportOptions opt;
    opt.job_id = "probe";
    opt.timeout = std::chrono::seconds(60);
    opt.connections = g.connections;
    TensorClient client(g.to, opt);
    std::vector<float> x(g.kilobytes > 0 ? static_cast<size_t>(g.kilobytes) << 8 : static_cast<size_t>(g.megabytes) << 18,
                         1.0f);
    for (int i = 0; i < g.repeat; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(g.gap_ms));
      proto::TensorHeader h;
      h.set_kind(proto::ACTIVATION);
      h.set_iteration(i);
      const auto t0 = std::chrono::steady_clock::now();
      std::cout << absl::StrFormat("sending %d at %d ns\n", i, MonotonicNs()) << std::flush;
      absl::Status s = client.Send(h, x.data(), x.size())->Wait();
      if (!s.ok()) return Error(s, 1);
      std::cout << absl::StrFormat("transfer %d acknowledged after %.4f s\n", i,
                                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count())
                << std::flush;
    }
    return 0;
  }
  if (g.proxy->parsed()) {
    std::vector<netem::ProxyRoute> routes;
    if (!g.routes.empty()) {
      auto r = netem::ReadRoutesFile(g.routes);
      if (!r.ok()) return Error(r.status(), 2);
      routes = *r;
    } else if (!g.proxy_to.empty()) {
      routes.push_back({g.listen, g.proxy_to, {g.delay_ms, 0, g.rate_mbit, 0}});
    } else {
      return Error(absl::InvalidArgumentError("give --routes FILE, or --listen, --to, --delay-ms and --rate-mbit"), 2);
    }
    absl::Status s = netem::RunProxy(routes);
    return s.ok() ? 0 : Error(s, 1);
  }
  if (g.clean->parsed()) {
    std::cout << "removed " << netem::EmulatedNetwork::CleanupStale() << " stale namespaces\n";
    return 0;
  }
  return -1;
}

}  // namespace longhaul
