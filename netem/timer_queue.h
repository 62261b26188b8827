#pragma once
// A delay line on a libuv loop with nanosecond precision: items are released in order of their
// release time (ties in arrival order). libuv's own timers have millisecond resolution, so this
// watches a CLOCK_MONOTONIC timerfd. A virtual CPU that idles wakes late, by tens of microseconds
// after a short sleep and by hundreds after a long one, and by how much differs from machine to
// machine. So the queue measures its own wake-ups: for each range of sleep lengths (powers of two)
// it keeps a running estimate of how late the timer fires, wakes that much early (twice it, plus a
// margin) and spins the rest of the way. A fixed early wake was either too short on some machines
// (the release came late, more so the longer the delay) or wasted a core spinning on others.
#include <sys/timerfd.h>
#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <queue>
#include <vector>

namespace longhaul::netem {

int64_t MonotonicNs();

// Readies the calling thread to run a TimerQueue: no timer slack (50 us by default, which would
// add to every delay) and real-time priority where allowed. Beside busy processes a woken
// ordinary thread waits for the scheduler, milliseconds at a time, and every packet's delay grows
// by that; a real-time one runs at once, as the kernel's own netem runs in softirq context. It
// sleeps between releases and spins at most the early-wake distance, so it cannot starve the
// machine (and the kernel's real-time throttling would stop it if it did). Without the privilege
// it says on stderr that delays will grow on a busy machine.
void PrepareDelayLineThread(const char* who);

template <typename T>
class TimerQueue {
 public:
  TimerQueue(uv_loop_t* loop, std::function<void(T&)> release) : release_(std::move(release)) {
    std::fill(std::begin(late_ns_), std::end(late_ns_), kInitialLateNs);
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
  // Early wake = 2 x estimated lateness + kMarginNs, within [kMarginNs, kMaxEarlyNs].
  static constexpr int64_t kMarginNs = 20'000, kMaxEarlyNs = 2'000'000, kInitialLateNs = 100'000;
  static constexpr int kBuckets = 40;
  struct Entry {
    int64_t release_ns;
    uint64_t seq;
    mutable T item;
    bool operator>(const Entry& o) const { return release_ns != o.release_ns ? release_ns > o.release_ns : seq > o.seq; }
  };

  static int Bucket(int64_t sleep_ns) {
    int b = 0;
    while (sleep_ns > 1 && b < kBuckets - 1) sleep_ns >>= 1, ++b;
    return b;
  }
  int64_t EarlyNs(int bucket) const { return std::clamp(2 * late_ns_[bucket] + kMarginNs, kMarginNs, kMaxEarlyNs); }

  void Pop() {
    T item = std::move(heap_.top().item);
    heap_.pop();
    release_(item);
  }

  void Arm() {
    if (heap_.empty()) return;
    const int64_t due = heap_.top().release_ns, now = MonotonicNs();
    if (armed_for_ != 0 && armed_due_ == due) return;  // armed for this release already
    const int bucket = Bucket(due - now);
    // Already within the early-wake distance: fire at once and spin.
    const int64_t wake = std::max(now, due - EarlyNs(bucket));
    itimerspec its{};
    its.it_value.tv_sec = wake / 1'000'000'000;
    its.it_value.tv_nsec = wake % 1'000'000'000;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
    timerfd_settime(fd_, TFD_TIMER_ABSTIME, &its, nullptr);
    armed_for_ = wake;
    armed_due_ = due;
    armed_bucket_ = wake > now ? bucket : -1;  // only a real sleep says how late a wake-up is
  }

  void OnTimer() {
    uint64_t expirations;
    while (read(fd_, &expirations, sizeof(expirations)) > 0) {
    }
    int64_t now = MonotonicNs();
    if (armed_bucket_ >= 0 && now >= armed_for_) {
      // A wake-up delayed by a busy neighbour counts too, capped so one outlier cannot make every
      // later wait a long spin.
      const int64_t late = std::min(now - armed_for_, kMaxEarlyNs);
      late_ns_[armed_bucket_] += (late - late_ns_[armed_bucket_]) / 8;
    }
    if (!heap_.empty()) {
      const int64_t due = heap_.top().release_ns;
      if (due - now <= kMaxEarlyNs) {
        while ((now = MonotonicNs()) < due) {
        }
      }
    }
    while (!heap_.empty() && heap_.top().release_ns <= now) Pop();
    armed_for_ = 0;
    Arm();
  }

  std::function<void(T&)> release_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  uint64_t seq_ = 0;
  int fd_ = -1;
  int64_t armed_for_ = 0;  // the timerfd's absolute expiry, 0 when not armed
  int64_t armed_due_ = 0;  // the release it is armed for
  int armed_bucket_ = -1;  // sleep-length bucket of the wait armed, -1 when it fires at once
  int64_t late_ns_[kBuckets];  // estimated wake-up lateness per sleep-length bucket
  uv_poll_t poll_;
};

}  // namespace longhaul::netem
