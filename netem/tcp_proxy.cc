#include "netem/tcp_proxy.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <memory>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "netem/timer_queue.h"

namespace longhaul::netem {
namespace {

constexpr size_t kQueueBytes = 1 << 20;  // held beyond rate x delay before reading stops
constexpr size_t kReadBytes = 64 << 10;

struct Connection;

// Reads one side of a connection with recvmsg, for the kernel's timestamp of the data's arrival:
// the delay counts from there, not from when the proxy woke up to read it. libuv's reads return
// no control data, so a poll handle on a duplicate of the socket's descriptor reads, and libuv
// keeps the original for writing.
struct Reader {
  uv_poll_t poll;
  int fd = -1;
  Connection* conn = nullptr;
  bool upstream = false;  // reads the client, for the target
};

// One direction of one route, shared by every connection on it.
struct Shaper {
  double bytes_per_ns = 0;  // 0: unlimited
  int64_t delay_ns = 0;
  int64_t serializer_free_ns = 0;
  size_t held = 0, cap = 0;
  std::list<Reader*> paused;  // sources whose reading stopped at the cap
};

struct Chunk {
  Connection* conn;
  bool upstream;  // client -> target
  std::unique_ptr<char[]> data;
  size_t size;  // 0 marks end of stream
};

struct Route {
  ProxyRoute cfg;
  uv_tcp_t listener;
  sockaddr_storage target;
  Shaper up, down;
};

struct Proxy {
  uv_loop_t* loop;
  std::vector<std::unique_ptr<Route>> routes;
  std::unique_ptr<TimerQueue<Chunk>> line;
};

struct Connection {
  Proxy* proxy;
  Route* route;
  uv_tcp_t client, server;
  Reader from_client, from_server;
  int open_handles = 2;  // and one more for each reader started
  int in_flight = 0;  // chunks in the delay line, writes and shutdowns not yet completed
  int finished_directions = 0;
  bool closing = false;
};

Proxy* g_proxy = nullptr;

// A connection is freed once its handles are closed and nothing refers to it any more.
void MaybeDelete(Connection* c) {
  if (c->closing && c->open_handles == 0 && c->in_flight == 0) delete c;
}

void Close(Connection* c) {
  if (c->closing) return;
  c->closing = true;
  auto done = [](uv_handle_t* h) {
    auto* conn = static_cast<Connection*>(h->data);
    --conn->open_handles;
    MaybeDelete(conn);
  };
  for (uv_tcp_t* t : {&c->client, &c->server}) {
    if (!uv_is_closing(reinterpret_cast<uv_handle_t*>(t))) uv_close(reinterpret_cast<uv_handle_t*>(t), done);
  }
  for (Reader* r : {&c->from_client, &c->from_server}) {
    for (Shaper* s : {&c->route->up, &c->route->down}) s->paused.remove(r);
    if (r->fd < 0) continue;
    r->poll.data = c;  // for `done`; the poll handle calls nothing else once closing
    uv_close(reinterpret_cast<uv_handle_t*>(&r->poll), done);
    close(r->fd);
  }
}

void OnReadable(uv_poll_t* p, int status, int events);

void Resume(Shaper& s) {
  while (s.held < s.cap && !s.paused.empty()) {
    Reader* r = s.paused.front();
    s.paused.pop_front();
    uv_poll_start(&r->poll, UV_READABLE, OnReadable);
  }
}

void Release(Chunk& chunk) {
  Connection* c = chunk.conn;
  Shaper& s = chunk.upstream ? c->route->up : c->route->down;
  uv_tcp_t* dest = chunk.upstream ? &c->server : &c->client;
  if (c->closing) {
    s.held -= chunk.size;
    Resume(s);
    --c->in_flight;
    return MaybeDelete(c);
  }
  if (chunk.size == 0) {  // the source finished: finish the destination's writing side too
    auto* req = new uv_shutdown_t;
    req->data = c;
    uv_shutdown(req, reinterpret_cast<uv_stream_t*>(dest), [](uv_shutdown_t* r, int) {
      auto* conn = static_cast<Connection*>(r->data);
      delete r;
      --conn->in_flight;
      if (++conn->finished_directions == 2) Close(conn);
      MaybeDelete(conn);
    });
    return;
  }
  struct Write {
    uv_write_t req;
    std::unique_ptr<char[]> data;
    size_t size;
    Shaper* shaper;
    Connection* conn;
  };
  auto* w = new Write{{}, std::move(chunk.data), chunk.size, &s, c};
  w->req.data = w;
  uv_buf_t b = uv_buf_init(w->data.get(), static_cast<unsigned>(w->size));
  uv_write(&w->req, reinterpret_cast<uv_stream_t*>(dest), &b, 1, [](uv_write_t* r, int status) {
    auto* wr = static_cast<Write*>(r->data);
    wr->shaper->held -= wr->size;
    Resume(*wr->shaper);
    Connection* conn = wr->conn;
    delete wr;
    --conn->in_flight;
    if (status < 0) Close(conn);
    MaybeDelete(conn);
  });
}

// The kernel's receive timestamp in a message's control data, as a monotonic time; now without one.
int64_t ArrivalNs(msghdr& m) {
  for (cmsghdr* h = CMSG_FIRSTHDR(&m); h != nullptr; h = CMSG_NXTHDR(&m, h)) {
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_TIMESTAMPNS) {
      timespec ts;
      std::memcpy(&ts, CMSG_DATA(h), sizeof(ts));
      return MonotonicOfRealtime(static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
    }
  }
  return MonotonicNs();
}

void OnReadable(uv_poll_t* p, int status, int) {
  auto* r = static_cast<Reader*>(p->data);
  Connection* c = r->conn;
  if (status < 0) return Close(c);
  Shaper& s = r->upstream ? c->route->up : c->route->down;
  std::unique_ptr<char[]> data(new char[kReadBytes]);
  char control[128];
  iovec iov{data.get(), kReadBytes};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(r->fd, &m, MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EINTR ? void() : Close(c);
  if (n == 0) {
    uv_poll_stop(p);
    // The end of the stream queues behind the data, so the far side sees everything first.
    ++c->in_flight;
    c->proxy->line->Push(std::max(MonotonicNs(), s.serializer_free_ns) + s.delay_ns, Chunk{c, r->upstream, nullptr, 0});
    return;
  }
  // A short read keeps only its bytes: `held` counts those, and a long link's many small segments
  // (acknowledgements) in whole read buffers held far more memory than the cap allows.
  if (static_cast<size_t>(n) < kReadBytes / 4) {
    std::unique_ptr<char[]> exact(new char[n]);
    std::memcpy(exact.get(), data.get(), static_cast<size_t>(n));
    data = std::move(exact);
  }
  const int64_t wire = s.bytes_per_ns > 0 ? static_cast<int64_t>(n / s.bytes_per_ns) : 0;
  s.serializer_free_ns = std::max(s.serializer_free_ns, ArrivalNs(m)) + wire;
  s.held += static_cast<size_t>(n);
  ++c->in_flight;
  c->proxy->line->Push(s.serializer_free_ns + s.delay_ns,
                       Chunk{c, r->upstream, std::move(data), static_cast<size_t>(n)});
  if (s.held >= s.cap) {
    uv_poll_stop(p);
    s.paused.push_back(r);
  }
}

// Whether it reads: where not, the connection is closed.
bool StartReading(Connection* c, uv_tcp_t* t, Reader* r, bool upstream) {
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(t), &fd) != 0) {
    Close(c);
    return false;
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
  r->conn = c;
  r->upstream = upstream;
  r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (r->fd < 0) {
    Close(c);
    return false;
  }
  uv_poll_init(c->proxy->loop, &r->poll, r->fd);
  r->poll.data = r;
  ++c->open_handles;
  uv_poll_start(&r->poll, UV_READABLE, OnReadable);
  return true;
}

void OnAccept(uv_stream_t* listener, int status) {
  if (status < 0) return;
  auto* route = static_cast<Route*>(listener->data);
  auto* c = new Connection{g_proxy, route, {}, {}, {}, {}};
  uv_tcp_init(g_proxy->loop, &c->client);
  uv_tcp_init(g_proxy->loop, &c->server);
  c->client.data = c->server.data = c;
  if (uv_accept(listener, reinterpret_cast<uv_stream_t*>(&c->client)) != 0) return Close(c);
  uv_tcp_nodelay(&c->client, 1);
  uv_tcp_nodelay(&c->server, 1);
  auto* req = new uv_connect_t;
  req->data = c;
  const int connecting =
      uv_tcp_connect(req, &c->server, reinterpret_cast<sockaddr*>(&route->target), [](uv_connect_t* r, int st) {
        auto* conn = static_cast<Connection*>(r->data);
        delete r;
        if (st < 0) return Close(conn);
        if (StartReading(conn, &conn->client, &conn->from_client, true)) {
          StartReading(conn, &conn->server, &conn->from_server, false);
        }
      });
  // Out of descriptors, say: no callback comes, so the client is let go now.
  if (connecting != 0) {
    delete req;
    Close(c);
  }
}

absl::StatusOr<sockaddr_storage> Resolve(const std::string& hostport) {
  const size_t colon = hostport.rfind(':');
  sockaddr_storage ss{};
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(hostport.substr(colon + 1), &port) || port < 0 ||
      port > 65535 ||
      uv_ip4_addr(hostport.substr(0, colon).c_str(), port, reinterpret_cast<sockaddr_in*>(&ss)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 host:port: ", hostport));
  }
  return ss;
}

}  // namespace

absl::Status WriteRoutesFile(const std::string& path, const std::vector<ProxyRoute>& routes) {
  std::ofstream f(path, std::ios::trunc);
  for (const ProxyRoute& r : routes) f << r.listen << " " << r.target << " " << r.link.delay_ms << " " << r.link.rate_mbit << "\n";
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ProxyRoute>> ReadRoutesFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open routes file ", path));
  std::vector<ProxyRoute> routes;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream in(line);
    ProxyRoute r;
    std::string rest;
    if (!(in >> r.listen >> r.target >> r.link.delay_ms >> r.link.rate_mbit) || (in >> rest) ||
        !std::isfinite(r.link.delay_ms) || !std::isfinite(r.link.rate_mbit) || r.link.delay_ms < 0 ||
        r.link.rate_mbit < 0 || r.link.delay_ms > 1e6 || r.link.rate_mbit > 1e7) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "routes file %s line %d is not 'LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS RATE_MBIT' with a delay in "
          "[0, 1e6] ms and a rate in [0, 1e7] Mbit/s (0: unlimited): %s",
          path, n, line));
    }
    routes.push_back(r);
  }
  return routes;
}

absl::Status RunProxy(const std::vector<ProxyRoute>& routes) {
  std::fprintf(stderr,
               "longhaul netem proxy: userspace emulation; it splits TCP, so window limits and slow start of the "
               "emulated link are NOT reproduced (use kernel-level emulation, as root, to validate transport tuning)\n");
  // An endpoint that dies mid-stream (a killed worker) must cost its own connections, not every
  // route: a write to its closed socket fails with EPIPE instead of killing the proxy.
  signal(SIGPIPE, SIG_IGN);
  // As the delay daemon: on a busy machine an ordinary process waits milliseconds for its wake-ups.
  if (const absl::Status rt = RaiseToRealTime(); !rt.ok()) {
    std::fprintf(stderr, "longhaul netem proxy: %s; delays grow by up to milliseconds while the machine is busy\n",
                 std::string(rt.message()).c_str());
  }
  Proxy proxy;
  proxy.loop = uv_default_loop();
  proxy.line = std::make_unique<TimerQueue<Chunk>>(proxy.loop, Release);
  g_proxy = &proxy;
  for (const ProxyRoute& cfg : routes) {
    auto r = std::make_unique<Route>();
    r->cfg = cfg;
    auto target = Resolve(cfg.target);
    auto listen = Resolve(cfg.listen);
    if (!target.ok()) return target.status();
    if (!listen.ok()) return listen.status();
    r->target = *target;
    for (Shaper* s : {&r->up, &r->down}) {
      s->bytes_per_ns = cfg.link.rate_mbit > 0 ? cfg.link.rate_mbit * 1e6 / 8 / 1e9 : 0;
      s->delay_ns = static_cast<int64_t>(cfg.link.delay_ms * 1e6);
      s->cap = static_cast<size_t>(cfg.link.rate_mbit * 1e6 / 8 * cfg.link.delay_ms / 1e3) + kQueueBytes;
    }
    uv_tcp_init(proxy.loop, &r->listener);
    r->listener.data = r.get();
    if (uv_tcp_bind(&r->listener, reinterpret_cast<sockaddr*>(&*listen), 0) != 0 ||
        uv_listen(reinterpret_cast<uv_stream_t*>(&r->listener), 128, OnAccept) != 0) {
      return absl::UnavailableError(absl::StrCat("proxy cannot listen on ", cfg.listen, " (in use?)"));
    }
    proxy.routes.push_back(std::move(r));
  }
  uv_signal_t sigterm, sigint;
  for (uv_signal_t* s : {&sigterm, &sigint}) {
    uv_signal_init(proxy.loop, s);
    uv_signal_start(s, [](uv_signal_t* h, int) { uv_stop(h->loop); }, s == &sigterm ? SIGTERM : SIGINT);
  }
  std::printf("ready\n");
  std::fflush(stdout);
  uv_run(proxy.loop, UV_RUN_DEFAULT);
  g_proxy = nullptr;
  return absl::OkStatus();
}

}  // namespace longhaul::netem
