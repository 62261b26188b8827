#pragma once
// Test helper: one HTTP exchange with a loopback server: sends `request` as it is and reads until
// the server closes.
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "tests/support/loopback.h"

namespace longhaul::testing {

inline std::string HttpExchange(const std::string& address, const std::string& request) {
  const int fd = ConnectLoopback(address);
  if (fd < 0) return "";
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  char buf[4096];
  ssize_t r;
  while ((r = recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, static_cast<size_t>(r));
  close(fd);
  return reply;
}

}  // namespace longhaul::testing
