#pragma once
// Test helper: a server on a Unix socket that writes back whatever each connection sends, until
// that connection closes its sending side, then closes its own; or, paused, accepts and reads
// nothing. It counts the connections it accepted.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <list>
#include <string>
#include <thread>

#include "transport/relay_loop.h"

namespace longhaul::testing {

class EchoServer {
 public:
  // Listens at `path`; with `reading` false, holds its connections without reading them.
  explicit EchoServer(const std::string& path, bool reading = true) : reading_(reading) {
    listen_fd_ = ListenUnix(path).value_or(-1);
    acceptor_ = std::thread([this] {
      while (!stop_) {
        pollfd p{listen_fd_, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        ++accepted_;
        connections_.emplace_back([this, fd] { Echo(fd); });
      }
    });
  }
  ~EchoServer() {
    stop_ = true;
    acceptor_.join();
    for (std::thread& t : connections_) t.join();
    close(listen_fd_);
  }
  int accepted() const { return accepted_.load(); }

 private:
  void Echo(int fd) {
    char buf[16384];
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (!reading_ || poll(&p, 1, 50) <= 0) {
        if (!reading_) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      const ssize_t r = recv(fd, buf, sizeof(buf), 0);
      if (r <= 0) break;
      for (ssize_t done = 0; done < r;) {
        const ssize_t w = send(fd, buf + done, static_cast<size_t>(r - done), MSG_NOSIGNAL);
        if (w <= 0) break;
        done += w;
      }
    }
    close(fd);
  }

  const bool reading_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::list<std::thread> connections_;  // the acceptor's alone until it is joined
};

}  // namespace longhaul::testing
