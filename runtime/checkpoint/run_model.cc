#include "checkpoint/run_model.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "model/param_layout.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

namespace fs = std::filesystem;

// The model section of a checkpoint's recorded config (the keys that shape the tensors), read on
// its own: a checkpoint whose other keys this build no longer knows still exports.
absl::StatusOr<ModelConfig> RecordedModel(const std::string& state_dir) {
  LH_ASSIGN_OR_RETURN(const CheckpointData data, ReadCheckpointState(state_dir));
  const std::string where = (fs::path(state_dir) / "state.json").string();
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(where, " records ", what, ": not a config longhaul train or a cluster wrote"));
  };
  if (!data.run_config.contains("model") || !data.run_config["model"].is_object()) return corrupt("no model config");
  const nlohmann::json& m = data.run_config["model"];
  ModelConfig c;
  for (auto [key, field] : {std::pair{"vocab_size", &c.vocab_size}, {"max_seq_len", &c.max_seq_len},
                            {"n_layer", &c.n_layer}, {"n_head", &c.n_head}, {"d_model", &c.d_model}}) {
    if (!m.contains(key) || !m[key].is_number_integer() || m[key].get<int64_t>() < 1 ||
        m[key].get<int64_t>() > (1 << 24)) {
      return corrupt(absl::StrCat("model.", key, " = ", m.contains(key) ? m[key].dump() : "nothing"));
    }
    *field = static_cast<int>(m[key].get<int64_t>());
  }
  if (m.contains("tied_head")) {
    if (!m["tied_head"].is_boolean()) return corrupt(absl::StrCat("model.tied_head = ", m["tied_head"].dump()));
    c.tied_head = m["tied_head"].get<bool>();
  }
  if (m.contains("attention")) {
    if (!m["attention"].is_string()) return corrupt(absl::StrCat("model.attention = ", m["attention"].dump()));
    absl::StatusOr<AttentionMask> mask = ParseAttentionMask(m["attention"].get<std::string>());
    if (!mask.ok()) return corrupt(absl::StrCat("model.attention = ", m["attention"].dump()));
    c.attention = *mask;
  }
  if (absl::Status s = c.Validate(); !s.ok()) return corrupt(std::string(s.message()));
  return c;
}

}  // namespace

absl::StatusOr<RunModel> LoadRunModel(const std::string& run_dir, std::optional<int64_t> step) {
  std::error_code ec;
  fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::exists(root, ec) && fs::exists(fs::path(run_dir) / "latest", ec)) root = run_dir;
  RunModel out;
  if (step) {
    out.checkpoint = CheckpointName(*step);
  } else {
    LH_ASSIGN_OR_RETURN(const std::string dir, LatestCheckpoint(root.string()));
    out.checkpoint = fs::path(dir).filename().string();
  }
  LH_ASSIGN_OR_RETURN(out.step, CheckpointStep(out.checkpoint));
  std::vector<fs::path> dirs;
  const bool one_process = fs::exists(root / out.checkpoint / "state.json", ec);
  if (one_process) {
    dirs.push_back(root / out.checkpoint);
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (absl::StartsWith(name, "stage_") && absl::StrContains(name, "_shard_") &&
          fs::exists(e.path() / out.checkpoint / "state.json", ec)) {
        dirs.push_back(e.path() / out.checkpoint);
      }
    }
    std::sort(dirs.begin(), dirs.end());
  }
  if (dirs.empty()) {
    return absl::NotFoundError(absl::StrFormat(
        "no checkpoint %s under %s (neither %s/state.json nor stage_*_shard_*/%s/state.json): name a run directory "
        "(train.out_dir) and a step it checkpointed",
        out.checkpoint, root.string(), out.checkpoint, out.checkpoint));
  }
  LH_ASSIGN_OR_RETURN(out.model, RecordedModel(dirs.front().string()));
  const ParamLayout whole(out.model, StageSpec::Whole(out.model));
  out.params.assign(whole.total(), 0.0f);
  std::vector<std::string> from(whole.tensors().size());
  for (const fs::path& dir : dirs) {
    LH_ASSIGN_OR_RETURN(const Safetensors st, LoadCheckpointParams(dir.string()));
    const std::string file = (dir / "model.safetensors").string();
    for (const auto& [name, tensor] : st.tensors) {
      const int i = whole.Find(name);
      if (i < 0) {
        return absl::DataLossError(
            absl::StrCat(file, " holds tensor ", name, ", which the run's model (its state.json) does not have"));
      }
      if (!from[i].empty()) {
        return absl::DataLossError(absl::StrCat("tensor ", name, " is in both ", from[i], " and ", file,
                                                ": the run directory mixes two runs' checkpoints"));
      }
      const ParamTensor& t = whole.tensors()[i];
      if (tensor.shape != t.shape) {
        return absl::DataLossError(absl::StrCat(file, ": tensor ", name, " has shape [",
                                                absl::StrJoin(tensor.shape, ", "), "], the run's model [",
                                                absl::StrJoin(t.shape, ", "), "]"));
      }
      std::copy(tensor.data.begin(), tensor.data.end(), out.params.begin() + static_cast<std::ptrdiff_t>(t.offset));
      from[i] = file;
    }
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i].empty()) missing.push_back(whole.tensors()[i].name);
  if (!missing.empty() && one_process) {
    return absl::DataLossError(absl::StrFormat("checkpoint %s lacks %s: not the model its state.json records",
                                               dirs.front().string(), absl::StrJoin(missing, ", ")));
  }
  if (!missing.empty()) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint %s under %s lacks %s: a parameter-server shard's directory (stage_S_shard_K/%s) is missing; "
        "where the workers wrote to their own disks, copy every shard's directory into one",
        out.checkpoint, root.string(), absl::StrJoin(missing, ", "), out.checkpoint));
  }
  return out;
}

}  // namespace longhaul
