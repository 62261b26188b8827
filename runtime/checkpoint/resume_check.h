#pragma once
// Whether a checkpoint may continue this job: the configuration it was written with against this
// one, key by key, by each key's ResumeRule (config/job_config.h). Callers check before reading
// any tensor, so a mismatch is one clear error instead of a shape error or a silently different run.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/job_config.h"

namespace longhaul {

// written_with is the run_config of a checkpoint's state.json. The error names every key that
// differs with both values, says whether it is a layout change, and gives the fix.
//
// A key the checkpoint lacks (written before longhaul recorded that key) counts as its default in
// this build, the value such a run had unless its config set another; defaults that depend on
// other keys (the even split of cluster.stage_layers) resolve with the checkpoint's own values of
// those keys. The error marks such a key as not recorded.
absl::Status CheckResumable(const nlohmann::json& written_with, const JobConfig& cfg,
                            const std::string& checkpoint_dir);

// Reads checkpoint_dir/state.json (no tensors) and checks it as above.
absl::Status CheckCheckpointResumable(const std::string& checkpoint_dir, const JobConfig& cfg);

// The blocks per stage a checkpoint's run_config records (cluster.stage_layers), where they are a
// cut of a model of `n_layer` blocks: whole counts from 0 that add up to it. nullopt otherwise,
// an older checkpoint's that records none included.
std::optional<std::vector<int>> RecordedCut(const nlohmann::json& written_with, int n_layer);

// A config that pins no cut (cluster.stage_layers empty) resumes with the cut the checkpoint was
// written with, which the coordinator's placement search may have chosen; one that pins a cut,
// or a checkpoint with the config's own even cut, leaves the config as it is.
absl::StatusOr<JobConfig> WithCheckpointCut(const std::string& checkpoint_dir, JobConfig cfg);

// A config with cluster.communication = "auto" resumes with the CommunicationKeys() values the
// checkpoint was written with (what the coordinator chose for the run that wrote it; a key the
// checkpoint does not record stays the config's); one with "fixed" is left as it is.
absl::StatusOr<JobConfig> WithCheckpointCommunication(const std::string& checkpoint_dir, JobConfig cfg);

}  // namespace longhaul
