#include "bench/baseline_script.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace longhaul::bench {

ScriptOutput RunBaselineScript(const std::string& script, const std::string& args, int timeout_s) {
  ScriptOutput r;
  const char* dir = std::getenv("LONGHAUL_BENCH_DIR");
  const char* python = std::getenv("LONGHAUL_PYTHON");
  r.interpreter = python != nullptr ? python : "/usr/bin/python3";
  const std::string path = std::string(dir != nullptr ? dir : LONGHAUL_SOURCE_DIR "/bench") + "/" + script;
  FILE* p = popen(absl::StrFormat("timeout %d %s %s %s 2>&1", timeout_s, r.interpreter, path, args).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) r.text += buf;
  const int status = pclose(p);
  r.timed_out = WIFEXITED(status) && WEXITSTATUS(status) == 124;
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return r;
}

std::optional<double> PrintedValue(const std::string& text, const std::string& key) {
  const size_t at = text.find(key + "=");
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + key.size() + 1, end = text.find_first_of(" \n", begin);
  double v = 0;
  if (!absl::SimpleAtod(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin), &v)) {
    return std::nullopt;
  }
  return v;
}

}  // namespace longhaul::bench
