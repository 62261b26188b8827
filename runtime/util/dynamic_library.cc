#include "util/dynamic_library.h"

#include <dlfcn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace longhaul {

absl::StatusOr<LoadedLibrary> LoadFirst(const std::string& what, const std::vector<std::string>& libraries,
                                        const std::vector<std::string>& required, const std::string& fix) {
  std::vector<std::string> tried;
  for (const std::string& lib : libraries) {
    // dlopen keeps a library it loaded either way, which is harmless: only the returned symbols
    // are used.
    void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      tried.push_back(absl::StrCat(lib, " (", dlerror(), ")"));
      continue;
    }
    LoadedLibrary loaded{lib, handle, {}};
    std::vector<std::string> missing;
    for (const std::string& name : required) {
      loaded.symbols.push_back(dlsym(handle, name.c_str()));
      if (loaded.symbols.back() == nullptr) missing.push_back(name);
    }
    if (missing.empty()) return loaded;
    tried.push_back(absl::StrCat(lib, " (loads, but has no ", absl::StrJoin(missing, "/"), ")"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot load ", what, ": tried ", absl::StrJoin(tried, ", "), "; ", fix));
}

}  // namespace longhaul
