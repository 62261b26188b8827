#include "transport/relay_loop.h"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {
namespace {

// epoll's word for what woke it: a connection's socket is its id times two, plus one for the
// dialed end; these two come before any.
constexpr uint64_t kListenerEvent = 0, kStopEvent = 1;
// Every connection socket is watched edge-triggered for everything, once: whoever handles an event
// goes on until the socket would block.
constexpr uint32_t kConnEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
// Accepted per wake, so a flood of connections does not starve the relayed ones.
constexpr int kAcceptsPerWake = 64;
// Out of descriptors with none to evict: the listener rests this long rather than spin.
constexpr auto kListenerRest = std::chrono::milliseconds(100);

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }

// Whether the process at the other end of Unix socket `fd` is this one (the kernel's word).
bool FromThisProcess(int fd) {
  ucred peer{};
  socklen_t len = sizeof(peer);
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.pid == getpid();
}

// The address of a Unix socket at `path`, or in the abstract namespace for "@name": with its length.
absl::StatusOr<std::pair<sockaddr_un, socklen_t>> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat("the Unix socket path %s is longer than %d bytes", path,
                                                      sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const bool abstract = absl::StartsWith(path, "@");
  if (abstract) addr.sun_path[0] = '\0';
  return std::make_pair(addr, static_cast<socklen_t>(abstract ? offsetof(sockaddr_un, sun_path) + path.size()
                                                               : sizeof(addr)));
}

// The directories PrivateSocketPath makes, in `tmp`.
constexpr char kPrivatePrefix[] = "longhaul-socket-";
// How old an abandoned socket is at least: one younger may be bound and not listening yet.
constexpr int kAbandonedAfterS = 60;

// Removes what PrivateSocketPath::Make made for processes that were killed: this user's
// directories whose socket `name` refuses connections (nothing listens on it any more).
void RemoveAbandoned(const std::filesystem::path& tmp, absl::string_view name) {
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(tmp, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const std::filesystem::path& d = it->path();
    if (!absl::StartsWith(d.filename().string(), kPrivatePrefix)) continue;
    struct stat dir, sock;
    const std::string path = (d / std::string(name)).string();
    const bool candidate = lstat(d.c_str(), &dir) == 0 && S_ISDIR(dir.st_mode) && dir.st_uid == getuid() &&
                           lstat(path.c_str(), &sock) == 0 && S_ISSOCK(sock.st_mode) &&
                           sock.st_mtime <= time(nullptr) - kAbandonedAfterS;
    if (!candidate) continue;
    const absl::StatusOr<std::pair<sockaddr_un, socklen_t>> addr = UnixAddress(path);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool refused = addr.ok() && fd >= 0 &&
                         connect(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0 &&
                         errno == ECONNREFUSED;
    if (fd >= 0) close(fd);
    if (refused) std::filesystem::remove_all(d, ec);
  }
}

}  // namespace

struct RelayLoop::Conn {
  uint64_t id = 0;
  int accepted = -1, dialed = -1;
  enum State { kDialing, kHandshake, kRelaying } state = kHandshake;
  Deadline deadline;
  // The handshake: its object, the bytes of the step still to write, and those it reads.
  std::unique_ptr<RelayHandshake> handshake;
  std::string out;
  size_t out_done = 0;
  char in[kMaxHandshakeRead];
  size_t in_want = 0, in_have = 0;
  bool last_step = false;
  // One direction of a relayed connection: buffered bytes [begin, end) of `buf`; `eof`: its
  // source closed its sending side; `shut`: so was its sink's, once the bytes were through.
  struct Pipe {
    std::unique_ptr<char[]> buf;
    size_t begin = 0, end = 0;
    bool eof = false, shut = false;
  };
  Pipe up, down;  // accepted to dialed, dialed to accepted
};

absl::StatusOr<std::unique_ptr<RelayLoop>> RelayLoop::Start(int listen_fd, RelayOptions options) {
  std::unique_ptr<RelayLoop> loop(new RelayLoop(listen_fd, std::move(options)));
  fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  loop->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (loop->epoll_fd_ < 0) return absl::ResourceExhaustedError(absl::StrCat("epoll_create1: ", strerror(errno)));
  epoll_event listener{EPOLLIN, {.u64 = kListenerEvent}}, stop{EPOLLIN, {.u64 = kStopEvent}};
  if (epoll_ctl(loop->epoll_fd_, EPOLL_CTL_ADD, listen_fd, &listener) != 0 ||
      epoll_ctl(loop->epoll_fd_, EPOLL_CTL_ADD, loop->stop_.fd(), &stop) != 0) {
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  loop->thread_ = std::thread([l = loop.get()] { l->Run(); });
  return loop;
}

RelayLoop::RelayLoop(int listen_fd, RelayOptions options) : options_(std::move(options)), listen_fd_(listen_fd) {}

RelayLoop::~RelayLoop() {
  stop_.Wake();
  if (thread_.joinable()) thread_.join();
  for (const auto& [id, c] : conns_) {
    if (c->accepted >= 0) close(c->accepted);
    if (c->dialed >= 0) close(c->dialed);
  }
  close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void RelayLoop::Run() {
  epoll_event events[256];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events, 256, WaitMs());
    for (int i = 0; i < n; ++i) {
      const uint64_t what = events[i].data.u64;
      if (what == kStopEvent) return;
      if (what == kListenerEvent) {
        Accept();
        continue;
      }
      // A connection closed earlier in this batch is gone from the map: its event is dropped.
      const auto it = conns_.find(what >> 1);
      if (it != conns_.end()) Advance(*it->second);
    }
    ExpirePending();
    if (listener_paused_until_ && std::chrono::steady_clock::now() >= *listener_paused_until_) {
      epoll_event listener{EPOLLIN, {.u64 = kListenerEvent}};
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &listener);
      listener_paused_until_.reset();
    }
  }
}

int RelayLoop::WaitMs() const {
  Deadline next = Forever();
  if (!pending_.empty()) next = conns_.at(*pending_.begin())->deadline;
  if (listener_paused_until_) next = std::min(next, *listener_paused_until_);
  return PollTimeoutMs(next);
}

void RelayLoop::Accept() {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      const bool out_of_descriptors = errno == EMFILE || errno == ENFILE;
      // A connection still in its handshake gives its descriptor to the one waiting.
      if (out_of_descriptors && EvictOldestPending()) continue;
      if (!WouldBlock()) {
        epoll_event none{0, {.u64 = kListenerEvent}};
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &none);
        listener_paused_until_ = std::chrono::steady_clock::now() + kListenerRest;
      }
      return;
    }
    if (relayed_count_.load() >= options_.max_relayed || (options_.this_process_only && !FromThisProcess(fd))) {
      ++turned_away_;  // counted before the peer can see the close
      close(fd);
      continue;
    }
    if (static_cast<int>(pending_.size()) >= options_.max_pending) EvictOldestPending();
    if (options_.nodelay_accepted) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    const uint64_t id = next_id_++;
    auto owned = std::make_unique<Conn>();
    Conn& c = *owned;
    c.id = id;
    c.accepted = fd;
    c.deadline = std::chrono::steady_clock::now() + options_.handshake_timeout;
    c.handshake = options_.handshake();
    conns_.emplace(id, std::move(owned));
    pending_.insert(id);
    pending_count_ = static_cast<int>(pending_.size());
    epoll_event ev{kConnEvents, {.u64 = id << 1}};
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      Close(id, true);
      continue;
    }
    if (!options_.handshake_on_accepted && !Dial(c).ok()) {
      Close(id, true);
      continue;
    }
    Advance(c);
  }
}

absl::Status RelayLoop::Dial(Conn& c) {
  const bool unix_socket = absl::StartsWith(options_.dial, "unix:");
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (unix_socket) {
    absl::StatusOr<std::pair<sockaddr_un, socklen_t>> a = UnixAddress(options_.dial.substr(5));
    if (!a.ok()) return a.status();
    std::memcpy(&addr, &a->first, sizeof(a->first));
    len = a->second;
  } else {
    absl::StatusOr<sockaddr_in> a = Resolve(options_.dial);
    if (!a.ok()) return a.status();
    std::memcpy(&addr, &*a, sizeof(*a));
    len = sizeof(*a);
  }
  c.dialed = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c.dialed < 0) return absl::ResourceExhaustedError(absl::StrCat("socket: ", strerror(errno)));
  if (!unix_socket) {
    const int one = 1;
    setsockopt(c.dialed, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  // A Unix socket whose backlog is full says EAGAIN: refused like any other failure.
  if (connect(c.dialed, reinterpret_cast<const sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", options_.dial, ": ", strerror(errno)));
  }
  epoll_event ev{kConnEvents, {.u64 = c.id << 1 | 1}};
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.dialed, &ev) != 0) {
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  c.state = Conn::kDialing;
  return absl::OkStatus();
}

void RelayLoop::Advance(Conn& c) {
  for (;;) {
    switch (c.state) {
      case Conn::kDialing: {
        pollfd p{c.dialed, POLLOUT, 0};
        if (poll(&p, 1, 0) <= 0) return;  // still connecting
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(c.dialed, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) return Close(c.id, true);
        if (options_.handshake_on_accepted) {
          StartRelay(c);
        } else {
          c.state = Conn::kHandshake;
        }
        continue;
      }
      case Conn::kHandshake: {
        const absl::StatusOr<bool> done = Handshake(c);
        if (!done.ok()) return Close(c.id, true);
        if (!*done) return;  // waits for its socket
        if (!Admit(c)) return;
        if (!options_.handshake_on_accepted) {
          StartRelay(c);
        } else if (!Dial(c).ok()) {
          return Close(c.id, true);
        }
        continue;
      }
      case Conn::kRelaying:
        if (!Relay(c)) Close(c.id, false);
        return;
    }
  }
}

absl::StatusOr<bool> RelayLoop::Handshake(Conn& c) {
  const int fd = options_.handshake_on_accepted ? c.accepted : c.dialed;
  for (;;) {
    if (c.out_done < c.out.size()) {
      const ssize_t w = send(fd, c.out.data() + c.out_done, c.out.size() - c.out_done, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && WouldBlock()) return false;
      if (w < 0) return absl::UnavailableError(strerror(errno));
      c.out_done += static_cast<size_t>(w);
      continue;
    }
    if (c.last_step) return true;
    if (c.in_have < c.in_want) {
      const ssize_t r = recv(fd, c.in + c.in_have, c.in_want - c.in_have, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && WouldBlock()) return false;
      if (r <= 0) return absl::UnavailableError("the connection ended in its handshake");
      c.in_have += static_cast<size_t>(r);
      continue;
    }
    absl::StatusOr<RelayHandshake::Step> step = c.handshake->Next(absl::string_view(c.in, c.in_want));
    if (!step.ok()) return step.status();
    if (step->read > kMaxHandshakeRead) return absl::InternalError("a handshake step reads too much");
    c.out = std::move(step->write);
    c.out_done = 0;
    c.in_want = step->read;
    c.in_have = 0;
    c.last_step = step->done;
  }
}

bool RelayLoop::Admit(Conn& c) {
  if (relayed_count_.load() >= options_.max_relayed) {
    Close(c.id, true);
    return false;
  }
  pending_.erase(c.id);
  pending_count_ = static_cast<int>(pending_.size());
  ++relayed_count_;
  c.handshake.reset();
  c.out = std::string();
  return true;
}

void RelayLoop::StartRelay(Conn& c) {
  c.state = Conn::kRelaying;
  c.up.buf = std::make_unique<char[]>(options_.buffer_bytes);
  c.down.buf = std::make_unique<char[]>(options_.buffer_bytes);
}

bool RelayLoop::Relay(Conn& c) {
  const size_t cap = options_.buffer_bytes;
  // Reads `from` into `p` while it has room and writes `p` to `to`, as far as each socket takes
  // it now: whether anything moved; nullopt where a socket broke.
  auto move = [cap](int from, int to, Conn::Pipe& p) -> std::optional<bool> {
    bool moved = false;
    if (!p.eof) {
      if (p.end == cap && p.begin > 0) {
        std::memmove(p.buf.get(), p.buf.get() + p.begin, p.end - p.begin);
        p.end -= p.begin;
        p.begin = 0;
      }
      if (p.end < cap) {
        const ssize_t r = recv(from, p.buf.get() + p.end, cap - p.end, 0);
        if (r > 0) p.end += static_cast<size_t>(r);
        if (r == 0) p.eof = true;
        if (r < 0 && errno != EINTR && !WouldBlock()) return std::nullopt;
        moved = r >= 0 || errno == EINTR;
      }
    }
    if (p.begin < p.end) {
      const ssize_t w = send(to, p.buf.get() + p.begin, p.end - p.begin, MSG_NOSIGNAL);
      if (w > 0) p.begin += static_cast<size_t>(w);
      if (p.begin == p.end) p.begin = p.end = 0;
      if (w < 0 && errno != EINTR && !WouldBlock()) return std::nullopt;
      moved = moved || w > 0 || errno == EINTR;
    }
    if (p.eof && p.begin == p.end && !p.shut) {
      shutdown(to, SHUT_WR);
      p.shut = true;
      moved = true;
    }
    return moved;
  };
  // Edge-triggered: keep going until neither direction moves, so every socket is left where it
  // would block (or its pipe full, which the other end's next event drains).
  for (bool moved = true; moved;) {
    const std::optional<bool> up = move(c.accepted, c.dialed, c.up);
    const std::optional<bool> down = move(c.dialed, c.accepted, c.down);
    if (!up || !down) return false;
    moved = *up || *down;
  }
  return !(c.up.shut && c.down.shut);
}

void RelayLoop::Close(uint64_t id, bool turned_away) {
  const auto it = conns_.find(id);
  if (it == conns_.end()) return;
  const Conn& c = *it->second;
  // Counted before the peers can see the close: a connection is pending or admitted (Admit).
  if (pending_.erase(id) == 0) --relayed_count_;
  pending_count_ = static_cast<int>(pending_.size());
  if (turned_away) ++turned_away_;
  // Closing a socket takes it out of the epoll set too.
  if (c.accepted >= 0) close(c.accepted);
  if (c.dialed >= 0) close(c.dialed);
  conns_.erase(it);
}

bool RelayLoop::EvictOldestPending() {
  if (pending_.empty()) return false;
  Close(*pending_.begin(), true);
  return true;
}

void RelayLoop::ExpirePending() {
  const Deadline now = std::chrono::steady_clock::now();
  while (!pending_.empty() && conns_.at(*pending_.begin())->deadline <= now) Close(*pending_.begin(), true);
}

absl::StatusOr<std::unique_ptr<PrivateSocketPath>> PrivateSocketPath::Make(absl::string_view name) {
  std::error_code ec;
  const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  RemoveAbandoned(tmp, name);
  std::string dir = (tmp / (std::string(kPrivatePrefix) + "XXXXXX")).string();
  if (ec || mkdtemp(dir.data()) == nullptr) {  // mode 0700
    return absl::FailedPreconditionError(absl::StrCat("cannot make a private directory ", dir, ": ",
                                                      ec ? ec.message() : strerror(errno), " (is $TMPDIR writable?)"));
  }
  std::string path = absl::StrCat(dir, "/", name);
  if (const auto a = UnixAddress(path); !a.ok()) {
    std::filesystem::remove(dir, ec);
    return absl::FailedPreconditionError(absl::StrCat(a.status().message(), "; set $TMPDIR to a shorter path"));
  }
  return std::unique_ptr<PrivateSocketPath>(new PrivateSocketPath(std::move(dir), std::move(path)));
}

PrivateSocketPath::~PrivateSocketPath() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::StatusOr<int> ListenUnix(const std::string& path) {
  absl::StatusOr<std::pair<sockaddr_un, socklen_t>> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("no socket to listen on: ", strerror(errno)));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0 || listen(fd, SOMAXCONN) != 0) {
    const std::string why = strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": ", why));
  }
  return fd;
}

}  // namespace longhaul
