#pragma once
// A run's whole model from its checkpoints, whatever layout wrote them: a one-process run's
// checkpoints/step_N/, or a cluster's checkpoints/stage_S_shard_K/step_N/, one file per
// parameter-server shard (each shard holds whole, named tensors).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"

namespace longhaul {

struct RunModel {
  ModelConfig model;
  int64_t step = 0;
  std::string checkpoint;     // the step's directory name, e.g. step_00000600
  std::vector<float> params;  // laid out by ParamLayout(model, StageSpec::Whole(model))
};

// The checkpoint of `step` (default: the newest complete one) under run_dir/checkpoints, or under
// run_dir itself where that is a checkpoints directory. Every file's size and CRC-32 are checked,
// and every tensor of the model must come exactly once; errors name the file and the fix.
absl::StatusOr<RunModel> LoadRunModel(const std::string& run_dir, std::optional<int64_t> step = std::nullopt);

}  // namespace longhaul
