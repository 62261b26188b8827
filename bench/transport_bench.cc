// Tensor transfer throughput on loopback: longhaul's transport (framed TCP, checksums, pooled
// receive buffers) against a plain TCP socket pair moving the same bytes, in the same run; iperf3
// and torch.distributed (gloo) send/recv too where installed; the fixed cost of one tensor,
// acknowledged, and one way as a pipeline's boundary tensors pay it; and the caller's time in Send
// for an int4 boundary tensor (encoded as it is written) against a push (encoded in Send).
//
//   build/bench/transport_bench [--sizes-mb 1,16,256] [--connections 1] [--chunk-mib 2] [--rounds 5]
//                               [--encode-mb 16]
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
#include <optional>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/baseline_script.h"
#include "format/wire_dtype.h"
#include "transport/tensor_transport.h"
#include "util/median.h"

namespace {

using longhaul::Median;

using Clock = std::chrono::steady_clock;

int Repeats(size_t bytes) { return bytes >= (256u << 20) ? 5 : (bytes >= (16u << 20) ? 15 : 50); }

// Seconds per transfer (medians), longhaul: in Send (the caller's thread), and from the send until
// acknowledged and taken from the mailbox. A tensor of `kind` in `dtype`.
struct Timed {
  double in_send = 0, whole = 0;
};
Timed Longhaul(size_t bytes, int connections, int chunk_mib, longhaul::proto::TensorKind kind = longhaul::proto::ACTIVATION,
               longhaul::WireDtype dtype = longhaul::WireDtype::kF32) {
  longhaul::Mailbox box;
  const longhaul::AnyTensorUpTo admission(bytes / 4);
  auto server = longhaul::TensorServer::Start("127.0.0.1:0", "bench", &box, &admission);
  longhaul::TransportOptions opt;
  opt.job_id = "bench";
  opt.connections = connections;
  opt.chunk_bytes = static_cast<size_t>(chunk_mib) << 20;
  longhaul::TensorClient client((*server)->address(), opt);
  std::vector<float> x(bytes / 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
  std::vector<double> in_send, whole;
  for (int i = -1; i < Repeats(bytes); ++i) {  // i = -1 warms the connection up
    const auto t0 = Clock::now();
    longhaul::proto::TensorHeader h;
    h.set_kind(kind);
    h.set_iteration(i + 1);
    h.set_dtype(static_cast<longhaul::proto::WireDtype>(dtype));
    std::shared_ptr<longhaul::SendOp> op = client.Send(h, x.data(), x.size());
    const auto t1 = Clock::now();
    absl::Status s = op->Wait();
    auto got = box.Take({kind, i + 1, 0, 0, 0, 0}, std::chrono::seconds(60));
    if (!s.ok() || !got.ok()) {
      std::cerr << "transport error: " << s << " " << got.status() << "\n";
      std::exit(1);
    }
    if (i >= 0) {
      in_send.push_back(std::chrono::duration<double>(t1 - t0).count());
      whole.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    box.Recycle(std::move(*got));  // as the worker does with consumed tensors
  }
  return {Median(in_send), Median(whole)};
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

// A figure measured once per round: its median over the rounds, and the range.
struct Rounds {
  std::vector<double> v;
  std::string Show(int decimals, const char* suffix = "") const {
    if (v.empty()) return "-";
    const auto one = [&](double x) { return absl::StrFormat("%.*f%s", decimals, x, suffix); };
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return one(Median(v)) + (v.size() > 1 ? absl::StrCat(" (", one(*lo), "-", one(*hi), ")") : "");
  }
};

int main(int argc, char** argv) {
  CLI::App app{"tensor transfer: longhaul transport vs a plain TCP socket pair"};
  std::vector<int> sizes_mb = {1, 16, 256};
  int connections = 1, chunk_mib = 2, rounds = 5, encode_mb = 16;
  app.add_option("--sizes-mb", sizes_mb)->delimiter(',');
  app.add_option("--encode-mb", encode_mb, "MB of floats sent in int4 from a boundary and from a push")
      ->check(CLI::Range(1, 1024));
  app.add_option("--connections", connections);
  app.add_option("--chunk-mib", chunk_mib);
  app.add_option("--rounds", rounds, "every measurement this many times, in turn")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  // Each round measures every transport one after the other, so that the ratios compare figures
  // taken seconds apart: a shared machine's pace drifts over a minute by more than the margins.
  struct PerSize {
    Rounds ours, plain, ratio, iperf, gloo, vs_gloo;
  };
  std::vector<PerSize> per_size(sizes_mb.size());
  Rounds fixed_ours, fixed_plain, fixed_more, one_way_ours, one_way_plain, one_way_more;
  Rounds caller_boundary, caller_push, caller_ratio, whole_boundary, whole_push;
  bool have_gloo = false;
  for (int round = 0; round < rounds; ++round) {
    const longhaul::bench::ScriptOutput gloo_run = longhaul::bench::RunBaselineScript(
        "torch_gloo_sendrecv.py",
        absl::StrFormat("--sizes-mb %d,%d,%d", sizes_mb[0], sizes_mb.size() > 1 ? sizes_mb[1] : 0,
                        sizes_mb.size() > 2 ? sizes_mb[2] : 0),
        600);
    have_gloo = gloo_run.ok;
    for (size_t i = 0; i < sizes_mb.size(); ++i) {
      const size_t bytes = static_cast<size_t>(sizes_mb[i]) << 20;
      PerSize& m = per_size[i];
      const double ours = bytes / Longhaul(bytes, connections, chunk_mib).whole / 1e9;
      const double plain = bytes / PlainSocket(bytes) / 1e9;
      m.ours.v.push_back(ours);
      m.plain.v.push_back(plain);
      m.ratio.v.push_back(ours / plain);
      // iperf3 is too short a test below 16 MB.
      if (const double iperf = bytes >= (16u << 20) ? Iperf3(bytes) : -1; iperf > 0) m.iperf.v.push_back(iperf);
      if (const std::optional<double> gloo =
              gloo_run.ok ? longhaul::bench::PrintedValue("\n" + gloo_run.text,
                                                          absl::StrFormat("\nsize_mb=%d gbps", sizes_mb[i]))
                          : std::nullopt;
          gloo && *gloo > 0) {
        m.gloo.v.push_back(*gloo);
        m.vs_gloo.v.push_back(ours / *gloo);
      }
    }
    // The fixed cost of a tensor: its header, the thread hand-offs on both sides and the
    // acknowledgement, beyond what a socket needs to carry 4 bytes and answer them.
    const double ours_small = Longhaul(4, connections, chunk_mib).whole, plain_small = PlainSocket(4);
    fixed_ours.v.push_back(ours_small * 1e6);
    fixed_plain.v.push_back(plain_small * 1e6);
    fixed_more.v.push_back((ours_small - plain_small) * 1e6);
    // An int4 boundary tensor is encoded by the connection's thread as it is written; the same
    // tensor sent as a gradient push is encoded in Send, on the caller's thread (the compute's).
    const size_t encoded = static_cast<size_t>(encode_mb) << 20;
    const Timed boundary = Longhaul(encoded, connections, chunk_mib, longhaul::proto::ACTIVATION, longhaul::WireDtype::kInt4);
    const Timed push = Longhaul(encoded, connections, chunk_mib, longhaul::proto::GRAD_PUSH, longhaul::WireDtype::kInt4);
    caller_boundary.v.push_back(boundary.in_send * 1e3);
    caller_push.v.push_back(push.in_send * 1e3);
    caller_ratio.v.push_back(push.in_send / boundary.in_send);
    whole_boundary.v.push_back(boundary.whole * 1e3);
    whole_push.v.push_back(push.whole * 1e3);
    const double ours_one_way = LonghaulPingPong(200), plain_one_way = PlainPingPong(200);
    one_way_ours.v.push_back(ours_one_way * 1e6);
    one_way_plain.v.push_back(plain_one_way * 1e6);
    one_way_more.v.push_back((ours_one_way - plain_one_way) * 1e6);
  }

  std::cout << absl::StrFormat(
      "tensor transfer over loopback, fp32, median of 5-50 transfers after a warm-up (time from send to the whole "
      "tensor received and acknowledged); longhaul with %d connection(s), %d MiB chunks, CRC-32C; %d round(s), each "
      "measuring every transport in turn: the median over the rounds, (the range)\n",
      connections, chunk_mib, rounds);
  for (size_t i = 0; i < sizes_mb.size(); ++i) {
    const PerSize& m = per_size[i];
    std::cout << absl::StrFormat("%5d MB  longhaul %s GB/s, socket %s GB/s: %s of the socket\n", sizes_mb[i],
                                 m.ours.Show(2), m.plain.Show(2), m.ratio.Show(2, "x"));
    std::cout << absl::StrFormat("          iperf3 %s GB/s, gloo %s GB/s: longhaul %s of gloo\n", m.iperf.Show(2),
                                 m.gloo.Show(2), m.vs_gloo.Show(2, "x"));
  }
  std::cout << absl::StrFormat(
      "fixed cost: a one-element tensor sent, received and acknowledged in %s us (median of 50); a plain socket's 4 "
      "bytes and 1-byte answer in %s us: %s us more per tensor\n",
      fixed_ours.Show(0), fixed_plain.Show(0), fixed_more.Show(0));
  std::cout << absl::StrFormat(
      "fixed cost one way: a one-element tensor bounced between two endpoints, each sending on what its mailbox "
      "got, %s us per crossing (median of 200 half round trips); a plain socket's 4 bytes bounced, %s us: %s "
      "us more per tensor\n",
      one_way_ours.Show(0), one_way_plain.Show(0), one_way_more.Show(0));
  std::cout << absl::StrFormat(
      "int4, %d MB of floats: the caller spends %s ms in Send for a boundary tensor (encoded by the connection's "
      "thread) against %s ms for a gradient push (encoded in Send): %s; whole transfer %s ms against %s ms\n",
      encode_mb, caller_boundary.Show(2), caller_push.Show(2), caller_ratio.Show(0, "x"), whole_boundary.Show(1),
      whole_push.Show(1));
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
  if (!have_gloo) std::cout << "gloo: skipped (needs Debian's python3-torch: bash deploy/setup.sh --with-torch)\n";
  if (Run("command -v iperf3").empty()) std::cout << "iperf3: skipped (not installed: apt-get install iperf3)\n";
  return 0;
}
