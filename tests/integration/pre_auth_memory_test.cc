// What a stranger without the job secret can make a live coordinator hold: a `longhaul coordinator`
// waiting for its workers, attacked on its port with HTTP/2 written by hand (http2_flood.h) and on
// its metrics endpoint. Its resident memory is measured before, at the peak while under attack
// (sampled throughout), and after; the peak stays within kPeakBound of before, what is left within
// kAfterBound, and a holder of the secret still gets its calls through.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "longhaul.grpc.pb.h"
#include "tests/support/http2_flood.h"
#include "tests/support/http_get.h"
#include "tests/support/process_memory.h"
#include "tests/support/processes.h"
#include "tests/support/tiny_model.h"
#include "transport/rpc_auth.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kPeakBound = 64 * kMiB, kAfterBound = 16 * kMiB;

// A coordinator of a two-stage job that no worker joins: it listens and waits.
class LiveCoordinator {
 public:
  explicit LiveCoordinator(const std::string& name) {
    dir_ = fs::path(::testing::TempDir()) / ("pre_auth_" + std::to_string(getpid())) / name;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "job.toml") << testing::kTinyModelToml
                                     << "[train]\nseq_len = 16\n[cluster]\njob_id = \"flooded\"\nstages = 2\n";
    const std::string secret = (dir_ / "job.secret").string();
    EXPECT_TRUE(JobSecret::WriteNew(secret).ok());
    secret_ = JobSecret::Load(secret).value_or(JobSecret());
    pid_ = testing::Spawn({LONGHAUL_BINARY, "coordinator", "-c", (dir_ / "job.toml").string(), "--set",
                           "train.out_dir=" + dir_.string(), "--listen", "127.0.0.1:0", "--port-file",
                           (dir_ / "port").string(), "--secret-file", secret, "--metrics-listen", "127.0.0.1:0"},
                          dir_ / "log.txt");
    int port = 0;
    for (int i = 0; i < 200 && !(std::ifstream(dir_ / "port") >> port); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    address_ = "127.0.0.1:" + std::to_string(port);
    for (int i = 0; i < 200 && !(std::ifstream(dir_ / ".metrics_address") >> metrics_address_); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~LiveCoordinator() {
    if (pid_ > 0) kill(pid_, SIGKILL), waitpid(pid_, nullptr, 0);
  }
  bool up() const { return pid_ > 0 && address_ != "127.0.0.1:0" && !metrics_address_.empty(); }
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  std::string log() const {
    std::ifstream f(dir_ / "log.txt");
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // A signed call of a holder of the secret: NOT_FOUND (no such worker) once past every check.
  grpc::Status SignedHeartbeat() const {
    auto channel = CoordinatorChannel(address_, secret_, TlsFiles(), grpc::ChannelArguments());
    if (!channel.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, std::string(channel.status().message()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::HeartbeatRequest req;
    req.set_worker_id(77);
    proto::HeartbeatReply reply;
    return proto::Coordinator::NewStub(*channel)->Heartbeat(&ctx, req, &reply);
  }

 private:
  fs::path dir_;
  JobSecret secret_;
  pid_t pid_ = -1;
  std::string address_, metrics_address_;
};

struct Figures {
  int64_t before = 0, peak = 0, after = 0;
};

// Resident memory of `pid` before `attack`, at its peak while it runs (sampled every few ms), and
// once it has settled after.
Figures Measure(pid_t pid, const std::function<void()>& attack) {
  std::this_thread::sleep_for(std::chrono::seconds(1));
  Figures f;
  f.before = f.peak = testing::ResidentBytes(pid);
  std::atomic<bool> done{false};
  std::atomic<int64_t> peak{f.peak};
  std::thread sampler([&] {
    while (!done) {
      peak = std::max(peak.load(), testing::ResidentBytes(pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  attack();
  done = true;
  sampler.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  f.after = testing::ResidentBytes(pid);
  f.peak = std::max(peak.load(), f.after);
  return f;
}

void Check(const char* attack, const Figures& f, const testing::h2::FloodResult& r, const LiveCoordinator& c) {
  std::printf("%s: %lld MiB written on %d connections (%d cut off); coordinator resident memory %lld MiB before, "
              "%lld MiB at the peak (+%lld), %lld MiB after (+%lld)\n",
              attack, static_cast<long long>(r.sent / kMiB), r.connections, r.cut_off,
              static_cast<long long>(f.before / kMiB), static_cast<long long>(f.peak / kMiB),
              static_cast<long long>((f.peak - f.before) / kMiB), static_cast<long long>(f.after / kMiB),
              static_cast<long long>((f.after - f.before) / kMiB));
  EXPECT_LE(f.peak - f.before, kPeakBound) << attack;
  EXPECT_LE(f.after - f.before, kAfterBound) << attack;
  const grpc::Status st = c.SignedHeartbeat();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << "a holder of the secret still gets through: "
                                                          << st.error_message() << "\n" << c.log();
}

TEST(PreAuthMemory, AnEndlessContinuationChain) {
  LiveCoordinator c("continuation");
  ASSERT_TRUE(c.up()) << c.log();
  testing::h2::FloodResult r;
  const Figures f = Measure(c.pid(), [&] { r = testing::h2::ContinuationChain(c.address(), 100 * kMiB); });
  Check("an endless CONTINUATION chain of 100 MiB", f, r, c);
}

TEST(PreAuthMemory, AHundredLargeUnsignedCallsAtOnce) {
  LiveCoordinator c("large_calls");
  ASSERT_TRUE(c.up()) << c.log();
  testing::h2::FloodResult r;
  const Figures f = Measure(c.pid(), [&] {
    r = testing::h2::LargeCalls(c.address(), "/longhaul.proto.Coordinator/ShipCheckpoint", 100, 4000000);
  });
  Check("100 unsigned calls of 4 MB at once", f, r, c);
}

TEST(PreAuthMemory, AThousandConnectionsOfHeaderFloods) {
  LiveCoordinator c("headers");
  ASSERT_TRUE(c.up()) << c.log();
  testing::h2::FloodResult r;
  // Each connection opens 25 streams whose headers (about 4 KiB each, under gRPC's metadata limit)
  // never end in a request: about 100 MiB in all, held open together for a second.
  const Figures f = Measure(c.pid(), [&] {
    r = testing::h2::HeadersFlood(c.address(), 1000, 25, 20, 200,
                                  [] { std::this_thread::sleep_for(std::chrono::seconds(1)); });
  });
  Check("1,000 connections of 25 streams of headers", f, r, c);
}

TEST(PreAuthMemory, TheMetricsEndpointReadsABoundedRequest) {
  LiveCoordinator c("metrics");
  ASSERT_TRUE(c.up()) << c.log();
  testing::h2::FloodResult r;
  const Figures f = Measure(c.pid(), [&] {
    const int fd = testing::h2::Connect(c.metrics_address());
    if (fd < 0) return;
    r.connections = 1;
    const std::string chunk = "X-Flood: " + std::string(1 << 20, 'v');
    bool open = true;
    while (open && r.sent < 100 * kMiB) {
      open = testing::h2::SendAll(fd, chunk);
      if (open) r.sent += static_cast<int64_t>(chunk.size());
    }
    r.cut_off = !open;
    close(fd);
  });
  Check("a request of 100 MiB to the metrics endpoint", f, r, c);
  const std::string scrape = testing::HttpExchange(c.metrics_address(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(scrape.rfind("HTTP/1.1 200 OK", 0), 0u) << scrape;
}

}  // namespace
}  // namespace longhaul
