#pragma once
// Tier-2 link emulation on one box: each emulated host is a network namespace with one veth to a
// router namespace; the router forwards between hosts, holds every forwarded packet for its
// pair's one-way delay (the delay daemon, NFQUEUE) and caps each pair's rate (htb on the router's
// egress). TCP stays end to end, so windows, slow start and gRPC flow control behave as on a real
// link. Everything it creates lives inside its namespaces and goes when they are deleted: on
// destruction, and, through a guardian process, when the creating process dies any other way.
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scenario/scenario.h"

namespace longhaul::netem {

struct NetworkOptions {
  std::string self_exe;                     // the longhaul binary, which runs the delay daemon
  // Set in every host namespace. Inside a namespace only net.ipv4.tcp_allowed_congestion_control
  // may be chosen (reno and bbr on these machines), so BBR, which real links here run too.
  std::string congestion_control = "bbr";
  std::string work_dir = "/tmp";            // links file and daemon log
  bool verify = true;                       // measure a round trip before returning
};

class EmulatedNetwork {
 public:
  static absl::StatusOr<std::unique_ptr<EmulatedNetwork>> Create(const Scenario& scenario, int hosts,
                                                                 const NetworkOptions& opt);
  ~EmulatedNetwork();

  int hosts() const { return static_cast<int>(hosts_.size()); }
  const std::string& router() const { return router_; }
  const std::string& netns(int host) const { return hosts_[host]; }
  // Host i's address, and the router's address on host i's link (where host i reaches a process
  // running in the router namespace without any emulated delay).
  static std::string Address(int host);
  static std::string GatewayOf(int host);
  // argv prefix that runs a command inside host i's namespace.
  std::vector<std::string> Exec(int host) const;
  std::vector<std::string> ExecInRouter() const;

  // OK while the delay daemon runs; else says that the experiment is no longer emulating.
  absl::Status CheckDaemon();
  pid_t daemon_pid() const { return daemon_; }
  // Connect time (one round trip) from host a to host b, in milliseconds.
  absl::StatusOr<double> MeasureRoundTripMs(int a, int b);

  // Removes every namespace a dead longhaul process left (names lh<pid>...); returns how many.
  static int CleanupStale();

 private:
  EmulatedNetwork() = default;
  absl::Status Build(const Scenario& s, int hosts, const NetworkOptions& opt);
  void Teardown();

  std::string prefix_, router_, work_dir_ = "/tmp";
  bool daemon_died_ = false;
  std::vector<std::string> hosts_;
  pid_t daemon_ = -1, guardian_ = -1;
  int guardian_pipe_ = -1;
};

}  // namespace longhaul::netem
