#pragma once
// A delay line on a libuv loop with microsecond accuracy: items are released in order of their
// release time (ties in arrival order). libuv's own timers have millisecond resolution, so this
// watches a CLOCK_MONOTONIC timerfd. Timers fire late, and how late depends on the machine and on
// how long the CPU slept (on virtual machines, tens of microseconds, more after longer sleeps, as
// an idle virtual CPU is woken through the hypervisor). So the queue
// learns, per octave of sleep length, how late its timer fires, arms it that much (and a margin)
// before the release time, and spins the rest. The spin is the margin plus the variation of
// lateness, some tens of microseconds per wake.
#include <sys/timerfd.h>
#include <uv.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "absl/status/status.h"

namespace longhaul::netem {

int64_t MonotonicNs();

// The CLOCK_MONOTONIC time of a CLOCK_REALTIME timestamp the kernel put on a packet when it arrived;
// now for a stamp that is not a time of the last 100 ms (0: none).
int64_t MonotonicOfRealtime(int64_t realtime_ns);

// Gives the calling process a real-time scheduling priority, so that a busy machine does not delay
// its wake-ups by a scheduler slice (milliseconds). Needs root or CAP_SYS_NICE; the error says so.
absl::Status RaiseToRealTime();

template <typename T>
class TimerQueue {
 public:
  TimerQueue(uv_loop_t* loop, std::function<void(T&)> release) : release_(std::move(release)) {
    late_ns_.fill(kInitialLateNs);
    fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    poll_ = new uv_poll_t;
    uv_poll_init(loop, poll_, fd_);
    poll_->data = this;
    uv_poll_start(poll_, UV_READABLE, [](uv_poll_t* p, int, int) { static_cast<TimerQueue*>(p->data)->OnTimer(); });
  }
  TimerQueue(const TimerQueue&) = delete;
  // The poll handle outlives the queue until the loop runs its close callback.
  ~TimerQueue() {
    uv_close(reinterpret_cast<uv_handle_t*>(poll_), [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
    close(fd_);
  }

  void Push(int64_t release_ns, T item) {
    heap_.push({release_ns, seq_++, std::move(item)});
    Arm();
  }
  size_t size() const { return heap_.size(); }
  // Releases everything still held, now (at shutdown).
  void Flush() {
    while (!heap_.empty()) Pop();
  }

 private:
  // Lateness is learned per octave of sleep length, from 64 us up; a sleep's early start is capped
  // at half the sleep (so dense traffic does not turn into a busy loop) and at 1 ms.
  static constexpr int kOctaves = 12;
  static constexpr int64_t kFirstOctaveNs = 64'000, kMaxEarlyNs = 1'000'000, kMarginNs = 10'000;
  static constexpr int64_t kInitialLateNs = 200'000;  // until the first wake of an octave says better
  struct Entry {
    int64_t release_ns;
    uint64_t seq;
    mutable T item;
    bool operator>(const Entry& o) const { return release_ns != o.release_ns ? release_ns > o.release_ns : seq > o.seq; }
  };

  static int Octave(int64_t sleep_ns) {
    int o = 0;
    while (o + 1 < kOctaves && sleep_ns >= (kFirstOctaveNs << o)) ++o;
    return o;
  }

  void Pop() {
    T item = std::move(heap_.top().item);
    heap_.pop();
    release_(item);
  }

  void Arm() {
    if (heap_.empty()) return;
    const int64_t due = heap_.top().release_ns;
    if (armed_due_ == due) return;
    const int64_t now = MonotonicNs();
    int64_t t = due;
    armed_gap_ = 0;
    if (due > now) {
      // The estimate is a decaying maximum, so the margin covers most of the spread of lateness.
      const int64_t late = late_ns_[Octave(due - now)];
      armed_gap_ = due - now;
      t -= std::min({late + late / 4 + kMarginNs, (due - now) / 2, kMaxEarlyNs});
    }
    itimerspec its{};
    its.it_value.tv_sec = t / 1'000'000'000;
    its.it_value.tv_nsec = t % 1'000'000'000;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
    timerfd_settime(fd_, TFD_TIMER_ABSTIME, &its, nullptr);
    armed_due_ = due;
    armed_for_ = t;
  }

  void OnTimer() {
    uint64_t expirations = 0, n;
    while (read(fd_, &n, sizeof(n)) > 0) expirations += n;
    const int64_t woke = MonotonicNs();
    if (expirations > 0 && armed_gap_ > 0) {
      int64_t& late = late_ns_[Octave(armed_gap_)];
      late = std::max(woke - armed_for_, late - late / 16);
    }
    if (!heap_.empty()) {
      const int64_t due = heap_.top().release_ns;
      if (due - woke <= kMaxEarlyNs) {
        while (MonotonicNs() < due) {
        }
      }
    }
    const int64_t now = MonotonicNs();
    while (!heap_.empty() && heap_.top().release_ns <= now) Pop();
    armed_due_ = -1;
    Arm();
  }

  std::function<void(T&)> release_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  uint64_t seq_ = 0;
  int fd_ = -1;
  // The head's release time, the timer's expiry, and how far ahead the head was when it was armed.
  int64_t armed_due_ = -1, armed_for_ = 0, armed_gap_ = 0;
  std::array<int64_t, kOctaves> late_ns_;  // how late the timer fires after a sleep of each octave
  uv_poll_t* poll_;
};

}  // namespace longhaul::netem
