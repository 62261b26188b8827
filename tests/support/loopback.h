#pragma once
// Test helper: a plain TCP connection to a loopback port, as a peer that speaks whatever a test
// writes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace longhaul::testing {

// A connected socket to loopback `address` ("host:port"), or -1; with `from`, from that loopback
// address (127.0.0.0/8), as another host would connect.
inline int ConnectLoopback(const std::string& address, const char* from = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (from != nullptr) {
    sockaddr_in source{};
    source.sin_family = AF_INET;
    inet_pton(AF_INET, from, &source.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)) != 0) {
      close(fd);
      return -1;
    }
  }
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

}  // namespace longhaul::testing
