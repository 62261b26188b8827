#include "netem/emulated_network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "netem/delay_daemon.h"
#include "netem/netns.h"
#include "netem/tc_commands.h"
#include "util/status_macros.h"

namespace longhaul::netem {
namespace fs = std::filesystem;

namespace {


absl::Status Sh(const std::string& cmd) {
  const std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  std::string out;
  char buf[512];
  while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = p != nullptr ? pclose(p) : -1;
  if (rc != 0) return absl::InternalError(absl::StrCat("`", cmd, "` failed: ", out));
  return absl::OkStatus();
}

void DeleteNamespacesWithPrefix(const std::string& prefix) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) std::system(("ip netns del " + name + " >/dev/null 2>&1").c_str());
  }
}

}  // namespace

std::string EmulatedNetwork::Address(int host) { return absl::StrFormat("10.251.%d.2", host + 1); }
std::string EmulatedNetwork::GatewayOf(int host) { return absl::StrFormat("10.251.%d.1", host + 1); }

std::vector<std::string> EmulatedNetwork::Exec(int host) const { return {"ip", "netns", "exec", hosts_[host]}; }
std::vector<std::string> EmulatedNetwork::ExecInRouter() const { return {"ip", "netns", "exec", router_}; }

absl::StatusOr<std::unique_ptr<EmulatedNetwork>> EmulatedNetwork::Create(const Scenario& s, int hosts,
                                                                         const NetworkOptions& opt) {
  if (hosts < 1 || hosts > 250) return absl::InvalidArgumentError("between 1 and 250 emulated hosts");
  std::string why;
  if (!CanCreateNamespaces(&why)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kernel-level link emulation ", why, "; run as root, or use the userspace proxy (longhaul netem proxy)"));
  }
  // Inside a namespace the kernel refuses (EPERM) a congestion control not on this list.
  std::ifstream allowed_file("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  std::string allowed;
  std::getline(allowed_file, allowed);
  if (const std::vector<std::string> names = absl::StrSplit(allowed, ' ', absl::SkipEmpty());
      allowed_file && std::find(names.begin(), names.end(), opt.congestion_control) == names.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "congestion control \"%s\" cannot be chosen inside a network namespace here "
        "(net.ipv4.tcp_allowed_congestion_control = \"%s\"): choose one of those, or allow it with "
        "sysctl -w net.ipv4.tcp_allowed_congestion_control=\"%s %s\"",
        opt.congestion_control, allowed, allowed, opt.congestion_control));
  }
  std::unique_ptr<EmulatedNetwork> n(new EmulatedNetwork());
  n->prefix_ = absl::StrCat("lh", getpid(), "-");
  absl::Status st = n->Build(s, hosts, opt);
  if (!st.ok()) return st;  // the destructor removes what was made
  return n;
}

absl::Status EmulatedNetwork::Build(const Scenario& s, int hosts, const NetworkOptions& opt) {
  work_dir_ = opt.work_dir;
  // The guardian outlives a crash of this process: when the pipe's write end closes, for whatever
  // reason, it deletes the namespaces (which takes the veths, rules and qdiscs with them).
  // Close-on-exec: the processes this one starts later must not hold the write end open.
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe");
  guardian_ = fork();
  if (guardian_ == 0) {
    close(fds[1]);
    setsid();  // out of the terminal's process group: Ctrl-C reaches the launcher, not the guardian
    signal(SIGINT, SIG_IGN);
    char c;
    while (read(fds[0], &c, 1) > 0) {
    }
    DeleteNamespacesWithPrefix(prefix_);
    _exit(0);
  }
  close(fds[0]);
  guardian_pipe_ = fds[1];

  router_ = prefix_ + "r";
  LH_RETURN_IF_ERROR(Sh("ip netns add " + router_));
  LH_RETURN_IF_ERROR(Sh("ip -n " + router_ + " link set lo up"));
  LH_RETURN_IF_ERROR(Sh("ip netns exec " + router_ + " sysctl -qw net.ipv4.ip_forward=1"));
  double max_bdp_bytes = 4 << 20;
  for (int i = 0; i < hosts; ++i)
    for (int j = 0; j < hosts; ++j) {
      const Link l = s.Between(i, j);
      max_bdp_bytes = std::max(max_bdp_bytes, (l.rate_mbit > 0 ? l.rate_mbit : 10000) * 1e6 / 8 * 2 * l.delay_ms / 1e3);
    }
  // Socket buffers of twice the largest bandwidth-delay product, or TCP, not the link, sets the rate.
  const long buf = static_cast<long>(2 * max_bdp_bytes);
  for (int i = 0; i < hosts; ++i) {
    const std::string ns = prefix_ + "h" + std::to_string(i);
    hosts_.push_back(ns);
    LH_RETURN_IF_ERROR(Sh("ip netns add " + ns));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s link add h%d type veth peer name eth0 netns %s", router_, i, ns)));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s addr add %s/24 dev h%d", router_, GatewayOf(i), i)));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s link set h%d up", router_, i)));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s addr add %s/24 dev eth0", ns, Address(i))));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s link set eth0 up", ns)));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s link set lo up", ns)));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s route add default via %s", ns, GatewayOf(i))));
    // What TCP hands eth0 at once crosses an htb bucket whole: on a slow link, packets of a
    // millisecond of its rate (GsoSegments), not 64 KiB, or a pause's refilled bucket lets a
    // message through faster than the link.
    double slowest = 0;
    for (int j = 0; j < hosts; ++j) {
      if (j == i) continue;
      const Link l = s.Between(i, j);
      for (double card : {s.EgressMbit(i), s.IngressMbit(j)}) {
        const double ceil = LinkShare(l.rate_mbit, card, hosts - 1).ceil_mbit;
        if (ceil > 0 && (slowest == 0 || ceil < slowest)) slowest = ceil;
      }
    }
    if (const int segments = GsoSegments(slowest); segments > 0) {
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip -n %s link set dev eth0 gso_max_segs %d", ns, segments)));
    }
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat(
        "ip netns exec %s sysctl -qw net.ipv4.tcp_congestion_control=%s net.ipv4.tcp_rmem='4096 131072 %d' "
        "net.ipv4.tcp_wmem='4096 16384 %d' net.ipv4.tcp_no_metrics_save=1 net.ipv4.tcp_slow_start_after_idle=0",
        ns, opt.congestion_control, buf, buf)));
  }
  // A host's card, egress: on the host's own veth, which every packet it sends crosses, one htb
  // class of the card's rate over one class per destination, so its links share the card as
  // their flows would on a host whose queue is fair per flow (each guaranteed an equal part, free
  // to borrow what the others leave).
  for (int i = 0; i < hosts; ++i) {
    const double card = s.EgressMbit(i);
    if (card <= 0) continue;
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("tc -n %s qdisc add dev eth0 root handle 1: htb default 1 r2q 1000", hosts_[i])));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("tc -n %s class add dev eth0 parent 1: classid 1:1 htb rate 100gbit", hosts_[i])));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("tc -n %s class add dev eth0 parent 1: classid 1:2 htb rate %gmbit ceil %gmbit "
                                          "burst %d cburst %d",
                                          hosts_[i], card, card, HtbBurstBytes(card), HtbBurstBytes(card))));
    for (int j = 0; j < hosts; ++j) {
      if (j == i) continue;
      const Link l = s.Between(i, j);
      const HtbShare share = LinkShare(l.rate_mbit, card, hosts - 1);
      const double ceil = share.ceil_mbit;
      const int cls = 10 + j;
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat(
          "tc -n %s class add dev eth0 parent 1:2 classid 1:%d htb rate %gmbit ceil %gmbit burst %d cburst %d",
          hosts_[i], cls, share.rate_mbit, ceil, HtbBurstBytes(ceil), HtbBurstBytes(ceil))));
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat("tc -n %s qdisc add dev eth0 parent 1:%d pfifo limit %d", hosts_[i], cls,
                                            QueueLimitPackets(ceil, l.delay_ms))));
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat(
          "tc -n %s filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst %s/32 flowid 1:%d", hosts_[i],
          Address(j), cls)));
    }
  }
  // Rates: on the router's egress towards host j, one htb class per source host at its pair's
  // rate; under one class of the card's rate where host j has an ingress card, which its sources
  // then share (each guaranteed an equal part, any of them free to borrow what the others leave).
  std::vector<PairDelay> delays;
  for (int j = 0; j < hosts; ++j) {
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("tc -n %s qdisc add dev h%d root handle 1: htb default 1 r2q 1000", router_, j)));
    LH_RETURN_IF_ERROR(Sh(absl::StrFormat("tc -n %s class add dev h%d parent 1: classid 1:1 htb rate 100gbit", router_, j)));
    const double card = s.IngressMbit(j);
    const std::string parent = card > 0 ? "1:2" : "1:";
    if (card > 0) {
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat(
          "tc -n %s class add dev h%d parent 1: classid 1:2 htb rate %gmbit ceil %gmbit burst %d cburst %d", router_, j,
          card, card, HtbBurstBytes(card), HtbBurstBytes(card))));
    }
    for (int i = 0; i < hosts; ++i) {
      if (i == j) continue;
      const Link l = s.Between(i, j);
      delays.push_back(DaemonLink(l, *ParseIpv4(Address(i)), *ParseIpv4(Address(j))));
      const HtbShare share = LinkShare(l.rate_mbit, card, hosts - 1);
      const double ceil = share.ceil_mbit;
      if (ceil <= 0) continue;
      const int cls = 10 + i;
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat(
          "tc -n %s class add dev h%d parent %s classid 1:%d htb rate %gmbit ceil %gmbit burst %d cburst %d", router_,
          j, parent, cls, share.rate_mbit, ceil, HtbBurstBytes(ceil), HtbBurstBytes(ceil))));
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat("tc -n %s qdisc add dev h%d parent 1:%d pfifo limit %d", router_, j, cls,
                                            QueueLimitPackets(ceil, l.delay_ms))));
      LH_RETURN_IF_ERROR(Sh(absl::StrFormat(
          "tc -n %s filter add dev h%d parent 1: protocol ip prio 1 u32 match ip src %s/32 flowid 1:%d", router_, j,
          Address(i), cls)));
    }
  }
  // Delays: the daemon holds every forwarded packet; no --queue-bypass, so without it nothing passes.
  const std::string links = (fs::path(opt.work_dir) / (prefix_ + "links.txt")).string();
  LH_RETURN_IF_ERROR(WriteLinksFile(links, delays));
  const std::string ready = (fs::path(opt.work_dir) / (prefix_ + "delayd.log")).string();
  std::fflush(nullptr);  // the child's freopen would write out a copy of what stdout still buffers
  daemon_ = fork();
  if (daemon_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    // Out of the terminal's process group: a Ctrl-C reaches the launcher, which stops the run
    // while packets still flow, and only then the daemon.
    setpgid(0, 0);
    if (freopen(ready.c_str(), "w", stdout) == nullptr) _exit(127);
    execl("/usr/sbin/ip", "ip", "netns", "exec", router_.c_str(), opt.self_exe.c_str(), "netem", "delayd", "--queue",
          std::to_string(kDelayQueue).c_str(), "--links", links.c_str(), nullptr);
    execlp("ip", "ip", "netns", "exec", router_.c_str(), opt.self_exe.c_str(), "netem", "delayd", "--queue",
           std::to_string(kDelayQueue).c_str(), "--links", links.c_str(), nullptr);
    _exit(127);
  }
  for (int i = 0; i < 100; ++i) {
    std::ifstream f(ready);
    std::string word;
    if (f >> word && word == "ready") break;
    LH_RETURN_IF_ERROR(CheckDaemon());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  LH_RETURN_IF_ERROR(CheckDaemon());
  LH_RETURN_IF_ERROR(Sh(absl::StrFormat("ip netns exec %s iptables -A FORWARD -j NFQUEUE --queue-num %d", router_, kDelayQueue)));

  if (opt.verify && hosts >= 2) {
    const double want = s.Between(0, 1).delay_ms + s.Between(1, 0).delay_ms;
    LH_ASSIGN_OR_RETURN(double rtt, MeasureRoundTripMs(0, 1));
    if (rtt < 0.8 * want - 0.2 || rtt > 1.5 * want + 5) {
      return absl::InternalError(absl::StrFormat(
          "the emulated round trip from host 0 to host 1 is %.2f ms, expected %.2f ms: the delay daemon is not "
          "holding packets",
          rtt, want));
    }
  }
  return absl::OkStatus();
}

absl::Status EmulatedNetwork::CheckDaemon() {
  if (daemon_ <= 0) return absl::FailedPreconditionError("no delay daemon");
  int status;
  if (waitpid(daemon_, &status, WNOHANG) == daemon_) {
    daemon_ = -1;
    daemon_died_ = true;
    return absl::UnavailableError(absl::StrCat(
        "the delay daemon (NFQUEUE) died: links are no longer emulated and packets are dropped; stop the experiment "
        "(its log: ",
        (fs::path(work_dir_) / (prefix_ + "delayd.log")).string(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> EmulatedNetwork::MeasureRoundTripMs(int a, int b) {
  LH_ASSIGN_OR_RETURN(int srv, SocketIn(hosts_[b], AF_INET, SOCK_STREAM));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, Address(b).c_str(), &addr.sin_addr);
  bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(srv, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(srv, 8);
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {  // the SYN / SYN-ACK exchange is one round trip
    auto cli = SocketIn(hosts_[a], AF_INET, SOCK_STREAM);
    if (!cli.ok()) {
      close(srv);
      return cli.status();
    }
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = connect(*cli, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    close(*cli);
    if (rc != 0) {
      close(srv);
      return absl::UnavailableError(absl::StrFormat("host %d cannot reach host %d through the router", a, b));
    }
    const int c = accept(srv, nullptr, nullptr);
    if (c >= 0) close(c);
    best = std::min(best, ms);
  }
  close(srv);
  return best;
}

void EmulatedNetwork::Teardown() {
  if (daemon_ > 0) {
    kill(daemon_, SIGTERM);
    waitpid(daemon_, nullptr, 0);
    daemon_ = -1;
  }
  if (!prefix_.empty()) DeleteNamespacesWithPrefix(prefix_);
  if (guardian_pipe_ >= 0) {
    close(guardian_pipe_);  // the guardian wakes, finds nothing left, and exits
    guardian_pipe_ = -1;
    waitpid(guardian_, nullptr, 0);
  }
  std::error_code ec;
  fs::remove(fs::path(work_dir_) / (prefix_ + "links.txt"), ec);
  if (!daemon_died_) fs::remove(fs::path(work_dir_) / (prefix_ + "delayd.log"), ec);  // kept to explain a death
}

EmulatedNetwork::~EmulatedNetwork() { Teardown(); }

int EmulatedNetwork::CleanupStale() {
  int removed = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("lh", 0) != 0) continue;
    const size_t dash = name.find('-');
    if (dash == std::string::npos) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(2, dash - 2), &pid) || pid <= 0) continue;
    if (kill(pid, 0) == 0) continue;  // its owner still runs
    std::system(("ip netns del " + name + " >/dev/null 2>&1").c_str());
    ++removed;
  }
  return removed;
}

}  // namespace longhaul::netem
