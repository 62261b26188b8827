#pragma once
// Test helper: the model of a run's latest checkpoint (one file for `train`, one per PS shard of
// the cut that wrote the step for a cluster: LoadRunModel), by tensor name: what two runs compare
// bitwise. Other directories' files (a replica's own optimizer state, error-feedback residuals,
// another cut's shards) are not the model's.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "checkpoint/run_model.h"
#include "model/param_layout.h"

namespace longhaul::testing {

inline std::map<std::string, std::vector<float>> LatestParams(const std::filesystem::path& out) {
  std::map<std::string, std::vector<float>> params;
  const absl::StatusOr<RunModel> run = LoadRunModel(out.string());
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return params;
  const ParamLayout whole(run->model, StageSpec::Whole(run->model));
  for (const ParamTensor& t : whole.tensors()) {
    const auto begin = run->params.begin() + static_cast<std::ptrdiff_t>(t.offset);
    params[t.name] = std::vector<float>(begin, begin + static_cast<std::ptrdiff_t>(t.size));
  }
  return params;
}

}  // namespace longhaul::testing
