#include "metrics/timeline.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "util/files.h"
#include "util/crc32c.h"
#include "util/bounded_json.h"

namespace longhaul {

int64_t Timeline::NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Timeline::Add(const std::string& name, Track track, int64_t start_us, int64_t end_us, int64_t iteration,
                   int micro) {
  absl::MutexLock lock(&mu_);
  events_.push_back({name, track, start_us, end_us, iteration, micro});
}

nlohmann::json Timeline::Events(int pid, int64_t shift_us) const {
  absl::MutexLock lock(&mu_);
  nlohmann::json out = nlohmann::json::array();
  for (const Event& e : events_) {
    nlohmann::json args = {{"iteration", e.iteration}};
    if (e.micro >= 0) args["micro_batch"] = e.micro;
    out.push_back({{"name", e.name}, {"ph", "X"}, {"ts", e.start_us + shift_us}, {"dur", e.end_us - e.start_us},
                   {"pid", pid}, {"tid", static_cast<int>(e.track)}, {"args", args}});
  }
  return out;
}

absl::StatusOr<TraceFile> Timeline::Write(const std::string& path, int pid, const std::string& process_name,
                                          int64_t shift_us) const {
  nlohmann::json events = Events(pid, shift_us);
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", process_name}}}});
  const char* tracks[] = {"compute", "send", "parameters"};
  for (int t = 0; t < 3; ++t) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", t}, {"args", {{"name", tracks[t]}}}});
  }
  const std::string text = nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  std::ofstream f(path, std::ios::trunc);
  f << text;
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return TraceFile{path, text.size(), Crc32c(0, text.data(), text.size())};
}

std::string BootId() {
  const absl::StatusOr<std::string> id = ReadWholeFile("/proc/sys/kernel/random/boot_id");
  return id.ok() ? std::string(absl::StripAsciiWhitespace(*id)) : std::string();
}

void ClockOffset::Sample(int64_t sent_us, int64_t remote_us, int64_t received_us) {
  absl::MutexLock lock(&mu_);
  const int64_t round_trip = received_us - sent_us;
  if (same_kernel_ || round_trip < 0 || (offset_us_ && round_trip >= round_trip_us_)) return;
  // The remote clock was read between sending and receiving: the midpoint errs by half the trip.
  offset_us_ = remote_us - (sent_us + round_trip / 2);
  round_trip_us_ = round_trip;
}

void ClockOffset::SameKernel() {
  absl::MutexLock lock(&mu_);
  same_kernel_ = true;
  offset_us_ = 0;
  round_trip_us_ = 0;
}

std::optional<int64_t> ClockOffset::offset_us() const {
  absl::MutexLock lock(&mu_);
  return offset_us_;
}

int64_t ClockOffset::error_us() const {
  absl::MutexLock lock(&mu_);
  return round_trip_us_ / 2;
}

absl::Status CheckTraceFile(const TraceFile& f) {
  // Only a regular file of the size written is read: not a device or a pipe, which might never end.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(f.path, ec)) return absl::NotFoundError(absl::StrCat("no trace file at ", f.path));
  if (const uintmax_t size = std::filesystem::file_size(f.path, ec); ec || size != f.bytes) {
    return absl::DataLossError(absl::StrFormat("%s holds %d bytes that are not the trace written there (%d bytes)",
                                               f.path, ec ? 0 : size, f.bytes));
  }
  const absl::StatusOr<std::string> text = ReadWholeFile(f.path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("no trace file at ", f.path));
  if (text->size() != f.bytes || Crc32c(0, text->data(), text->size()) != f.crc32c) {
    return absl::DataLossError(absl::StrFormat("%s holds %d bytes that are not the trace written there (%d bytes)",
                                               f.path, text->size(), f.bytes));
  }
  return absl::OkStatus();
}

absl::Status MergeTraces(const std::vector<std::string>& files, const std::string& out) {
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& path : files) {
    const absl::StatusOr<std::string> text = ReadWholeFile(path);
    if (!text.ok()) return text.status();
    nlohmann::json j = ParseBoundedJson(*text);
    if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) {
      return absl::DataLossError(absl::StrCat("trace file ", path, " is not valid JSON"));
    }
    for (auto& e : j["traceEvents"]) all.push_back(e);
  }
  std::ofstream f(out, std::ios::trunc);
  f << nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", out));
  return absl::OkStatus();
}

}  // namespace longhaul
