#include "worker/checkpoint_courier.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "util/status_macros.h"
#include "worker/coordinator_client.h"
#include "util/bounded_json.h"
#include "util/files.h"

namespace longhaul {
namespace {

namespace fs = std::filesystem;

// Reads the file at `path` part by part, each of at most kCheckpointChunkBytes, and hands each to
// send(the file's size, the part's offset, its bytes), stopping at the first error; Cancelled once
// `cancelled` says so between parts.
absl::Status SendInParts(const fs::path& path,
                         const std::function<absl::Status(uint64_t, uint64_t, const std::string&)>& send,
                         const std::function<bool()>& cancelled = {}) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot read the size of ", path.string(), ": ", ec.message()));
  std::ifstream f(path, std::ios::binary);
  std::string data;
  uint64_t offset = 0;
  do {
    if (cancelled && cancelled()) return absl::CancelledError(absl::StrCat("shipping ", path.string(), " was dropped"));
    data.resize(std::min<uint64_t>(kCheckpointChunkBytes, size - offset));
    if (!f.read(data.data(), static_cast<std::streamsize>(data.size()))) {
      return absl::InternalError(absl::StrCat("cannot read ", path.string()));
    }
    LH_RETURN_IF_ERROR(send(size, offset, data));
    offset += data.size();
  } while (offset < size);
  return absl::OkStatus();
}

absl::Status ShipFile(CoordinatorClient& client, const fs::path& path, proto::CheckpointChunk chunk,
                      const std::function<bool()>& cancelled) {
  chunk.set_file(path.filename().string());
  return SendInParts(
      path,
      [&](uint64_t size, uint64_t offset, const std::string& data) {
        chunk.set_file_bytes(size);
        chunk.set_offset(offset);
        chunk.set_data(data);
        return client.ShipCheckpoint(chunk);
      },
      cancelled);
}

absl::Status FetchFile(CoordinatorClient& client, proto::CheckpointFetch fetch, const fs::path& to, uint64_t most) {
  std::ofstream f(to, std::ios::binary | std::ios::trunc);
  uint64_t offset = 0, size = 0;
  do {
    fetch.set_offset(offset);
    LH_ASSIGN_OR_RETURN(const proto::CheckpointChunk chunk, client.FetchCheckpoint(fetch));
    if (offset == 0) size = chunk.file_bytes();
    if (chunk.file_bytes() > most || chunk.file_bytes() != size || chunk.offset() != offset ||
        chunk.data().size() > size - offset || (chunk.data().empty() && offset < size)) {
      return absl::DataLossError(absl::StrFormat(
          "the coordinator sent %d bytes at byte %d of %s/%s, a file of %d bytes, where byte %d of a file of at most "
          "%d bytes was asked for: run the coordinator and the workers from one build, with one job config",
          chunk.data().size(), chunk.offset(), fetch.piece(), fetch.file(), chunk.file_bytes(), offset,
          offset == 0 ? most : size));
    }
    f.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    offset += chunk.data().size();
  } while (offset < size);
  if (!f.flush()) return absl::InternalError(absl::StrCat("cannot write ", to.string()));
  return absl::OkStatus();
}

absl::Status FetchInto(CoordinatorClient& client, const fs::path& dir, const fs::path& aside, uint64_t version,
                       uint64_t max_file_bytes, bool state_only) {
  proto::CheckpointFetch fetch;
  fetch.set_plan_version(version);
  fetch.set_piece(dir.parent_path().filename().string());
  // Every file at once: one after another would take a round trip each on a slow link to the
  // coordinator, and a spare fetches a few pieces before its first iteration.
  LH_ASSIGN_OR_RETURN(const uint64_t state_most, MaxCheckpointFileBytes("state.json", 0, 0, false));
  std::vector<std::future<absl::Status>> files;
  for (const char* file : kCheckpointFiles) {
    const bool state = std::string(file) == "state.json";
    if (state_only && !state) continue;
    fetch.set_file(file);
    files.push_back(std::async(std::launch::async, FetchFile, std::ref(client), fetch, aside / file,
                               state ? state_most : max_file_bytes));
  }
  std::vector<absl::Status> got;
  for (auto& f : files) got.push_back(f.get());
  for (const absl::Status& st : got) {
    if (!st.ok() && !absl::IsNotFound(st)) return st;
  }
  if (!got.back().ok()) return got.back();  // no state.json: no such piece
  // The files state.json lists must have come; their sizes and CRC-32s are checked again when the
  // piece is read. One it does not list (moments of a piece that has none) goes.
  LH_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile((aside / "state.json").string()));
  const nlohmann::json state = ParseBoundedJson(text);
  if (!state.is_object() || !state.contains("files") || !state["files"].is_object()) {
    return absl::DataLossError(absl::StrCat("the coordinator's ", fetch.piece(),
                                            "/state.json lists no files: restore that checkpoint piece"));
  }
  std::error_code ec;
  for (size_t i = 0; !state_only && i + 1 < got.size(); ++i) {
    const bool listed = state["files"].contains(kCheckpointFiles[i]);
    if (listed && !got[i].ok()) {
      return absl::DataLossError(absl::StrCat("the coordinator's ", fetch.piece(), " lacks ", kCheckpointFiles[i],
                                              ", which its state.json lists: restore that checkpoint piece"));
    }
    if (!listed) fs::remove(aside / kCheckpointFiles[i], ec);
  }
  for (const auto& listed : state["files"].items()) {
    if (!IsCheckpointFile(listed.key()) || listed.key() == "state.json") {
      return absl::DataLossError(absl::StrCat("the coordinator's ", fetch.piece(), "/state.json lists \"", listed.key(),
                                              "\", which no checkpoint holds: restore that checkpoint piece"));
    }
  }
  fs::remove_all(dir, ec);
  fs::create_directories(dir.parent_path(), ec);
  fs::rename(aside, dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", aside.string(), ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status ShipTimelineFile(CoordinatorClient& client, const TraceFile& trace) {
  proto::TimelineChunk chunk;
  return SendInParts(trace.path, [&](uint64_t size, uint64_t offset, const std::string& data) {
    if (size != trace.bytes) return absl::DataLossError(absl::StrFormat("%s changed since it was written", trace.path));
    chunk.set_file_bytes(size);
    chunk.set_offset(offset);
    chunk.set_data(data);
    return client.ShipTimeline(chunk);
  });
}

absl::Status ShipCheckpointPiece(CoordinatorClient& client, const std::string& step_dir, int64_t step,
                                 uint64_t version, const std::function<bool()>& cancelled) {
  const fs::path dir(step_dir);
  proto::CheckpointChunk chunk;
  chunk.set_plan_version(version);
  chunk.set_step(step);
  chunk.set_piece(dir.parent_path().filename().string());
  std::error_code ec;
  for (const char* file : kCheckpointFiles) {
    if (fs::exists(dir / file, ec)) LH_RETURN_IF_ERROR(ShipFile(client, dir / file, chunk, cancelled));
  }
  return absl::OkStatus();
}

CheckpointShipper::CheckpointShipper(CoordinatorClient& client) : client_(client), thread_([this] { Loop(); }) {}

CheckpointShipper::~CheckpointShipper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.SignalAll();
  thread_.join();
}

void CheckpointShipper::Ship(std::string step_dir, int64_t step, uint64_t version, std::function<absl::Status()> then) {
  {
    absl::MutexLock lock(&mu_);
    jobs_.push_back({std::move(step_dir), step, version, std::move(then)});
  }
  cv_.SignalAll();
}

absl::Status CheckpointShipper::Flush() {
  absl::MutexLock lock(&mu_);
  while (!((jobs_.empty() && !busy_) || !error_.ok())) cv_.Wait(&mu_);
  return error_;
}

absl::Status CheckpointShipper::Error() {
  absl::MutexLock lock(&mu_);
  return error_;
}

void CheckpointShipper::Drop() {
  absl::MutexLock lock(&mu_);
  jobs_.clear();
  dropping_ = true;
  while (busy_) cv_.Wait(&mu_);
  dropping_ = false;
  error_ = absl::OkStatus();
}

void CheckpointShipper::Loop() {
  // mu_ is held throughout but while a job ships: locked and unlocked by hand, as a scoped lock
  // cannot let go in the middle.
  mu_.Lock();
  while (true) {
    while (!stop_ && jobs_.empty()) cv_.Wait(&mu_);
    if (stop_) break;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    mu_.Unlock();
    absl::Status st = job.step_dir.empty() ? absl::OkStatus()
                                           : ShipCheckpointPiece(client_, job.step_dir, job.step, job.version,
                                                                 [this] { return dropping_.load(); });
    if (st.ok()) st = job.then();
    mu_.Lock();
    busy_ = false;
    // After a failure nothing later is shipped: the piece it failed on would be missing there.
    if (!st.ok() && error_.ok()) error_ = st, jobs_.clear();
    cv_.SignalAll();
  }
  mu_.Unlock();
}

absl::Status FetchCheckpointPiece(CoordinatorClient& client, const std::string& step_dir, uint64_t version,
                                  uint64_t max_file_bytes, bool state_only) {
  const fs::path aside(step_dir + ".fetch");
  std::error_code ec;
  fs::remove_all(aside, ec);
  fs::create_directories(aside, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", aside.string(), ": ", ec.message()));
  const absl::Status fetched = FetchInto(client, fs::path(step_dir), aside, version, max_file_bytes, state_only);
  fs::remove_all(aside, ec);
  return fetched;
}

}  // namespace longhaul
