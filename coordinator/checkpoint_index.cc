#include "coordinator/checkpoint_index.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/planning.h"
#include "layout/plan_layout.h"
#include "model/param_layout.h"
#include "transport/wire_plan.h"

namespace longhaul {
namespace fs = std::filesystem;

CheckpointIndex::CheckpointIndex(std::string root, int64_t latest_step, std::string latest_name)
    : root_(std::move(root)), latest_step_(latest_step), latest_name_(std::move(latest_name)) {}

absl::StatusOr<bool> CheckpointIndex::Add(int64_t step, const CheckpointPieceRoot& piece, size_t pieces) {
  std::set<std::tuple<int, int, int>>& reported = reported_[step];
  if (!reported.emplace(static_cast<int>(piece.kind), piece.stage, piece.index).second) {
    return absl::AlreadyExistsError("the piece was reported already");
  }
  return reported.size() == pieces;
}

absl::StatusOr<std::string> CheckpointIndex::Complete(int64_t step, int keep) {
  if (absl::Status st = SetLatestCheckpoint(root_, step); !st.ok()) return st;
  latest_step_ = step;
  latest_name_ = CheckpointName(step);
  reported_.erase(reported_.begin(), reported_.find(step));
  const absl::Status pruned = PruneCheckpoints(root_, latest_step_, keep);
  return pruned.ok() ? std::string() : std::string(pruned.message());
}

void CheckpointIndex::Rewind(int64_t start) { reported_.erase(reported_.upper_bound(start), reported_.end()); }

bool PlanGives(const proto::Plan& plan, const JobConfig& cfg, const proto::Assignment& a,
               const CheckpointPieceRoot& piece) {
  switch (piece.kind) {
    case CheckpointPieceRoot::Kind::kShard:
      return HostsShard(plan, a, piece.stage, piece.index);
    case CheckpointPieceRoot::Kind::kResidual:
      return a.stage() == piece.stage && piece.index / GroupsPerReplica(plan, cfg) == a.replica() &&
             FeedbackStreams(plan, cfg).count({piece.stage, piece.index}) > 0;
    case CheckpointPieceRoot::Kind::kLocal:
      return cfg.train.local_steps > 1 && a.stage() == piece.stage && a.replica() == piece.index;
  }
  return false;
}

std::pair<uint64_t, size_t> PieceSize(const proto::Plan& plan, const JobConfig& cfg, const CheckpointPieceRoot& piece) {
  const ParamLayout layout(cfg.model, cfg.Stage(piece.stage));
  if (piece.kind != CheckpointPieceRoot::Kind::kShard) return {layout.total(), layout.tensors().size()};
  for (const proto::ShardPlacement& sp : plan.shards()) {
    if (sp.stage() != piece.stage || sp.shard() != piece.index) continue;
    const auto [begin, end] = layout.Range(sp.first_tensor(), sp.end_tensor());
    return {end - begin, static_cast<size_t>(sp.end_tensor() - sp.first_tensor())};
  }
  return {0, 0};
}

absl::Status CheckPart(uint64_t file_bytes, uint64_t offset, uint64_t bytes) {
  if (bytes > kCheckpointChunkBytes || offset > file_bytes || bytes > file_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a part of %d bytes at %d of a %d-byte file (parts are at most %d bytes, within the file)", bytes, offset,
        file_bytes, kCheckpointChunkBytes));
  }
  return absl::OkStatus();
}

absl::Status ReceivePart(const std::string& path_name, uint64_t file_bytes, uint64_t offset, const std::string& data) {
  // One part of a file at a time: two at one offset (a call and its retry) would both find the
  // file that long and both append. Other files' parts, most of them, go on meanwhile.
  // Each lock guards no field, only the files whose names hash to it.
  static std::array<absl::Mutex, 64> writing;
  absl::MutexLock lock(&writing[std::hash<std::string>{}(path_name) % writing.size()]);
  const fs::path path(path_name);
  const fs::path part = path_name + ".part";
  std::error_code ec;
  if (offset == 0) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", path.parent_path().string(), ": ", ec.message()));
  }
  const uintmax_t have = offset == 0 ? 0 : fs::file_size(part, ec);
  if (ec || have != offset) {
    return absl::FailedPreconditionError(
        absl::StrFormat("a part of %s at byte %d, where %d bytes of it are here: ship the file from its start",
                        path_name, offset, ec ? 0 : have));
  }
  {
    std::ofstream f(part, offset == 0 ? std::ios::binary | std::ios::trunc : std::ios::binary | std::ios::app);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f.flush()) return absl::InternalError(absl::StrCat("cannot write ", part.string()));
  }
  if (offset + data.size() == file_bytes) {
    fs::rename(part, path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot rename ", part.string()));
  }
  return absl::OkStatus();
}

absl::StatusOr<FilePart> ReadPart(const std::string& path, uint64_t offset) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path, " is not here"));
  if (offset > size) return absl::OutOfRangeError(absl::StrFormat("byte %d of %s, which has %d", offset, path, size));
  FilePart part{size, std::string(std::min<uint64_t>(kCheckpointChunkBytes, size - offset), '\0')};
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  if (!f.read(part.data.data(), static_cast<std::streamsize>(part.data.size()))) {
    return absl::InternalError(absl::StrCat("cannot read ", path));
  }
  return part;
}

}  // namespace longhaul
