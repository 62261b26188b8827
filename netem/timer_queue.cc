#include "netem/timer_queue.h"

#include <sched.h>
#include <time.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace longhaul::netem {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t MonotonicOfRealtime(int64_t realtime_ns) {
  timespec real;
  clock_gettime(CLOCK_REALTIME, &real);
  const int64_t now = MonotonicNs();
  const int64_t age = static_cast<int64_t>(real.tv_sec) * 1'000'000'000 + real.tv_nsec - realtime_ns;
  return age >= 0 && age < 100'000'000 ? now - age : now;
}

absl::Status RaiseToRealTime() {
  // The lowest real-time priority is enough to run before every ordinary process.
  sched_param p{};
  p.sched_priority = sched_get_priority_min(SCHED_FIFO);
  if (sched_setscheduler(0, SCHED_FIFO, &p) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot take a real-time priority (", std::strerror(errno),
                                                    "): run as root or grant CAP_SYS_NICE"));
  }
  return absl::OkStatus();
}

}  // namespace longhaul::netem
