#pragma once
// The worker role: registers with the coordinator, receives the plan (which stage of which
// replica it runs, where each parameter-server shard lives), then runs the stage's schedule every
// iteration: receive activations, forward, send; receive gradients, backward, send; push the
// stage's gradients to their PS shards, serve the shards it owns, pull the new parameters.
#include <string>

#include "absl/status/status.h"
#include "transport/rpc_auth.h"

namespace longhaul {

struct WorkerOptions {
  std::string coordinator;              // host:port
  std::string listen = "127.0.0.1:0";   // where peers reach this worker's tensor server
  std::string job_id;                   // if set, refuse to join any other job
  int threads = 0;                      // CPU threads; 0: train.threads from the job config
  std::string backend;                  // "cpu" or "cuda:N"; empty: the job's (cluster.stage_backends, train.backend)
  double connect_timeout_s = 60;        // how long to keep trying the coordinator
  std::string dial_map;                 // file of "address dial_instead" lines: reach peers through a proxy
  int slot = -1;                        // the worker id to ask for (a launcher's host number); -1: any
  std::string secret_file;              // the job secret (job_secret.h); empty: $LONGHAUL_SECRET_FILE, else none
  TlsFiles tls;                         // TLS to the coordinator (rpc_auth.h)
  // This worker's own run directory (its checkpoint pieces, its timeline); empty: the job's
  // train.out_dir. Where it is not the coordinator's, pieces travel through the coordinator.
  std::string out_dir;
};

// Runs until the job finishes (OK) or fails; errors name the peer or step involved.
absl::Status RunWorker(const WorkerOptions& opt);

}  // namespace longhaul
