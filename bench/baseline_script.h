#pragma once
// The benchmarks' PyTorch baselines (bench/*.py), run as a child process under a time limit: from
// $LONGHAUL_BENCH_DIR (a packed bundle's bench/) or else the source tree's bench/, with
// $LONGHAUL_PYTHON or else /usr/bin/python3 (Debian's python3-torch here; a GPU machine's image
// keeps PyTorch in the python3 first on its PATH).
#include <optional>
#include <string>

namespace longhaul::bench {

struct ScriptOutput {
  bool ok = false;  // exited with status 0 within the limit
  bool timed_out = false;
  std::string text;  // its stdout and stderr
  std::string interpreter;
};
ScriptOutput RunBaselineScript(const std::string& script, const std::string& args, int timeout_s);

// The number the script printed as "key=<number>", if it did.
std::optional<double> PrintedValue(const std::string& text, const std::string& key);

}  // namespace longhaul::bench
