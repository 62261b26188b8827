#include "netem/delay_daemon.h"

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

extern "C" {
#include <libnetfilter_queue/libnetfilter_queue.h>
}

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "netem/timer_queue.h"
#include "util/hash.h"

namespace longhaul::netem {
namespace {

struct PairState {
  PairDelay link;
  int64_t last_release_ns = 0;
};

struct Daemon {
  nfq_handle* h = nullptr;
  nfq_q_handle* qh = nullptr;
  uv_loop_t* loop = nullptr;
  uv_poll_t nfq_poll;
  uv_signal_t sigterm, sigint;
  std::map<std::pair<uint32_t, uint32_t>, PairState> pairs;
  std::unique_ptr<TimerQueue<uint32_t>> held;  // packet ids
  Rng rng{1};

  // When the packet entered the queue, on the monotonic clock: the kernel's timestamp where it
  // has one (the daemon itself may have woken late from idle), else now.
  static int64_t ArrivalNs(nfq_data* nfa) {
    timeval tv{};
    if (nfq_get_timestamp(nfa, &tv) != 0) return MonotonicNs();
    return MonotonicOfRealtime(static_cast<int64_t>(tv.tv_sec) * 1'000'000'000 +
                               static_cast<int64_t>(tv.tv_usec) * 1000);
  }

  int OnPacket(nfq_data* nfa) {
    nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == nullptr) return 0;
    const uint32_t id = ntohl(ph->packet_id);
    unsigned char* data = nullptr;
    const int len = nfq_get_payload(nfa, &data);
    if (len < 20 || (data[0] >> 4) != 4) return nfq_set_verdict(qh, id, NF_ACCEPT, 0, nullptr);
    uint32_t src, dst;
    std::memcpy(&src, data + 12, 4);
    std::memcpy(&dst, data + 16, 4);
    auto it = pairs.find({ntohl(src), ntohl(dst)});
    if (it == pairs.end()) return nfq_set_verdict(qh, id, NF_ACCEPT, 0, nullptr);
    PairState& p = it->second;
    if (p.link.loss > 0 && rng.Uniform() < p.link.loss) return nfq_set_verdict(qh, id, NF_DROP, 0, nullptr);
    int64_t delay = p.link.delay_ns;
    if (p.link.jitter_ns > 0) delay += static_cast<int64_t>((2 * rng.Uniform() - 1) * p.link.jitter_ns);
    const int64_t release = std::max(p.last_release_ns, ArrivalNs(nfa) + std::max<int64_t>(0, delay));
    p.last_release_ns = release;
    held->Push(release, id);
    return 0;
  }
};

int Callback(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* data) { return static_cast<Daemon*>(data)->OnPacket(nfa); }

absl::StatusOr<std::vector<PairDelay>> ReadLinks(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open links file ", path));
  std::vector<PairDelay> links;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string src, dst;
    PairDelay p;
    if (!(in >> src >> dst >> p.delay_ns >> p.jitter_ns >> p.loss)) continue;
    const std::optional<uint32_t> a = ParseIpv4(src), b = ParseIpv4(dst);
    if (!a || !b) return absl::InvalidArgumentError(absl::StrCat("links file ", path, ": bad address in '", line, "'"));
    p.src = *a, p.dst = *b;
    links.push_back(p);
  }
  return links;
}

}  // namespace

std::optional<uint32_t> ParseIpv4(const std::string& dotted) {
  in_addr a{};
  if (inet_pton(AF_INET, dotted.c_str(), &a) != 1) return std::nullopt;
  return ntohl(a.s_addr);
}

absl::Status WriteLinksFile(const std::string& path, const std::vector<PairDelay>& links) {
  std::ofstream f(path, std::ios::trunc);
  for (const PairDelay& p : links) {
    in_addr a{htonl(p.src)}, b{htonl(p.dst)};
    char sa[INET_ADDRSTRLEN], sb[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, sa, sizeof(sa));
    inet_ntop(AF_INET, &b, sb, sizeof(sb));
    f << sa << " " << sb << " " << p.delay_ns << " " << p.jitter_ns << " " << p.loss << "\n";
  }
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status RunDelayDaemon(int queue, const std::string& links_file, uint64_t seed) {
  auto links = ReadLinks(links_file);
  if (!links.ok()) return links.status();
  // Timers fire up to the thread's slack late (50 us by default): that would add to every delay.
  prctl(PR_SET_TIMERSLACK, 1UL);
  // The workers' compute keeps the cores busy: an ordinary process would wait a scheduler slice
  // (milliseconds) for each wake-up, and every packet with it.
  if (const absl::Status rt = RaiseToRealTime(); !rt.ok()) {
    std::fprintf(stderr, "longhaul netem delayd: %s; delays grow by up to milliseconds while the machine is busy\n",
                 std::string(rt.message()).c_str());
  }
  Daemon d;
  d.rng = Rng(seed);
  for (const PairDelay& p : *links) d.pairs[{p.src, p.dst}] = {p, 0};

  d.h = nfq_open();
  if (d.h == nullptr) return absl::PermissionDeniedError("nfq_open failed: needs root (CAP_NET_ADMIN)");
  d.qh = nfq_create_queue(d.h, static_cast<uint16_t>(queue), &Callback, &d);
  if (d.qh == nullptr) {
    nfq_close(d.h);
    return absl::UnavailableError(absl::StrFormat("cannot bind NFQUEUE %d (is another daemon on it?)", queue));
  }
  nfq_set_mode(d.qh, NFQNL_COPY_PACKET, 20);  // the IPv4 header is all it reads
  nfq_set_queue_flags(d.qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  nfq_set_queue_maxlen(d.qh, 1 << 16);
  nfnl_rcvbufsiz(nfq_nfnlh(d.h), 64 << 20);
  // The kernel stamps packets on arrival only while some socket asks for timestamps: this one does.
  const int stamp_keeper = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(stamp_keeper, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));

  d.loop = uv_default_loop();
  d.held = std::make_unique<TimerQueue<uint32_t>>(
      d.loop, [&d](uint32_t& id) { nfq_set_verdict(d.qh, id, NF_ACCEPT, 0, nullptr); });
  uv_poll_init(d.loop, &d.nfq_poll, nfq_fd(d.h));
  d.nfq_poll.data = &d;
  uv_poll_start(&d.nfq_poll, UV_READABLE, [](uv_poll_t* p, int, int) {
    auto* dm = static_cast<Daemon*>(p->data);
    alignas(8) char buf[65536];
    for (;;) {
      const ssize_t n = recv(nfq_fd(dm->h), buf, sizeof(buf), MSG_DONTWAIT);
      if (n <= 0) break;
      nfq_handle_packet(dm->h, buf, static_cast<int>(n));
    }
  });
  for (uv_signal_t* s : {&d.sigterm, &d.sigint}) {
    uv_signal_init(d.loop, s);
    s->data = &d;
  }
  auto stop = [](uv_signal_t* s, int) { uv_stop(static_cast<Daemon*>(s->data)->loop); };
  uv_signal_start(&d.sigterm, stop, SIGTERM);
  uv_signal_start(&d.sigint, stop, SIGINT);

  std::printf("ready\n");
  std::fflush(stdout);
  uv_run(d.loop, UV_RUN_DEFAULT);

  d.held->Flush();  // let what was in flight go rather than strand it
  d.held.reset();
  nfq_destroy_queue(d.qh);
  nfq_close(d.h);
  close(stamp_keeper);
  return absl::OkStatus();
}

}  // namespace longhaul::netem
