#pragma once
// `longhaul local`: a coordinator and stages × replicas workers as separate processes on this
// machine, talking over loopback (or emulated links), their output in this terminal. Ctrl-C stops them all.
// With a scenario, each worker runs in its own emulated host (netem/emulated_network.h) and the
// coordinator in the router namespace, so data-plane traffic crosses the emulated links and the
// control plane does not. Where namespaces are not allowed (or with emulation "proxy"), workers
// stay on loopback and reach each other through a userspace proxy, one route per ordered pair.
#include <cstdint>
#include <string>
#include <vector>

namespace longhaul {

// Returns the process exit status: 0 when the job finished, else non-zero. With `worker_disks`,
// each worker writes to a run directory of its own (train.out_dir/worker_disks/wN), as machines
// that share no filesystem do: its checkpoint pieces travel through the coordinator.
int RunLocalCluster(const std::string& self_exe, const std::string& config_path,
                    const std::vector<std::string>& overrides, int64_t stop_at, const std::string& scenario = "",
                    const std::string& emulation = "auto", bool worker_disks = false);

// RunLocalCluster with this process's standard output, and so its children's, in the file `log`
// (created or truncated) for the call: for commands that run several jobs and print their own
// tables (`longhaul experiment`, `longhaul convergence`).
int RunLocalClusterLogged(const std::string& log, const std::string& self_exe, const std::string& config_path,
                          const std::vector<std::string>& overrides, const std::string& scenario = "",
                          const std::string& emulation = "auto");

}  // namespace longhaul
