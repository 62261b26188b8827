#include "checkpoint/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "util/status_macros.h"

namespace longhaul {
namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 1;

std::vector<TensorView> Views(const ParamLayout& layout, const float* buf, const std::string& prefix) {
  std::vector<TensorView> views;
  for (const ParamTensor& t : layout.tensors()) views.push_back({prefix + t.name, t.shape, buf + t.offset});
  return views;
}

absl::Status WriteTextAtomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp.string(), ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status CopyInto(const Safetensors& st, const std::string& file, const ParamLayout& layout,
                      const std::string& prefix, float* dst) {
  for (const ParamTensor& t : layout.tensors()) {
    auto it = st.tensors.find(prefix + t.name);
    if (it == st.tensors.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, " has no tensor ", prefix, t.name, ": the checkpoint was written for a different model or stage"));
    }
    if (it->second.shape != t.shape) {
      auto fmt = [](const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); };
      return absl::FailedPreconditionError(absl::StrCat(file, ": tensor ", prefix, t.name, " has shape ",
                                                        fmt(it->second.shape), " but the model expects ", fmt(t.shape),
                                                        ": the model config differs from the checkpoint's"));
    }
    std::copy(it->second.data.begin(), it->second.data.end(), dst + t.offset);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& root, const CheckpointData& data, const ParamLayout& layout,
                            const float* params, const float* m, const float* v) {
  const std::string name = CheckpointName(data.step);
  const fs::path final_dir = fs::path(root) / name, tmp_dir = fs::path(root) / (name + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create checkpoint directory ", tmp_dir.string(), ": ", ec.message()));

  nlohmann::json files = nlohmann::json::object();
  auto write = [&](const std::string& file, const std::vector<TensorView>& views) -> absl::Status {
    const fs::path p = tmp_dir / file;
    LH_ASSIGN_OR_RETURN(uint32_t crc, WriteSafetensors(p.string(), views, {{"format", "pt"}}));
    files[file] = {{"bytes", fs::file_size(p)}, {"crc32", crc}};
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
  LH_RETURN_IF_ERROR(WriteTextAtomically(tmp_dir / "state.json", state.dump(2)));
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp_dir.string(), ": ", ec.message()));
  return SetLatestCheckpoint(root, data.step);
}

std::string CheckpointName(int64_t step) { return absl::StrFormat("step_%08d", step); }

absl::Status SetLatestCheckpoint(const std::string& root, int64_t step) {
  return WriteTextAtomically(fs::path(root) / "latest", CheckpointName(step) + "\n");
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& root) {
  std::ifstream f(fs::path(root) / "latest");
  std::string name;
  if (!f || !(f >> name)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint under ", root, " (", root,
                                            "/latest is missing): train without resume first"));
  }
  return (fs::path(root) / name).string();
}

absl::StatusOr<CheckpointData> LoadCheckpoint(const std::string& dir, const ParamLayout& layout, float* params,
                                              float* m, float* v) {
  const std::string state_path = (fs::path(dir) / "state.json").string();
  LH_ASSIGN_OR_RETURN(std::string state_text, ReadWholeFile(state_path));
  nlohmann::json state = nlohmann::json::parse(state_text, nullptr, false);
  if (state.is_discarded() || !state.contains("files") || !state.contains("step")) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", state_path, " is corrupt (not the JSON longhaul writes)"));
  }
  if (state.value("format_version", 0) != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrFormat("checkpoint %s has format version %d; this build reads %d",
                                                         dir, state.value("format_version", 0), kFormatVersion));
  }
  auto load = [&](const std::string& file) -> absl::StatusOr<Safetensors> {
    const std::string path = (fs::path(dir) / file).string();
    if (!state["files"].contains(file)) return absl::DataLossError(absl::StrCat(state_path, " does not list ", file));
    LH_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
    const size_t want = state["files"][file]["bytes"].get<size_t>();
    if (bytes.size() != want) {
      return absl::DataLossError(absl::StrFormat("checkpoint file %s is truncated: %d bytes, expected %d", path,
                                                 bytes.size(), want));
    }
    const uint32_t crc = state["files"][file]["crc32"].get<uint32_t>();
    if (Crc32(bytes) != crc) {
      return absl::DataLossError(absl::StrFormat(
          "checkpoint file %s is corrupt: CRC-32 %08x, expected %08x (restore it or resume from an earlier step)",
          path, Crc32(bytes), crc));
    }
    return ParseSafetensors(path, bytes);
  };
  LH_ASSIGN_OR_RETURN(Safetensors model, load("model.safetensors"));
  LH_RETURN_IF_ERROR(CopyInto(model, (fs::path(dir) / "model.safetensors").string(), layout, "", params));
  if (m != nullptr && v != nullptr) {
    LH_ASSIGN_OR_RETURN(Safetensors opt, load("optimizer.safetensors"));
    const std::string opt_path = (fs::path(dir) / "optimizer.safetensors").string();
    LH_RETURN_IF_ERROR(CopyInto(opt, opt_path, layout, "exp_avg.", m));
    LH_RETURN_IF_ERROR(CopyInto(opt, opt_path, layout, "exp_avg_sq.", v));
  }
  CheckpointData data;
  data.step = state["step"].get<int64_t>();
  data.run_config = state.value("run_config", nlohmann::json::object());
  return data;
}

}  // namespace longhaul
