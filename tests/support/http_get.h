#pragma once
// Test helper: one HTTP exchange with a loopback server: sends `request` as it is and reads until
// the server closes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace longhaul::testing {

// A connected socket to loopback `address` ("host:port"), or -1.
inline int ConnectLoopback(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

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
