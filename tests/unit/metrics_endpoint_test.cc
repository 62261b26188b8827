// The metrics endpoint over real sockets: a scrape gets the text, anything else a short answer or a
// closed connection, and a client that sends nothing holds it up for kMetricsRequestTimeout at most.
#include "coordinator/metrics_endpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <string>

#include "tests/support/http_get.h"
#include "tests/support/process_memory.h"

namespace longhaul {
namespace {

TEST(MetricsEndpoint, AScrapeGetsTheTextAndAnythingElseAShortAnswer) {
  std::atomic<int> renders{0};
  auto e = MetricsEndpoint::Start("127.0.0.1:0", [&] {
    ++renders;
    return std::string("# TYPE lh gauge\nlh 1\n");
  });
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string ok = testing::HttpExchange((*e)->address(), "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << ok;
  EXPECT_NE(ok.find("Content-Length: 21\r\n"), std::string::npos) << ok;
  EXPECT_EQ(ok.substr(ok.size() - 21), "# TYPE lh gauge\nlh 1\n");
  EXPECT_EQ(testing::HttpExchange((*e)->address(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(testing::HttpExchange((*e)->address(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(testing::HttpExchange((*e)->address(), std::string("\x16\x03\x01\x02\x00\r\n\r\n", 9)).rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(testing::HttpExchange((*e)->address(), std::string(9000, 'A')), "") << "an endless request is closed unanswered";
  // However much a client sends, the endpoint holds at most kMaxMetricsRequestBytes of it.
  const std::string flood(4 << 20, 'A');
  const int64_t rss = testing::ResidentBytes();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(testing::HttpExchange((*e)->address(), flood), "");
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "20 requests of 4 MiB: resident memory grew by " << grew / 1024 << " KiB\n";
  EXPECT_LT(grew, 16 << 20);
  EXPECT_EQ(renders.load(), 1);
}

TEST(MetricsEndpoint, ASilentClientHoldsItUpForTheRequestTimeoutAtMost) {
  auto e = MetricsEndpoint::Start("127.0.0.1:0", [] { return std::string("# TYPE lh gauge\nlh 1\n"); });
  ASSERT_TRUE(e.ok()) << e.status();
  const int silent = testing::ConnectLoopback((*e)->address());
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ok = testing::HttpExchange((*e)->address(), "GET /metrics HTTP/1.0\r\n\r\n");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(silent);
  std::cout << "a scrape behind a silent client waited " << waited << " s\n";
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK", 0), 0u) << ok;
}

TEST(MetricsEndpoint, AnAddressInUseIsNamed) {
  auto a = MetricsEndpoint::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(a.ok());
  auto b = MetricsEndpoint::Start((*a)->address(), [] { return std::string(); });
  EXPECT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--metrics-listen"), std::string::npos) << b.status();
}

}  // namespace
}  // namespace longhaul
