#pragma once
// `longhaul netem ...`: link emulation tools (delay daemon, tc for real hosts, checks, cleanup,
// the userspace proxy).
#include <CLI/CLI.hpp>

namespace longhaul {

// Adds the netem subcommands to `app`; RunNetemCommand runs whichever was parsed.
void AddNetemCommands(CLI::App& app);
// Returns the exit status, or -1 when no netem subcommand was parsed.
int RunNetemCommand(const std::string& self_exe);

}  // namespace longhaul
