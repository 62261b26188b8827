#pragma once
// Per-process event recording in Chrome trace format ("X" complete events), so a run's timeline
// opens in Perfetto or chrome://tracing. Timestamps come from the monotonic clock, which every
// process on one host shares, so traces of several workers merge into one picture.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul {

// Rows of a worker in the trace.
enum class Track { kCompute = 0, kSend = 1, kParams = 2 };

// A trace file as its writer wrote it. A worker reports its own to the coordinator, which merges it
// only where the file it finds at that path is that one: a worker on a disk of its own names a
// path at which the coordinator's machine may hold another job's file, or none.
struct TraceFile {
  std::string path;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  bool operator==(const TraceFile&) const = default;
};
// OK where f.path holds f.bytes bytes of CRC f.crc32c; NotFound where there is no file, DataLoss
// where it holds another.
absl::Status CheckTraceFile(const TraceFile& f);

class Timeline {
 public:
  static int64_t NowMicros();

  void Add(const std::string& name, Track track, int64_t start_us, int64_t end_us, int64_t iteration, int micro = -1);
  // The events as a JSON array, each tagged with pid (one per worker) and the track as tid.
  nlohmann::json Events(int pid) const;
  absl::StatusOr<TraceFile> Write(const std::string& path, int pid, const std::string& process_name) const;

 private:
  struct Event {
    std::string name;
    Track track;
    int64_t start_us, end_us, iteration;
    int micro;
  };
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// Merges worker trace files into one Chrome trace at `out`.
absl::Status MergeTraces(const std::vector<std::string>& files, const std::string& out);

}  // namespace longhaul
