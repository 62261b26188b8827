#pragma once
// `longhaul plan`: the fastest layouts of a job's model and global batch on N workers of one device
// over one network (plan/layout_search.h), as a ranked table with the figures the seed notes worked
// out by hand (iteration time, tokens/s, TFLOP/s per GPU, MFU, days per 100B tokens, memory), the
// layouts memory rules out and why, and the best one as `--set` overrides. Then the settings that
// change the numerics (local updates, wire compression, a larger global batch), each charged the
// convergence penalty the bench measured (plan/convergence_penalty.h), ranked by time to the same
// loss, and the best one's config written for `longhaul local`.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace longhaul {

// Adds `plan` (without -c/--set, which main adds as for every job command) and returns it.
CLI::App* AddPlanCommand(CLI::App& app);
// Runs the parsed `plan`; returns the exit status (2 for bad input).
int RunPlanCommand(const std::string& config_path, const std::vector<std::string>& overrides);

}  // namespace longhaul
