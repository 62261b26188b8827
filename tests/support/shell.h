#pragma once
// Test helper: a shell command's exit status and its output (stdout and stderr together).
#include <cstdio>
#include <string>

namespace longhaul::testing {

struct ShResult {
  int status = -1;
  std::string output;
};

inline ShResult Sh(const std::string& command) {
  ShResult r;
  FILE* sh = popen((command + " 2>&1").c_str(), "r");
  if (sh == nullptr) return r;
  char line[512];
  while (fgets(line, sizeof(line), sh) != nullptr) r.output += line;
  r.status = pclose(sh);
  return r;
}

}  // namespace longhaul::testing
