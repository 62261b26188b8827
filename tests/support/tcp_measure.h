#pragma once
// Test helpers that measure a connected TCP pair: round trips of one-byte ping-pongs, and the
// goodput of a bulk transfer after slow start.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace longhaul::testing {

// Median of `rounds` one-byte ping-pongs from cli, echoed by srv, in milliseconds.
inline double PingPongMs(int cli, int srv, int rounds) {
  std::thread echo([&] {
    char c;
    for (int i = 0; i < rounds; ++i)
      if (read(srv, &c, 1) != 1 || write(srv, &c, 1) != 1) return;
  });
  std::vector<double> ms;
  char c = 'x';
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (write(cli, &c, 1) != 1 || read(cli, &c, 1) != 1) break;
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  echo.join();
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? -1 : ms[ms.size() / 2];
}

// Sends `bytes` from cli to srv; returns the payload rate in Mbit/s seen by the receiver after the
// first quarter (slow start) has arrived.
inline double GoodputMbit(int cli, int srv, size_t bytes) {
  std::thread sender([&] {
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
