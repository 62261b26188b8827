#include "netem/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace longhaul::netem {

absl::StatusOr<int> SocketIn(const std::string& netns, int domain, int type) {
  const int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  const int target = open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
  if (self < 0 || target < 0) {
    if (self >= 0) close(self);
    if (target >= 0) close(target);
    return absl::NotFoundError(absl::StrCat("no network namespace ", netns));
  }
  if (setns(target, CLONE_NEWNET) != 0) {
    const int err = errno;
    close(self), close(target);
    return absl::PermissionDeniedError(absl::StrCat("cannot enter namespace ", netns, ": ", std::strerror(err)));
  }
  const int fd = socket(domain, type | SOCK_CLOEXEC, 0);
  const int err = errno;
  setns(self, CLONE_NEWNET);
  close(self), close(target);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket in ", netns, ": ", std::strerror(err)));
  return fd;
}

bool CanCreateNamespaces(std::string* why) {
  if (geteuid() != 0) {
    *why = "needs root to create network namespaces";
    return false;
  }
  const std::string probe = "lhprobe" + std::to_string(getpid());
  if (std::system(("ip netns add " + probe + " >/dev/null 2>&1").c_str()) != 0) {
    *why = "`ip netns add` is not allowed here (no CAP_SYS_ADMIN, or no iproute2)";
    return false;
  }
  std::system(("ip netns del " + probe + " >/dev/null 2>&1").c_str());
  return true;
}

}  // namespace longhaul::netem
