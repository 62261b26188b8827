#pragma once
// `longhaul experiment`: the source experiment (../shared/seeds/001: GPT-3 XL, GPipe over 12
// stages, micro-batch 1, 64 micro-batches) scaled to this machine and run under its five network
// settings, with a table of iteration times and their ratios to the default setting beside the
// source's: longhaul configured like the source and with its defaults, pipeline only and (with_dp)
// with data parallelism. `pace` names whose compute the scaling keeps the links' proportion to:
// "v100", the source's own (202 ms per micro-batch per stage, measured there), a named device at
// `efficiency` of its bf16 peak ("a100", "h100"), or a device profile's file (its bf16 blocks, else
// fp32) — so one box shows what the slow links cost at today's GPUs' pace.
#include <string>
#include <vector>

namespace longhaul {

struct ExperimentPace {
  std::string device = "v100";
  double efficiency = 0.45;
};

int RunExperiment(const std::string& self_exe, const std::string& config_path,
                  const std::vector<std::string>& overrides, const std::string& emulation, bool with_dp,
                  const ExperimentPace& pace = {});

}  // namespace longhaul
