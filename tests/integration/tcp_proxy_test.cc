// The userspace proxy (tier 3), as a real process on loopback: both directions delayed, one rate
// per direction, and the warning that it splits TCP. Needs no root.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "tests/support/tcp_measure.h"

namespace {

using longhaul::testing::MeasureRoundTrips;
using longhaul::testing::RoundTrips;

using Clock = std::chrono::steady_clock;

int ListenOnLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  listen(fd, 4);
  *port = ntohs(a.sin_port);
  return fd;
}

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < 100; ++i) {  // the proxy may still be starting
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

class ProxyTest : public ::testing::Test {
 protected:
  void Start(double delay_ms, double rate_mbit) {
    server_ = ListenOnLoopback(&target_port_);
    int probe;
    close(ListenOnLoopback(&probe));
    proxy_port_ = probe;
    log_ = ::testing::TempDir() + "/proxy_" + std::to_string(getpid()) + ".log";
    pid_ = fork();
    if (pid_ == 0) {
      if (freopen(log_.c_str(), "w", stderr) == nullptr) _exit(127);
      execl(LONGHAUL_BINARY, LONGHAUL_BINARY, "netem", "proxy", "--listen",
            ("127.0.0.1:" + std::to_string(proxy_port_)).c_str(), "--to",
            ("127.0.0.1:" + std::to_string(target_port_)).c_str(), "--delay-ms", std::to_string(delay_ms).c_str(),
            "--rate-mbit", std::to_string(rate_mbit).c_str(), nullptr);
      _exit(127);
    }
    client_ = ConnectLoopback(proxy_port_);
    ASSERT_GE(client_, 0);
    accepted_ = accept(server_, nullptr, nullptr);
    int one = 1;
    setsockopt(accepted_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  void TearDown() override {
    if (pid_ > 0) kill(pid_, SIGTERM), waitpid(pid_, nullptr, 0);
    for (int fd : {client_, accepted_, server_})
      if (fd >= 0) close(fd);
  }
  int server_ = -1, client_ = -1, accepted_ = -1, target_port_ = 0, proxy_port_ = 0;
  pid_t pid_ = -1;
  std::string log_;
};

// A routes file line the proxy cannot follow is refused, naming it: skipped, it would leave a pair
// of workers unshaped.
TEST(ProxyRoutes, ALineItCannotFollowIsRefusedNamingIt) {
  const std::string routes = ::testing::TempDir() + "/routes_" + std::to_string(getpid()),
                    log = ::testing::TempDir() + "/routes_" + std::to_string(getpid()) + ".log";
  for (const char* bad : {"127.0.0.1:1 127.0.0.1:2 5", "127.0.0.1:1 127.0.0.1:2 -1 100",
                          "127.0.0.1:1 127.0.0.1:2 5 100 more", "127.0.0.1:1 127.0.0.1:2 1e300 100"}) {
    std::ofstream(routes) << "127.0.0.1:3 127.0.0.1:4 1 10\n" << bad << "\n";
    const int status =
        std::system((std::string(LONGHAUL_BINARY) + " netem proxy --routes " + routes + " > " + log + " 2>&1").c_str());
    std::ifstream in(log);
    const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(status, 0) << bad;
    EXPECT_NE(said.find("line 2 is not 'LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS RATE_MBIT'"), std::string::npos)
        << said;
  }
}

// What the proxy adds per direction: half the difference between the median round trip through it
// and the median round trip of a direct loopback connection, both timed by the kernel's socket
// timestamps (MeasureRoundTrips), so the endpoints' wake-ups do not count, and the proxy's own do.
// It must be within 0.1 ms + 0.5% of the set 5 ms.
TEST_F(ProxyTest, DelaysBothDirectionsAndSaysItSplitsTcp) {
  int port;
  const int listener = ListenOnLoopback(&port);
  const int direct_client = ConnectLoopback(port);
  const int direct_server = accept(listener, nullptr, nullptr);
  const RoundTrips direct = MeasureRoundTrips(direct_client, direct_server, 100);
  for (int fd : {listener, direct_client, direct_server}) close(fd);
  ASSERT_GT(direct.network_ms, 0) << "no kernel timestamps on these sockets";
  Start(5, 1000);
  const RoundTrips rt = MeasureRoundTrips(client_, accepted_, 40);
  const double added = (rt.network_ms - direct.network_ms) / 2;
  std::cout << absl::StrFormat(
      "direct loopback: median round trip %.4f ms in user space, %.4f ms by kernel stamps\n"
      "proxy at 5 ms one-way: median round trip %.4f ms in user space, %.4f ms by kernel stamps; added per "
      "direction %.4f ms (%+.1f us; bound 125 us)\n",
      direct.user_ms, direct.network_ms, rt.user_ms, rt.network_ms, added, 1000 * (added - 5));
  EXPECT_NEAR(added, 5, 0.1 + 0.005 * 5);
  std::ifstream f(log_);
  std::string log((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("splits TCP"), std::string::npos) << log;
}

// The delay counts from the data's arrival at the proxy (the kernel's receive timestamp), not from
// when the proxy gets round to reading it: here the proxy is stopped for 3 ms after each send.
TEST_F(ProxyTest, DelayCountsFromArrivalNotFromTheRead) {
  Start(5, 1000);
  const double ms = longhaul::testing::MeasureOneWayMs(client_, accepted_, 10, [&] {
    kill(pid_, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    kill(pid_, SIGCONT);
  });
  std::cout << absl::StrFormat("proxy at 5 ms one-way, stopped 3 ms after each send: median one-way %.4f ms\n", ms);
  EXPECT_NEAR(ms, 5, 0.1 + 0.005 * 5);
}

TEST_F(ProxyTest, BulkFlowGetsTheRate) {
  Start(2, 200);
  const double mbit = longhaul::testing::GoodputMbit(client_, accepted_, 200e6 / 8 * 1.5);  // 1.5 s at the rate
  std::cout << "proxy at 200 Mbit/s: " << mbit << " Mbit/s of payload\n";
  // The proxy meters payload bytes, so the payload gets the whole rate.
  EXPECT_GT(mbit, 0.93 * 200);
  EXPECT_LT(mbit, 1.03 * 200);
}

// An endpoint killed mid-stream (its socket reset while the proxy still writes to it) costs that
// connection only: the proxy lives on and carries the next one.
TEST_F(ProxyTest, AnEndpointThatDiesMidStreamDoesNotTakeTheProxyDown) {
  Start(1, 1000);
  const linger reset{1, 0};
  setsockopt(accepted_, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  close(accepted_);
  accepted_ = -1;
  const std::vector<char> chunk(1 << 16, 'x');
  for (int i = 0; i < 64; ++i) {
    if (send(client_, chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) break;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(waitpid(pid_, nullptr, WNOHANG), 0) << "the proxy died with the endpoint";
  const int next = ConnectLoopback(proxy_port_);
  ASSERT_GE(next, 0);
  const int served = accept(server_, nullptr, nullptr);
  ASSERT_GE(served, 0);
  ASSERT_EQ(send(next, "ping", 4, MSG_NOSIGNAL), 4);
  char got[4] = {};
  ASSERT_EQ(recv(served, got, 4, MSG_WAITALL), 4);
  EXPECT_EQ(std::string(got, 4), "ping");
  close(next);
  close(served);
}

}  // namespace
