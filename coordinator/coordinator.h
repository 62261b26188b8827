#pragma once
// The coordinator role: one per job, control plane only (no tensor passes through it). It admits
// workers, publishes the plan (stage and replica of each worker, parameter-server shard
// placement) and its later versions, records each iteration and prints its progress line, keeps
// the checkpoint index, notices lost workers and recovers from them, and at the end writes the
// run's records. RunCoordinator is its start-up: where the job goes on from, the job (job.h), the
// gRPC service (service.h) and the supervisor's loop (supervisor.h).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "transport/rpc_auth.h"

namespace longhaul {

struct CoordinatorOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // section.key=value
  std::string listen = "0.0.0.0:7070";
  std::string port_file;  // if set, the bound port is written here once listening
  int64_t stop_at = 0;    // stop and checkpoint after this step (the schedule still spans train.steps)
  // The workers' network, if known (a netem scenario, worker w on host w): the coordinator then
  // prints the planner's prediction of the iteration time beside the measured one.
  std::string scenario;
  std::string secret_file;  // the job secret (job_secret.h); empty: $LONGHAUL_SECRET_FILE, else none
  TlsFiles tls;             // TLS on the port (rpc_auth.h)
  // Where to serve Prometheus metrics (metrics_endpoint.h); empty: nowhere (metrics.prom in the
  // run directory still has them).
  std::string metrics_listen;
};

absl::Status RunCoordinator(const CoordinatorOptions& opt);

// Set from a signal handler: the coordinator stops the job and exits.
void RequestCoordinatorStop();

}  // namespace longhaul
