#pragma once
// `longhaul convergence`: the convergence bench every setting that changes the numerics is judged
// by. It trains the job of its config (configs/convergence.toml: a GPT on real English text) once
// per setting and seed, every setting on the same tokens and layout (1 stage x 2 replicas over
// loopback: the numerics do not depend on the network), and prints in one run the validation loss
// against tokens and against emulated wall-clock, each setting's penalty against the exact path
// (plan/convergence_penalty.h) with the seed-to-seed spread beside it, writes the curves as an SVG
// and the penalties as the file the planner reads.
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace longhaul {

// Adds `convergence` (without -c/--set, which main adds as for every job command) and returns it.
CLI::App* AddConvergenceCommand(CLI::App& app);
// Runs the parsed `convergence`; returns the exit status (2 for bad input, 1 for a failed run).
int RunConvergenceCommand(const std::string& self_exe, const std::string& config_path,
                          const std::vector<std::string>& overrides, const std::string& command_line);

}  // namespace longhaul
