#pragma once
// Reading a file whole: checkpoints, configs, vocabularies, trace files, /proc entries.
#include <string>

#include "absl/status/statusor.h"

namespace longhaul {

// The file's bytes; NotFound where it cannot be opened, DataLoss where reading it fails.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace longhaul
