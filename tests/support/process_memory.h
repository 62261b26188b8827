#pragma once
// Test helper: the resident memory of a process, from /proc/<pid>/status (0 if unknown).
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace longhaul::testing {

inline int64_t ResidentBytes(pid_t pid = getpid()) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      int64_t kib = 0;
      f >> kib;
      return kib * 1024;
    }
    f.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace longhaul::testing
