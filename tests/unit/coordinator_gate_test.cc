// The coordinator's gate and a client's forwarder over real sockets, in front of an echo server
// standing for gRPC: a forwarder with the job secret gets through both ways; one with another
// secret leaves the gate, naming it, and the echo server never hears of it; the handshake's bytes
// are those coordinator_gate.h lays out; HTTP/2 sent at the gate is closed unread; thousands of
// connections that never finish their handshake hold the gate to its bound, and the job's own
// client still gets through.
#include "transport/coordinator_gate.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/echo_server.h"
#include "tests/support/http2_flood.h"
#include "tests/support/loopback.h"
#include "tests/support/process_memory.h"

namespace longhaul {
namespace {

JobSecret NewSecret(const std::string& name) {
  const std::string p = ::testing::TempDir() + "/coordinator_gate_test_" + std::to_string(getpid()) + "_" + name;
  std::remove(p.c_str());
  EXPECT_TRUE(JobSecret::WriteNew(p).ok());
  return JobSecret::Load(p).value_or(JobSecret());
}

// A gate holding `secret` in front of an echo server on a private socket.
struct Gate {
  explicit Gate(const JobSecret& secret) {
    backend = *PrivateSocketPath::Make("echo.sock");
    echo = std::make_unique<testing::EchoServer>(backend->path());
    gate = *CoordinatorGate::Start("127.0.0.1:0", secret, backend->path());
  }
  std::unique_ptr<PrivateSocketPath> backend;
  std::unique_ptr<testing::EchoServer> echo;
  std::unique_ptr<CoordinatorGate> gate;
};

// A connection to a forwarder's target ("unix-abstract:NAME").
int ConnectForwarder(const GateForwarder& forwarder) {
  const std::string target = forwarder.target(), name = target.substr(target.find(':') + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) return close(fd), -1;
  return fd;
}

// Exactly n bytes, or fewer where the connection ended (or nothing came for 10 s).
std::string Receive(int fd, size_t n) {
  const timeval patience{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  std::string got(n, '\0');
  size_t have = 0;
  while (have < n) {
    const ssize_t r = recv(fd, got.data() + have, n - have, 0);
    if (r <= 0) break;
    have += static_cast<size_t>(r);
  }
  got.resize(have);
  return got;
}

// An echo through the forwarder of `message`: what came back.
std::string EchoThrough(const GateForwarder& forwarder, const std::string& message) {
  const int fd = ConnectForwarder(forwarder);
  if (fd < 0) return "no connection";
  std::thread writer([&] { testing::h2::SendAll(fd, message); });
  std::string back = Receive(fd, message.size());
  writer.join();
  close(fd);
  return back;
}

void WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 200 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

TEST(CoordinatorGate, AForwarderWithTheSecretGetsThroughBothWays) {
  const JobSecret secret = NewSecret("a");
  Gate g(secret);
  const std::unique_ptr<GateForwarder> f = *GateForwarder::Start(g.gate->address(), secret);
  std::string message(3 << 20, '\0');
  for (size_t i = 0; i < message.size(); ++i) message[i] = static_cast<char>(i * 7 + i / 11);
  EXPECT_TRUE(EchoThrough(*f, message) == message);
  EXPECT_EQ(f->refusal(), "");
  EXPECT_EQ(g.echo->accepted(), 1);
  EXPECT_EQ(g.gate->refused(), 0);
  // Without a secret on either side (the empty key), anyone passes, as before the gate.
  Gate open(JobSecret{});
  const std::unique_ptr<GateForwarder> anyone = *GateForwarder::Start(open.gate->address(), JobSecret());
  EXPECT_EQ(EchoThrough(*anyone, "hello"), "hello");
}

TEST(CoordinatorGate, AnotherSecretLeavesTheGateNamedAndNothingReachesTheServer) {
  const JobSecret secret = NewSecret("b"), other = NewSecret("c");
  Gate g(secret);
  for (const JobSecret& wrong : {other, JobSecret()}) {
    const std::unique_ptr<GateForwarder> f = *GateForwarder::Start(g.gate->address(), wrong);
    EXPECT_EQ(EchoThrough(*f, "hello"), "");
    EXPECT_NE(f->refusal().find("holds another job secret than this process's (" + wrong.source() + ")"),
              std::string::npos)
        << f->refusal();
  }
  WaitUntil([&] { return g.gate->refused() >= 2; });
  EXPECT_EQ(g.gate->refused(), 2);
  EXPECT_EQ(g.echo->accepted(), 0);
}

TEST(CoordinatorGate, TheHandshakeIsTheBytesTheHeaderLaysOut) {
  const JobSecret secret = NewSecret("d");
  Gate g(secret);
  const int fd = testing::ConnectLoopback(g.gate->address());
  const std::string client_nonce(kNonceBytes, 'n');
  // "LHC1", version 1 as a little-endian u32, the nonce; the first relayed bytes right behind.
  EXPECT_TRUE(testing::h2::SendAll(fd, std::string("LHC1\x01\x00\x00\x00", 8) + client_nonce));
  const std::string challenge = Receive(fd, kGateChallengeBytes);
  ASSERT_EQ(challenge.size(), kGateChallengeBytes);
  const std::string gate_nonce = challenge.substr(0, kNonceBytes);
  EXPECT_EQ(challenge.substr(kNonceBytes), GateProof(secret, client_nonce, gate_nonce));
  EXPECT_NE(GateProof(secret, client_nonce, gate_nonce), ClientProof(secret, client_nonce, gate_nonce));
  EXPECT_EQ(g.echo->accepted(), 0) << "nothing is relayed before the client's proof";
  EXPECT_TRUE(testing::h2::SendAll(fd, ClientProof(secret, client_nonce, gate_nonce) + "ping"));
  EXPECT_EQ(Receive(fd, 4), "ping");
  close(fd);
}

TEST(CoordinatorGate, Http2AtTheGateIsClosedUnread) {
  Gate g(NewSecret("e"));
  const int fd = testing::h2::Connect(g.gate->address());
  bool open = testing::h2::SendAll(fd, testing::h2::kPreface + testing::h2::Frame(testing::h2::kSettings, 0, 0, ""));
  int64_t sent = 0;
  const std::string headers =
      testing::h2::Frame(testing::h2::kHeaders, 0, 1, testing::h2::RequestHeaders("/x", 100, 100).substr(0, 16000));
  while (open && sent < (64 << 20)) {
    open = testing::h2::SendAll(fd, headers);
    sent += static_cast<int64_t>(headers.size());
  }
  close(fd);
  EXPECT_FALSE(open) << "the gate read " << sent << " bytes of HTTP/2";
  WaitUntil([&] { return g.gate->refused() >= 1; });
  EXPECT_EQ(g.gate->refused(), 1);
  EXPECT_EQ(g.echo->accepted(), 0);
}

TEST(CoordinatorGate, ConnectionsThatNeverFinishTheirHandshakeAreBoundedAndTheJobStillGetsThrough) {
  const JobSecret secret = NewSecret("f");
  Gate g(secret);
  const int64_t rss = testing::ResidentBytes();
  // Twice the bound, each with half a hello, from one address.
  std::vector<int> fds;
  for (int i = 0; i < 2 * kMaxGateHandshakes; ++i) {
    const int fd = testing::ConnectLoopback(g.gate->address());
    ASSERT_GE(fd, 0) << "connection " << i << ": " << strerror(errno);
    testing::h2::SendAll(fd, "LHC1");
    fds.push_back(fd);
  }
  WaitUntil([&] { return g.gate->handshaking() + g.gate->refused() >= 2 * kMaxGateHandshakes; });
  EXPECT_LE(g.gate->handshaking(), kMaxGateHandshakes);
  EXPECT_GE(g.gate->refused(), kMaxGateHandshakes);
  const std::unique_ptr<GateForwarder> f = *GateForwarder::Start(g.gate->address(), secret);
  EXPECT_EQ(EchoThrough(*f, "still here"), "still here");
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << 2 * kMaxGateHandshakes << " connections in their handshakes: " << g.gate->handshaking()
            << " held, " << g.gate->refused() << " closed; this process grew by " << grew / 1024 << " KiB\n";
  EXPECT_LT(grew, 16 << 20);
  for (int fd : fds) close(fd);
}

}  // namespace
}  // namespace longhaul
