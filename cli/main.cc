// longhaul: the command-line entry point. `longhaul train` runs a job in this process.
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "config/job_config.h"
#include "worker/local_trainer.h"

namespace {

int Fail(const absl::Status& s, int code) {
  std::cerr << "longhaul: error: " << s.message() << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"longhaul: GPT training across machines joined by slow networks"};
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> overrides;
  CLI::App* train = app.add_subcommand("train", "train a model in this process, as one stage and one replica");
  train->add_option("-c,--config", config_path, "job config (TOML)")->required();
  train->add_option("--set", overrides, "override a config key: --set train.steps=100 (repeatable)");
  int64_t stop_at = 0;
  train->add_option("--stop-at", stop_at,
                    "stop and checkpoint after this step; resume later with --set train.resume=true");

  CLI11_PARSE(app, argc, argv);

  if (train->parsed()) {
    auto cfg = longhaul::LoadJobConfig(config_path, overrides);
    if (!cfg.ok()) return Fail(cfg.status(), 2);
    auto trainer = longhaul::LocalTrainer::Create(*cfg);
    if (!trainer.ok()) return Fail(trainer.status(), 2);
    if (absl::Status s = (*trainer)->Run(std::cout, stop_at); !s.ok()) return Fail(s, 1);
  }
  return 0;
}
