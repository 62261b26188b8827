#pragma once
// A delay line on a libuv loop with nanosecond precision: items are released in order of their
// release time (ties in arrival order). libuv's own timers have millisecond resolution, so this
// watches a CLOCK_MONOTONIC timerfd. An idle virtual CPU wakes a few hundred microseconds late,
// more the longer it slept, so long sleeps end early and spin up to the release time; under load
// wakes are frequent and short and nothing spins.
#include <sys/timerfd.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace longhaul::netem {

int64_t MonotonicNs();

template <typename T>
class TimerQueue {
 public:
  TimerQueue(uv_loop_t* loop, std::function<void(T&)> release) : release_(std::move(release)) {
    fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    uv_poll_init(loop, &poll_, fd_);
    poll_.data = this;
    uv_poll_start(&poll_, UV_READABLE, [](uv_poll_t* p, int, int) { static_cast<TimerQueue*>(p->data)->OnTimer(); });
  }
  TimerQueue(const TimerQueue&) = delete;
  ~TimerQueue() {
    uv_poll_stop(&poll_);
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
  static constexpr int64_t kLongSleepNs = 1'000'000, kEarlyNs = 300'000;
  struct Entry {
    int64_t release_ns;
    uint64_t seq;
    mutable T item;
    bool operator>(const Entry& o) const { return release_ns != o.release_ns ? release_ns > o.release_ns : seq > o.seq; }
  };

  void Pop() {
    T item = std::move(heap_.top().item);
    heap_.pop();
    release_(item);
  }

  void Arm() {
    if (heap_.empty()) return;
    int64_t t = heap_.top().release_ns;
    if (t - MonotonicNs() > kLongSleepNs) t -= kEarlyNs;
    if (armed_for_ == t) return;
    itimerspec its{};
    its.it_value.tv_sec = t / 1'000'000'000;
    its.it_value.tv_nsec = t % 1'000'000'000;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
    timerfd_settime(fd_, TFD_TIMER_ABSTIME, &its, nullptr);
    armed_for_ = t;
  }

  void OnTimer() {
    uint64_t expirations;
    while (read(fd_, &expirations, sizeof(expirations)) > 0) {
    }
    if (!heap_.empty()) {
      const int64_t due = heap_.top().release_ns;
      if (due - MonotonicNs() <= kEarlyNs) {
        while (MonotonicNs() < due) {
        }
      }
    }
    const int64_t now = MonotonicNs();
    while (!heap_.empty() && heap_.top().release_ns <= now) Pop();
    armed_for_ = 0;
    Arm();
  }

  std::function<void(T&)> release_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  uint64_t seq_ = 0;
  int fd_ = -1;
  int64_t armed_for_ = 0;
  uv_poll_t poll_;
};

}  // namespace longhaul::netem
