#pragma once
// Tier-3 link emulation: a userspace TCP proxy on libuv, for machines where this process may not
// create network namespaces. Each route listens on one address and forwards every connection to a
// target, delaying and rate-limiting both directions: a chunk read from one side goes through a
// serializer shared by all connections of the route (finishing at max(previous finish, arrival) +
// size/rate), then a delay line (released at finish + delay). Bytes held per direction are capped
// at rate x delay plus a queue; beyond that the proxy stops reading, so TCP's flow control pushes
// back on the sender.
//
// It splits each TCP connection in two, so the sender's window and slow start see the proxy, not
// the emulated link: never use it to validate transport tuning (it says so when it starts).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scenario/scenario.h"

namespace longhaul::netem {

struct ProxyRoute {
  std::string listen;  // host:port
  std::string target;  // host:port
  Link link;
};

// Routes file: one per line, "listen target delay_ms rate_mbit".
absl::Status WriteRoutesFile(const std::string& path, const std::vector<ProxyRoute>& routes);
absl::StatusOr<std::vector<ProxyRoute>> ReadRoutesFile(const std::string& path);

// Serves the routes until SIGTERM/SIGINT; prints "ready" once every listener is bound.
absl::Status RunProxy(const std::vector<ProxyRoute>& routes);

}  // namespace longhaul::netem
