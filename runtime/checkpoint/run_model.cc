#include "checkpoint/run_model.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/resume_check.h"
#include "model/param_layout.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

namespace fs = std::filesystem;

absl::Status Corrupt(const std::string& state_dir, const std::string& what) {
  return absl::DataLossError(absl::StrCat((fs::path(state_dir) / "state.json").string(), " records ", what,
                                          ": not a config longhaul train or a cluster wrote"));
}

// The model section of a checkpoint's recorded config (the keys that shape the tensors), read on
// its own: a checkpoint whose other keys this build no longer knows still exports.
absl::StatusOr<ModelConfig> RecordedModel(const std::string& state_dir, const CheckpointData& data) {
  auto corrupt = [&](const std::string& what) { return Corrupt(state_dir, what); };
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
  if (m.contains("subspace_divisor")) {
    if (!m["subspace_divisor"].is_number_integer() || m["subspace_divisor"].get<int64_t>() < 1 ||
        m["subspace_divisor"].get<int64_t>() > (1 << 24)) {
      return corrupt(absl::StrCat("model.subspace_divisor = ", m["subspace_divisor"].dump()));
    }
    c.subspace_divisor = static_cast<int>(m["subspace_divisor"].get<int64_t>());
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

// The stages that wrote a cluster's checkpoint and their parameter-server shards, as its config
// records them (cluster.stages, cluster.stage_layers, cluster.replicas, cluster.ps).
struct RecordedLayout {
  ModelConfig model;
  std::vector<StageSpec> stages;
  int replicas = 1;
  bool central = false;
};

absl::StatusOr<RecordedLayout> ReadRecordedLayout(const std::string& state_dir) {
  LH_ASSIGN_OR_RETURN(const CheckpointData data, ReadCheckpointState(state_dir));
  RecordedLayout out;
  LH_ASSIGN_OR_RETURN(out.model, RecordedModel(state_dir, data));
  const nlohmann::json cluster = data.run_config.value("cluster", nlohmann::json::object());
  if (!cluster.is_object()) return Corrupt(state_dir, absl::StrCat("cluster = ", cluster.dump()));
  auto count = [&](const char* key, int most) -> absl::StatusOr<int> {
    const nlohmann::json v = cluster.value(key, nlohmann::json());
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > most) {
      return Corrupt(state_dir, absl::StrCat("cluster.", key, " = ", v.dump()));
    }
    return static_cast<int>(v.get<int64_t>());
  };
  LH_ASSIGN_OR_RETURN(const int stages, count("stages", 65536));
  LH_ASSIGN_OR_RETURN(out.replicas, count("replicas", 65536));
  out.central = cluster.value("ps", nlohmann::json()) == "central";
  // A checkpoint written before the cut was recorded has the even one.
  if (cluster.value("stage_layers", nlohmann::json()).is_null()) {
    for (int s = 0; s < stages; ++s) out.stages.push_back(StageSpec::Even(out.model, s, stages));
    return out;
  }
  const std::optional<std::vector<int>> cut = RecordedCut(data.run_config, out.model.n_layer);
  if (!cut || cut->size() != static_cast<size_t>(stages)) {
    return Corrupt(state_dir, absl::StrCat("cluster.stage_layers = ", cluster["stage_layers"].dump(), " for ", stages,
                                           " stages of ", out.model.n_layer, " blocks"));
  }
  for (int s = 0; s < stages; ++s) out.stages.push_back(StageSpec::OfCut(*cut, s));
  return out;
}

// What `fetch` brought of `dir`: nothing where it is kept nowhere (the caller names what is missing).
absl::Status Fetched(const FetchPiece& fetch, const std::string& dir, bool layout_only) {
  const absl::Status st = fetch(dir, layout_only);
  return absl::IsNotFound(st) ? absl::OkStatus() : st;
}

std::vector<std::string> Names(const ParamLayout& layout, int first, int end) {
  std::vector<std::string> names;
  for (int i = first; i < end; ++i) names.push_back(layout.tensors()[i].name);
  return names;
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
  const std::string state_dir = CheckpointStateDir(root.string(), out.checkpoint);
  LH_ASSIGN_OR_RETURN(const std::vector<CheckpointPiece> pieces, CheckpointPieces(root.string(), out.checkpoint));
  LH_ASSIGN_OR_RETURN(const CheckpointData data, ReadCheckpointState(state_dir));
  LH_ASSIGN_OR_RETURN(out.model, RecordedModel(state_dir, data));
  const ParamLayout whole(out.model, StageSpec::Whole(out.model));
  out.params.assign(whole.total(), 0.0f);
  LH_RETURN_IF_ERROR(LoadFromPieces(pieces, whole, out.params.data(), nullptr, nullptr));
  // The model the stages ran: its parameter servers may hold other values where a subspace model
  // holds its own (a lossy push, weight decay), which every stage puts back as it takes them.
  if (out.model.subspace_divisor > 1) {
    const nlohmann::json& train = data.run_config.value("train", nlohmann::json::object());
    if (!train.contains("seed") || !train["seed"].is_number_integer()) return Corrupt(state_dir, "no train.seed");
    ZeroRuns(whole.SubspaceZeroRuns(), out.params.data());
    FixedEmbedding(out.model, train["seed"].get<uint64_t>()).WriteInto(whole, out.params.data(), 0, whole.total());
  }
  return out;
}

absl::StatusOr<std::vector<CheckpointPiece>> CheckpointPieces(const std::string& root, const std::string& name,
                                                              const std::function<std::string(int stage)>& stage_root,
                                                              const FetchPiece& fetch) {
  std::error_code ec;
  // A cluster's layout is in its first shard's state.json.
  if (fetch && !fs::exists(fs::path(root) / name / "state.json", ec)) {
    LH_RETURN_IF_ERROR(Fetched(fetch, (fs::path(ShardCheckpointRoot(root, 0, 0)) / name).string(), true));
  }
  const std::string state_dir = CheckpointStateDir(root, name);
  if (!fs::exists(fs::path(state_dir) / "state.json", ec)) {
    return absl::NotFoundError(absl::StrFormat(
        "no checkpoint %s under %s (neither %s/state.json nor stage_0_shard_0/%s/state.json): name a run directory "
        "(train.out_dir) and a step it checkpointed",
        name, root, name, name));
  }
  if (state_dir == (fs::path(root) / name).string()) {
    LH_ASSIGN_OR_RETURN(const CheckpointData data, ReadCheckpointState(state_dir));
    LH_ASSIGN_OR_RETURN(const ModelConfig model, RecordedModel(state_dir, data));
    const ParamLayout whole(model, StageSpec::Whole(model));
    return std::vector<CheckpointPiece>{{state_dir, Names(whole, 0, static_cast<int>(whole.tensors().size()))}};
  }
  LH_ASSIGN_OR_RETURN(const RecordedLayout recorded, ReadRecordedLayout(state_dir));
  std::vector<CheckpointPiece> pieces;
  for (int s = 0; s < static_cast<int>(recorded.stages.size()); ++s) {
    const ParamLayout stage(recorded.model, recorded.stages[s]);
    if (stage_root) {
      pieces.push_back({(fs::path(stage_root(s)) / name).string(),
                        Names(stage, 0, static_cast<int>(stage.tensors().size()))});
      continue;
    }
    int shard = 0;  // numbered as the coordinator's plan numbers them
    for (const ParamLayout::PsShardCut& cut : stage.PsShards(recorded.replicas, recorded.central)) {
      pieces.push_back({(fs::path(ShardCheckpointRoot(root, s, shard++)) / name).string(),
                        Names(stage, cut.first_tensor, cut.end_tensor)});
    }
  }
  return pieces;
}

absl::Status FetchPieces(const std::vector<CheckpointPiece>& pieces, const ParamLayout& layout,
                         const FetchPiece& fetch) {
  std::set<std::string> names;
  for (const ParamTensor& t : layout.tensors()) names.insert(t.name);
  std::vector<std::future<absl::Status>> fetched;
  for (const CheckpointPiece& piece : pieces) {
    if (std::any_of(piece.tensors.begin(), piece.tensors.end(), [&](const std::string& t) { return names.count(t); })) {
      fetched.push_back(std::async(std::launch::async, Fetched, std::cref(fetch), std::cref(piece.dir), false));
    }
  }
  absl::Status first;
  for (auto& f : fetched) first.Update(f.get());
  return first;
}

absl::Status LoadFromPieces(const std::vector<CheckpointPiece>& pieces, const ParamLayout& layout, float* params,
                            float* m, float* v, bool skip_absent, const FetchPiece& fetch) {
  std::map<std::string, size_t> piece_of;
  for (size_t i = 0; i < pieces.size(); ++i)
    for (const std::string& t : pieces[i].tensors) piece_of[t] = i;
  std::vector<std::vector<ParamTensor>> wanted(pieces.size());
  for (const ParamTensor& t : layout.tensors()) {
    auto it = piece_of.find(t.name);
    if (it == piece_of.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint holds no tensor ", t.name, ": it was written for a different model"));
    }
    wanted[it->second].push_back(t);
  }
  std::error_code ec;
  if (fetch) LH_RETURN_IF_ERROR(FetchPieces(pieces, layout, fetch));
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (wanted[i].empty()) continue;
    const bool absent = !fs::exists(fs::path(pieces[i].dir) / "state.json", ec);
    if (absent && skip_absent) continue;
    if (absent) {
      std::vector<std::string> names;
      for (const ParamTensor& t : wanted[i]) names.push_back(t.name);
      return absl::DataLossError(absl::StrFormat(
          "the checkpoint lacks %s: %s is missing; where the workers wrote to their own disks, copy every shard's "
          "directory into one",
          absl::StrJoin(names, ", "), pieces[i].dir));
    }
    LH_RETURN_IF_ERROR(LoadCheckpointTensors(pieces[i].dir, wanted[i], params, m, v).status());
  }
  return absl::OkStatus();
}

absl::Status VerifyCheckpointStep(const std::string& root, const std::string& name) {
  LH_ASSIGN_OR_RETURN(const std::vector<CheckpointPiece> pieces, CheckpointPieces(root, name));
  std::set<std::string> dirs;
  for (const CheckpointPiece& piece : pieces) dirs.insert(piece.dir);
  // The residuals and the stages' own state beside the shards, where the run kept them: the
  // layout does not say whether it did.
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const absl::StatusOr<CheckpointPieceRoot> piece = ParseCheckpointPieceRoot(e.path().filename().string());
    if (piece.ok() && piece->kind != CheckpointPieceRoot::Kind::kShard && fs::exists(e.path() / name, ec)) {
      dirs.insert((e.path() / name).string());
    }
  }
  for (const std::string& dir : dirs) LH_RETURN_IF_ERROR(VerifyCheckpointDir(dir));
  return absl::OkStatus();
}

absl::StatusOr<std::string> LastIntactCheckpoint(const std::string& root, int64_t before) {
  // Every step is under the first shard's directory, which every layout has, or under root itself
  // for a one-process run.
  std::set<int64_t, std::greater<>> steps;
  for (const fs::path& dir : {fs::path(root), fs::path(ShardCheckpointRoot(root, 0, 0))}) {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const absl::StatusOr<int64_t> step = CheckpointStep(e.path().string());
      if (step.ok() && *step < before && e.is_directory(ec)) steps.insert(*step);
    }
  }
  for (const int64_t step : steps)
    if (VerifyCheckpointStep(root, CheckpointName(step)).ok()) return CheckpointName(step);
  return absl::NotFoundError(
      absl::StrFormat("no checkpoint under %s before %s is intact", root, CheckpointName(before)));
}

}  // namespace longhaul
