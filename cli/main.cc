// longhaul: the command-line entry point.
//   train        one process, one stage, one replica
//   coordinator  the control plane of a multi-worker job
//   worker       one worker of a multi-worker job
//   local        a coordinator and its workers as processes on this machine
//   plan         the fastest layouts of a job on N devices over a network, by simulation
//   convergence  the convergence bench: each numerics-changing setting's penalty on real text
//   export, sample, tokenize   models in and out (cli/model_commands.h)
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

#include "cli/convergence.h"
#include "cli/experiment.h"
#include "cli/local_cluster.h"
#include "cli/model_commands.h"
#include "cli/netem_command.h"
#include "cli/plan_command.h"
#include "config/job_config.h"
#include "coordinator/coordinator.h"
#include "worker/local_trainer.h"
#include "worker/worker.h"
#include "version.h"

namespace {

// One write for the whole line: std::cerr writes each << on its own, and the processes of a local
// job share one stderr, where another process's line could land between a prefix and its message.
int Fail(const absl::Status& s, int code) {
  std::cerr << absl::StrCat("longhaul: error: ", s.message(), "\n");
  return code;
}

// Config errors (bad input) exit 2, everything else 1.
int CodeFor(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound ? 2 : 1;
}

void StopCoordinator(int) { longhaul::RequestCoordinatorStop(); }
void StopTrainer(int) { longhaul::LocalTrainer::RequestStop(); }

// A command line CLI11 cannot parse: one line naming the problem and the subcommands, status 2.
int UsageError(CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  std::string problem = absl::StrReplaceAll(e.what(), {{"\n", " "}});
  if (argc > 1 && argv[1][0] != '-' && std::find(names.begin(), names.end(), argv[1]) == names.end()) {
    problem = absl::StrCat("unknown subcommand '", argv[1], "'");
  } else if (argc > 1 && argv[1][0] != '-') {
    problem = absl::StrCat(argv[1], ": ", problem);
  }
  std::cerr << "longhaul: error: " << problem << " (subcommands: " << absl::StrJoin(names, ", ")
            << "; longhaul SUBCOMMAND --help lists its options)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"longhaul: GPT training across machines joined by slow networks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", LONGHAUL_VERSION_TEXT, "print the version, the commit and how this binary was built");

  std::string config_path;
  std::vector<std::string> overrides;
  auto add_config = [&](CLI::App* cmd) {
    cmd->add_option("-c,--config", config_path, "job config (TOML)")->required();
    cmd->add_option("--set", overrides, "override a config key: --set train.steps=100 (repeatable)");
  };

  int64_t stop_at = 0;
  std::vector<CLI::Option*> stop_at_options;
  auto add_stop_at = [&](CLI::App* cmd) {
    stop_at_options.push_back(cmd->add_option(
        "--stop-at", stop_at, "stop and checkpoint after this step; resume later with --set train.resume=true"));
  };

  CLI::App* train = app.add_subcommand("train", "train a model in this process, as one stage and one replica");
  add_config(train);
  add_stop_at(train);

  CLI::App* local = app.add_subcommand("local", "run a coordinator and its workers as processes on this machine");
  add_config(local);
  add_stop_at(local);
  std::string scenario;
  local->add_option("--scenario", scenario,
                    "run each worker in its own emulated host with this scenario's links (netem/scenarios/*.toml)");
  std::string emulation = "auto";
  local->add_option("--emulation", emulation,
                    "kernel (namespaces, needs root), proxy (userspace, splits TCP), or auto: kernel where allowed")
      ->check(CLI::IsMember({"auto", "kernel", "proxy"}))
      ->capture_default_str();
  bool worker_disks = false;
  local->add_flag("--worker-disks", worker_disks,
                  "each worker writes to a run directory of its own (train.out_dir/worker_disks/wN), as machines "
                  "without a shared filesystem: checkpoint pieces travel through the coordinator");

  CLI::App* experiment = app.add_subcommand(
      "experiment", "the source experiment scaled to this machine, under its five network settings");
  add_config(experiment);
  experiment->add_option("--emulation", emulation, "kernel, proxy or auto")
      ->check(CLI::IsMember({"auto", "kernel", "proxy"}))
      ->capture_default_str();
  bool pipeline_only = false;
  experiment->add_flag("--pipeline-only", pipeline_only,
                       "skip the data-parallel runs (8 workers, 48 micro-batches: most of the experiment's time)");
  longhaul::ExperimentPace pace;
  experiment
      ->add_option("--pace", pace.device,
                   "whose compute the links are weighed against: v100 (the source's own, 202 ms per micro-batch per "
                   "stage), a100, h100, or a device profile (runtime/plan/profiles/*.toml)")
      ->capture_default_str();
  experiment->add_option("--efficiency", pace.efficiency, "fraction of a named --pace device's bf16 peak its blocks reach")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();

  longhaul::CoordinatorOptions copt;
  CLI::App* coord = app.add_subcommand("coordinator", "run the coordinator of a multi-worker job");
  add_config(coord);
  add_stop_at(coord);
  coord->add_option("--listen", copt.listen, "address to listen on")->capture_default_str();
  coord->add_option("--port-file", copt.port_file, "write the bound port to this file");
  coord->add_option("--scenario", copt.scenario,
                    "the workers' links (netem/scenarios/*.toml, worker w on host w): predict the iteration time "
                    "and print it beside the measured one");

  auto add_security = [](CLI::App* cmd, std::string& secret_file, longhaul::TlsFiles& tls, bool coordinator) {
    cmd->add_option("--secret-file", secret_file,
                    "the job secret every process of the job holds (`longhaul secret FILE` makes one; default: "
                    "$LONGHAUL_SECRET_FILE, else none)");
    cmd->add_option("--tls-cert", tls.cert, coordinator ? "TLS: this coordinator's certificate (PEM)"
                                                        : "mutual TLS: this worker's certificate (PEM)");
    cmd->add_option("--tls-key", tls.key, "TLS: the key of --tls-cert (PEM)");
    cmd->add_option("--tls-ca", tls.ca, coordinator ? "mutual TLS: accept only workers with a certificate this CA signed"
                                                    : "TLS: the CA that signed the coordinator's certificate");
  };
  add_security(coord, copt.secret_file, copt.tls, true);
  coord->add_option("--metrics-listen", copt.metrics_listen,
                    "serve Prometheus metrics at http://ADDRESS/metrics (read-only, unauthenticated: a loopback "
                    "or monitoring address); the run directory's metrics.prom has them either way");

  std::string secret_out;
  CLI::App* secret = app.add_subcommand("secret", "write a new random job secret to a file only its owner can read");
  secret->add_option("file", secret_out, "where to write it (never overwritten)")->required();

  longhaul::WorkerOptions wopt;
  CLI::App* worker = app.add_subcommand("worker", "run one worker of a multi-worker job");
  worker->add_option("--coordinator", wopt.coordinator, "the coordinator's host:port")->required();
  worker->add_option("--listen", wopt.listen, "address peers reach this worker at (port 0 picks one)")
      ->capture_default_str();
  worker->add_option("--job-id", wopt.job_id, "refuse to join a job with another cluster.job_id");
  worker->add_option("--threads", wopt.threads, "CPU threads (default: train.threads of the job)")
      ->check(CLI::Range(0, 1024));
  worker->add_option("--connect-timeout", wopt.connect_timeout_s, "seconds to keep trying the coordinator")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  worker->add_option("--out-dir", wopt.out_dir,
                     "this worker's own run directory (default: the job's train.out_dir); where it is not the "
                     "coordinator's, checkpoint pieces travel through the coordinator");
  worker->add_option("--dial-map", wopt.dial_map, "file of 'peer_address dial_instead' lines (proxied links)");
  worker->add_option("--slot", wopt.slot,
                     "ask for this worker id (stage = id % stages, replica = id / stages), as a launcher that "
                     "placed the workers on known hosts does (default: the next free one)")
      ->check(CLI::Range(0, 65535));
  worker->add_option("--backend", wopt.backend, "\"cpu\" or \"cuda:N\" (default: train.backend of the job)")
      ->check([](const std::string& b) {
        const auto d = longhaul::ParseBackend(b, "--backend");
        return d.ok() ? std::string() : std::string(d.status().message());
      });

  add_security(worker, wopt.secret_file, wopt.tls, false);

  CLI::App* plan = longhaul::AddPlanCommand(app);
  add_config(plan);
  CLI::App* convergence = longhaul::AddConvergenceCommand(app);
  add_config(convergence);

  longhaul::AddNetemCommands(app);
  longhaul::AddModelCommands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return UsageError(app, argc, argv, e);
  }
  std::error_code ec;
  const std::string self_exe = std::filesystem::canonical("/proc/self/exe", ec).string();
  if (ec) return Fail(absl::InternalError(absl::StrCat("cannot resolve /proc/self/exe: ", ec.message())), 1);

  // --stop-at must name a step of the run, which only the config knows.
  for (const CLI::Option* o : stop_at_options) {
    if (o->count() == 0) continue;
    auto cfg = longhaul::LoadJobConfig(config_path, overrides);
    if (!cfg.ok()) return Fail(cfg.status(), 2);
    if (absl::Status s = longhaul::CheckStopAt(stop_at, *cfg); !s.ok()) return Fail(s, 2);
  }

  // Buffers are sized from the config and checked against the memory first; should an allocation
  // still fail, the process says so and exits instead of aborting.
  try {
    if (train->parsed()) {
      auto cfg = longhaul::LoadJobConfig(config_path, overrides);
      if (!cfg.ok()) return Fail(cfg.status(), 2);
      // Ctrl-C or SIGTERM ends the step under way, checkpoints and exits 130; a second one kills.
      struct sigaction sa = {};
      sa.sa_handler = StopTrainer;
      sa.sa_flags = SA_RESETHAND;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGINT, &sa, nullptr);
      sigaction(SIGTERM, &sa, nullptr);
      auto trainer = longhaul::LocalTrainer::Create(*cfg);
      if (!trainer.ok()) return Fail(trainer.status(), 2);
      if (absl::Status s = (*trainer)->Run(std::cout, stop_at); !s.ok()) {
        if (s.code() != absl::StatusCode::kCancelled) return Fail(s, 1);
        std::cerr << "longhaul train: " << s.message() << "\n";
        return 130;
      }
    } else if (local->parsed()) {
      return longhaul::RunLocalCluster(self_exe, config_path, overrides, stop_at, scenario, emulation, worker_disks);
    } else if (experiment->parsed()) {
      return longhaul::RunExperiment(self_exe, config_path, overrides, emulation, !pipeline_only, pace);
    } else if (coord->parsed()) {
      copt.config_path = config_path;
      copt.overrides = overrides;
      copt.stop_at = stop_at;
      signal(SIGINT, StopCoordinator);
      signal(SIGTERM, StopCoordinator);
      if (absl::Status s = longhaul::RunCoordinator(copt); !s.ok()) return Fail(s, CodeFor(s));
    } else if (worker->parsed()) {
      if (absl::Status s = longhaul::RunWorker(wopt); !s.ok()) return Fail(s, 1);
    } else if (secret->parsed()) {
      if (absl::Status s = longhaul::JobSecret::WriteNew(secret_out); !s.ok()) return Fail(s, 1);
      std::cout << "wrote a new job secret to " << secret_out << ": copy it to every host of the job and pass "
                << "--secret-file (or set LONGHAUL_SECRET_FILE)\n";
    } else if (plan->parsed()) {
      return longhaul::RunPlanCommand(config_path, overrides);
    } else if (convergence->parsed()) {
      return longhaul::RunConvergenceCommand(self_exe, config_path, overrides,
                                             absl::StrJoin(std::vector<std::string>(argv, argv + argc), " "));
    } else if (longhaul::ModelCommandParsed()) {
      if (absl::Status s = longhaul::RunModelCommand(); !s.ok()) return Fail(s, CodeFor(s));
    } else {
      return longhaul::RunNetemCommand(self_exe);
    }
  } catch (const std::bad_alloc&) {
    return Fail(absl::ResourceExhaustedError(
                    "out of memory: a buffer the job needs could not be allocated; lower train.micro_batch_size or "
                    "train.seq_len, set train.recompute = true, or use a smaller model"),
                1);
  } catch (const std::length_error& e) {
    return Fail(absl::ResourceExhaustedError(absl::StrCat(
                    "a buffer the job needs is larger than this machine can address (", e.what(),
                    "): lower train.micro_batch_size or train.seq_len, or use a smaller model")),
                1);
  }
  return 0;
}
