#include "checkpoint/resume_check.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

const nlohmann::json* Find(const nlohmann::json& j, const std::string& section, const std::string& key) {
  if (!j.is_object() || !j.contains(section) || !j.at(section).is_object() || !j.at(section).contains(key)) {
    return nullptr;
  }
  return &j.at(section).at(key);
}

// An int the checkpoint recorded for section.key, when it is a sane positive one.
int RecordedPositive(const nlohmann::json& j, const char* section, const char* key, int fallback) {
  const nlohmann::json* v = Find(j, section, key);
  return v != nullptr && v->is_number_integer() && v->get<int64_t>() >= 1 && v->get<int64_t>() <= 1'000'000
             ? static_cast<int>(v->get<int64_t>())
             : fallback;
}

// The effective config of a run that set nothing, with the keys other defaults depend on taken
// from the checkpoint.
nlohmann::json DefaultsFor(const nlohmann::json& written_with) {
  JobConfig d;
  d.model.n_layer = RecordedPositive(written_with, "model", "n_layer", d.model.n_layer);
  d.cluster.stages = std::min(RecordedPositive(written_with, "cluster", "stages", d.cluster.stages), d.model.n_layer);
  return EffectiveConfigJson(d);
}

// A value as --set takes it: strings bare, the rest in TOML (= JSON) syntax.
std::string SetValue(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

absl::Status CheckResumable(const nlohmann::json& written_with, const JobConfig& cfg,
                            const std::string& checkpoint_dir) {
  const nlohmann::json now = EffectiveConfigJson(cfg), defaults = DefaultsFor(written_with);
  std::vector<std::string> differ, layout_differ, fixes, then_layout, now_layout;
  for (const ConfigKey& k : ConfigKeys()) {
    if (k.resume == ResumeRule::kFree) continue;
    const nlohmann::json* recorded = Find(written_with, k.section, k.key);
    const nlohmann::json& was = recorded != nullptr ? *recorded : defaults.at(k.section).at(k.key);
    const nlohmann::json& is = now.at(k.section).at(k.key);
    if (k.resume == ResumeRule::kLayout) {
      then_layout.push_back(absl::StrCat(k.name(), " = ", was.dump()));
      now_layout.push_back(absl::StrCat(k.name(), " = ", is.dump()));
    }
    if (was == is) continue;
    (k.resume == ResumeRule::kLayout ? layout_differ : differ)
        .push_back(absl::StrCat(
            k.name(), " = ", was.dump(),
            recorded != nullptr ? "" : " (not recorded: the checkpoint predates this key; taken as its default)",
            ", the config has ", is.dump()));
    fixes.push_back(absl::StrCat("--set ", k.name(), "=", SetValue(was)));
  }
  if (differ.empty() && layout_differ.empty()) return absl::OkStatus();
  std::string msg = absl::StrCat("checkpoint ", checkpoint_dir, " was written");
  if (!differ.empty()) absl::StrAppend(&msg, " with ", absl::StrJoin(differ, "; "));
  if (!layout_differ.empty()) {
    absl::StrAppend(&msg, differ.empty() ? "" : ", and", " for another layout (", absl::StrJoin(layout_differ, "; "),
                    "): a layout change, which resume does not support; the checkpoint's layout is ",
                    absl::StrJoin(then_layout, ", "), ", the config's is ", absl::StrJoin(now_layout, ", "));
  }
  absl::StrAppend(&msg, ". Resume with the checkpoint's values (", absl::StrJoin(fixes, " "),
                  ") or start a new run with another train.out_dir");
  return absl::FailedPreconditionError(msg);
}

absl::Status CheckCheckpointResumable(const std::string& checkpoint_dir, const JobConfig& cfg) {
  LH_ASSIGN_OR_RETURN(CheckpointData state, ReadCheckpointState(checkpoint_dir));
  return CheckResumable(state.run_config, cfg, checkpoint_dir);
}

std::optional<std::vector<int>> RecordedCut(const nlohmann::json& written_with, int n_layer) {
  const nlohmann::json* recorded = Find(written_with, "cluster", "stage_layers");
  if (recorded == nullptr || !recorded->is_array()) return std::nullopt;
  std::vector<int> cut;
  int64_t sum = 0;
  for (const nlohmann::json& b : *recorded) {
    if (!b.is_number_integer() || b.get<int64_t>() < 0 || b.get<int64_t>() > n_layer) return std::nullopt;
    cut.push_back(static_cast<int>(b.get<int64_t>()));
    sum += cut.back();
  }
  if (sum != n_layer) return std::nullopt;
  return cut;
}

absl::StatusOr<JobConfig> WithCheckpointCut(const std::string& checkpoint_dir, JobConfig cfg) {
  if (!cfg.cluster.stage_layers.empty()) return cfg;
  LH_ASSIGN_OR_RETURN(CheckpointData state, ReadCheckpointState(checkpoint_dir));
  // A cut of this model only, of its stage count: another layout or model is CheckResumable's to
  // name (model.n_layer).
  const std::optional<std::vector<int>> cut = RecordedCut(state.run_config, cfg.model.n_layer);
  if (!cut || cut->size() != static_cast<size_t>(cfg.cluster.stages) || *cut == cfg.Cut()) return cfg;
  return cfg.WithCut(*cut);
}

absl::StatusOr<JobConfig> WithCheckpointCommunication(const std::string& checkpoint_dir, JobConfig cfg) {
  if (!cfg.cluster.choose_communication) return cfg;
  LH_ASSIGN_OR_RETURN(CheckpointData state, ReadCheckpointState(checkpoint_dir));
  std::vector<std::string> chosen;
  for (const ConfigKey& k : CommunicationKeys()) {
    if (const nlohmann::json* v = Find(state.run_config, k.section, k.key)) {
      chosen.push_back(absl::StrCat(k.name(), "=", SetValue(*v)));
    }
  }
  if (chosen.empty()) return cfg;
  return ParseJobConfig(cfg.toml_text, cfg.source_path, chosen);
}

}  // namespace longhaul
