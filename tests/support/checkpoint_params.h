#pragma once
// Test helper: every model.safetensors of a run's latest checkpoint (one for `train`, one per PS
// shard for a cluster), merged by tensor name: what two runs compare bitwise. Other directories'
// files (a replica's own optimizer state, error-feedback residuals) are not the model's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace longhaul::testing {

inline std::map<std::string, std::vector<float>> LatestParams(const std::filesystem::path& out) {
  std::map<std::string, std::vector<float>> params;
  std::string step;
  std::ifstream(out / "checkpoints" / "latest") >> step;
  for (auto& e : std::filesystem::recursive_directory_iterator(out / "checkpoints")) {
    if (e.path().filename() != "model.safetensors" || e.path().parent_path().filename() != step) continue;
    const std::string owner = e.path().parent_path().parent_path().filename().string();
    if (e.path().parent_path().parent_path() != out / "checkpoints" && owner.rfind("stage_", 0) != 0) continue;
    auto st = ReadSafetensors(e.path().string());
    EXPECT_TRUE(st.ok()) << st.status();
    for (auto& [name, t] : st->tensors) params[name] = t.data;
  }
  return params;
}

}  // namespace longhaul::testing
