// Tensor transfer throughput on loopback: longhaul's transport (framed TCP, checksums, pooled
// receive buffers) against a plain TCP socket pair moving the same bytes, in the same run; iperf3
// and torch.distributed (gloo) send/recv too where installed; and the fixed cost of one tensor,
// acknowledged, and one way as a pipeline's boundary tensors pay it.
//
//   build/bench/transport_bench [--sizes-mb 1,16,256] [--connections 1] [--chunk-mib 2]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "bench/baseline_script.h"
#include "transport/tensor_transport.h"
#include "util/median.h"

namespace {

using longhaul::Median;

using Clock = std::chrono::steady_clock;

int Repeats(size_t bytes) { return bytes >= (256u << 20) ? 5 : (bytes >= (16u << 20) ? 15 : 50); }

// Seconds per transfer (median), longhaul: send until acknowledged and taken from the mailbox.
double Longhaul(size_t bytes, int connections, int chunk_mib) {
  longhaul::Mailbox box;
  const longhaul::AnyTensorUpTo admission(bytes / 4);
  auto server = longhaul::TensorServer::Start("127.0.0.1:0", "bench", &box, &admission);
  longhaul::TransportOptions opt;
  opt.job_id = "bench";
  opt.connections = connections;
  opt.chunk_bytes = static_cast<size_t>(chunk_mib) << 20;
  longhaul::TensorClient client((*server)->address(), opt);
  std::vector<float> x(bytes / 4, 1.5f);
  std::vector<double> times;
  for (int i = -1; i < Repeats(bytes); ++i) {  // i = -1 warms the connection up
    const auto t0 = Clock::now();
    longhaul::proto::TensorHeader h;
    h.set_kind(longhaul::proto::ACTIVATION);
    h.set_iteration(i + 1);
    absl::Status s = client.Send(h, x.data(), x.size())->Wait();
    auto got = box.Take({longhaul::proto::ACTIVATION, i + 1, 0, 0, 0, 0}, std::chrono::seconds(60));
    if (!s.ok() || !got.ok()) {
      std::cerr << "transport error: " << s << " " << got.status() << "\n";
      std::exit(1);
    }
    if (i >= 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    box.Recycle(std::move(*got));  // as the worker does with consumed tensors
  }
  return Median(times);
}

// One way (median half round trip) of a one-element tensor bounced between two longhaul
// endpoints, each answering what its mailbox got: what a pipeline pays per boundary tensor beyond
// the bytes, with no acknowledgement waited for.
double LonghaulPingPong(int reps) {
  longhaul::Mailbox box_a, box_b;
  const longhaul::AnyTensorUpTo admission(1);
  auto server_a = longhaul::TensorServer::Start("127.0.0.1:0", "bench", &box_a, &admission);
  auto server_b = longhaul::TensorServer::Start("127.0.0.1:0", "bench", &box_b, &admission);
  if (!server_a.ok() || !server_b.ok()) {
    std::cerr << "transport error: " << server_a.status() << " " << server_b.status() << "\n";
    std::exit(1);
  }
  longhaul::TransportOptions opt;
  opt.job_id = "bench";
  longhaul::TensorClient to_a((*server_a)->address(), opt), to_b((*server_b)->address(), opt);
  const float x = 1.5f;
  auto send = [&](longhaul::TensorClient& c, int i) {
    longhaul::proto::TensorHeader h;
    h.set_kind(longhaul::proto::ACTIVATION);
    h.set_iteration(i);
    return c.Send(h, &x, 1);
  };
  auto take = [](longhaul::Mailbox& box, int i) {
    auto got = box.Take({longhaul::proto::ACTIVATION, i, 0, 0, 0, 0}, std::chrono::seconds(60));
    if (!got.ok()) {
      std::cerr << "transport error: " << got.status() << "\n";
      std::exit(1);
    }
    box.Recycle(std::move(*got));
  };
  std::vector<std::shared_ptr<longhaul::SendOp>> ops;
  std::thread echo([&] {
    for (int i = 0; i <= reps; ++i) {
      take(box_b, i);
      ops.push_back(send(to_a, i));
    }
  });
  std::vector<std::shared_ptr<longhaul::SendOp>> mine;
  std::vector<double> times;
  for (int i = 0; i <= reps; ++i) {  // i = 0 opens the connections
    const auto t0 = Clock::now();
    mine.push_back(send(to_b, i));
    take(box_a, i);
    if (i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2);
  }
  echo.join();
  for (auto& op : ops) (void)op->Wait();
  for (auto& op : mine) (void)op->Wait();
  return Median(times);
}

// A listening socket on a free loopback port, whose address goes into `*addr`.
int LoopbackListener(sockaddr_in* addr) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  addr->sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &addr->sin_addr);
  bind(listener, reinterpret_cast<sockaddr*>(addr), sizeof(*addr));
  socklen_t len = sizeof(*addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(addr), &len);
  listen(listener, 1);
  return listener;
}

// The same over a plain TCP socket pair: 4 bytes each way.
double PlainPingPong(int reps) {
  sockaddr_in addr{};
  const int listener = LoopbackListener(&addr);
  int one = 1;
  std::thread echo([&] {
    int fd = accept(listener, nullptr, nullptr);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[4];
    for (int i = 0; i <= reps; ++i) {
      if (read(fd, buf, 4) != 4 || write(fd, buf, 4) != 4) break;
    }
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<double> times;
  char buf[4] = {1, 2, 3, 4};
  for (int i = 0; i <= reps; ++i) {
    const auto t0 = Clock::now();
    if (write(fd, buf, 4) != 4 || read(fd, buf, 4) != 4) break;
    if (i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2);
  }
  close(fd);
  echo.join();
  close(listener);
  return Median(times);
}

// Seconds per transfer (median), plain TCP: write all bytes, the receiver reads them all into a
// buffer and answers one byte.
double PlainSocket(size_t bytes) {
  sockaddr_in addr{};
  const int listener = LoopbackListener(&addr);
  const int reps = Repeats(bytes) + 1;
  std::thread receiver([&] {
    int fd = accept(listener, nullptr, nullptr);
    std::vector<char> buf(bytes);
    for (int i = 0; i < reps; ++i) {
      size_t got = 0;
      while (got < bytes) {
        ssize_t r = read(fd, buf.data() + got, bytes - got);
        if (r <= 0) return;
        got += static_cast<size_t>(r);
      }
      char ack = 1;
      if (write(fd, &ack, 1) != 1) return;
    }
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> data(bytes, 7);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    size_t sent = 0;
    while (sent < bytes) {
      ssize_t w = write(fd, data.data() + sent, bytes - sent);
      if (w <= 0) break;
      sent += static_cast<size_t>(w);
    }
    char ack;
    if (read(fd, &ack, 1) != 1) break;
    if (i > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  close(fd);
  receiver.join();
  close(listener);
  return Median(times);
}

// Output of a shell command, or "" when it fails.
std::string Run(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  return pclose(p) == 0 ? out : "";
}

// iperf3's receiver-side rate for `bytes` over loopback, in GB/s; < 0 when iperf3 is absent.
double Iperf3(size_t bytes) {
  if (Run("command -v iperf3").empty()) return -1;
  const std::string port = "5299";
  const std::string out = Run("iperf3 -s -1 -p " + port + " >/dev/null 2>&1 & sleep 0.3; iperf3 -c 127.0.0.1 -p " +
                              port + " -n " + std::to_string(bytes) + " -f m 2>/dev/null | grep receiver");
  const size_t mbits = out.find(" Mbits/sec");
  if (mbits == std::string::npos) return -1;
  const size_t start = out.rfind(' ', mbits - 1);
  return std::stod(out.substr(start, mbits - start)) / 8e3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensor transfer: longhaul transport vs a plain TCP socket pair"};
  std::vector<int> sizes_mb = {1, 16, 256};
  int connections = 1, chunk_mib = 2;
  app.add_option("--sizes-mb", sizes_mb)->delimiter(',');
  app.add_option("--connections", connections);
  app.add_option("--chunk-mib", chunk_mib);
  CLI11_PARSE(app, argc, argv);

  const longhaul::bench::ScriptOutput gloo_run = longhaul::bench::RunBaselineScript(
      "torch_gloo_sendrecv.py",
      absl::StrFormat("--sizes-mb %d,%d,%d", sizes_mb[0], sizes_mb.size() > 1 ? sizes_mb[1] : 0,
                      sizes_mb.size() > 2 ? sizes_mb[2] : 0),
      600);
  const std::string gloo = gloo_run.ok ? gloo_run.text : "";
  std::cout << absl::StrFormat(
      "tensor transfer over loopback, fp32, median of 5-50 transfers after a warm-up (time from send to the whole "
      "tensor received and acknowledged); longhaul with %d connection(s), %d MiB chunks, CRC-32C\n",
      connections, chunk_mib);
  std::cout << absl::StrFormat("%8s %14s %14s %8s %12s %12s %9s\n", "size", "longhaul GB/s", "socket GB/s", "ratio",
                               "iperf3 GB/s", "gloo GB/s", "vs gloo");
  for (int mb : sizes_mb) {
    const size_t bytes = static_cast<size_t>(mb) << 20;
    const double ours = bytes / Longhaul(bytes, connections, chunk_mib) / 1e9;
    const double plain = bytes / PlainSocket(bytes) / 1e9;
    const double iperf = bytes >= (16u << 20) ? Iperf3(bytes) : -1;  // too short a test below that
    std::string gloo_rate = "-";
    const std::string key = absl::StrFormat("size_mb=%d gbps=", mb);
    if (size_t at = gloo.find(key); at != std::string::npos) {
      gloo_rate = gloo.substr(at + key.size(), gloo.find('\n', at) - at - key.size());
    }
    double gloo_gbps = 0;
    const bool have_gloo = absl::SimpleAtod(gloo_rate, &gloo_gbps) && gloo_gbps > 0;
    std::cout << absl::StrFormat("%6d MB %14.2f %14.2f %7.2fx %12s %12s %9s\n", mb, ours, plain, ours / plain,
                                 iperf < 0 ? "-" : absl::StrFormat("%.2f", iperf), gloo_rate,
                                 have_gloo ? absl::StrFormat("%.2fx", ours / gloo_gbps) : "-");
  }
  // The fixed cost of a tensor: its header, the thread hand-offs on both sides and the
  // acknowledgement, beyond what a socket needs to carry 4 bytes and answer them.
  const double ours_small = Longhaul(4, connections, chunk_mib), plain_small = PlainSocket(4);
  std::cout << absl::StrFormat(
      "fixed cost: a one-element tensor sent, received and acknowledged in %.0f us (median of 50); a plain socket's 4 "
      "bytes and 1-byte answer in %.0f us: %.0f us more per tensor\n",
      ours_small * 1e6, plain_small * 1e6, (ours_small - plain_small) * 1e6);
  const double ours_one_way = LonghaulPingPong(200), plain_one_way = PlainPingPong(200);
  std::cout << absl::StrFormat(
      "fixed cost one way: a one-element tensor bounced between two endpoints, each sending on what its mailbox "
      "got, %.0f us per crossing (median of 200 half round trips); a plain socket's 4 bytes bounced, %.0f us: %.0f "
      "us more per tensor\n",
      ours_one_way * 1e6, plain_one_way * 1e6, (ours_one_way - plain_one_way) * 1e6);
  // The socket pair's two threads share one CPU; a tensor hops between threads on both sides, and a
  // hop to an idle CPU waits for it to wake: on a virtual machine whose idle CPUs halt at once, a
  // hypervisor's interrupt (20-35 us each in `perf sched timehist` here).
  if (std::ifstream poll_ns("/sys/module/haltpoll/parameters/guest_halt_poll_ns"); poll_ns) {
    long ns = -1;
    poll_ns >> ns;
    std::cout << absl::StrFormat(
        "idle CPUs poll %d us before they halt (/sys/module/haltpoll/parameters/guest_halt_poll_ns)%s\n", ns / 1000,
        ns == 0 ? ": each hand-off to a sleeping thread on the other CPU waits for the hypervisor to wake that CPU"
                : "");
  }
  if (gloo.empty()) std::cout << "gloo: skipped (needs Debian's python3-torch: bash deploy/setup.sh --with-torch)\n";
  if (Run("command -v iperf3").empty()) std::cout << "iperf3: skipped (not installed: apt-get install iperf3)\n";
  return 0;
}
