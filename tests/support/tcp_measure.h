#pragma once
// Test helpers that measure a connected TCP pair: one-way times and round trips of one-byte
// messages, and the goodput of a bulk transfer after slow start.
#include <linux/net_tstamp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "util/median.h"

namespace longhaul::testing {

// The kernel's software timestamps (SO_TIMESTAMPING) of one-byte messages: when the sender's
// kernel handed the byte to the device, and when the receiver's kernel took it in. Their difference
// is the path between the two kernels, without either endpoint's wake-up.
inline void EnableKernelTimestamps(int fd) {
  const int flags = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE |
                    SOF_TIMESTAMPING_OPT_TSONLY;
  setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof(flags));
}

namespace internal {

// The software timestamp in a message's control data, in ns of CLOCK_REALTIME, or 0.
inline int64_t StampIn(msghdr& m) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPING) {
      timespec ts[3];
      std::memcpy(ts, CMSG_DATA(c), sizeof(ts));
      return static_cast<int64_t>(ts[0].tv_sec) * 1'000'000'000 + ts[0].tv_nsec;
    }
  }
  return 0;
}

}  // namespace internal

// Reads one byte; returns its kernel receive stamp (0 without one), or -1 when the read fails.
inline int64_t ReadStamped(int fd) {
  char c, control[256];
  iovec iov{&c, 1};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  if (recvmsg(fd, &m, 0) != 1) return -1;
  return internal::StampIn(m);
}

// Writes one byte; returns the kernel's stamp of its send, from the error queue (0 without one
// within a second), or -1 when the write fails.
inline int64_t WriteStamped(int fd, char c) {
  if (write(fd, &c, 1) != 1) return -1;
  for (int waited_ms = 0; waited_ms < 1000; ++waited_ms) {
    char control[256];
    msghdr m{};
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) >= 0) return internal::StampIn(m);
    pollfd p{fd, 0, 0};  // the error queue reports itself as POLLERR
    poll(&p, 1, 1);
  }
  return 0;
}

inline double Median(std::vector<double> v) { return v.empty() ? -1 : longhaul::Median(std::move(v)); }

// One-byte ping-pongs from cli, echoed by srv, each round trip timed two ways (medians, in ms):
// - user: from before the client's write to after its read, as an application sees it. It includes
//   how late each side's thread wakes up to read, which on an idle virtual machine grows with the
//   time it slept (tens of microseconds after a few milliseconds).
// - network: by kernel timestamps, client's send to echo's receive plus echo's send to client's
//   receive: the path without the endpoints' wake-ups. Negative where there are no timestamps.
struct RoundTrips {
  double user_ms = -1, network_ms = -1;
};

inline RoundTrips MeasureRoundTrips(int cli, int srv, int rounds) {
  EnableKernelTimestamps(cli);
  EnableKernelTimestamps(srv);
  // Send and receive stamps of the client and of the echo, per round.
  std::vector<int64_t> cli_tx(rounds, 0), cli_rx(rounds, 0), echo_rx(rounds, 0), echo_tx(rounds, 0);
  std::thread echo([&] {
    for (int i = 0; i < rounds; ++i) {
      echo_rx[i] = ReadStamped(srv);
      if (echo_rx[i] < 0 || (echo_tx[i] = WriteStamped(srv, 'y')) < 0) return;
    }
  });
  std::vector<double> user, network;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cli_tx[i] = WriteStamped(cli, 'x');
    if (cli_tx[i] < 0 || (cli_rx[i] = ReadStamped(cli)) < 0) break;
    user.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  echo.join();
  for (int i = 0; i < static_cast<int>(user.size()); ++i) {
    if (cli_tx[i] > 0 && cli_rx[i] > 0 && echo_rx[i] > 0 && echo_tx[i] > 0) {
      network.push_back(((echo_rx[i] - cli_tx[i]) + (cli_rx[i] - echo_tx[i])) / 1e6);
    }
  }
  return {Median(user), Median(network)};
}

// Median one-way time in ms, by kernel timestamps, of `rounds` one-byte messages from `from` to
// `to`, with `after_send` run after each send. Negative where there are no timestamps.
inline double MeasureOneWayMs(int from, int to, int rounds, const std::function<void()>& after_send) {
  EnableKernelTimestamps(from);
  EnableKernelTimestamps(to);
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    const int64_t sent = WriteStamped(from, 'x');
    after_send();
    const int64_t got = sent < 0 ? -1 : ReadStamped(to);
    if (got < 0) break;
    if (sent > 0 && got > 0) ms.push_back((got - sent) / 1e6);
  }
  return Median(ms);
}

// The link is under test, not the scheduler: beside busy neighbours an ordinary thread wakes late
// (a reader drains its socket late, a timer fires late) and the figure measures the machine's
// load. Where allowed (root), a measuring thread runs at a real-time priority, as the delay daemon
// does; such threads block on sockets or sleeps, so they cannot starve anything.
inline void PreferRealTime() {
  sched_param p{};
  p.sched_priority = 10;
  pthread_setschedparam(pthread_self(), SCHED_FIFO, &p);
}

// PreferRealTime for the calling thread until the end of the scope.
class RealTimeScope {
 public:
  RealTimeScope() {
    pthread_getschedparam(pthread_self(), &policy_, &param_);
    PreferRealTime();
  }
  ~RealTimeScope() { pthread_setschedparam(pthread_self(), policy_, &param_); }

 private:
  int policy_ = SCHED_OTHER;
  sched_param param_{};
};

// Sends `bytes` from cli to srv; returns the payload rate in Mbit/s seen by the receiver after the
// first quarter (slow start) has arrived.
inline double GoodputMbit(int cli, int srv, size_t bytes) {
  RealTimeScope real_time;
  std::thread sender([&] {
    PreferRealTime();
    std::vector<char> buf(1 << 20, 'a');
    size_t sent = 0;
    while (sent < bytes) {
      const ssize_t w = write(cli, buf.data(), std::min(buf.size(), bytes - sent));
      if (w <= 0) return;
      sent += static_cast<size_t>(w);
    }
  });
  std::vector<char> buf(1 << 20);
  size_t got = 0;
  std::chrono::steady_clock::time_point t_quarter;
  while (got < bytes) {
    const ssize_t r = read(srv, buf.data(), buf.size());
    if (r <= 0) break;
    if (got < bytes / 4 && got + static_cast<size_t>(r) >= bytes / 4) t_quarter = std::chrono::steady_clock::now();
    got += static_cast<size_t>(r);
  }
  sender.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_quarter).count();
  return (got - bytes / 4) * 8 / s / 1e6;
}

}  // namespace longhaul::testing
