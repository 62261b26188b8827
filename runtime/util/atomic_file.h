#pragma once
// Files that readers may open at any moment (a browser reloading the loss curve, a resume after a
// crash, a script polling summary.json) are written aside and renamed over the old one, so a
// reader finds the old file or the new one, never half of either.
#include <string>

#include "absl/status/status.h"

namespace longhaul {

absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace longhaul
