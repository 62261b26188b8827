#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "util/atomic_file.h"
#include "util/status_macros.h"
#include "util/bounded_json.h"
#include "util/files.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 1;
// Under a root of steps: a pruned step's directory, whose files the next checkpoint writes over.
constexpr char kRecycled[] = "recycled";

std::vector<TensorView> Views(const ParamLayout& layout, const float* buf, const std::string& prefix) {
  std::vector<TensorView> views;
  for (const ParamTensor& t : layout.tensors()) views.push_back({prefix + t.name, t.shape, buf + t.offset});
  return views;
}

// state.json, checked field by field: it is read from disk, so nothing in it is trusted.
struct State {
  CheckpointData data;
  struct File {
    uint64_t bytes = 0;
    uint32_t crc = 0;
  };
  std::map<std::string, File> files;
};

absl::StatusOr<State> ReadState(const std::string& dir) {
  const std::string path = (fs::path(dir) / "state.json").string();
  LH_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is corrupt (", what,
                                            "; not the JSON longhaul writes): restore it or resume from an earlier "
                                            "step"));
  };
  const nlohmann::json j = ParseBoundedJson(text);
  if (j.is_discarded()) return corrupt("not valid JSON");
  if (!j.is_object()) return corrupt("not a JSON object");
  auto field = [&](const char* key) -> const nlohmann::json* { return j.contains(key) ? &j.at(key) : nullptr; };
  const nlohmann::json* version = field("format_version");
  if (version == nullptr || !version->is_number_integer()) return corrupt("no integer format_version");
  if (version->get<int64_t>() != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrFormat("checkpoint %s has format version %d; this build reads %d",
                                                         dir, version->get<int64_t>(), kFormatVersion));
  }
  State st;
  const nlohmann::json* step = field("step");
  if (step == nullptr || !step->is_number_unsigned()) return corrupt("no step >= 0");
  st.data.step = static_cast<int64_t>(std::min<uint64_t>(step->get<uint64_t>(), INT64_MAX));
  const nlohmann::json* config = field("run_config");
  if (config != nullptr && !config->is_object()) return corrupt("run_config is not an object");
  st.data.run_config = config != nullptr ? *config : nlohmann::json::object();
  const nlohmann::json* files = field("files");
  if (files == nullptr || !files->is_object()) return corrupt("no files object");
  for (const auto& [name, entry] : files->items()) {
    if (!entry.is_object() || !entry.contains("bytes") || !entry.at("bytes").is_number_unsigned() ||
        !entry.contains("crc32") || !entry.at("crc32").is_number_unsigned() ||
        entry.at("crc32").get<uint64_t>() > UINT32_MAX) {
      return corrupt(absl::StrCat("files.", name, " lacks its size or CRC-32"));
    }
    st.files[name] = {entry.at("bytes").get<uint64_t>(), static_cast<uint32_t>(entry.at("crc32").get<uint64_t>())};
  }
  return st;
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& root, const CheckpointData& data, const ParamLayout& layout,
                            const float* params, const float* m, const float* v) {
  const std::string name = CheckpointName(data.step);
  const fs::path final_dir = fs::path(root) / name, tmp_dir = fs::path(root) / (name + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  // A pruned checkpoint's directory, claimed whole by one rename, so its files are written over in
  // place: a fresh file's page cache is new memory, many times slower to write than pages
  // written over, which a job checkpointing every step would pay at each step.
  fs::rename(fs::path(root) / kRecycled, tmp_dir, ec);
  if (ec) fs::create_directories(tmp_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create checkpoint directory ", tmp_dir.string(), ": ", ec.message()));

  nlohmann::json files = nlohmann::json::object();
  auto write = [&](const std::string& file, const std::vector<TensorView>& views) -> absl::Status {
    const fs::path p = tmp_dir / file;
    LH_ASSIGN_OR_RETURN(uint32_t crc, WriteSafetensors(p.string(), views, {{"format", "pt"}}));
    std::error_code ec;
    const uintmax_t bytes = fs::file_size(p, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot read back the size of ", p.string(), ": ", ec.message()));
    files[file] = {{"bytes", bytes}, {"crc32", crc}};
    return absl::OkStatus();
  };
  LH_RETURN_IF_ERROR(write("model.safetensors", Views(layout, params, "")));
  if (m != nullptr && v != nullptr) {
    std::vector<TensorView> opt = Views(layout, m, "exp_avg.");
    for (TensorView& t : Views(layout, v, "exp_avg_sq.")) opt.push_back(t);
    LH_RETURN_IF_ERROR(write("optimizer.safetensors", opt));
  }
  nlohmann::json state = {{"format_version", kFormatVersion},
                          {"step", data.step},
                          {"resume_iteration", data.step},
                          {"run_config", data.run_config},
                          {"files", files}};
  LH_RETURN_IF_ERROR(WriteFileAtomically((tmp_dir / "state.json").string(), state.dump(2)));
  for (const fs::directory_entry& e : fs::directory_iterator(tmp_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != "state.json" && !files.contains(name)) fs::remove_all(e.path(), ec);  // a recycled leftover
  }
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp_dir.string(), ": ", ec.message()));
  return SetLatestCheckpoint(root, data.step);
}

std::string CheckpointName(int64_t step) { return absl::StrFormat("step_%08d", step); }

absl::Status SetLatestCheckpoint(const std::string& root, int64_t step) {
  return WriteFileAtomically((fs::path(root) / "latest").string(), CheckpointName(step) + "\n");
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& root) {
  const fs::path latest = fs::path(root) / "latest";
  std::ifstream f(latest);
  std::string name;
  if (!f || !(f >> name)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint under ", root, " (", latest.string(),
                                            " is missing): train without resume first"));
  }
  if (!CheckpointStep(name).ok()) {
    return absl::DataLossError(absl::StrCat(latest.string(), " names \"", name,
                                            "\", not a checkpoint directory (step_NNNNNNNN): write the name of the "
                                            "newest complete step_* directory into it"));
  }
  return (fs::path(root) / name).string();
}

absl::StatusOr<int64_t> CheckpointStep(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  int64_t step = 0;
  if (name.rfind("step_", 0) != 0 || name.size() > 5 + 18 || name.find_first_not_of("0123456789", 5) != std::string::npos ||
      !absl::SimpleAtoi(name.substr(5), &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory ", dir, ": its name is not step_ and a step number"));
  }
  return step;
}

absl::Status PruneCheckpoints(const std::string& root, int64_t newest, int keep) {
  if (keep <= 0) return absl::OkStatus();
  std::error_code ec;
  auto prune = [&](const fs::path& dir) {
    std::vector<std::pair<int64_t, fs::path>> steps;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const absl::StatusOr<int64_t> step = CheckpointStep(e.path().string());
      if (e.is_directory() && step.ok() && *step <= newest) steps.emplace_back(*step, e.path());
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + keep < steps.size(); ++i) {
      // One goes where the next SaveCheckpoint takes its files from, unless one waits there.
      std::error_code not_recycled;
      if (i == 0) fs::rename(steps[i].second, dir / kRecycled, not_recycled);
      if (i > 0 || not_recycled) fs::remove_all(steps[i].second, ec);
    }
  };
  prune(root);  // a one-process run's steps
  for (const fs::directory_entry& dir : fs::directory_iterator(root, ec))
    if (dir.is_directory() && !CheckpointStep(dir.path().string()).ok()) prune(dir.path());
  if (ec) return absl::InternalError(absl::StrCat("cannot remove old checkpoints under ", root, ": ", ec.message()));
  return absl::OkStatus();
}

std::string ShardCheckpointRoot(const std::string& root, int stage, int shard) {
  return (fs::path(root) / absl::StrFormat("stage_%d_shard_%d", stage, shard)).string();
}

std::string LocalCheckpointRoot(const std::string& root, int stage, int replica) {
  return (fs::path(root) / absl::StrFormat("local_stage_%d_replica_%d", stage, replica)).string();
}

std::string ResidualCheckpointRoot(const std::string& root, int stage, int job_replica) {
  return (fs::path(root) / absl::StrFormat("residual_stage_%d_replica_%d", stage, job_replica)).string();
}

absl::StatusOr<CheckpointPieceRoot> ParseCheckpointPieceRoot(const std::string& name) {
  using Kind = CheckpointPieceRoot::Kind;
  for (auto [kind, prefix, middle] : {std::tuple{Kind::kShard, "stage_", "_shard_"},
                                      {Kind::kResidual, "residual_stage_", "_replica_"},
                                      {Kind::kLocal, "local_stage_", "_replica_"}}) {
    if (!absl::StartsWith(name, prefix)) continue;
    const std::string rest = name.substr(std::string(prefix).size());
    const size_t at = rest.find(middle);
    CheckpointPieceRoot piece{kind};
    if (at == std::string::npos || !absl::SimpleAtoi(rest.substr(0, at), &piece.stage) ||
        !absl::SimpleAtoi(rest.substr(at + std::string(middle).size()), &piece.index) || piece.stage < 0 ||
        piece.index < 0) {
      break;
    }
    const std::string spelled = kind == Kind::kShard      ? ShardCheckpointRoot("", piece.stage, piece.index)
                                : kind == Kind::kResidual ? ResidualCheckpointRoot("", piece.stage, piece.index)
                                                          : LocalCheckpointRoot("", piece.stage, piece.index);
    if (spelled != name) break;
    return piece;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", absl::CHexEscape(name.substr(0, 64)),
      "\" is no checkpoint piece: stage_S_shard_K, residual_stage_S_replica_R or local_stage_S_replica_R"));
}

absl::StatusOr<uint64_t> MaxCheckpointFileBytes(const std::string& file, uint64_t floats, size_t tensors,
                                                bool with_moments) {
  // A safetensors header names each tensor (exp_avg_sq. and a model name), its shape and offsets.
  auto tensors_file = [&](uint64_t copies) { return 8 + 4096 + copies * (tensors * 512 + floats * sizeof(float)); };
  if (file == "state.json") return uint64_t{16} << 20;
  if (file == "model.safetensors") return tensors_file(1);
  if (file == "optimizer.safetensors" && with_moments) return tensors_file(2);
  return absl::InvalidArgumentError(absl::StrCat("\"", absl::CHexEscape(file.substr(0, 64)),
                                                 "\" is no file this checkpoint piece holds"));
}

bool IsCheckpointFile(const std::string& name) {
  return std::find(std::begin(kCheckpointFiles), std::end(kCheckpointFiles), name) != std::end(kCheckpointFiles);
}

std::string CheckpointStateDir(const std::string& root, const std::string& name) {
  const fs::path own = fs::path(root) / name, shard = fs::path(ShardCheckpointRoot(root, 0, 0)) / name;
  std::error_code ec;
  return (fs::exists(own / "state.json", ec) || !fs::exists(shard, ec) ? own : shard).string();
}

absl::StatusOr<CheckpointData> ReadCheckpointState(const std::string& dir) {
  LH_ASSIGN_OR_RETURN(State st, ReadState(dir));
  return st.data;
}

namespace {

// One of the files state.json lists, with its size and CRC-32 there.
absl::StatusOr<State::File> Listed(const std::string& dir, const State& state, const std::string& file) {
  auto listed = state.files.find(file);
  if (listed == state.files.end()) {
    return absl::DataLossError(absl::StrCat((fs::path(dir) / "state.json").string(), " does not list ", file));
  }
  return listed->second;
}

absl::Status SizeAsListed(const std::string& path, uint64_t bytes, const State::File& listed) {
  if (bytes == listed.bytes) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrFormat("checkpoint file %s is truncated: %d bytes, expected %d (restore it or resume from an earlier "
                      "step)",
                      path, bytes, listed.bytes));
}

absl::Status CrcAsListed(const std::string& path, uint32_t crc, const State::File& listed) {
  if (crc == listed.crc) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "checkpoint file %s is corrupt: CRC-32 %08x, expected %08x (restore it or resume from an earlier step)", path,
      crc, listed.crc));
}

// One of the files state.json lists, its size and CRC-32 checked before it is parsed.
absl::StatusOr<Safetensors> LoadListed(const std::string& dir, const State& state, const std::string& file) {
  const std::string path = (fs::path(dir) / file).string();
  LH_ASSIGN_OR_RETURN(const State::File listed, Listed(dir, state, file));
  LH_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  LH_RETURN_IF_ERROR(SizeAsListed(path, bytes.size(), listed));
  LH_RETURN_IF_ERROR(CrcAsListed(path, Crc32(bytes), listed));
  return ParseSafetensors(path, bytes);
}

// Tensors of a layout under a name prefix, and the buffer (laid out by the layout) they go to.
struct Target {
  const char* prefix;
  float* dst;
};

// Reads one of the files state.json lists straight into the targets' buffers: its size checked
// before anything is read, each tensor's name and shape checked against the layout before its
// bytes are read, its CRC-32 over every byte as it arrives. No copy of the file is made: a spare
// resuming a d_model 512 stage read its shards (28 MB) into fresh memory twice over before, which
// on these VMs is slow to touch. On an error the buffers hold whatever was read.
absl::Status ReadListedInto(const std::string& dir, const State& state, const std::string& file,
                            const std::vector<ParamTensor>& tensors, const std::vector<Target>& targets) {
  const std::string path = (fs::path(dir) / file).string();
  LH_ASSIGN_OR_RETURN(const State::File listed, Listed(dir, state, file));
  std::ifstream f(path, std::ios::binary);
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (!f || ec) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  LH_RETURN_IF_ERROR(SizeAsListed(path, size, listed));
  uint32_t crc = 0;
  auto read = [&](char* to, size_t n) {
    f.read(to, static_cast<std::streamsize>(n));
    crc = Crc32Update(crc, to, n);
    return static_cast<size_t>(f.gcount()) == n;
  };
  const auto truncated = [&] { return absl::DataLossError(absl::StrCat("checkpoint file ", path, " ended early")); };
  std::string head(std::min<uintmax_t>(size, 8), '\0');
  if (!read(head.data(), head.size())) return truncated();
  if (const uint64_t len = head.size() == 8 ? SafetensorsHeaderLength(head) : 0; len > 0 && len <= size - 8) {
    head.resize(8 + len);
    if (!read(head.data() + 8, len)) return truncated();
  }
  LH_ASSIGN_OR_RETURN(const SafetensorsHeader header, ParseSafetensorsHeader(path, head, size));
  struct Piece {
    size_t begin, end;
    float* dst;
  };
  std::vector<Piece> pieces;
  for (const Target& target : targets) {
    for (const ParamTensor& t : tensors) {
      auto it = header.tensors.find(target.prefix + t.name);
      if (it == header.tensors.end()) {
        return absl::FailedPreconditionError(absl::StrCat(path, " has no tensor ", target.prefix, t.name,
                                                          ": the checkpoint was written for a different model or stage"));
      }
      if (it->second.shape != t.shape) {
        auto fmt = [](const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); };
        return absl::FailedPreconditionError(absl::StrCat(path, ": tensor ", target.prefix, t.name, " has shape ",
                                                          fmt(it->second.shape), " but the model expects ",
                                                          fmt(t.shape), ": the model config differs from the checkpoint's"));
      }
      pieces.push_back({it->second.begin, it->second.end, target.dst + t.offset});
    }
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  // The data section in file order: each tensor into its place, the bytes no target takes through
  // a block of scratch (they count in the CRC all the same).
  size_t at = 0;
  std::vector<char> scratch(1 << 16);
  auto skip_to = [&](size_t to) {
    for (size_t n; at < to; at += n) {
      n = std::min(to - at, scratch.size());
      if (!read(scratch.data(), n)) return false;
    }
    return true;
  };
  for (const Piece& p : pieces) {
    if (p.begin < at) {
      return absl::DataLossError(absl::StrCat("safetensors file ", path, " is corrupt: two tensors share bytes"));
    }
    if (!skip_to(p.begin) || !read(reinterpret_cast<char*>(p.dst), p.end - p.begin)) return truncated();
    at = p.end;
  }
  if (!skip_to(size - header.data_start)) return truncated();
  return CrcAsListed(path, crc, listed);
}

}  // namespace

absl::Status VerifyCheckpointDir(const std::string& dir) {
  LH_ASSIGN_OR_RETURN(const State state, ReadState(dir));
  LH_RETURN_IF_ERROR(Listed(dir, state, "model.safetensors").status());
  std::vector<char> block(1 << 20);
  for (const auto& [file, listed] : state.files) {
    // The names come from disk: only a checkpoint's own files are read, never a path elsewhere.
    if (!IsCheckpointFile(file) || file == "state.json") {
      return absl::DataLossError(absl::StrCat((fs::path(dir) / "state.json").string(), " lists \"",
                                              absl::CHexEscape(file.substr(0, 64)),
                                              "\", which no checkpoint holds: restore it or resume from an earlier "
                                              "step"));
    }
    const std::string path = (fs::path(dir) / file).string();
    std::ifstream f(path, std::ios::binary);
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (!f || ec) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", path, " is missing: restore it or resume from an earlier step"));
    }
    LH_RETURN_IF_ERROR(SizeAsListed(path, size, listed));
    uint32_t crc = 0;
    while (f) {
      f.read(block.data(), static_cast<std::streamsize>(block.size()));
      crc = Crc32Update(crc, block.data(), static_cast<size_t>(f.gcount()));
    }
    if (f.bad()) return absl::DataLossError(absl::StrCat("cannot read checkpoint file ", path));
    LH_RETURN_IF_ERROR(CrcAsListed(path, crc, listed));
  }
  return absl::OkStatus();
}

absl::StatusOr<Safetensors> LoadCheckpointParams(const std::string& dir) {
  LH_ASSIGN_OR_RETURN(State state, ReadState(dir));
  return LoadListed(dir, state, "model.safetensors");
}

absl::StatusOr<CheckpointData> LoadCheckpoint(const std::string& dir, const ParamLayout& layout, float* params,
                                              float* m, float* v) {
  return LoadCheckpointTensors(dir, layout.tensors(), params, m, v);
}

absl::StatusOr<CheckpointData> LoadCheckpointTensors(const std::string& dir, const std::vector<ParamTensor>& tensors,
                                                     float* params, float* m, float* v) {
  LH_ASSIGN_OR_RETURN(State state, ReadState(dir));
  if (params != nullptr) LH_RETURN_IF_ERROR(ReadListedInto(dir, state, "model.safetensors", tensors, {{"", params}}));
  if (m != nullptr && v != nullptr) {
    LH_RETURN_IF_ERROR(
        ReadListedInto(dir, state, "optimizer.safetensors", tensors, {{"exp_avg.", m}, {"exp_avg_sq.", v}}));
  }
  return state.data;
}

}  // namespace longhaul
