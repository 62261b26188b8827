#pragma once
// Libraries loaded at run time (dlopen) rather than linked: a process that never calls one pays
// nothing for it, and one that cannot find it gets an error naming the fix, not a loader failure
// before main.
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace longhaul {

struct LoadedLibrary {
  std::string path;            // of `libraries`, the one loaded
  void* handle = nullptr;      // dlopen's, kept open for the process's life
  std::vector<void*> symbols;  // `required`'s addresses, in its order
};

// The first of `libraries` that dlopen loads (RTLD_NOW | RTLD_GLOBAL) and that has every symbol of
// `required`. Else FailedPrecondition: "cannot load <what>: tried <each library and why>; <fix>".
absl::StatusOr<LoadedLibrary> LoadFirst(const std::string& what, const std::vector<std::string>& libraries,
                                        const std::vector<std::string>& required, const std::string& fix);

}  // namespace longhaul
