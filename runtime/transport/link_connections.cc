#include "transport/link_connections.h"

#include <algorithm>
#include <cmath>
#include <fstream>

namespace longhaul {
namespace {

// The third field of a tcp_rmem / tcp_wmem file: the most autotuning may grow a buffer to.
uint64_t ReadMax(const char* path) {
  std::ifstream f(path);
  uint64_t min = 0, initial = 0, max = 0;
  return f >> min >> initial >> max ? max : 0;
}

}  // namespace

SocketBufferLimits ReadSocketBufferLimits() {
  return {ReadMax("/proc/sys/net/ipv4/tcp_wmem"), ReadMax("/proc/sys/net/ipv4/tcp_rmem")};
}

double ConnectionWindowBytes(const SocketBufferLimits& sender, const SocketBufferLimits& receiver) {
  const uint64_t send = sender.send_max > 0 ? sender.send_max : kDefaultSendBufferMax;
  const uint64_t receive = receiver.receive_max > 0 ? receiver.receive_max : kDefaultReceiveBufferMax;
  return std::min(0.7 * static_cast<double>(send), 0.5 * static_cast<double>(receive));
}

int ConnectionsFor(double rate, double round_trip_s, double window_bytes) {
  const auto known = [](double x) { return x > 0 && std::isfinite(x); };
  if (!known(rate) || !known(round_trip_s) || !known(window_bytes)) return 1;  // as without a plan
  const double need = std::ceil(rate * round_trip_s / window_bytes);
  return static_cast<int>(std::clamp(need, 1.0, static_cast<double>(kMaxAutoConnections)));
}

void SetLinkConnections(const std::map<std::pair<int, int>, int>& connections, proto::Plan& plan) {
  plan.clear_link_connections();
  for (const auto& [pair, n] : connections) {
    if (n <= 1) continue;
    proto::LinkConnections* l = plan.add_link_connections();
    l->set_from_worker(pair.first);
    l->set_to_worker(pair.second);
    l->set_connections(n);
  }
}

std::map<std::pair<int, int>, int> LinkConnectionsOf(const proto::Plan& plan) {
  std::map<std::pair<int, int>, int> out;
  for (const proto::LinkConnections& l : plan.link_connections()) {
    out[{l.from_worker(), l.to_worker()}] = l.connections();
  }
  return out;
}

}  // namespace longhaul
