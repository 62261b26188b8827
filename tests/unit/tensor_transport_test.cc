// Real gRPC on loopback: tensors round-trip in every wire dtype and over several connections; a
// peer of another job is refused with both job ids named; garbage bytes on the port close only
// their own connection.
#include "transport/tensor_transport.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/support/garbage_socket.h"

namespace longhaul {
namespace {

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
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<float> x = Ramp(3'000'001);  // 12 MB, odd length, several chunks per part
  int micro = 0;
  for (WireDtype d : {WireDtype::kF32, WireDtype::kF16, WireDtype::kBf16}) {
    TransportOptions opt;
    opt.job_id = "jobA", opt.dtype = d, opt.connections = 3, opt.chunk_bytes = 1 << 20;
    TensorClient client((*server)->address(), opt);
    auto op = client.Send(Header(proto::ACTIVATION, micro), x.data(), x.size());
    ASSERT_TRUE(op->Wait().ok()) << op->Wait();
    auto got = box.Take(Key(proto::ACTIVATION, micro), std::chrono::seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), x.size());
    // fp16 keeps 11 significant bits, bf16 8: relative error bounds 2^-11 and 2^-8.
    const double tol = d == WireDtype::kF32 ? 0.0 : (d == WireDtype::kF16 ? 4.9e-4 : 3.9e-3);
    for (size_t i = 0; i < x.size(); i += 997) ASSERT_LE(std::abs((*got)[i] - x[i]), tol * std::abs(x[i]) + 1e-7) << i;
    ++micro;
  }
  EXPECT_EQ((*server)->refused(), 0);
}

TEST(TensorTransport, StrangerFromAnotherJobIsRefusedAndTheServerGoesOn) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box);
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

TEST(TensorTransport, GarbageOnThePortClosesOnlyThatConnection) {
  Mailbox box;
  auto server = TensorServer::Start("127.0.0.1:0", "jobA", &box);
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

}  // namespace
}  // namespace longhaul
