// TimerQueue, the delay line of the delay daemon and the proxy: items come out in order of their
// release time, and on time after a sleep of any length. The timers of these virtual machines fire
// tens to a hundred microseconds late, later the longer the CPU slept; a queue that trusted them
// would add that to every emulated delay.
#include "netem/timer_queue.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <uv.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace longhaul::netem {
namespace {

// Runs a loop with a queue until a release stops it; the queue is gone, its handle closed, on return.
template <typename T>
void RunQueue(std::function<void(T&, TimerQueue<T>&, uv_loop_t*)> on_release,
              std::function<void(TimerQueue<T>&)> start) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  std::unique_ptr<TimerQueue<T>> q;
  q = std::make_unique<TimerQueue<T>>(&loop, [&](T& item) { on_release(item, *q, &loop); });
  start(*q);
  uv_run(&loop, UV_RUN_DEFAULT);
  q.reset();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(TimerQueueTest, ReleasesInOrderOfReleaseTimeTiesInArrivalOrder) {
  std::vector<int> order;
  const int64_t t0 = MonotonicNs() + 2'000'000;
  RunQueue<int>(
      [&](int& i, TimerQueue<int>& q, uv_loop_t* loop) {
        order.push_back(i);
        if (q.size() == 0) uv_stop(loop);
      },
      [&](TimerQueue<int>& q) {
        q.Push(t0 + 300'000, 3);
        q.Push(t0, 1);
        q.Push(t0 + 300'000, 4);
        q.Push(t0 + 100'000, 2);
      });
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4}));
}

// Holds one item at a time for `sleep_ns`, `rounds` times: how late each came out, in microseconds.
std::vector<double> Lateness(int64_t sleep_ns, int rounds) {
  std::vector<double> late;
  RunQueue<int64_t>(
      [&](int64_t& due, TimerQueue<int64_t>& q, uv_loop_t* loop) {
        const int64_t now = MonotonicNs();
        late.push_back((now - due) / 1e3);
        if (static_cast<int>(late.size()) == rounds) return uv_stop(loop);
        q.Push(now + sleep_ns, now + sleep_ns);
      },
      [&](TimerQueue<int64_t>& q) {
        const int64_t due = MonotonicNs() + sleep_ns;
        q.Push(due, due);
      });
  std::sort(late.begin(), late.end());
  return late;
}

// With a real-time priority, as the delay daemon runs, so that busy neighbours cannot delay the
// wake-ups (without it, two busy processes per core make 90th percentiles of 3 ms here).
TEST(TimerQueueTest, ReleasesOnTimeAfterSleepsOfAnyLength) {
  struct RestorePolicy {  // for the tests that follow in this process
    int policy = sched_getscheduler(0);
    sched_param param{};
    RestorePolicy() { sched_getparam(0, &param); }
    ~RestorePolicy() { sched_setscheduler(0, policy, &param); }
  } restore;
  const absl::Status rt = RaiseToRealTime();
  if (!rt.ok()) GTEST_SKIP() << rt;
  const std::vector<std::pair<double, int>> holds = {{0.25, 60}, {1, 60}, {5, 40}, {25, 20}, {100, 10}};
  for (const auto& [sleep_ms, rounds] : holds) {
    const std::vector<double> late = Lateness(static_cast<int64_t>(sleep_ms * 1e6), rounds);
    ASSERT_EQ(static_cast<int>(late.size()), rounds);
    const double median = late[late.size() / 2];
    std::cout << absl::StrFormat("held %g ms, %d times: released late by median %.1f us, 90th percentile %.1f us, "
                                 "max %.1f us\n",
                                 sleep_ms, rounds, median, late[late.size() * 9 / 10], late.back());
    EXPECT_LT(median, 10.0) << absl::StrFormat("held %g ms", sleep_ms);
  }
}

}  // namespace
}  // namespace longhaul::netem
