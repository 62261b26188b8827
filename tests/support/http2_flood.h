#pragma once
// Test helper: HTTP/2 written by hand, as an attacker without the job secret would send it to the
// coordinator's port: the connection preface, SETTINGS, HEADERS and CONTINUATION frames of HPACK
// literal fields, DATA (RFC 9113, RFC 7541). Each attack returns what it sent and whether the
// server cut it off; none waits longer than kFloodPatience for a server that stops reading.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/loopback.h"

namespace longhaul::testing::h2 {

inline constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
enum FrameType : uint8_t {
  kData = 0,
  kHeaders = 1,
  kRstStream = 3,
  kSettings = 4,
  kPing = 6,
  kGoAway = 7,
  kWindowUpdate = 8,
  kContinuation = 9
};
inline constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
inline constexpr size_t kMaxFrame = 16384;  // the default SETTINGS_MAX_FRAME_SIZE
inline constexpr int kFloodPatienceS = 10;

// A frame: 24-bit length, type, flags, 31-bit stream id (big-endian), payload.
inline std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  const size_t n = payload.size();
  std::string f = {static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n),
                   static_cast<char>(type), static_cast<char>(flags),
                   static_cast<char>(stream >> 24 & 0x7f), static_cast<char>(stream >> 16),
                   static_cast<char>(stream >> 8), static_cast<char>(stream)};
  return f + payload;
}

// An HPACK integer with a `prefix_bits` prefix in a first byte that starts as `first`.
inline std::string Integer(uint64_t v, int prefix_bits, uint8_t first) {
  const uint64_t max = (1u << prefix_bits) - 1;
  if (v < max) return std::string(1, static_cast<char>(first | v));
  std::string out(1, static_cast<char>(first | max));
  for (v -= max; v >= 128; v >>= 7) out.push_back(static_cast<char>((v & 127) | 128));
  out.push_back(static_cast<char>(v));
  return out;
}

// A literal header field without indexing, its name new (RFC 7541 6.2.2): nothing the decoder
// could refer to later, so each costs the server what it keeps of it.
inline std::string Literal(const std::string& name, const std::string& value) {
  return Integer(0, 4, 0) + Integer(name.size(), 7, 0) + name + Integer(value.size(), 7, 0) + value;
}

// A gRPC request's header block for `path`, then `fields` fields of `value_bytes` each.
inline std::string RequestHeaders(const std::string& path, int fields = 0, size_t value_bytes = 0) {
  std::string block = Literal(":method", "POST") + Literal(":scheme", "http") + Literal(":path", path) +
                      Literal(":authority", "coordinator") + Literal("content-type", "application/grpc") +
                      Literal("te", "trailers");
  for (int i = 0; i < fields; ++i) block += Literal("x-flood-" + std::to_string(i), std::string(value_bytes, 'v'));
  return block;
}

// A loopback connection whose reads and writes give up after kFloodPatienceS, or -1.
inline int Connect(const std::string& address) {
  const int fd = ConnectLoopback(address);
  if (fd < 0) return -1;
  const timeval patience{kFloodPatienceS, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &patience, sizeof(patience));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  return fd;
}

// Whether all of `bytes` went out (false: the server closed or reset the connection, or stopped
// reading for kFloodPatienceS).
inline bool SendAll(int fd, const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t w = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

struct FloodResult {
  int64_t sent = 0;         // bytes that went out, over every connection
  int cut_off = 0;          // connections the server closed or reset before the attack was through
  int connections = 0;      // opened
};

// (a) One connection: a HEADERS frame without END_HEADERS, then CONTINUATION frames full of small
// literal fields, `bytes` in all; the header block never ends.
inline FloodResult ContinuationChain(const std::string& address, int64_t bytes) {
  FloodResult r;
  const int fd = Connect(address);
  if (fd < 0) return r;
  r.connections = 1;
  std::string fields;
  while (fields.size() + 120 < kMaxFrame) fields += Literal("x-abc", std::string(100, 'v'));
  const std::string chunk = Frame(kContinuation, 0, 1, fields);
  bool open = SendAll(fd, kPreface + Frame(kSettings, 0, 0, "") + Frame(kHeaders, 0, 1, RequestHeaders("/x")));
  while (open && r.sent < bytes) {
    open = SendAll(fd, chunk);
    if (open) r.sent += static_cast<int64_t>(chunk.size());
  }
  r.cut_off = open ? 0 : 1;
  close(fd);
  return r;
}

// One call's connection that follows the server's flow control: reads its frames (SETTINGS,
// WINDOW_UPDATE, PING answered as a client must) and sends DATA as far as the windows allow, until
// the message is out and the server answered or closed.
class FlowControlledCall {
 public:
  FlowControlledCall(int fd, std::string message) : fd_(fd), message_(std::move(message)) {}
  // Bytes sent; `*cut_off`: the server closed the connection before the message was out.
  int64_t Run(const std::string& path, bool* cut_off) {
    *cut_off = true;
    if (!SendAll(fd_, kPreface + Frame(kSettings, 0, 0, "") +
                          Frame(kHeaders, kEndHeaders, 1, RequestHeaders(path)))) {
      return 0;
    }
    size_t offset = 0;
    for (;;) {
      while (offset < message_.size() && std::min(conn_window_, stream_window_) > 0) {
        const size_t n = std::min<size_t>({kMaxFrame, message_.size() - offset,
                                           static_cast<size_t>(std::min(conn_window_, stream_window_))});
        const bool last = offset + n == message_.size();
        if (!SendAll(fd_, Frame(kData, last ? kEndStream : 0, 1, message_.substr(offset, n)))) return offset;
        offset += n;
        conn_window_ -= static_cast<int64_t>(n);
        stream_window_ -= static_cast<int64_t>(n);
      }
      uint8_t head[9];
      if (!ReadExactly(head, 9)) return offset;
      const size_t length = size_t{head[0]} << 16 | size_t{head[1]} << 8 | head[2];
      std::string payload(length, '\0');
      if (!ReadExactly(payload.data(), length)) return offset;
      const uint8_t type = head[3], flags = head[4];
      const uint32_t stream =
          (uint32_t{head[5]} & 0x7f) << 24 | uint32_t{head[6]} << 16 | uint32_t{head[7]} << 8 | head[8];
      if (type == kSettings && !(flags & kAck)) {
        for (size_t i = 0; i + 6 <= payload.size(); i += 6) {
          if (payload[i] == 0 && payload[i + 1] == 4) {  // SETTINGS_INITIAL_WINDOW_SIZE
            const int64_t size = Word(payload, i + 2);
            stream_window_ += size - initial_window_;
            initial_window_ = size;
          }
        }
        if (!SendAll(fd_, Frame(kSettings, kAck, 0, ""))) return offset;
      } else if (type == kWindowUpdate && payload.size() == 4) {
        (stream == 0 ? conn_window_ : stream_window_) += Word(payload, 0) & 0x7fffffff;
      } else if (type == kPing && !(flags & kAck)) {
        if (!SendAll(fd_, Frame(kPing, kAck, 0, payload))) return offset;
      } else if (type == kGoAway || type == kRstStream || (type == kHeaders && (flags & kEndStream))) {
        *cut_off = offset < message_.size();
        return offset;  // the call is over: refused, or answered
      }
    }
  }

 private:
  static int64_t Word(const std::string& b, size_t at) {
    return int64_t{static_cast<uint8_t>(b[at])} << 24 | int64_t{static_cast<uint8_t>(b[at + 1])} << 16 |
           int64_t{static_cast<uint8_t>(b[at + 2])} << 8 | static_cast<uint8_t>(b[at + 3]);
  }
  bool ReadExactly(void* to, size_t n) {
    for (size_t got = 0; got < n;) {
      const ssize_t r = recv(fd_, static_cast<char*>(to) + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }
  const int fd_;
  const std::string message_;
  int64_t conn_window_ = 65535, stream_window_ = 65535, initial_window_ = 65535;
};

// (b) `calls` unsigned gRPC calls of `path` at once, each on its own connection with a message of
// `message_bytes` (5-byte gRPC prefix, then the bytes).
inline FloodResult LargeCalls(const std::string& address, const std::string& path, int calls, size_t message_bytes) {
  std::string message = {0, static_cast<char>(message_bytes >> 24), static_cast<char>(message_bytes >> 16),
                         static_cast<char>(message_bytes >> 8), static_cast<char>(message_bytes)};
  message += std::string(message_bytes, 'm');
  std::atomic<int64_t> sent{0};
  std::atomic<int> cut_off{0}, connections{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < calls; ++i) {
    threads.emplace_back([&] {
      const int fd = Connect(address);
      if (fd < 0) return;
      ++connections;
      bool cut = false;
      sent += FlowControlledCall(fd, message).Run(path, &cut);
      cut_off += cut;
      close(fd);
    });
  }
  for (std::thread& t : threads) t.join();
  return FloodResult{sent.load(), cut_off.load(), connections.load()};
}

// (c) `connections` connections at once, each opening `streams` streams whose HEADERS carry
// `fields` literal fields of `value_bytes` each and never end their requests. Every connection
// stays open until all are through (or cut off), then `hold` runs, then they close.
template <typename Hold>
inline FloodResult HeadersFlood(const std::string& address, int connections, int streams, int fields,
                                size_t value_bytes, Hold hold) {
  const std::string block = RequestHeaders("/longhaul.proto.Coordinator/Heartbeat", fields, value_bytes);
  std::atomic<int64_t> sent{0};
  std::atomic<int> cut_off{0}, opened{0};
  std::vector<int> fds(static_cast<size_t>(connections), -1);
  constexpr int kThreads = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int c = t; c < connections; c += kThreads) {
        const int fd = fds[static_cast<size_t>(c)] = Connect(address);
        if (fd < 0) continue;
        ++opened;
        bool open = SendAll(fd, kPreface + Frame(kSettings, 0, 0, ""));
        for (int s = 0; open && s < streams; ++s) {
          const std::string frame = Frame(kHeaders, kEndHeaders, static_cast<uint32_t>(2 * s + 1), block);
          open = SendAll(fd, frame);
          if (open) sent += static_cast<int64_t>(frame.size());
        }
        cut_off += !open;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  hold();
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  return FloodResult{sent.load(), cut_off.load(), opened.load()};
}

}  // namespace longhaul::testing::h2
