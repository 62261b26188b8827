#pragma once
// Sockets inside a named network namespace (/run/netns/NAME), created from any thread of this
// process: the calling thread enters the namespace, makes the socket and returns. A socket keeps
// the namespace it was made in, so the rest of the program can use it as any other.
#include <string>

#include "absl/status/statusor.h"

namespace longhaul::netem {

absl::StatusOr<int> SocketIn(const std::string& netns, int domain, int type);

// Whether this process may create network namespaces (root, and a kernel that allows it).
bool CanCreateNamespaces(std::string* why);

}  // namespace longhaul::netem
