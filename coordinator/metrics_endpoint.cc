#include "coordinator/metrics_endpoint.h"

#include <sys/socket.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace longhaul {
namespace {

std::string Response(const std::string& status, const std::string& type, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address,
                                                                        std::function<std::string()> render) {
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint(std::move(render)));
  absl::StatusOr<int> fd = ListenTcp(address, &e->address_);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("the metrics endpoint (--metrics-listen): ", fd.status().message()));
  }
  e->listen_fd_ = *fd;
  e->thread_ = std::thread([p = e.get()] { p->Serve(); });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  stop_.Wake();
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsEndpoint::Serve() {
  for (;;) {
    const std::optional<int> fd = AcceptOrStop(listen_fd_, stop_);
    if (!fd) return;
    if (*fd < 0) continue;
    Answer(*fd);
    close(*fd);
  }
}

void MetricsEndpoint::Answer(int fd) {
  const Deadline deadline = std::chrono::steady_clock::now() + kMetricsRequestTimeout;
  std::string request;
  char buf[1024];
  // The request line and headers end at the first empty line; a scrape has no body.
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() >= kMaxMetricsRequestBytes || !WaitReadable(fd, deadline, stop_).ok()) return;
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return;
    request.append(buf, static_cast<size_t>(r));
  }
  std::string reply;
  const std::string line = request.substr(0, request.find("\r\n"));
  if (!absl::StartsWith(line, "GET ")) {
    reply = Response(absl::StrContains(line, " HTTP/") ? "405 Method Not Allowed" : "400 Bad Request", "text/plain",
                     "only GET /metrics is served here\n");
  } else if (const std::string path = line.substr(line.find(' ') + 1, line.rfind(' ') - line.find(' ') - 1);
             path != "/metrics" && !absl::StartsWith(path, "/metrics?")) {
    reply = Response("404 Not Found", "text/plain", "longhaul serves /metrics\n");
  } else {
    reply = Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
  }
  (void)WriteAll(fd, reply.data(), reply.size(), deadline, stop_);
}

}  // namespace longhaul
