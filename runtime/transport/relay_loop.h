#pragma once
// A relay that lets nothing through before a handshake: one thread's epoll loop accepts
// connections on a listening socket, takes each through a handshake of a few bytes (RelayHandshake)
// on one of its two ends, and only then relays bytes both ways between the connection it accepted
// and one it dials. Before the handshake ends, a connection holds the handshake's bytes and nothing
// else: its other bytes stay in the kernel, unread. The coordinator's gate and a client's forwarder
// (coordinator_gate.h) are its two uses.
//
// Bounds: at most `max_pending` connections between their accept and the end of their handshake
// (a newer one closes the oldest), each for at most `handshake_timeout`; at most `max_relayed`
// relayed (a newer one is closed at once), each with a buffer of `buffer_bytes` per direction.
// Reading one side stops while the other's buffer is full (back-pressure); an end that closes its
// sending side closes the other's once its bytes are through, and a connection reset on either
// end closes both.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/socket_io.h"

namespace longhaul {

// The most bytes a handshake step reads at once.
inline constexpr size_t kMaxHandshakeRead = 64;

// One connection's handshake, step by step: each step writes its bytes, then reads exactly the
// number it asks for (never more, so nothing after the handshake is consumed by it).
class RelayHandshake {
 public:
  virtual ~RelayHandshake() = default;
  struct Step {
    std::string write;
    size_t read = 0;    // at most kMaxHandshakeRead
    bool done = false;  // the handshake succeeded: relaying starts once `write` is out
  };
  // The first step (`read` empty), then each next one given the bytes the last asked for; an error
  // closes the connection.
  virtual absl::StatusOr<Step> Next(absl::string_view read) = 0;
};

struct RelayOptions {
  // Where each accepted connection is relayed to: "unix:PATH", "unix:@NAME" (abstract) or "host:port".
  std::string dial;
  // Whether the handshake runs on the accepted connection (then the dial follows it), or on the
  // dialed one (the dial comes first).
  bool handshake_on_accepted = true;
  std::function<std::unique_ptr<RelayHandshake>()> handshake;
  std::chrono::milliseconds handshake_timeout{10000};  // from accept to relaying, the dial included
  int max_pending = 1024;
  int max_relayed = 1024;
  size_t buffer_bytes = 64 << 10;  // per direction of a relayed connection
  bool nodelay_accepted = false;   // TCP_NODELAY on accepted connections (TCP ones)
  // Accepts only connections from this very process (a Unix socket's peer credentials): for a
  // socket in the abstract namespace, which any local process may connect to.
  bool this_process_only = false;
};

class RelayLoop {
 public:
  // Serves `listen_fd`, a listening socket it takes over, on a thread of its own.
  static absl::StatusOr<std::unique_ptr<RelayLoop>> Start(int listen_fd, RelayOptions options);
  // Closes the listening socket and every connection, and joins the thread.
  ~RelayLoop();
  RelayLoop(const RelayLoop&) = delete;
  RelayLoop& operator=(const RelayLoop&) = delete;

  // Connections in their handshake (or its dial) now, and past it now.
  int pending() const { return pending_count_.load(); }
  int relayed() const { return relayed_count_.load(); }
  // Connections closed before they were relayed so far: a failed or unfinished handshake, a dial
  // that failed, the oldest pending one making way for a newer one, one beyond max_relayed.
  int64_t turned_away() const { return turned_away_.load(); }

 private:
  struct Conn;
  explicit RelayLoop(int listen_fd, RelayOptions options);
  void Run();
  void Accept();
  // Takes `c` through its states as far as its sockets allow, closing it where something failed.
  void Advance(Conn& c);
  // Starts connecting `c` to options_.dial.
  absl::Status Dial(Conn& c);
  // Whether the handshake is over, or waits for its socket; an error where it failed.
  absl::StatusOr<bool> Handshake(Conn& c);
  // At the end of `c`'s handshake: counts it relayed from now on, or closes it where max_relayed
  // are (false).
  bool Admit(Conn& c);
  // Both ends connected and the handshake over: gives `c` its buffers.
  void StartRelay(Conn& c);
  // Moves what it can both ways: false once the connection is over (both ways closed, or broken).
  bool Relay(Conn& c);
  void Close(uint64_t id, bool turned_away);
  // Closes the oldest connection still in its handshake: whether there was one.
  bool EvictOldestPending();
  // The next deadline of a pending connection, or of the paused listener.
  int WaitMs() const;
  void ExpirePending();

  const RelayOptions options_;
  const int listen_fd_;
  int epoll_fd_ = -1;
  WakeFd stop_;
  std::thread thread_;
  // The loop thread's alone once it started (no lock: no other thread touches them).
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;  // by id: oldest first
  std::set<uint64_t> pending_;                       // ids of those not relayed yet
  uint64_t next_id_ = 1;
  std::optional<Deadline> listener_paused_until_;  // out of descriptors: accepting rests until then
  std::atomic<int> pending_count_{0}, relayed_count_{0};
  std::atomic<int64_t> turned_away_{0};
};

// A path for a Unix socket in a new directory only this user may enter (mode 0700) under the
// system's temporary directory; the directory and what it holds go with the object. Those of
// killed processes (their socket of the same name older than a minute, nothing listening) are
// removed when the next is made.
class PrivateSocketPath {
 public:
  static absl::StatusOr<std::unique_ptr<PrivateSocketPath>> Make(absl::string_view name);
  ~PrivateSocketPath();
  PrivateSocketPath(const PrivateSocketPath&) = delete;
  PrivateSocketPath& operator=(const PrivateSocketPath&) = delete;
  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }

 private:
  PrivateSocketPath(std::string dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)) {}
  std::string dir_, path_;
};

// A listening Unix socket at `path`, or in the abstract namespace for "@name" (close-on-exec,
// non-blocking).
absl::StatusOr<int> ListenUnix(const std::string& path);

}  // namespace longhaul
