// The framed TCP data plane on loopback: tensors round-trip in every wire dtype (int8 included) and over several connections; a
// peer of another job is refused with both job ids named; garbage bytes on the port close only
// their own connection; crafted headers (sizes that wrap, sizes beyond what the receiver admits,
// streams that stop after their header, duplicates, replays, iterations outside the window) are
// refused before anything is allocated and leave nothing behind; a cancelled send ends at once.
#include "transport/tensor_transport.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

#include "tests/support/garbage_socket.h"
#include "tests/support/process_memory.h"
#include "tests/support/raw_tensor_peer.h"
#include "transport/socket_io.h"

namespace longhaul {
namespace {

const AnyTensorUpTo kAnySize(uint64_t{1} << 23);

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.001f * static_cast<float>(i)) * 3.0f;
  return v;
}

proto::TensorHeader Header(int kind, int micro) {
  proto::TensorHeader h;
  h.set_kind(static_cast<proto::TensorKind>(kind));
  h.set_iteration(5);
  h.set_micro_batch(micro);
  h.set_from_stage(1);
  h.set_from_replica(0);
  return h;
}

TensorKey Key(int kind, int micro) { return {kind, 5, micro, 1, 0, 0}; }

TEST(TensorTransport, RoundTripsInEveryDtypeOverSeveralConnections) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<float> x = Ramp(3'000'001);  // 12 MB, odd length, several chunks per part
  int micro = 0;
  for (WireDtype d : {WireDtype::kF32, WireDtype::kF16, WireDtype::kBf16, WireDtype::kInt8}) {
    TransportOptions opt;
    opt.job_id = "jobA", opt.dtype = d, opt.connections = 3, opt.chunk_bytes = 1 << 20;
    TensorClient client((*server)->address(), opt);
    auto op = client.Send(Header(proto::ACTIVATION, micro), x.data(), x.size());
    ASSERT_TRUE(op->Wait().ok()) << op->Wait();
    auto got = box.Take(Key(proto::ACTIVATION, micro), std::chrono::seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), x.size());
    if (d == WireDtype::kInt8) {
      // Parts are encoded alone, cut where int8's blocks fall in the whole tensor: what arrives is
      // what a worker rounds its own copy to (RoundThroughWire), bit for bit.
      std::vector<float> own = x;
      RoundThroughWire(own.data(), own.data(), own.size(), d);
      ASSERT_EQ(*got, own);
      ++micro;
      continue;
    }
    // fp16 keeps 11 significant bits, bf16 8: relative error bounds 2^-11 and 2^-8.
    const double tol = d == WireDtype::kF32 ? 0.0 : (d == WireDtype::kF16 ? 4.9e-4 : 3.9e-3);
    for (size_t i = 0; i < x.size(); i += 997) ASSERT_LE(std::abs((*got)[i] - x[i]), tol * std::abs(x[i]) + 1e-7) << i;
    ++micro;
  }
  EXPECT_EQ((*server)->refused(), 0);
}

// A boundary's gradient in int4 rounds stochastically (wire_dtype.h), an activation to the nearest:
// values 0.3 of a step above a level arrive with their mean kept (the activation's all on the
// level), and the same gradient sent again (a resend after a recovery) over another number of
// connections arrives bit for bit as before.
TEST(TensorTransport, Int4GradientsRoundStochasticallyAndAResendCarriesTheSameBits) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<float> x(1'000'000, 2.3f);
  for (size_t b = 0; b < x.size(); b += kScaleBlock) x[b] = 7.0f;  // each block's step: 1
  auto receive = [&](int kind, int micro, int connections) {
    TransportOptions opt;
    opt.job_id = "jobA", opt.dtype = WireDtype::kInt4, opt.connections = connections, opt.chunk_bytes = 1 << 16;
    EXPECT_TRUE(TensorClient((*server)->address(), opt).Send(Header(kind, micro), x.data(), x.size())->Wait().ok());
    auto got = box.Take(Key(kind, micro), std::chrono::seconds(10));
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : std::vector<float>();
  };
  auto mean = [&](const std::vector<float>& y) {
    double sum = 0, count = 0;
    for (size_t i = 0; i < y.size(); ++i)
      if (i % kScaleBlock != 0) sum += y[i], ++count;
    return sum / count;
  };
  const std::vector<float> gradient = receive(proto::GRADIENT, 0, 3);
  ASSERT_EQ(gradient.size(), x.size());
  EXPECT_NEAR(mean(gradient), 2.3, 0.005);
  EXPECT_EQ(mean(receive(proto::ACTIVATION, 0, 3)), 2.0);
  EXPECT_EQ(receive(proto::GRADIENT, 0, 1), gradient);
}

// A boundary tensor in int4 is encoded by the connection's thread as it is written, and arrives
// as the wire rounds it; a gradient push is encoded before Send returns, so its buffer is the
// caller's again at once: overwritten then, the push still arrives as it was sent.
TEST(TensorTransport, APushIsEncodedBeforeSendReturnsABoundaryTensorAsItIsWritten) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok()) << server.status();
  TransportOptions opt;
  opt.job_id = "jobA", opt.dtype = WireDtype::kInt4, opt.connections = 2, opt.chunk_bytes = 1 << 16;
  TensorClient client((*server)->address(), opt);
  const std::vector<float> x = Ramp(1'000'000);
  std::vector<float> want(x.size());
  RoundThroughWire(x.data(), want.data(), x.size(), WireDtype::kInt4);
  for (const int kind : {proto::ACTIVATION, proto::GRAD_PUSH}) {
    std::vector<float> sent = x;
    std::shared_ptr<SendOp> op = client.Send(Header(kind, 0), sent.data(), sent.size());
    if (kind == proto::GRAD_PUSH) std::fill(sent.begin(), sent.end(), std::nanf(""));
    ASSERT_TRUE(op->Wait().ok());
    auto got = box.Take(Key(kind, 0), std::chrono::seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == want) << proto::TensorKind_Name(static_cast<proto::TensorKind>(kind));
  }
}

// A boundary tensor encoded as it is written goes in a part per MiB on the wire whatever the
// connections (one part's encoding runs while the kernel sends the last), anything else in a part
// per connection and MiB; a tiny tensor whole.
TEST(TensorTransport, ABoundaryTensorEncodedAsWrittenGoesInAPartPerMiB) {
  const size_t n = 2048 * 2048;  // a GPT-3 XL activation: 2.2 MB in int4, 16.8 MB in fp32
  EXPECT_EQ(TensorParts(n, proto::ACTIVATION, WireDtype::kInt4, 1), 2u);
  EXPECT_EQ(TensorParts(n, proto::GRADIENT, WireDtype::kInt4, 4), 2u);
  EXPECT_EQ(TensorParts(n, proto::GRAD_PUSH, WireDtype::kInt4, 1), 1u);
  EXPECT_EQ(TensorParts(n, proto::ACTIVATION, WireDtype::kF32, 1), 1u);
  EXPECT_EQ(TensorParts(n, proto::ACTIVATION, WireDtype::kF32, 4), 4u);
  EXPECT_EQ(TensorParts(1000, proto::ACTIVATION, WireDtype::kInt4, 4), 1u);
  EXPECT_TRUE(EncodedAsWritten(proto::EVAL_ACTIVATION, WireDtype::kBf16));
  EXPECT_FALSE(EncodedAsWritten(proto::ACTIVATION, WireDtype::kF32));
  EXPECT_FALSE(EncodedAsWritten(proto::PARAMS, WireDtype::kBf16));
}

TEST(TensorTransport, StrangerFromAnotherJobIsRefusedAndTheServerGoesOn) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok());
  TransportOptions stranger;
  stranger.job_id = "jobB";
  stranger.timeout = std::chrono::milliseconds(5000);
  const std::vector<float> x = Ramp(1000);
  absl::Status s = TensorClient((*server)->address(), stranger).Send(Header(proto::GRADIENT, 0), x.data(), x.size())->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the peer runs job 'jobB'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("this worker runs job 'jobA'"), std::string::npos) << s;
  EXPECT_EQ((*server)->refused(), 1);

  TransportOptions friendly;
  friendly.job_id = "jobA";
  ASSERT_TRUE(TensorClient((*server)->address(), friendly).Send(Header(proto::GRADIENT, 0), x.data(), x.size())->Wait().ok());
  EXPECT_TRUE(box.Take(Key(proto::GRADIENT, 0), std::chrono::seconds(5)).ok());
}

// A worker moving to the next plan version reopens its mailbox: what it held and a Close are gone,
// a part sent under the old version is refused with both versions named, and one of the new is
// taken; a reservation the reopen forgot cannot be completed or abandoned by its old stream.
TEST(TensorTransport, AReopenedMailboxTakesOnlyTheNewPlanVersion) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok());
  TransportOptions opt;
  opt.job_id = "jobA";
  const std::vector<float> x = Ramp(1000);
  proto::TensorHeader h = Header(proto::ACTIVATION, 0);
  h.set_plan_version(1);
  ASSERT_TRUE(TensorClient((*server)->address(), opt).Send(h, x.data(), x.size())->Wait().ok());
  box.Close("plan version 2 replaces version 1");
  box.Reopen(2);
  EXPECT_EQ(box.HeldFloats(), 0u);
  const absl::Status old = TensorClient((*server)->address(), opt).Send(h, x.data(), x.size())->Wait();
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition) << old;
  EXPECT_NE(old.message().find("is of plan version 1; this worker runs plan version 2"), std::string::npos) << old;
  h.set_plan_version(2);
  ASSERT_TRUE(TensorClient((*server)->address(), opt).Send(h, x.data(), x.size())->Wait().ok());
  auto got = box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);

  ASSERT_TRUE(box.BeginPart(Key(proto::GRADIENT, 0), 2, 10, 0, 10).ok());
  box.Reopen(3);
  ASSERT_TRUE(box.BeginPart(Key(proto::GRADIENT, 0), 3, 10, 0, 10).ok());
  box.AbandonPart(Key(proto::GRADIENT, 0), 2, 0);
  EXPECT_FALSE(box.CompletePart(Key(proto::GRADIENT, 0), 2, 0, std::vector<float>(10, 1.0f)).ok());
  ASSERT_TRUE(box.CompletePart(Key(proto::GRADIENT, 0), 3, 0, std::vector<float>(10, 2.0f)).ok());
  auto mine = box.Take(Key(proto::GRADIENT, 0), std::chrono::seconds(1));
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ((*mine)[0], 2.0f);
}

// A sender whose connection closes after its tensors were admitted is reported with the place and
// the plan version its last header gave: the coordinator maps only the running version's places
// onto workers (a connection of the version before may close after its receiver began the next).
TEST(TensorTransport, ASenderThatLeavesIsNamedWithItsPlaceAndPlanVersion) {
  Mailbox box;
  box.Reopen(3);
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok());
  std::mutex mu;
  std::vector<TensorServer::Sender> left;
  (*server)->SetSenderLeftObserver([&](const TensorServer::Sender& s) {
    std::lock_guard<std::mutex> lock(mu);
    left.push_back(s);
  });
  TransportOptions opt;
  opt.job_id = "jobA";
  const std::vector<float> x = Ramp(100);
  proto::TensorHeader h = Header(proto::ACTIVATION, 0);
  h.set_plan_version(3);
  h.set_from_stage(2);
  h.set_from_replica(1);
  {
    TensorClient client((*server)->address(), opt);
    ASSERT_TRUE(client.Send(h, x.data(), x.size())->Wait().ok());
  }
  for (int i = 0; i < 1000; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!left.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(left.size(), 1u) << "the closed connection was not reported within 10 s";
  EXPECT_EQ(left[0].stage, 2);
  EXPECT_EQ(left[0].replica, 1);
  EXPECT_EQ(left[0].plan_version, 3u);
}

// Admits tensors of one plan version, which the test moves on; newer ones are ahead of it.
class OneVersion : public AnyTensorUpTo {
 public:
  OneVersion() : AnyTensorUpTo(uint64_t{1} << 23) {}
  absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& h, int) const override {
    if (h.plan_version() != version) {
      return absl::FailedPreconditionError(absl::StrFormat("plan version %d, not %d", h.plan_version(), version.load()));
    }
    return h.total_elements();
  }
  bool Ahead(const proto::TensorHeader& h, std::chrono::steady_clock::duration) const override {
    return h.plan_version() > version;
  }
  bool Stale(const proto::TensorHeader& h) const override { return h.plan_version() < version; }
  std::atomic<uint64_t> version{1};
};

// A part of a version the receiver has left is read and dropped: its sender hears so, and the
// connection carries the next version's tensors (a refusal would have closed it).
TEST(TensorTransport, APartOfAVersionLeftIsDroppedAndItsConnectionStays) {
  Mailbox box;
  OneVersion admission;
  admission.version = 2;
  box.Reopen(2);
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &admission);
  ASSERT_TRUE(server.ok());
  TransportOptions opt;
  opt.job_id = "jobA";
  const std::vector<float> x = Ramp(5000);
  TensorClient client((*server)->address(), opt);
  proto::TensorHeader h = Header(proto::ACTIVATION, 0);
  h.set_plan_version(1);
  const absl::Status old = client.Send(h, x.data(), x.size())->Wait();
  EXPECT_EQ(old.code(), absl::StatusCode::kAborted) << old;
  EXPECT_NE(old.message().find("dropped: this worker has left plan version 1"), std::string::npos) << old;
  EXPECT_EQ(box.HeldFloats(), 0u);
  h.set_plan_version(2);
  ASSERT_TRUE(client.Send(h, x.data(), x.size())->Wait().ok());
  auto got = box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);
  EXPECT_EQ((*server)->refused(), 0) << "the drop was counted as a refusal";
  // A stale part whose bytes do not match its checksum (more or fewer than announced) is no drop:
  // the stream is out of step, and its connection closes with the reason.
  proto::TensorHeader stale = h;
  stale.set_job_id("jobA");
  stale.set_protocol_version(kProtocolVersion);
  stale.set_dtype(proto::F32);
  stale.set_plan_version(1);
  stale.set_total_elements(10);
  stale.set_part_offset(0);
  stale.set_part_elements(10);
  std::string corrupt = testing::PartFrame(stale, Ramp(10));
  corrupt[corrupt.size() - 20] ^= 0x40;
  testing::RawPeer peer((*server)->address(), "jobA");
  ASSERT_TRUE(peer.hello().ok()) << peer.hello();
  peer.Write(corrupt);
  const absl::Status bad = peer.Ack();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_NE(bad.message().find("checksum mismatch"), std::string::npos) << bad;
}

// A resumed plan version has no start barrier: a tensor of a version the receiver has yet to set up
// waits in its server until it has, and is refused only where it never comes (the part timeout).
TEST(TensorTransport, ATensorOfAVersionNotYetSetUpWaitsForIt) {
  Mailbox box;
  OneVersion admission;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &admission);
  ASSERT_TRUE(server.ok());
  (*server)->SetPartTimeout(std::chrono::milliseconds(300));
  TransportOptions opt;
  opt.job_id = "jobA";
  const std::vector<float> x = Ramp(1000);
  proto::TensorHeader h = Header(proto::ACTIVATION, 0);
  h.set_plan_version(2);
  TensorClient client((*server)->address(), opt);
  std::shared_ptr<SendOp> op = client.Send(h, x.data(), x.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(op->Done()) << "admitted before its version was set up: " << op->Wait();
  box.Close("plan version 2 replaces version 1");
  box.Reopen(2);
  admission.version = 2;
  ASSERT_TRUE(op->Wait().ok()) << op->Wait();
  auto got = box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);

  h.set_plan_version(3);
  const absl::Status never = client.Send(h, x.data(), x.size())->Wait();
  EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition) << never;
  EXPECT_NE(never.message().find("plan version 3, not 2"), std::string::npos) << never;
}

// A job secret written for a test (JobSecret::Load refuses files others may read).
JobSecret TestSecret(const std::string& name) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/secret_", name, "_", getpid());
  std::remove(path.c_str());
  EXPECT_TRUE(JobSecret::WriteNew(path).ok());
  auto secret = JobSecret::Load(path);
  EXPECT_TRUE(secret.ok()) << secret.status();
  std::remove(path.c_str());
  return secret.value_or(JobSecret());
}

// Raises this process's limit of open files towards `wanted`: the limit now.
rlim_t AllowOpenFiles(rlim_t wanted) {
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < wanted) {
    files.rlim_cur = std::min(files.rlim_max, wanted);
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
  }
  return files.rlim_cur;
}

// The tensor port takes only peers that prove they hold the job secret: none, another, and a
// recorded handshake replayed byte for byte are refused before anything is read past the hello,
// and the receiver holds no memory for them; a sender finds out, before sending a byte of tensor,
// that a receiver without the secret is no peer of its job.
// A stranger that opens as many connections as a server serves at once and never says hello does
// not keep the job's peers out: the oldest connection still in its hello gives way to each newer
// one.
TEST(TensorTransport, StrangersHoldingEveryConnectionGiveWayToAPeerOfTheJob) {
  constexpr int kStrangers = 512;  // the server's limit
  if (const rlim_t allowed = AllowOpenFiles(4 * kStrangers); allowed < 4 * kStrangers) {
    GTEST_SKIP() << "needs " << 4 * kStrangers << " open files (ulimit -n), allowed " << allowed;
  }
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok()) << server.status();
  const int64_t rss = testing::ResidentBytes();
  const auto [host, port] = *SplitHostPort((*server)->address());
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host.c_str(), &at.sin_addr);
  std::vector<int> strangers;
  for (int i = 0; i < kStrangers; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0) << strerror(errno);
    strangers.push_back(fd);
  }
  // Every stranger's connection is served before the peer's comes.
  for (int i = 0; i < 500 && (*server)->refused() == 0; ++i) {
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(connect(probe, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0) << strerror(errno);
    strangers.push_back(probe);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE((*server)->refused(), 1) << "the server never reached its limit";
  std::cout << "at the limit: " << (*server)->last_refusal() << "\n";
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(5);
  const std::vector<float> x = Ramp(100);
  const absl::Status s = TensorClient((*server)->address(), opt).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5)).ok());
  EXPECT_NE((*server)->last_refusal().find("gave way to a newer one"), std::string::npos) << (*server)->last_refusal();
  // A connection in its hello holds a thread and nothing sized by what a stranger says.
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "with " << strangers.size() << " silent connections: resident memory grew by " << grew / 1024
            << " KiB\n";
  EXPECT_LT(grew, 64 << 20);
  for (int fd : strangers) close(fd);
}

// Strangers whose hellos are refused and who never read why hold their connections only until a
// newer one needs the room: a flood of them does not keep the job's peers out while the server
// waits for each to read its refusal.
TEST(TensorTransport, RefusedHellosNobodyReadsGiveWayToAPeerOfTheJob) {
  if (const rlim_t allowed = AllowOpenFiles(4 * kMaxTensorConnections); allowed < 4 * kMaxTensorConnections) {
    GTEST_SKIP() << "needs " << 4 * kMaxTensorConnections << " open files (ulimit -n), allowed " << allowed;
  }
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string hello = testing::HelloFrame("jobB") + std::string(kNonceBytes + kHelloIdentityBytes, 'x');
  // Each refused connection waits a while for its peer to read why; the flood keeps within that
  // while, in batches the server's accept queue takes whole (a connection beyond it would wait for
  // its SYN to be sent again).
  std::vector<int> strangers;
  for (int i = 0; i < kMaxTensorConnections; ++i) {
    const int fd = testing::ConnectLoopback((*server)->address(), "127.0.0.2");
    ASSERT_GE(fd, 0) << "cannot connect from 127.0.0.2: " << strerror(errno);
    ASSERT_EQ(write(fd, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
    strangers.push_back(fd);
    for (int waited = 0; i % 32 == 31 && (*server)->refused() <= i - 32 && waited < 1000; ++waited) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  for (int i = 0; i < 10000 && (*server)->refused() < kMaxTensorConnections; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::cout << (*server)->refused() << " refused, the last: " << (*server)->last_refusal() << "\n";
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(5);
  const std::vector<float> x = Ramp(100);
  const absl::Status s = TensorClient((*server)->address(), opt).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5)).ok());
  for (int fd : strangers) close(fd);
}

TEST(TensorTransport, PeersWithoutTheJobSecretAreRefusedAndNothingIsAllocated) {
  const JobSecret secret = TestSecret("a"), other = TestSecret("b");
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize, secret);
  ASSERT_TRUE(server.ok());
  const std::vector<float> x = Ramp(1000);
  const int64_t rss = testing::ResidentBytes();
  for (const JobSecret* wrong : {static_cast<const JobSecret*>(nullptr), &other}) {
    for (int i = 0; i < 50; ++i) {
      testing::RawPeer peer((*server)->address(), "jobA", wrong == nullptr ? JobSecret() : *wrong);
      ASSERT_EQ(peer.hello().code(), absl::StatusCode::kPermissionDenied) << peer.hello();
      ASSERT_NE(peer.hello().message().find("does not hold this job's secret"), std::string::npos) << peer.hello();
      // The refusal closes the connection: a tensor written after it goes nowhere.
      peer.Write(testing::PartFrame(Header(proto::ACTIVATION, 0), x));
      EXPECT_TRUE(absl::IsUnavailable(peer.Ack(std::chrono::seconds(5))));
    }
  }
  testing::RawPeer honest((*server)->address(), "jobA", secret);
  ASSERT_TRUE(honest.hello().ok()) << honest.hello();
  for (int i = 0; i < 50; ++i) {
    testing::RawPeer replay((*server)->address(), "");
    replay.Write(honest.handshake());
    ASSERT_TRUE(replay.Ack().ok()) << "the hello itself is fine";
    ASSERT_TRUE(replay.Discard(testing::kChallengeBytes).ok());
    const absl::Status s = replay.Ack();
    ASSERT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  }
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "150 refused handshakes: resident memory grew by " << grew / 1024 << " KiB\n";
  EXPECT_LT(grew, 4 << 20);
  EXPECT_EQ(box.HeldFloats(), 0u);
  EXPECT_EQ((*server)->refused(), 150);

  TransportOptions sender;
  sender.job_id = "jobA";
  sender.timeout = std::chrono::seconds(10);
  sender.secret = other;
  absl::Status s = TensorClient((*server)->address(), sender).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("nothing was sent"), std::string::npos) << s;
  sender.secret = secret;
  s = TensorClient((*server)->address(), sender).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
  ASSERT_TRUE(s.ok()) << s;
  auto got = box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);
}

// A job's members as a test gives them: each worker's key, share of connections and whether the
// plan places it; a worker dropped was lost, any other is not heard of. It admits any tensor of
// at most 2^23 elements, and records which worker sent each.
class Roster : public TensorAdmission {
 public:
  struct Entry {
    std::string key;
    int share = 4;
    bool placed = true;
  };
  void Set(int worker, Entry e) {
    absl::MutexLock lock(&mu_);
    entries_[worker] = std::move(e);
  }
  void Drop(int worker) {
    absl::MutexLock lock(&mu_);
    entries_.erase(worker);
    lost_.insert(worker);
  }
  absl::Status Member(int worker, absl::string_view key) const override {
    absl::MutexLock lock(&mu_);
    if (lost_.count(worker)) return absl::PermissionDeniedError(absl::StrFormat("worker %d was lost", worker));
    const auto e = entries_.find(worker);
    if (e == entries_.end()) return absl::UnavailableError(absl::StrFormat("worker %d is no member", worker));
    if (e->second.key != key) return absl::PermissionDeniedError(absl::StrFormat("worker %d: another key", worker));
    return absl::OkStatus();
  }
  Share ShareOf(int worker) const override {
    absl::MutexLock lock(&mu_);
    const Entry& e = entries_.at(worker);
    return {e.share, e.placed};
  }
  absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& h, int sender) const override {
    absl::MutexLock lock(&mu_);
    senders_.push_back(sender);
    return kAnySize.Admit(h, sender);
  }
  std::vector<int> senders() const {
    absl::MutexLock lock(&mu_);
    return senders_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::set<int> lost_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<int> senders_ ABSL_GUARDED_BY(mu_);
};

std::shared_ptr<const WorkerKey> NewKey() { return std::make_shared<const WorkerKey>(WorkerKey::Generate().value()); }

// Options of job "jobA" of worker `worker` signing with `key`, each send waiting at most 10 s.
TransportOptions As(int worker, std::shared_ptr<const WorkerKey> key) {
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(10);
  opt.worker_id = worker;
  opt.key = std::move(key);
  return opt;
}

// Each side's signature covers the job, both nonces and both ends, under a label of its side: it
// verifies for that hello alone.
TEST(TensorTransport, AHelloSignatureStandsForItsOwnHelloAndSideAlone) {
  const std::shared_ptr<const WorkerKey> key = NewKey();
  const HelloTranscript t{"jobA", std::string(kNonceBytes, 's'), std::string(kNonceBytes, 'r'), 3, 7};
  const std::string sig = SignHello(*key, HelloSide::kSender, t);
  EXPECT_TRUE(HelloSignatureValid(key->public_key(), sig, HelloSide::kSender, t));
  EXPECT_FALSE(HelloSignatureValid(key->public_key(), sig, HelloSide::kReceiver, t)) << "stands for the other side";
  const std::vector<std::pair<const char*, std::function<void(HelloTranscript&)>>> changes = {
      {"another receiver", [](HelloTranscript& o) { o.receiver = 8; }},
      {"another sender", [](HelloTranscript& o) { o.sender = 4; }},
      {"another nonce", [](HelloTranscript& o) { o.receiver_nonce[0] = 'x'; }},
      {"another job", [](HelloTranscript& o) { o.job = "jobB"; }},
  };
  for (const auto& [what, change] : changes) {
    HelloTranscript other = t;
    change(other);
    EXPECT_FALSE(HelloSignatureValid(key->public_key(), sig, HelloSide::kSender, other)) << what;
  }
  EXPECT_FALSE(HelloSignatureValid(NewKey()->public_key(), sig, HelloSide::kSender, t)) << "another key";
}

// A receiver admits the worker its membership gives the key the sender signs with, and tells its
// admission that worker with every header. A worker it has not heard of waits a moment for the
// news (then is refused, naming it), and so does nothing else; another key, or a lost worker, is
// refused at once. Nothing is allocated for any refused one.
TEST(TensorTransport, AReceiverAdmitsOnlyAWorkerOfItsMembershipByItsKey) {
  const std::shared_ptr<const WorkerKey> receiver_key = NewKey(), member = NewKey();
  Mailbox box;
  Roster roster;
  roster.Set(3, {member->public_key()});
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &roster, JobSecret(), receiver_key);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->SetWorkerId(7);
  const PeerIdentity seven{7, receiver_key->public_key()};
  const std::vector<float> x = Ramp(100);
  ASSERT_TRUE(TensorClient((*server)->address(), As(3, member), seven).Send(Header(proto::ACTIVATION, 0), x.data(),
                                                                           x.size())->Wait().ok());
  EXPECT_TRUE(box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5)).ok());
  EXPECT_EQ(roster.senders(), std::vector<int>{3});

  auto refused = [&](const TransportOptions& opt) {
    return TensorClient((*server)->address(), opt, seven).Send(Header(proto::ACTIVATION, 1), x.data(), x.size())->Wait();
  };
  absl::Status s = refused(As(3, NewKey()));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("worker 3: another key"), std::string::npos) << s;
  const auto asked = std::chrono::steady_clock::now();
  s = refused(As(9, NewKey()));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("worker 9 is no member"), std::string::npos) << s;
  EXPECT_GE(std::chrono::steady_clock::now() - asked, TensorServer::kUnheardMemberPatience);
  // News of a member that comes while its hello waits lets it in.
  const std::shared_ptr<const WorkerKey> late = NewKey();
  std::thread news([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    roster.Set(11, {late->public_key()});
  });
  s = TensorClient((*server)->address(), As(11, late), seven).Send(Header(proto::ACTIVATION, 1), x.data(), x.size())->Wait();
  news.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(box.Take(Key(proto::ACTIVATION, 1), std::chrono::seconds(5)).ok());
  roster.Drop(3);
  s = refused(As(3, member));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("worker 3 was lost"), std::string::npos) << s;
  EXPECT_EQ(box.HeldFloats(), 0u);
  EXPECT_EQ(roster.senders(), (std::vector<int>{3, 11}));
  EXPECT_EQ((*server)->refused(), 3);
}

// A sender checks, before it sends a byte of tensor, that the receiver proves it is the worker it
// means to reach by the key the job gave that worker.
TEST(TensorTransport, ASenderSendsNothingToAnotherWorkerThanTheOneItMeans) {
  const std::shared_ptr<const WorkerKey> receiver_key = NewKey(), member = NewKey();
  Mailbox box;
  Roster roster;
  roster.Set(3, {member->public_key()});
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &roster, JobSecret(), receiver_key);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->SetWorkerId(7);
  const std::vector<float> x = Ramp(100);
  for (const PeerIdentity& meant : {PeerIdentity{8, receiver_key->public_key()}, PeerIdentity{7, NewKey()->public_key()}}) {
    const absl::Status s =
        TensorClient((*server)->address(), As(3, member), meant).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find(absl::StrFormat("is worker 7%s, not worker %d",
                                               meant.worker_id == 7 ? " with another key than the job's" : "",
                                               meant.worker_id)),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("nothing was sent"), std::string::npos) << s;
  }
  EXPECT_TRUE(roster.senders().empty()) << "a header reached the receiver";
  EXPECT_EQ(box.HeldFloats(), 0u);
}

// A member holds at most its share of a receiver's connections. When every connection is taken,
// a new one takes the place of one still in its hello, else of a member's the plan does not place,
// else of a placed member's beyond its share; never of a placed member's within its share.
TEST(TensorTransport, AMembersConnectionsBeyondItsShareGiveWayToAPlacedPeer) {
  if (const rlim_t allowed = AllowOpenFiles(4 * kMaxTensorConnections); allowed < 4 * kMaxTensorConnections) {
    GTEST_SKIP() << "needs " << 4 * kMaxTensorConnections << " open files (ulimit -n), allowed " << allowed;
  }
  const std::shared_ptr<const WorkerKey> placed = NewKey(), spare = NewKey(), other = NewKey();
  Mailbox box;
  Roster roster;
  roster.Set(3, {placed->public_key(), 2, true});
  roster.Set(5, {spare->public_key(), kMaxTensorConnections, false});
  roster.Set(6, {other->public_key(), kMaxTensorConnections, true});
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &roster);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  std::vector<std::unique_ptr<testing::RawPeer>> held;
  auto connect = [&](int worker, const std::shared_ptr<const WorkerKey>& key) {
    held.push_back(std::make_unique<testing::RawPeer>(address, "jobA", JobSecret(), testing::Speaker{worker, key}));
    return held.back()->hello();
  };
  const int64_t rss = testing::ResidentBytes();
  // The spare takes every connection but worker 3's first: worker 3's second pushes out its oldest.
  ASSERT_TRUE(connect(3, placed).ok());
  for (int i = 1; i < kMaxTensorConnections; ++i) ASSERT_TRUE(connect(5, spare).ok()) << i;
  absl::Status s = connect(3, placed);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(held[1]->Answered()) << "the spare's oldest connection is still open";
  std::cout << (*server)->last_refusal() << "\n";
  EXPECT_NE((*server)->last_refusal().find("a connection of worker 5, which the plan does not place now, gave way"),
            std::string::npos)
      << (*server)->last_refusal();
  // Worker 3 holds its share: a third is refused, naming it.
  s = connect(3, placed);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("worker 3 holds 2 connections"), std::string::npos) << s;
  // Worker 6, placed, takes every connection but worker 3's first, within its share: a newer
  // connection finds none to take the place of...
  held.clear();
  ASSERT_TRUE(connect(3, placed).ok());
  for (int i = 1, tries = 0; i < kMaxTensorConnections && tries < 1000; ++tries) {
    if (connect(6, other).ok()) {
      ++i;
    } else {
      // The connections closed above not yet ended at the server.
      held.pop_back();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ASSERT_EQ(held.size(), static_cast<size_t>(kMaxTensorConnections));
  s = connect(3, placed);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("beyond the 512"), std::string::npos) << s;
  held.pop_back();
  // ... until a new plan gives worker 6 less: then its connections beyond that give way.
  roster.Set(6, {other->public_key(), 1, true});
  s = connect(3, placed);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_NE((*server)->last_refusal().find("a connection of worker 6, one of 511 where its share is 1, gave way"),
            std::string::npos)
      << (*server)->last_refusal();
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "with " << kMaxTensorConnections << " proven connections: resident memory grew by " << grew / 1024
            << " KiB\n";
  EXPECT_LT(grew, 64 << 20);
}

TEST(TensorTransport, PeerOfAnotherProtocolVersionIsRefusedNamingBoth) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok());
  testing::RawPeer old((*server)->address(), "");
  old.Write(testing::HelloFrame("jobA", kProtocolVersion - 1));
  const absl::Status s = old.Ack();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(absl::StrFormat("protocol version %d, this worker", kProtocolVersion - 1)),
            std::string::npos)
      << s;
  EXPECT_TRUE(absl::IsUnavailable(old.Ack(std::chrono::seconds(5)))) << "and the connection is closed";
}

TEST(TensorTransport, GarbageOnThePortClosesOnlyThatConnection) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok());
  TransportOptions opt;
  opt.job_id = "jobA";
  TensorClient client((*server)->address(), opt);  // connected before the garbage arrives
  const std::vector<float> x = Ramp(5000);
  ASSERT_TRUE(client.Send(Header(proto::PARAMS, 0), x.data(), x.size())->Wait().ok());

  EXPECT_TRUE(testing::GarbageConnectionIsClosed((*server)->address())) << "the server should close it";

  ASSERT_TRUE(client.Send(Header(proto::PARAMS, 1), x.data(), x.size())->Wait().ok());
  auto a = box.Take(Key(proto::PARAMS, 0), std::chrono::seconds(5));
  auto b = box.Take(Key(proto::PARAMS, 1), std::chrono::seconds(5));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*b, x);
}

// A receiver of job "jobA" that takes tensors of at most 2^20 elements.
struct SmallReceiver {
  SmallReceiver() {
    auto started = TensorServer::Start("127.0.0.1:0", "jobA", &box, &small);
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server = *std::move(started);
  }
  Mailbox box;
  const AnyTensorUpTo small{1 << 20};
  std::unique_ptr<TensorServer> server;
};

TEST(TensorTransport, ARefusedLargeTensorReachesItsSenderWithTheReason) {
  // The receiver refuses at the header while the sender still has most of 64 MiB to write: the
  // reason must come back, not a reset connection.
  SmallReceiver receiver;
  ASSERT_NE(receiver.server, nullptr);
  TransportOptions opt;
  opt.job_id = "jobA";
  const std::vector<float> big(16 << 20, 1.0f);
  const absl::Status s = TensorClient(receiver.server->address(), opt).Send(Header(proto::ACTIVATION, 0), big.data(),
                                                                           big.size())->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("this receiver takes 1 to 1048576"), std::string::npos) << s;
}

// A sender that waits for its sends only later hears of a failure at once, from the thread that
// saw it, once per tensor whatever its parts; a cancellation (a plan version's end) is no failure.
TEST(TensorTransport, ASendTellsItsObserverOfAFailureOnceAndOfACancellationNever) {
  SmallReceiver receiver;
  ASSERT_NE(receiver.server, nullptr);
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.connections = 4;
  std::atomic<int> told{0};
  absl::Status heard;
  std::mutex mu;
  auto observe = [&](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    heard = s;
    ++told;
  };
  const std::vector<float> big(16 << 20, 1.0f);  // 4 parts, each refused
  const absl::Status s =
      TensorClient(receiver.server->address(), opt).Send(Header(proto::ACTIVATION, 0), big.data(), big.size(), observe)->Wait();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(told, 1);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(heard, s);
  }

  TransportOptions cancellable;
  cancellable.timeout = std::chrono::seconds(60);
  cancellable.canceller = std::make_shared<SendCanceller>();
  TensorClient nowhere("127.0.0.1:1", cancellable);  // nobody listens: the send waits for the peer
  auto op = nowhere.Send(Header(proto::ACTIVATION, 0), big.data(), 10, observe);
  cancellable.canceller->Cancel("plan version 2 replaces version 1");
  EXPECT_EQ(op->Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(told, 1) << "a cancellation was told as a failure";
}

TEST(TensorTransport, APartThatStallsAfterItsHeaderIsDroppedAtThePartTimeout) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok());
  (*server)->SetPartTimeout(std::chrono::milliseconds(300));
  proto::TensorHeader h = Header(proto::ACTIVATION, 0);
  h.set_job_id("jobA");
  h.set_protocol_version(kProtocolVersion);
  h.set_dtype(proto::F32);
  h.set_total_elements(1000);
  h.set_part_elements(1000);
  testing::RawPeer stalled((*server)->address(), "jobA");
  ASSERT_TRUE(stalled.hello().ok());
  stalled.Write(testing::HeaderFrame(h) + std::string(100, '\0'));  // 100 of its 4000 bytes, then nothing
  const absl::Status s = stalled.Ack(std::chrono::seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(box.HeldFloats(), 0u);
  const std::vector<float> x = Ramp(1000);
  TransportOptions opt;
  opt.job_id = "jobA";
  ASSERT_TRUE(TensorClient((*server)->address(), opt).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait().ok())
      << "the stalled part's reservation is gone";
}

TEST(TensorTransport, UnreachablePeerFailsAtTheDeadlineNamingIt) {
  TransportOptions opt;
  opt.timeout = std::chrono::milliseconds(700);
  const std::vector<float> x = Ramp(10);
  absl::Status s = TensorClient("127.0.0.1:1", opt).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("to 127.0.0.1:1"), std::string::npos) << s;
}

TEST(Mailbox, TakeTimesOutAndCloseWakesWaiters) {
  Mailbox box;
  auto r = box.Take(Key(proto::ACTIVATION, 3), std::chrono::milliseconds(50));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("activation of iteration 5, micro-batch 3"), std::string::npos);
  box.Close("job aborted");
  EXPECT_EQ(box.Take(Key(proto::ACTIVATION, 3), std::chrono::seconds(5)).status().code(), absl::StatusCode::kAborted);
}

// A header as a peer could craft it: every size as given, nothing checked.
proto::TensorHeader Crafted(int64_t iteration, uint64_t total, uint64_t offset, uint64_t n) {
  proto::TensorHeader h = Header(proto::ACTIVATION, 0);
  h.set_job_id("jobA");
  h.set_protocol_version(kProtocolVersion);
  h.set_dtype(proto::F32);
  h.set_iteration(iteration);
  h.set_total_elements(total);
  h.set_part_offset(offset);
  h.set_part_elements(n);
  return h;
}

// A flood of connections from one address that never say hello pushes out its own, not a far
// peer of the job from another address whose hello is under way (a round trip on a slow link).
TEST(TensorTransport, AFloodFromOneAddressPushesOutItsOwnConnectionsNotAnotherPeersHello) {
  constexpr int kFlood = 612;  // 100 beyond the server's limit
  if (const rlim_t allowed = AllowOpenFiles(4 * kFlood); allowed < 4 * kFlood) {
    GTEST_SKIP() << "needs " << 4 * kFlood << " open files (ulimit -n), allowed " << allowed;
  }
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok()) << server.status();
  testing::RawPeer far((*server)->address(), "");
  ASSERT_TRUE(far.Write(testing::HelloFrame("jobA").substr(0, 4)));  // the rest is a round trip away
  std::vector<int> flood;
  for (int i = 0; i < kFlood; ++i) {
    const int fd = testing::ConnectLoopback((*server)->address(), "127.0.0.2");
    ASSERT_GE(fd, 0) << "cannot connect from 127.0.0.2: " << strerror(errno);
    flood.push_back(fd);
  }
  const int evictions = kFlood + 1 - 512;
  for (int i = 0; i < 500 && (*server)->refused() < evictions; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::cout << "after " << kFlood << " connections from 127.0.0.2: " << (*server)->refused()
            << " refused, the last: " << (*server)->last_refusal() << "\n";
  ASSERT_GE((*server)->refused(), evictions) << "the server never reached its limit";
  const absl::Status hello = far.Hello("jobA", JobSecret(), 4);
  EXPECT_TRUE(hello.ok()) << hello;
  const std::vector<float> x = Ramp(100);
  ASSERT_TRUE(far.Write(testing::PartFrame(Crafted(5, x.size(), 0, x.size()), x)));
  const absl::Status ack = far.Ack();
  EXPECT_TRUE(ack.ok()) << ack;
  EXPECT_TRUE(box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5)).ok());
  for (int fd : flood) close(fd);
}

// A part admitted under one version whose receiver moves to the next while its bytes come (the new
// version's mailbox has no place for it): dropped as a stale part is, and the connection carries
// the next version's part. Refused, it closed the connection under that next part.
TEST(TensorTransport, APartWhoseVersionIsLeftWhileItArrivesIsDroppedAndItsConnectionStays) {
  // Counts the parts it lets in: the server reserves each in the mailbox right after.
  struct CountingVersion : OneVersion {
    absl::StatusOr<uint64_t> Admit(const proto::TensorHeader& h, int sender) const override {
      ++admitted;
      return OneVersion::Admit(h, sender);
    }
    mutable std::atomic<int> admitted{0};
  };
  Mailbox box;
  CountingVersion admission;
  box.Reopen(1);
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &admission);
  ASSERT_TRUE(server.ok());
  testing::RawPeer peer((*server)->address(), "jobA");
  ASSERT_TRUE(peer.hello().ok()) << peer.hello();
  const std::vector<float> x = Ramp(5000);
  proto::TensorHeader h = Crafted(5, x.size(), 0, x.size());
  h.set_plan_version(1);
  const std::string frame = testing::PartFrame(h, x);
  const size_t half = frame.size() / 2;
  ASSERT_TRUE(peer.Write(frame.substr(0, half)));
  // Admitted, then reserved in version 1's mailbox on the same thread (a moment is plenty; were
  // it not yet reserved, version 2's mailbox would refuse it and the test fail, not pass).
  for (int i = 0; i < 500 && admission.admitted == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(admission.admitted, 1) << "the part was never admitted";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  admission.version = 2;
  box.Reopen(2);
  ASSERT_TRUE(peer.Write(frame.substr(half)));
  const absl::Status dropped = peer.Ack(std::chrono::seconds(10));
  EXPECT_EQ(dropped.code(), absl::StatusCode::kAborted) << dropped;
  EXPECT_NE(dropped.message().find("dropped: this worker has left plan version 1"), std::string::npos) << dropped;
  h.set_plan_version(2);
  ASSERT_TRUE(peer.Write(testing::PartFrame(h, x)));
  EXPECT_TRUE(peer.Ack(std::chrono::seconds(10)).ok()) << "the connection did not carry the next version's part";
  auto got = box.Take(Key(proto::ACTIVATION, 0), std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);
  EXPECT_EQ((*server)->refused(), 0) << "the drop was counted as a refusal";
}

// The receiver's answer to one crafted part on a connection of its own.
absl::Status SendCrafted(const std::string& address, const proto::TensorHeader& h, const std::vector<float>& values) {
  testing::RawPeer peer(address, "jobA");
  if (!peer.hello().ok()) return peer.hello();
  peer.Write(testing::PartFrame(h, values));
  return peer.Ack();
}

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = TensorServer::Start("127.0.0.1:0", "jobA", &box_, &kAnySize);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  // The server still receives a well-formed tensor.
  void ExpectStillServes(int64_t iteration) {
    TransportOptions opt;
    opt.job_id = "jobA";
    proto::TensorHeader h = Header(proto::ACTIVATION, 0);
    h.set_iteration(iteration);
    const std::vector<float> x = Ramp(1000);
    ASSERT_TRUE(TensorClient(server_->address(), opt).Send(h, x.data(), x.size())->Wait().ok());
    auto got = box_.Take({proto::ACTIVATION, iteration, 0, 1, 0, 0}, std::chrono::seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, x);
  }
  Mailbox box_;
  std::unique_ptr<TensorServer> server_;
};

TEST_F(Hostile, PartOffsetThatWrapsAroundIsRefused) {
  // offset + elements wraps to 1 in uint64: a check written as offset + n > total lets it through
  // and the receiver writes before its buffer.
  const absl::Status s =
      SendCrafted(server_->address(), Crafted(5, 5, std::numeric_limits<uint64_t>::max(), 2), {1.0f, 2.0f});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find("does not fit a tensor of 5 elements"), std::string::npos) << s.message();
  EXPECT_EQ(box_.HeldFloats(), 0u);
  ExpectStillServes(6);
}

TEST_F(Hostile, SizeBeyondWhatTheReceiverAdmitsIsRefusedBeforeAllocating) {
  const int64_t rss = testing::ResidentBytes();
  const uint64_t huge = uint64_t{1} << 34;  // 64 GiB of floats
  const absl::Status s = SendCrafted(server_->address(), Crafted(5, huge, 0, huge), {1.0f});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s.message();
  EXPECT_NE(s.message().find("17179869184"), std::string::npos) << s.message();
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "resident memory grew by " << grew / 1024 << " KiB\n";
  EXPECT_LT(grew, 16 << 20);
  ExpectStillServes(6);
}

// Peers that each say hello and send one header, then nothing.
std::vector<std::unique_ptr<testing::RawPeer>> HeaderOnlyPeers(const std::string& address, uint64_t n) {
  std::vector<std::unique_ptr<testing::RawPeer>> peers;
  for (int it = 0; it < 3; ++it) {
    peers.push_back(std::make_unique<testing::RawPeer>(address, "jobA"));
    EXPECT_TRUE(peers.back()->hello().ok()) << peers.back()->hello();
    peers.back()->Write(testing::HeaderFrame(Crafted(it, n, 0, n)));
  }
  return peers;
}

TEST_F(Hostile, StreamsThatStopAfterTheirHeaderHoldNoMemoryAndLeaveNothingBehind) {
  const int64_t rss = testing::ResidentBytes();
  const uint64_t n = uint64_t{1} << 23;  // the most the receiver admits: 32 MiB each
  auto peers = HeaderOnlyPeers(server_->address(), n);
  // A second stream for a part already reserved is refused: proof the first one's header is in.
  const absl::Status dup = SendCrafted(server_->address(), Crafted(0, n, 0, n), std::vector<float>(n, 1.0f));
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists) << dup.message();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (auto& p : peers) EXPECT_FALSE(p->Answered()) << "the header-only streams stay open";
  EXPECT_EQ(box_.HeldFloats(), 0u);
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "3 header-only streams of " << n * 4 / (1 << 20) << " MiB each: resident memory grew by "
            << grew / 1024 << " KiB\n";
  EXPECT_LT(grew, 64 << 20) << "the refused duplicate's bytes may be buffered, nothing more";
  for (auto& p : peers) p->Close();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the receiver notices they went
  // Abandoned: the same parts can now arrive for real.
  const std::vector<float> x = Ramp(n);
  for (int it = 0; it < 3; ++it) {
    const absl::Status s = SendCrafted(server_->address(), Crafted(it, n, 0, n), x);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(box_.Take({proto::ACTIVATION, it, 0, 1, 0, 0}, std::chrono::seconds(5)).ok());
  }
}

TEST_F(Hostile, ShutdownEndsStreamsThatStopAfterTheirHeader) {
  auto peers = HeaderOnlyPeers(server_->address(), 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  server_->Shutdown();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "shutdown with 3 header-only streams open took " << took << " s\n";
  EXPECT_LT(took, 10);  // it hung forever once, when such a stream held 64 GiB
  for (auto& p : peers) EXPECT_TRUE(absl::IsUnavailable(p->Ack(std::chrono::seconds(5)))) << "closed without an answer";
  EXPECT_EQ(box_.HeldFloats(), 0u);
}

TEST_F(Hostile, DuplicateAndOverlappingPartsAreRefused) {
  const std::vector<float> x = Ramp(100);
  const std::vector<float> lo(x.begin(), x.begin() + 50), hi(x.begin() + 50, x.end());
  EXPECT_TRUE(SendCrafted(server_->address(), Crafted(5, 100, 0, 50), lo).ok());
  // Twice the first half would add up to 100 elements with the second half never written.
  const absl::Status again = SendCrafted(server_->address(), Crafted(5, 100, 0, 50), lo);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again.message();
  const absl::Status overlap =
      SendCrafted(server_->address(), Crafted(5, 100, 25, 50), std::vector<float>(x.begin() + 25, x.begin() + 75));
  EXPECT_EQ(overlap.code(), absl::StatusCode::kAlreadyExists) << overlap.message();
  const absl::Status other_total = SendCrafted(server_->address(), Crafted(5, 120, 50, 50), hi);
  EXPECT_EQ(other_total.code(), absl::StatusCode::kInvalidArgument) << other_total.message();
  EXPECT_TRUE(SendCrafted(server_->address(), Crafted(5, 100, 50, 50), hi).ok());
  auto got = box_.Take({proto::ACTIVATION, 5, 0, 1, 0, 0}, std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);
}

TEST_F(Hostile, ReplaysAndIterationsOutsideTheWindowAreRefused) {
  box_.SetWindow(5);
  const std::vector<float> x = Ramp(10);
  ASSERT_TRUE(SendCrafted(server_->address(), Crafted(5, 10, 0, 10), x).ok());
  ASSERT_TRUE(box_.Take({proto::ACTIVATION, 5, 0, 1, 0, 0}, std::chrono::seconds(5)).ok());
  EXPECT_EQ(SendCrafted(server_->address(), Crafted(5, 10, 0, 10), x).code(), absl::StatusCode::kAlreadyExists);
  for (int64_t it : {int64_t{4}, int64_t{7}, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
    const absl::Status s = SendCrafted(server_->address(), Crafted(it, 10, 0, 10), x);
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << it << ": " << s.message();
  }
  ASSERT_TRUE(SendCrafted(server_->address(), Crafted(6, 10, 0, 10), x).ok());
  box_.SetWindow(7);  // iteration 6 was never taken: moving on drops it
  EXPECT_EQ(box_.HeldFloats(), 0u);
  ExpectStillServes(7);
}

// The window of a run's start begins at iteration -1 (the initial parameters' broadcast), where
// INT64_MAX less its start overflowed and took the part in.
TEST(Mailbox, TheLastIterationIsOutsideAWindowFromMinusOne) {
  Mailbox box;
  box.SetWindow(-1);
  const absl::Status s =
      box.BeginPart({proto::ACTIVATION, std::numeric_limits<int64_t>::max(), 0, 1, 0, 0}, 1, 10, 0, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_TRUE(box.BeginPart({proto::ACTIVATION, 0, 0, 1, 0, 0}, 1, 10, 0, 10).ok());
}

// A part is refused exactly where it overlaps one reserved before (checked against every part,
// one by one, over random parts of one tensor), and 100000 one-element parts of one tensor are
// reserved (a scan over the parts already there made that 5·10^9 comparisons).
TEST(Mailbox, APartIsRefusedExactlyWhereItOverlapsAnother) {
  Mailbox box;
  const TensorKey key{proto::GRADIENT, 0, 0, 1, 0, 0};
  constexpr uint64_t kTotal = 1000;
  std::vector<std::pair<uint64_t, uint64_t>> taken;  // [offset, offset + n)
  uint64_t state = 12345;
  auto next = [&](uint64_t bound) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    return (state >> 33) % bound;
  };
  int accepted = 0;
  for (int i = 0; i < 2000; ++i) {
    const uint64_t offset = next(kTotal), n = 1 + next(std::min<uint64_t>(40, kTotal - offset));
    const bool overlaps = std::any_of(taken.begin(), taken.end(),
                                      [&](const auto& t) { return offset < t.second && t.first < offset + n; });
    const absl::Status s = box.BeginPart(key, 1, kTotal, offset, n);
    ASSERT_EQ(s.ok(), !overlaps) << "[" << offset << ", +" << n << "): " << s;
    if (overlaps) {
      EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
    } else {
      taken.emplace_back(offset, offset + n);
      ++accepted;
    }
  }
  EXPECT_GT(accepted, 20);

  const TensorKey many{proto::GRADIENT, 0, 0, 1, 0, 1};
  constexpr uint64_t kParts = 100000;
  for (uint64_t i = 0; i < kParts; ++i) ASSERT_TRUE(box.BeginPart(many, 1, kParts, i, 1).ok()) << i;
  EXPECT_EQ(box.BeginPart(many, 1, kParts, kParts / 2, 1).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(Hostile, OversizedHeadersExtraBytesAndBadChecksumsAreRefused) {
  proto::TensorHeader fat = Crafted(5, 10, 0, 10);
  for (int i = 0; i < 5000; ++i) fat.add_shape(i);
  EXPECT_EQ(SendCrafted(server_->address(), fat, Ramp(10)).code(), absl::StatusCode::kInvalidArgument);

  // Framing cannot tell extra bytes from a checksum: the first four of them are read as one.
  proto::TensorHeader ten = Crafted(6, 10, 0, 10);
  testing::RawPeer more(server_->address(), "jobA");
  more.Write(testing::HeaderFrame(ten) + std::string(reinterpret_cast<const char*>(Ramp(12).data()), 48));
  const absl::Status s1 = more.Ack();
  EXPECT_EQ(s1.code(), absl::StatusCode::kDataLoss) << s1.message();
  EXPECT_NE(s1.message().find("more or fewer bytes"), std::string::npos) << s1.message();

  std::string corrupt = testing::PartFrame(Crafted(7, 10, 0, 10), Ramp(10));
  corrupt[corrupt.size() - 20] ^= 0x40;
  testing::RawPeer flipped(server_->address(), "jobA");
  flipped.Write(corrupt);
  const absl::Status s2 = flipped.Ack();
  EXPECT_EQ(s2.code(), absl::StatusCode::kDataLoss) << s2.message();
  EXPECT_EQ(box_.HeldFloats(), 0u);
  // Each refused part's reservation went with its stream.
  for (int64_t it : {5, 6, 7}) ExpectStillServes(it);
}

// Quantized parts (int8, int4, int3, int2, and rotated: int3h, int2h, int1h) as a peer could craft them: sized by their blocks (a part one
// byte long is read as a bad checksum, never past its buffer), scales that are NaN decoded to NaN
// without a fault, a huge one refused before anything is allocated, and dtypes that do not exist
// (0 is the config-only "auto") refused by name.
TEST_F(Hostile, CraftedQuantizedPartsAndUnknownDtypes) {
  const std::vector<float> x = Ramp(300);
  int64_t it = 5;
  for (const auto& [dtype, d] : {std::pair{proto::INT8, WireDtype::kInt8}, std::pair{proto::INT4, WireDtype::kInt4},
                                std::pair{proto::INT3, WireDtype::kInt3}, std::pair{proto::INT2, WireDtype::kInt2},
                                std::pair{proto::INT3H, WireDtype::kInt3H}, std::pair{proto::INT2H, WireDtype::kInt2H},
                                std::pair{proto::INT1H, WireDtype::kInt1H}}) {
    SCOPED_TRACE(WireDtypeName(d));
    auto header = [dtype = dtype](int64_t at, uint64_t n) {
      proto::TensorHeader h = Crafted(at, n, 0, n);
      h.set_dtype(dtype);
      return h;
    };
    std::string wire(WireBytes(x.size(), d), '\0');
    EncodeWire(x.data(), x.size(), d, wire.data());
    testing::RawPeer good(server_->address(), "jobA");
    good.Write(testing::PartFrame(header(it, x.size()), wire));
    ASSERT_TRUE(good.Ack().ok()) << good.Ack();
    auto got = box_.Take({proto::ACTIVATION, it++, 0, 1, 0, 0}, std::chrono::seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<float> own = x;
    RoundThroughWire(own.data(), own.data(), own.size(), d);
    EXPECT_EQ(*got, own);

    testing::RawPeer long_part(server_->address(), "jobA");
    long_part.Write(testing::PartFrame(header(it++, x.size()), wire + '\x01'));
    EXPECT_EQ(long_part.Ack().code(), absl::StatusCode::kDataLoss);

    // of 512 or 1024 values, or of 128
    const size_t blocks = d == WireDtype::kInt2 || d == WireDtype::kInt2H || d == WireDtype::kInt1H ? 1 : 3;
    std::string nan_scales = wire;
    for (size_t b = 0; b < blocks; ++b) std::memset(&nan_scales[4 * b], 0xff, 4);  // every scale a NaN
    testing::RawPeer nans(server_->address(), "jobA");
    nans.Write(testing::PartFrame(header(it, x.size()), nan_scales));
    ASSERT_TRUE(nans.Ack().ok()) << nans.Ack();
    auto poisoned = box_.Take({proto::ACTIVATION, it++, 0, 1, 0, 0}, std::chrono::seconds(5));
    ASSERT_TRUE(poisoned.ok()) << poisoned.status();
    for (float v : *poisoned) ASSERT_TRUE(std::isnan(v));

    const int64_t rss = testing::ResidentBytes();
    const uint64_t huge = uint64_t{1} << 34;
    EXPECT_EQ(SendCrafted(server_->address(), header(it++, huge), {1.0f}).code(),
              absl::StatusCode::kResourceExhausted);
    const int64_t grew = testing::ResidentBytes() - rss;
    std::cout << "an " << WireDtypeName(d) << " part announcing 2^34 elements: resident memory grew by "
              << grew / 1024 << " KiB\n";
    EXPECT_LT(grew, 16 << 20);
  }

  for (int dtype : {0, 12, 255}) {
    proto::TensorHeader h = Crafted(it, 10, 0, 10);
    h.set_dtype(static_cast<proto::WireDtype>(dtype));
    const absl::Status s = SendCrafted(server_->address(), h, Ramp(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << dtype << ": " << s;
    EXPECT_NE(s.message().find("unknown wire dtype"), std::string::npos) << s;
  }
  EXPECT_EQ(box_.HeldFloats(), 0u);
  ExpectStillServes(it);
}

// topk parts as a peer could craft them: offsets past the chunk, repeated or out of order, decode
// within the tensor (the offsets past it are dropped), so a live receiver hands over exactly the
// tensor's elements and goes on serving.
TEST_F(Hostile, CraftedTopKPartsStayWithinTheirTensor) {
  const uint64_t n = 100;  // one chunk of 100: 4 values kept
  proto::TensorHeader h = Crafted(5, n, 0, n);
  h.set_dtype(proto::TOPK);
  std::string wire(WireBytes(n, WireDtype::kTopK), '\0');
  const uint16_t offsets[4] = {0xffff, 99, 100, 99};
  const uint16_t values[4] = {0x3f80, 0x4000, 0x4040, 0x4080};  // bf16 1, 2, 3, 4
  std::memcpy(wire.data(), offsets, 8);
  std::memcpy(wire.data() + 8, values, 8);
  testing::RawPeer peer(server_->address(), "jobA");
  peer.Write(testing::PartFrame(h, wire));
  ASSERT_TRUE(peer.Ack().ok()) << peer.Ack();
  auto got = box_.Take({proto::ACTIVATION, 5, 0, 1, 0, 0}, std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), n);
  std::vector<float> want(n, 0.0f);
  want[99] = 4.0f;  // the last of the repeated offset wins; 0xffff and 100 lie past the chunk
  EXPECT_EQ(*got, want);
  ExpectStillServes(6);
}

// A receiver that is no longhaul worker: it reads whatever comes and answers the n-th read with
// reply(what it read, n).
// An acknowledgement as a receiver writes it: its length (u32, little-endian), then its bytes.
std::string Framed(const proto::TensorAck& ack) {
  std::string frame;
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>((ack.ByteSizeLong() >> (8 * i)) & 0xff));
  return frame + ack.SerializeAsString();
}

std::string OkAck() {
  proto::TensorAck ok;
  ok.set_ok(true);
  return Framed(ok);
}

std::string RefusalAck(absl::StatusCode code, const std::string& error) {
  proto::TensorAck refusal;
  refusal.set_ok(false);
  refusal.set_code(static_cast<int32_t>(code));
  refusal.set_error(error);
  return Framed(refusal);
}

// What a fake receiver reads after the hello: the sender's proof, acknowledged, then parts, each
// answered once whole (its header's length, the header, its fp32 bytes and checksum) with
// ack_for(its number, from 1).
struct PartStream {
  std::string Feed(const std::string& got, const std::function<std::string(int)>& ack_for) {
    bytes += got;
    std::string acks;
    if (!proved && bytes.size() >= testing::kSenderProofBytes) {
      bytes.erase(0, testing::kSenderProofBytes);
      proved = true;
      acks += OkAck();
    }
    for (;;) {
      if (bytes.size() < 4) break;
      const uint32_t header_bytes = static_cast<uint8_t>(bytes[0]) | static_cast<uint8_t>(bytes[1]) << 8 |
                                    static_cast<uint8_t>(bytes[2]) << 16 | static_cast<uint32_t>(static_cast<uint8_t>(bytes[3])) << 24;
      proto::TensorHeader h;
      if (bytes.size() < 4 + header_bytes || !h.ParseFromArray(bytes.data() + 4, static_cast<int>(header_bytes))) break;
      const size_t whole = 4 + header_bytes + h.part_elements() * sizeof(float) + 4;
      if (bytes.size() < whole) break;
      bytes.erase(0, whole);
      acks += ack_for(++parts);
    }
    return acks;
  }
  std::string bytes;
  bool proved = false;
  std::atomic<int> parts{0};
};

// What a fake receiver of job "jobA" without a secret answers `hello` with, as worker 0.
std::string FakeChallenge(const std::string& hello) {
  static const WorkerKey key = WorkerKey::Generate().value();
  return testing::ReceiverChallenge(hello, JobSecret(), "jobA", key, 0);
}

class FakeReceiver {
 public:
  explicit FakeReceiver(std::function<std::string(const std::string&, int)> reply) : reply_(std::move(reply)) {
    const absl::StatusOr<int> listener = ListenTcp("127.0.0.1:0", &address_);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = listener.value_or(-1);
    thread_ = std::thread([this] {
      const int fd = accept(listener_, nullptr, nullptr);
      char buf[1 << 16];
      ssize_t got = 0;
      for (int n = 0; fd >= 0 && (got = read(fd, buf, sizeof(buf))) > 0; ++n) {
        const std::string reply = reply_(std::string(buf, static_cast<size_t>(got)), n);
        if (!reply.empty() && write(fd, reply.data(), reply.size()) < 0) break;
      }
      if (fd >= 0) close(fd);
    });
  }
  ~FakeReceiver() {
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  std::function<std::string(const std::string&, int)> reply_;
  std::string address_;
  int listener_ = -1;
  std::thread thread_;
};

// A receiver of job "jobA" that takes one connection, proves no secret (JobSecret()), and answers
// each whole part with ack_for(its number, from 1).
class PartReceiver {
 public:
  explicit PartReceiver(std::function<std::string(int)> ack_for)
      : ack_for_(std::move(ack_for)), receiver_([this](const std::string& got, int n) {
          if (n == 0) {
            return FakeChallenge(got);
          }
          return stream.Feed(got, ack_for_);
        }) {}
  std::string address() const { return receiver_.address(); }
  PartStream stream;

 private:
  std::function<std::string(int)> ack_for_;
  FakeReceiver receiver_;
};

// Options of job "jobA" whose sends a canceller ends, each waiting at most 3 s.
TransportOptions Cancellable() {
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(3);
  opt.canceller = std::make_shared<SendCanceller>();
  return opt;
}

// What a sender reads back is checked as a receiver checks what it reads: an acknowledgement that
// claims 4 GiB fails the send, names the peer as no longhaul worker, and allocates nothing.
// OpenSoon connects and says hello before the first tensor, which then waits for neither (a new
// plan version's first iteration on long links); without it nothing connects until a tensor.
TEST(TensorTransport, OpenSoonConnectsBeforeTheFirstTensor) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(at);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&at), &len), 0);
  TransportOptions opt;
  opt.timeout = std::chrono::seconds(2);
  {
    TensorClient client(absl::StrCat("127.0.0.1:", ntohs(at.sin_port)), opt);
    pollfd p{listener, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 300), 0) << "a connection before any tensor or OpenSoon";
    client.OpenSoon();
    ASSERT_EQ(poll(&p, 1, 5000), 1) << "OpenSoon did not connect";
    const int conn = accept(listener, nullptr, nullptr);
    ASSERT_GE(conn, 0);
    char hello[8];
    EXPECT_GT(recv(conn, hello, sizeof(hello), 0), 0) << "it connected but said no hello";
    close(conn);
  }
  close(listener);
}

TEST(TensorTransport, AReceiverThatAnswersWithGarbageFailsTheSendWithoutAllocating) {
  const std::string huge = std::string("\xff\xff\xff\xff") + std::string(64, 'x');
  proto::TensorAck ok;
  ok.set_ok(true);
  const std::string ok_frame = Framed(ok);
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(10);
  const std::vector<float> x = Ramp(1000);
  const int64_t rss = testing::ResidentBytes();
  {
    FakeReceiver at_hello([&](const std::string&, int n) { return n == 0 ? huge : ""; });
    const absl::Status s = TensorClient(at_hello.address(), opt).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("not a longhaul worker"), std::string::npos) << s;
  }
  {
    // It knows the (empty) secret and says so, accepts the sender's proof, then answers the part
    // with garbage (the part follows the proof without waiting for its acknowledgement).
    FakeReceiver at_part([&](const std::string& got, int n) {
      if (n == 0) return FakeChallenge(got);
      return n == 1 ? ok_frame + huge : std::string();
    });
    const absl::Status s = TensorClient(at_part.address(), opt).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("no acknowledgement"), std::string::npos) << s;
  }
  const int64_t grew = testing::ResidentBytes() - rss;
  std::cout << "two garbage receivers: resident memory grew by " << grew / 1024 << " KiB\n";
  EXPECT_LT(grew, 16 << 20);
}

// The first part follows the sender's proof at once, one round trip after the hello; a receiver
// that refuses the proof fails that part with its reason.
TEST(TensorTransport, TheFirstPartFollowsTheProofWithoutWaitingForItsAcknowledgement) {
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(10);
  const std::vector<float> x = Ramp(1000);
  std::string after_hello;
  std::mutex mu;
  const std::string refusal_frame =
      RefusalAck(absl::StatusCode::kPermissionDenied, "refused: the peer does not hold this job's secret");
  {
    // It proves itself, then says nothing until the part's bytes are in: the proof's
    // acknowledgement comes only then, and it is a refusal.
    FakeReceiver receiver([&](const std::string& got, int n) {
      if (n == 0) return FakeChallenge(got);
      std::lock_guard<std::mutex> lock(mu);
      after_hello += got;
      return after_hello.size() >= testing::kSenderProofBytes + x.size() * sizeof(float) ? refusal_frame
                                                                                          : std::string();
    });
    const absl::Status s = TensorClient(receiver.address(), opt).Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find("does not hold this job's secret"), std::string::npos) << s;
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_GT(after_hello.size(), testing::kSenderProofBytes + x.size() * sizeof(float))
      << "the part was not sent before the proof was acknowledged";
}

// Small parts leave from the caller's thread while earlier ones await their acknowledgements
// (TensorClient's connection thread polls meanwhile): each acknowledgement still completes its own
// part, in order. The receiver answers part 1 only with part 2, and refuses part 2.
TEST(TensorTransport, APartSentWhileAnEarlierAwaitsItsAcknowledgementGetsItsOwn) {
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(10);
  const std::vector<float> x = Ramp(10);
  const std::string refusal_frame = RefusalAck(absl::StatusCode::kInvalidArgument, "part 2 is refused");
  PartReceiver receiver([&](int part) { return part == 1 ? "" : part == 2 ? OkAck() + refusal_frame : OkAck(); });
  TensorClient client(receiver.address(), opt);
  std::shared_ptr<SendOp> first = client.Send(Header(proto::ACTIVATION, 0), x.data(), x.size());
  for (int i = 0; i < 400 && receiver.stream.parts < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(receiver.stream.parts, 1) << "the first part never reached the receiver";
  EXPECT_FALSE(first->Done());
  std::shared_ptr<SendOp> second = client.Send(Header(proto::ACTIVATION, 1), x.data(), x.size());
  EXPECT_TRUE(first->Wait().ok()) << first->Wait();
  const absl::Status s = second->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("part 2 is refused"), std::string::npos) << s;
}

// Thousands of tensors sent back to back without waiting, small ones (written by the caller where
// the connection allows) between larger ones (written by the connection's thread): every one
// arrives whole, bit for bit, and is acknowledged.
TEST(TensorTransport, SmallAndLargeTensorsInterleavedArriveWhole) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box, &kAnySize);
  ASSERT_TRUE(server.ok()) << server.status();
  TransportOptions opt;
  opt.job_id = "jobA";
  opt.timeout = std::chrono::seconds(10);  // a part lost between the threads fails within it
  TensorClient client((*server)->address(), opt);
  const std::vector<float> x = Ramp(6000);  // 24 KB: above the caller's 16 KiB
  const size_t sizes[] = {1, 100, 6000, 3};
  constexpr int kTensors = 3000;
  std::vector<std::shared_ptr<SendOp>> ops;
  for (int i = 0; i < kTensors; ++i) ops.push_back(client.Send(Header(proto::ACTIVATION, i), x.data(), sizes[i % 4]));
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(ops[i]->Wait().ok()) << i << ": " << ops[i]->Wait();
    auto got = box.Take(Key(proto::ACTIVATION, i), std::chrono::seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, std::vector<float>(x.begin(), x.begin() + sizes[i % 4])) << i;
  }
  EXPECT_EQ((*server)->refused(), 0);
}

// A plan version's end cancels its sends; a connection it found between tensors stays open, and
// the next version's canceller rearms it. The receiver takes one connection only: a client that
// connected again would wait out its timeout for a hello that never comes.
TEST(SendCanceller, AConnectionBetweenTensorsServesTheNextCancellerWithoutConnectingAgain) {
  const TransportOptions opt = Cancellable();
  const std::vector<float> x = Ramp(10);
  PartReceiver receiver([](int) { return OkAck(); });
  TensorClient client(receiver.address(), opt);
  ASSERT_TRUE(client.Send(Header(proto::ACTIVATION, 0), x.data(), x.size())->Wait().ok());
  opt.canceller->Cancel("plan version 2 replaces version 1");
  const absl::Status cancelled = client.Send(Header(proto::ACTIVATION, 1), x.data(), x.size())->Wait();
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled) << cancelled;
  client.Rearm(std::make_shared<SendCanceller>());
  const absl::Status again = client.Send(Header(proto::ACTIVATION, 1), x.data(), x.size())->Wait();
  EXPECT_TRUE(again.ok()) << again << " (it connected again)";
}

// Cancelled while its part, written whole, awaits an acknowledgement (a plan version given up with
// sends in flight): the connection stays, that acknowledgement is read and dropped when it comes,
// and the next version's part goes on the same connection (the receiver takes one only).
TEST(SendCanceller, AConnectionWhosePartsWereWrittenWholeOutlivesTheCancellation) {
  const TransportOptions opt = Cancellable();
  const std::vector<float> x = Ramp(10);
  // The first part's acknowledgement comes only with the second's.
  PartReceiver receiver([](int part) { return part == 1 ? "" : part == 2 ? OkAck() + OkAck() : OkAck(); });
  TensorClient client(receiver.address(), opt);
  std::shared_ptr<SendOp> first = client.Send(Header(proto::ACTIVATION, 0), x.data(), x.size());
  for (int i = 0; i < 200 && receiver.stream.parts < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(receiver.stream.parts, 1) << "the first part never reached the receiver";
  EXPECT_FALSE(first->Done());
  opt.canceller->Cancel("plan version 2 replaces version 1");
  const absl::Status cancelled = first->Wait();
  EXPECT_EQ(cancelled.code(), absl::StatusCode::kCancelled) << cancelled;
  client.Rearm(std::make_shared<SendCanceller>());
  const absl::Status again = client.Send(Header(proto::ACTIVATION, 1), x.data(), x.size())->Wait();
  EXPECT_TRUE(again.ok()) << again << " (it connected again, or took the dropped acknowledgement for its own)";
  const absl::Status third = client.Send(Header(proto::ACTIVATION, 2), x.data(), x.size())->Wait();
  EXPECT_TRUE(third.ok()) << third;
  EXPECT_EQ(receiver.stream.parts, 3);
}

TEST(SendCanceller, EndsSendsInFlightAtOnceAndRefusesLaterOnes) {
  TransportOptions opt;
  opt.timeout = std::chrono::seconds(60);
  opt.canceller = std::make_shared<SendCanceller>();
  const std::vector<float> x = Ramp(10);
  TensorClient client("127.0.0.1:1", opt);  // nobody listens: the send waits for the peer
  auto op = client.Send(Header(proto::ACTIVATION, 0), x.data(), x.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  opt.canceller->Cancel("the coordinator stopped the job");
  const absl::Status s = op->Wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "cancelled send returned after " << waited << " s\n";
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_NE(s.message().find("the coordinator stopped the job"), std::string::npos) << s;
  const absl::Status later = client.Send(Header(proto::ACTIVATION, 1), x.data(), x.size())->Wait();
  EXPECT_EQ(later.code(), absl::StatusCode::kCancelled) << later;
  // A cancelled connection's thread sleeps until the client goes (it once spun a core).
  auto cpu = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  const double before = cpu();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::cout << "CPU time over 300 ms after the cancel: " << cpu() - before << " s\n";
  EXPECT_LT(cpu() - before, 0.1);
}

// Close ends a client's sends in flight without waiting for its threads, which the destructor
// joins: a recovery drops a lost peer's client that way, off its set-up's path.
TEST(TensorTransport, CloseFailsSendsInFlightAndReturnsAtOnce) {
  TransportOptions opt;
  opt.timeout = std::chrono::seconds(60);
  const std::vector<float> x = Ramp(10);
  auto client = std::make_unique<TensorClient>("127.0.0.1:1", opt);  // nobody listens: the send waits
  auto op = client->Send(Header(proto::ACTIVATION, 0), x.data(), x.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(op->Done());
  client->Close();
  const absl::Status s = op->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_NE(s.message().find("the sender was closed"), std::string::npos) << s;
  client->Close();  // a second Close does nothing
  client.reset();
}

}  // namespace
}  // namespace longhaul
