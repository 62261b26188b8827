#include "util/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace longhaul {

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace longhaul
