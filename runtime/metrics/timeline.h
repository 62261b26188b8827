#pragma once
// Per-process event recording in Chrome trace format ("X" complete events), so a run's timeline
// opens in Perfetto or chrome://tracing. Timestamps come from the monotonic clock, which every
// process on one host shares, so traces of several workers merge into one picture.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

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

  void Add(const std::string& name, Track track, int64_t start_us, int64_t end_us, int64_t iteration, int micro = -1)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The events as a JSON array, each tagged with pid (one per worker) and the track as tid.
  nlohmann::json Events(int pid, int64_t shift_us = 0) const ABSL_LOCKS_EXCLUDED(mu_);
  // With every event moved by `shift_us` (onto another process's clock: ClockOffset).
  absl::StatusOr<TraceFile> Write(const std::string& path, int pid, const std::string& process_name,
                                  int64_t shift_us = 0) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Event {
    std::string name;
    Track track;
    int64_t start_us, end_us, iteration;
    int micro;
  };
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

// This kernel's boot id (/proc/sys/kernel/random/boot_id; empty where unreadable): processes that
// share it share the monotonic clock, which timestamps the timelines.
std::string BootId();

// The offset from this process's monotonic clock to another's (remote - local, µs), from round
// trips to it: each gives the remote clock at some moment between sending and receiving, so the
// offset within half the round trip; the shortest round trip's sample stands. On one kernel
// (SameKernel) the clocks are one, and the offset exactly 0.
class ClockOffset {
 public:
  void Sample(int64_t sent_us, int64_t remote_us, int64_t received_us) ABSL_LOCKS_EXCLUDED(mu_);
  void SameKernel() ABSL_LOCKS_EXCLUDED(mu_);
  // Empty until the first sample (or SameKernel).
  std::optional<int64_t> offset_us() const ABSL_LOCKS_EXCLUDED(mu_);
  // Half the round trip of the sample that stands (0 on one kernel).
  int64_t error_us() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::optional<int64_t> offset_us_ ABSL_GUARDED_BY(mu_);
  int64_t round_trip_us_ ABSL_GUARDED_BY(mu_) = 0;
  bool same_kernel_ ABSL_GUARDED_BY(mu_) = false;
};

// Merges worker trace files into one Chrome trace at `out`.
absl::Status MergeTraces(const std::vector<std::string>& files, const std::string& out);

}  // namespace longhaul
