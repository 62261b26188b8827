#include "transport/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {

int PollTimeoutMs(Deadline deadline) {
  if (deadline == Forever()) return -1;
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  return static_cast<int>(
      std::min<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), std::numeric_limits<int>::max()));
}

namespace {

// Waits for `events` on fd: OK, DeadlineExceeded or Cancelled.
absl::Status WaitFor(int fd, short events, Deadline deadline, const WakeFd& wake) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {wake.fd(), POLLIN, 0}};
    const int r = poll(p, 2, PollTimeoutMs(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    if (p[1].revents != 0) return absl::CancelledError("woken");
    if (p[0].revents != 0) return absl::OkStatus();
    if (std::chrono::steady_clock::now() >= deadline) return absl::DeadlineExceededError("deadline passed");
  }
}

}  // namespace

absl::StatusOr<sockaddr_in> Resolve(const std::string& address) {
  auto hp = SplitHostPort(address);
  if (!hp.ok()) return hp.status();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(hp->second));
  const std::string host = hp->first.empty() || hp->first == "[::]" ? "0.0.0.0" : hp->first;
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve host '", host, "' of ", address));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return addr;
}

WakeFd::WakeFd() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
WakeFd::~WakeFd() { close(fd_); }

void WakeFd::Wake() {
  const uint64_t one = 1;
  (void)!write(fd_, &one, sizeof(one));
}

void WakeFd::Clear() {
  uint64_t v;
  (void)!read(fd_, &v, sizeof(v));
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
  }
  return std::make_pair(address.substr(0, colon), port);
}

std::string HostOf(const std::string& address) {
  const absl::StatusOr<std::pair<std::string, int>> hp = SplitHostPort(address);
  return hp.ok() ? hp->first : address;
}

absl::StatusOr<int> ListenTcp(const std::string& address, std::string* bound) {
  auto addr = Resolve(address);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("no socket to listen on: ", strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0 || listen(fd, 128) != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", why, " (in use, or not an address of this host?)"));
  }
  socklen_t len = sizeof(*addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&*addr), &len);
  *bound = address.substr(0, address.rfind(':')) + ":" + std::to_string(ntohs(addr->sin_port));
  return fd;
}

namespace {

// One connection attempt by `deadline`: the connected socket, or Unavailable with the reason
// (`*refused`: the host refused it), DeadlineExceeded, Cancelled (woken) or ResourceExhausted.
absl::StatusOr<int> ConnectOnce(const sockaddr_in& addr, Deadline deadline, const WakeFd& wake,
                                const std::string& congestion_control, std::string* warning, bool* refused) {
  *refused = false;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("no socket to connect with: ", strerror(errno)));
  if (!congestion_control.empty() &&
      setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion_control.data(), congestion_control.size()) != 0 &&
      warning != nullptr) {
    *warning = absl::StrFormat(
        "TCP congestion control '%s' is not available to this process (%s), so tensor connections use the system's "
        "default; load it or list it in net.ipv4.tcp_allowed_congestion_control, or set "
        "transport.congestion_control = \"\"",
        congestion_control, strerror(errno));
  }
  int r = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  if (r != 0 && errno == EINPROGRESS) {
    if (absl::Status s = WaitFor(fd, POLLOUT, deadline, wake); !s.ok()) {
      close(fd);
      return s;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    r = err == 0 ? 0 : -1;
    errno = err;
  }
  if (r == 0) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
  }
  *refused = errno == ECONNREFUSED;
  const std::string why = strerror(errno);
  close(fd);
  return absl::UnavailableError(why);
}

}  // namespace

absl::StatusOr<int> ConnectTcp(const std::string& address, Deadline deadline, const WakeFd& wake,
                               const std::string& congestion_control, std::string* warning) {
  auto addr = Resolve(address);
  if (!addr.ok()) return addr.status();
  std::string last = "no attempt";
  for (;;) {
    bool refused = false;
    absl::StatusOr<int> fd = ConnectOnce(*addr, deadline, wake, congestion_control, warning, &refused);
    if (fd.ok()) return fd;
    if (absl::IsDeadlineExceeded(fd.status())) break;
    if (!absl::IsUnavailable(fd.status())) return fd.status();
    last = std::string(fd.status().message());
    // Refused or unreachable: the peer may still be starting. Try again shortly.
    const Deadline retry = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
    pollfd p = {wake.fd(), POLLIN, 0};
    if (poll(&p, 1, PollTimeoutMs(retry)) > 0) return absl::CancelledError("woken");
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  return absl::DeadlineExceededError(absl::StrCat("no connection to ", address, " (last attempt: ", last, ")"));
}

PortAnswer ProbePort(const std::string& address, Deadline deadline) {
  const absl::StatusOr<sockaddr_in> addr = Resolve(address);
  if (!addr.ok()) return PortAnswer::kNoAnswer;
  const WakeFd never;
  bool refused = false;
  const absl::StatusOr<int> fd = ConnectOnce(*addr, deadline, never, "", nullptr, &refused);
  if (fd.ok()) {
    close(*fd);
    return PortAnswer::kListening;
  }
  return refused ? PortAnswer::kRefused : PortAnswer::kNoAnswer;
}

absl::Status WriteAll(int fd, const void* data, size_t n, Deadline deadline, const WakeFd& wake) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitFor(fd, POLLOUT, deadline, wake); !s.ok()) return s;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("connection broken while sending: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t n, Deadline deadline, const WakeFd& wake, bool* closed) {
  char* p = static_cast<char*>(data);
  if (closed != nullptr) *closed = false;
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      if (closed != nullptr) *closed = true;
      return absl::UnavailableError("the peer closed the connection");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitFor(fd, POLLIN, deadline, wake); !s.ok()) return s;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("connection broken while receiving: ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WaitReadable(int fd, Deadline deadline, const WakeFd& wake) { return WaitFor(fd, POLLIN, deadline, wake); }

std::optional<int> AcceptOrStop(int listen_fd, const WakeFd& stop) {
  for (;;) {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop.fd(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) return std::nullopt;
    if (p[1].revents != 0) return std::nullopt;
    if (p[0].revents == 0) continue;
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    // Out of descriptors, say: the port stays readable, so wait a little rather than spin.
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return fd;
  }
}

}  // namespace longhaul
