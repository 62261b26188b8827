#include "netem/timer_queue.h"

#include <sched.h>
#include <sys/prctl.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace longhaul::netem {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void PrepareDelayLineThread(const char* who) {
  prctl(PR_SET_TIMERSLACK, 1UL);
  const sched_param rt{.sched_priority = 50};
  if (sched_setscheduler(0, SCHED_FIFO, &rt) != 0) {
    std::fprintf(stderr, "%s: no real-time priority (%s): delays will grow while the machine is busy\n", who,
                 std::strerror(errno));
  }
}

}  // namespace longhaul::netem
