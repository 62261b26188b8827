#pragma once
// Test helper: connects to a loopback port, writes bytes that are no protocol of ours, and reports whether
// the server closed the connection (read returns 0) within 10 s.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace longhaul::testing {

inline bool GarbageConnectionIsClosed(const std::string& address) {
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return close(fd), false;
  const std::string garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(4096, '\x17');
  if (write(fd, garbage.data(), garbage.size()) <= 0) return close(fd), false;
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  ssize_t r;
  while ((r = read(fd, buf, sizeof(buf))) > 0) {
  }
  close(fd);
  return r == 0;
}

}  // namespace longhaul::testing
