// The relay loop over real sockets, with a handshake of its own ("OPEN" answered "OK"): nothing
// passes before the handshake and everything after, both ways, with half-closes; a failed or
// silent handshake never reaches the other side; the caps on pending and relayed connections hold;
// a side that stops reading stops the other (back-pressure, the buffers fixed); and the handshake
// may run on the dialed side, as a client's forwarder runs it, for connections of this process
// alone; a private socket path is its owner's alone, and one a killed process left is removed.
#include "transport/relay_loop.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "tests/support/echo_server.h"
#include "tests/support/loopback.h"
#include "tests/support/process_memory.h"

namespace longhaul {
namespace {

// Reads "OPEN" and answers "OK" (the accepting side), or says "OPEN" and reads "OK" (the dialing
// side).
class OpenHandshake : public RelayHandshake {
 public:
  explicit OpenHandshake(bool accepting) : accepting_(accepting) {}
  absl::StatusOr<Step> Next(absl::string_view read) override {
    switch (step_++) {
      case 0:
        return accepting_ ? Step{"", 4} : Step{"OPEN", 2};
      default:
        if (read != (accepting_ ? "OPEN" : "OK")) return absl::PermissionDeniedError("wrong word");
        return Step{accepting_ ? "OK" : "", 0, true};
    }
  }

 private:
  const bool accepting_;
  int step_ = 0;
};

RelayOptions Options(const std::string& dial, bool handshake_on_accepted = true) {
  RelayOptions o;
  o.dial = dial;
  o.handshake_on_accepted = handshake_on_accepted;
  o.handshake = [handshake_on_accepted] { return std::make_unique<OpenHandshake>(handshake_on_accepted); };
  return o;
}

// A relay on a loopback TCP port in front of an echo server on a private Unix socket.
struct Relay {
  explicit Relay(const std::function<void(RelayOptions&)>& tune = {}, bool echo_reads = true) {
    backend = *PrivateSocketPath::Make("echo.sock");
    echo = std::make_unique<testing::EchoServer>(backend->path(), echo_reads);
    const int fd = *ListenTcp("127.0.0.1:0", &address);
    RelayOptions o = Options("unix:" + backend->path());
    if (tune) tune(o);
    loop = *RelayLoop::Start(fd, std::move(o));
  }
  std::unique_ptr<PrivateSocketPath> backend;
  std::unique_ptr<testing::EchoServer> echo;
  std::string address;
  std::unique_ptr<RelayLoop> loop;
};

void Send(int fd, const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t w = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    ASSERT_GT(w, 0) << strerror(errno);
    done += static_cast<size_t>(w);
  }
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

// Whether the other side closed `fd` within `wait` (reading what is left).
bool ClosedWithin(int fd, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    const ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN)) return true;
  }
  return false;
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + i / 7);
  return s;
}

TEST(RelayLoop, NothingPassesBeforeTheHandshakeAndEverythingAfterBothWays) {
  Relay r;
  const int fd = testing::ConnectLoopback(r.address);
  ASSERT_GE(fd, 0);
  // The handshake's word and the first bytes to relay in one write: the handshake reads its four.
  Send(fd, "OPENhello");
  EXPECT_EQ(Receive(fd, 7), "OKhello");
  const std::string big = Pattern(8 << 20);
  std::thread writer([&] { Send(fd, big); });
  EXPECT_TRUE(Receive(fd, big.size()) == big);
  writer.join();
  EXPECT_EQ(r.loop->relayed(), 1);
  EXPECT_EQ(r.loop->pending(), 0);
  // This side's end reaches the echo server, whose own end comes back.
  shutdown(fd, SHUT_WR);
  EXPECT_TRUE(ClosedWithin(fd, std::chrono::seconds(5)));
  close(fd);
  for (int i = 0; i < 100 && r.loop->relayed() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(r.loop->relayed(), 0);
  EXPECT_EQ(r.loop->turned_away(), 0);
}

TEST(RelayLoop, AFailedHandshakeNeverReachesTheOtherSide) {
  Relay r;
  const int fd = testing::ConnectLoopback(r.address);
  Send(fd, "NOPE" + std::string(100000, 'x'));
  EXPECT_TRUE(ClosedWithin(fd, std::chrono::seconds(5)));
  close(fd);
  EXPECT_EQ(r.echo->accepted(), 0);
  EXPECT_EQ(r.loop->turned_away(), 1);
}

TEST(RelayLoop, ASilentConnectionIsClosedAtTheHandshakeTimeout) {
  Relay r([](RelayOptions& o) { o.handshake_timeout = std::chrono::milliseconds(300); });
  const int fd = testing::ConnectLoopback(r.address);
  Send(fd, "OP");  // half a handshake, then silence
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(ClosedWithin(fd, std::chrono::seconds(5)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  EXPECT_GE(took, 0.2);
  EXPECT_EQ(r.loop->turned_away(), 1);
  EXPECT_EQ(r.echo->accepted(), 0);
}

TEST(RelayLoop, TheOldestPendingConnectionGivesWayToANewerOne) {
  Relay r([](RelayOptions& o) { o.max_pending = 3; });
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    fds.push_back(testing::ConnectLoopback(r.address));
    // Accepted in order: each before the next connects.
    for (int j = 0; j < 100 && r.loop->pending() + r.loop->turned_away() < i + 1; ++j)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(ClosedWithin(fds[0], std::chrono::seconds(2)));
  EXPECT_FALSE(ClosedWithin(fds[1], std::chrono::milliseconds(100)));
  EXPECT_EQ(r.loop->pending(), 3);
  // The newest still gets through.
  Send(fds[3], "OPENabc");
  EXPECT_EQ(Receive(fds[3], 5), "OKabc");
  for (int fd : fds) close(fd);
}

TEST(RelayLoop, AConnectionBeyondTheRelayedCapIsClosed) {
  Relay r([](RelayOptions& o) { o.max_relayed = 1; });
  const int first = testing::ConnectLoopback(r.address), second = testing::ConnectLoopback(r.address);
  Send(first, "OPENa");
  EXPECT_EQ(Receive(first, 3), "OKa");
  Send(second, "OPENb");
  EXPECT_TRUE(ClosedWithin(second, std::chrono::seconds(5)));
  EXPECT_EQ(r.echo->accepted(), 1);
  close(first);
  close(second);
}

TEST(RelayLoop, ASideThatStopsReadingStopsTheOtherAndTheBuffersStayTheirSize) {
  Relay r({}, /*echo_reads=*/false);
  const int fd = testing::ConnectLoopback(r.address);
  Send(fd, "OPEN");
  EXPECT_EQ(Receive(fd, 2), "OK");
  // Writes until the socket has taken nothing for half a second: what the kernel's buffers on the
  // way and the relay's one buffer hold, never what was offered.
  const int64_t rss = testing::ResidentBytes();
  const std::string chunk(1 << 20, 'x');
  int64_t sent = 0;
  auto last = std::chrono::steady_clock::now();
  while (sent < (256 << 20) && std::chrono::steady_clock::now() - last < std::chrono::milliseconds(500)) {
    const ssize_t w = send(fd, chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      sent += w;
      last = std::chrono::steady_clock::now();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "a relay to a side that reads nothing took " << sent / 1024 << " KiB; this process grew by "
            << grew / 1024 << " KiB\n";
  EXPECT_LT(sent, 64 << 20);
  EXPECT_LT(grew, 8 << 20);
  close(fd);
}

// A connection to the abstract Unix socket "@name".
int ConnectAbstract(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) return close(fd), -1;
  return fd;
}

TEST(RelayLoop, TheHandshakeMayRunOnTheDialedSideForThisProcessAlone) {
  // A client's forwarder (on an abstract Unix socket, the handshake on what it dials) in front of
  // the relay above: bytes written before its handshake ended wait in the kernel and go through
  // after.
  Relay gate;
  const std::string name = "longhaul-relay-test-" + std::to_string(getpid());
  RelayOptions o = Options(gate.address, false);
  o.this_process_only = true;
  std::unique_ptr<RelayLoop> forwarder = *RelayLoop::Start(*ListenUnix("@" + name), std::move(o));
  const int fd = ConnectAbstract(name);
  ASSERT_GE(fd, 0) << strerror(errno);
  const std::string bytes = Pattern(1 << 20);
  std::thread writer([&] { Send(fd, bytes); });
  EXPECT_TRUE(Receive(fd, bytes.size()) == bytes);
  writer.join();
  EXPECT_EQ(forwarder->relayed(), 1);
  EXPECT_EQ(gate.loop->relayed(), 1);
  close(fd);
  // Another process is closed before anything is dialed for it.
  const pid_t child = fork();
  if (child == 0) {
    const int other = ConnectAbstract(name);
    const timeval patience{5, 0};
    setsockopt(other, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
    char b;
    _exit(other >= 0 && recv(other, &b, 1, 0) == 0 ? 0 : 1);
  }
  int status = -1;
  waitpid(child, &status, 0);
  EXPECT_EQ(status, 0) << "the other process's connection was not closed";
  EXPECT_EQ(forwarder->turned_away(), 1);
  EXPECT_EQ(gate.echo->accepted(), 1);
}

TEST(RelayLoop, APrivateSocketPathIsItsOwnersAloneAndGoesWithIt) {
  std::string dir;
  {
    const std::unique_ptr<PrivateSocketPath> p = *PrivateSocketPath::Make("x.sock");
    dir = p->dir();
    struct stat st;
    ASSERT_EQ(stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700);
    EXPECT_EQ(p->path(), dir + "/x.sock");
    const int fd = *ListenUnix(p->path());
    close(fd);
  }
  struct stat st;
  EXPECT_NE(stat(dir.c_str(), &st), 0) << dir << " is still there";
}

// A directory of a process that was killed: its socket, bound `age_s` ago, listening or not.
std::string LeftBehind(const std::string& name, int age_s, bool listening) {
  std::string dir = (std::filesystem::temp_directory_path() / "longhaul-socket-XXXXXX").string();
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/" + name;
  const int fd = *ListenUnix(path);
  if (!listening) close(fd);
  const timespec when[2] = {{time(nullptr) - age_s, 0}, {time(nullptr) - age_s, 0}};
  EXPECT_EQ(utimensat(AT_FDCWD, path.c_str(), when, AT_SYMLINK_NOFOLLOW), 0) << strerror(errno);
  return dir;
}

TEST(RelayLoop, AKilledProcesssPrivateSocketPathIsRemovedByTheNext) {
  const std::string name = "left_" + std::to_string(getpid()) + ".sock";
  const std::string dead = LeftBehind(name, 120, false), young = LeftBehind(name, 0, false),
                    alive = LeftBehind(name, 120, true);
  const std::unique_ptr<PrivateSocketPath> p = *PrivateSocketPath::Make(name);
  struct stat st;
  EXPECT_NE(stat(dead.c_str(), &st), 0) << dead << " is still there";
  EXPECT_EQ(stat(young.c_str(), &st), 0) << "a socket bound a moment ago may not listen yet";
  EXPECT_EQ(stat(alive.c_str(), &st), 0) << "a socket something listens on is in use";
  std::filesystem::remove_all(young);
  std::filesystem::remove_all(alive);
}

}  // namespace
}  // namespace longhaul
