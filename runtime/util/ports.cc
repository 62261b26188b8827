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

// A loopback TCP socket bound to `port` (0: the kernel's pick), with the port it holds; fd -1 and
// port 0 where the bind failed.
struct Held {
  int fd = -1;
  int port = 0;
};

Held TryBind(int port) {
  Held h;
  h.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (h.fd < 0) return {};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  if (bind(h.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(h.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(h.fd);
    return {};
  }
  h.port = ntohs(a.sin_port);
  return h;
}

}  // namespace

std::vector<int> FreeLoopbackPorts(int n) {
  // Below the ephemeral range: every outgoing connection takes its local port from that range,
  // and a job's workers open many, so a port picked there can be taken before (or between) the
  // binds it was picked for.
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  const int first = std::max(1024, low - 20000);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(first, std::max(first, low - 1));
  // Every port stays bound until all are picked, so no two picks are the same port.
  std::vector<Held> held;
  for (int i = 0; i < n; ++i) {
    Held h;
    for (int attempt = 0; attempt < 200 && h.port == 0 && low > first; ++attempt) h = TryBind(pick(rng));
    if (h.port == 0) h = TryBind(0);
    held.push_back(h);
  }
  std::vector<int> ports;
  for (const Held& h : held) {
    ports.push_back(h.port);
    if (h.fd >= 0) close(h.fd);
  }
  return ports;
}

int FreeLoopbackPort() { return FreeLoopbackPorts(1)[0]; }

}  // namespace longhaul
