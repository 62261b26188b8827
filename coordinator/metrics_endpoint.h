#pragma once
// An HTTP endpoint a Prometheus server scrapes: GET /metrics answers with what `render` returns
// (Prometheus's text format, job_metrics.h); anything else gets 404, 405 or 400 and the
// connection closes. It is read-only and holds no secret, so it is not authenticated: bind it to
// loopback or a monitoring network (--metrics-listen). One thread serves one request at a time; a
// request must arrive whole within kMetricsRequestTimeout and within kMaxMetricsRequestBytes.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "transport/socket_io.h"

namespace longhaul {

inline constexpr size_t kMaxMetricsRequestBytes = 8192;
inline constexpr auto kMetricsRequestTimeout = std::chrono::seconds(2);

class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address,
                                                                std::function<std::string()> render);
  ~MetricsEndpoint();
  const std::string& address() const { return address_; }  // host:port bound

 private:
  explicit MetricsEndpoint(std::function<std::string()> render) : render_(std::move(render)) {}
  void Serve();
  void Answer(int fd);

  std::function<std::string()> render_;
  std::string address_;
  int listen_fd_ = -1;
  WakeFd stop_;
  std::thread thread_;
};

}  // namespace longhaul
