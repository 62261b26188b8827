#include "util/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

namespace longhaul {

namespace {

// Binds a loopback TCP socket to `port` (0: the kernel's pick) and closes it; the port bound, or 0.
int TryBind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  int bound = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) bound = ntohs(a.sin_port);
  }
  close(fd);
  return bound;
}

}  // namespace

int FreeLoopbackPort() {
  // Below the ephemeral range: every outgoing connection takes its local port from that range,
  // and a job's workers open many, so a port picked there can be taken before (or between) the
  // binds it was picked for.
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  const int first = std::max(1024, low - 20000);
  if (low > first) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(first, low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (const int port = TryBind(pick(rng)); port > 0) return port;
    }
  }
  return TryBind(0);
}

}  // namespace longhaul
