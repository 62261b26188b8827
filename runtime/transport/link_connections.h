#pragma once
// How many TCP connections each link's tensors are split over. One connection has at most one
// window in flight per round trip, and the window is capped by the sender's send buffer (the
// maximum of the host's tcp_wmem, of which the kernel's own overhead leaves about 70% for data:
// 72-80% measured, netem_test) and by about half the receiver's receive buffer (tcp_rmem's
// maximum, the same overhead). A link whose rate × round trip is larger runs below its rate on
// one connection (measured on an emulated link: send buffer / round trip, netem_test) and needs
// ceil(rate × round trip / window) of them. The coordinator decides per link from the links it
// knows (a scenario or the link probes) and each host's buffer limits, which its worker reports
// at registration; the plan carries the result.
#include <cstdint>
#include <map>
#include <utility>

#include "longhaul.pb.h"

namespace longhaul {

inline constexpr int kMaxAutoConnections = 16;
// Linux's defaults, where a host's limits are unknown (a worker of another platform).
inline constexpr uint64_t kDefaultSendBufferMax = 4 << 20, kDefaultReceiveBufferMax = 6 << 20;

struct SocketBufferLimits {
  uint64_t send_max = 0, receive_max = 0;  // bytes; 0: unknown
};

// This host's (this network namespace's) limits from /proc/sys/net/ipv4/tcp_wmem and tcp_rmem.
SocketBufferLimits ReadSocketBufferLimits();

// The window one connection can keep in flight from a sender with `sender`'s limits to a
// receiver with `receiver`'s: the smaller of 70% of the send buffer and half the receive buffer.
double ConnectionWindowBytes(const SocketBufferLimits& sender, const SocketBufferLimits& receiver);

// Connections for a link of `rate` bytes/s and `round_trip_s`: 1 to kMaxAutoConnections.
int ConnectionsFor(double rate, double round_trip_s, double window_bytes);

// In a plan, the pairs (from worker, to worker) that use more than one connection.
void SetLinkConnections(const std::map<std::pair<int, int>, int>& connections, proto::Plan& plan);
std::map<std::pair<int, int>, int> LinkConnectionsOf(const proto::Plan& plan);

}  // namespace longhaul
