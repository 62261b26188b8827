#pragma once
// `longhaul experiment`: the source experiment (../shared/seeds/001: GPT-3 XL, GPipe over 12
// stages, micro-batch 1, 64 micro-batches) scaled to this machine and run under its five network
// settings, with a table of iteration times and their ratios to the default setting beside the
// source's: longhaul configured like the source and with its defaults, pipeline only and (with_dp)
// with data parallelism.
#include <string>
#include <vector>

namespace longhaul {

int RunExperiment(const std::string& self_exe, const std::string& config_path,
                  const std::vector<std::string>& overrides, const std::string& emulation, bool with_dp);

}  // namespace longhaul
