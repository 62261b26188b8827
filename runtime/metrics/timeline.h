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

namespace longhaul {

// Rows of a worker in the trace.
enum class Track { kCompute = 0, kSend = 1, kParams = 2 };

class Timeline {
 public:
  static int64_t NowMicros();

  void Add(const std::string& name, Track track, int64_t start_us, int64_t end_us, int64_t iteration, int micro = -1);
  // The events as a JSON array, each tagged with pid (one per worker) and the track as tid.
  nlohmann::json Events(int pid) const;
  absl::Status Write(const std::string& path, int pid, const std::string& process_name) const;

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
