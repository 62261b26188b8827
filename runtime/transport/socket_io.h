#pragma once
// Blocking-with-deadline TCP helpers for the tensor data plane: every wait also watches a wake
// descriptor, so a cancelled send or a shutting-down server never sits in a system call.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <netinet/in.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul {

using Deadline = std::chrono::steady_clock::time_point;

// An eventfd that wakes every Wait* watching it, until Clear.
class WakeFd {
 public:
  WakeFd();
  ~WakeFd();
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;
  int fd() const { return fd_; }
  void Wake();
  void Clear();

 private:
  int fd_;
};

// "host:port" (IPv4 or a name that resolves to one) split and checked.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);
// The host of "host:port"; an address that is no host:port, whole. Workers whose tensor addresses
// share a host share a machine.
std::string HostOf(const std::string& address);
// The IPv4 address and port of "host:port", a name resolved (an empty host or "[::]": any).
absl::StatusOr<sockaddr_in> Resolve(const std::string& address);

// A listening socket on `address` (port 0: any free one); the bound "host:port" in `bound`.
absl::StatusOr<int> ListenTcp(const std::string& address, std::string* bound);

// A connected, non-blocking socket with TCP_NODELAY, or why not by `deadline`. A refused
// connection is retried every 100 ms (a peer still starting up is waited for); `wake` ends the
// wait early with Cancelled. `congestion_control` (empty: the system's) is chosen before the
// connection exists: switching later leaves the first algorithm's state behind (from BBR, pacing
// at a rate the new one never raises: a 64 KiB tensor then took 63 ms more at 135 ms one-way).
// Where the kernel refuses the name, `*warning` says so and the system's default is used.
absl::StatusOr<int> ConnectTcp(const std::string& address, Deadline deadline, const WakeFd& wake,
                               const std::string& congestion_control = "", std::string* warning = nullptr);

// What one connection attempt to "host:port" found by `deadline`: something listens there (the
// connection is closed at once), the host refused it (nothing listens: ECONNREFUSED), or neither
// could be told (no such host, unreachable, no answer in time).
enum class PortAnswer { kListening, kRefused, kNoAnswer };
PortAnswer ProbePort(const std::string& address, Deadline deadline);

// Writes or reads exactly n bytes on a non-blocking socket by `deadline`. Errors: DeadlineExceeded,
// Cancelled (woken), Unavailable (reset, or the peer closed: `closed` says which for reads).
absl::Status WriteAll(int fd, const void* data, size_t n, Deadline deadline, const WakeFd& wake);
absl::Status ReadAll(int fd, void* data, size_t n, Deadline deadline, const WakeFd& wake, bool* closed = nullptr);
// Waits until `fd` has bytes to read (or the peer closed): OK, DeadlineExceeded or Cancelled.
absl::Status WaitReadable(int fd, Deadline deadline, const WakeFd& wake);

// Waits for a connection on `listen_fd` and accepts it (non-blocking, close-on-exec): its socket,
// or -1 where accept failed (after a short pause, so a caller that loops does not spin); nullopt
// once `stop` is woken.
std::optional<int> AcceptOrStop(int listen_fd, const WakeFd& stop);

inline Deadline Forever() { return Deadline::max(); }

// Milliseconds poll may sleep before `deadline` (-1: no deadline), rounded up so a wait never
// returns just before its deadline and spins, and within an int.
int PollTimeoutMs(Deadline deadline);

}  // namespace longhaul
