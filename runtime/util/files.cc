#include "util/files.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace longhaul {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  // In blocks (a pipe has no size to read at once): a character at a time is slow enough to show
  // in a recovering spare's set-up, which reads checkpoint files this way.
  std::string bytes;
  std::error_code ec;
  if (const uintmax_t size = std::filesystem::file_size(path, ec); !ec) bytes.reserve(size);
  std::vector<char> block(1 << 16);
  while (f.read(block.data(), static_cast<std::streamsize>(block.size())) || f.gcount() > 0) {
    bytes.append(block.data(), static_cast<size_t>(f.gcount()));
  }
  if (f.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return bytes;
}

}  // namespace longhaul
