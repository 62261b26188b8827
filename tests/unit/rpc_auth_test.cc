// The coordinator port's authentication (rpc_auth.h) on a real gRPC server behind its gate in this
// process: signed channels get through, everything else is refused (a client without the gate's
// handshake at the gate, an unsigned call by the server's check); TLS settings that cannot work
// are named.
#include "transport/rpc_auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "longhaul.grpc.pb.h"
#include "tests/support/grpc_server.h"

namespace longhaul {
namespace {

// Answers heartbeats once the verifier lets them through.
class Checked : public proto::Coordinator::Service {
 public:
  explicit Checked(JobSecret secret) : verifier(std::move(secret)) {}
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply*) override {
    if (grpc::Status st = verifier.Check(*ctx, "Heartbeat", *req); !st.ok()) return st;
    ++answered;
    return grpc::Status::OK;
  }
  RpcVerifier verifier;
  std::atomic<int> answered{0};
};

struct Server {
  explicit Server(const JobSecret& secret) : service(secret) {
    server = testing::StartLoopbackServer(&service, &address, secret);
  }
  Checked service;
  std::unique_ptr<CoordinatorServer> server;
  std::string address;
};

JobSecret NewSecret(const std::string& name) {
  const std::string p = absl::StrCat(::testing::TempDir(), "/rpc_auth_test_", getpid(), "_", name);
  std::remove(p.c_str());
  EXPECT_TRUE(JobSecret::WriteNew(p).ok());
  auto s = JobSecret::Load(p);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.value_or(JobSecret());
}

grpc::Status Beat(const std::shared_ptr<grpc::Channel>& channel, int worker = 3) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::HeartbeatRequest req;
  req.set_worker_id(worker);
  proto::HeartbeatReply reply;
  return proto::Coordinator::NewStub(channel)->Heartbeat(&ctx, req, &reply);
}

std::shared_ptr<grpc::Channel> Signed(const std::string& address, const JobSecret& secret) {
  auto c = CoordinatorChannel(address, secret, TlsFiles(), grpc::ChannelArguments());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(nullptr);
}

// Through the gate with `secret`, the calls unsigned.
std::shared_ptr<grpc::Channel> Unsigned(const std::string& address, const JobSecret& secret) {
  auto c = UnsignedCoordinatorChannel(address, secret, TlsFiles(), grpc::ChannelArguments());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(nullptr);
}

TEST(RpcAuth, SignedCallsPassAndEveryOtherIsRefused) {
  const JobSecret secret = NewSecret("a"), other = NewSecret("b");
  Server s(secret);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Beat(Signed(s.address, secret), i).ok());
  // A plain gRPC client never gets past the gate's handshake: its connection is closed.
  const grpc::Status plain = Beat(grpc::CreateChannel(s.address, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  const grpc::Status unsigned_call = Beat(Unsigned(s.address, secret));
  EXPECT_EQ(unsigned_call.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(unsigned_call.error_message().find("carries no proof"), std::string::npos) << unsigned_call.error_message();
  // Another secret, or none, is refused at the gate, and the call says why.
  for (const JobSecret& wrong : {other, JobSecret()}) {
    const grpc::Status st = Beat(Signed(s.address, wrong));
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_NE(st.error_message().find("holds another job secret than this process's (" + wrong.source() + ")"),
              std::string::npos)
        << st.error_message();
  }
  EXPECT_EQ(s.service.answered.load(), 20);
  // The gate counts a connection as it closes it, on its own thread.
  for (int i = 0; i < 100 && s.server->gate().refused() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(s.server->gate().refused(), 3) << "the plain client and the two without the secret";
  EXPECT_EQ(s.service.verifier.refused(), 1) << "the unsigned call";
}

TEST(RpcAuth, MalformedProofsAreRefused) {
  const JobSecret secret = NewSecret("c");
  Server s(secret);
  auto plain = proto::Coordinator::NewStub(Unsigned(s.address, secret));
  for (const std::string& value : {std::string(""), std::string("1.2.3"), std::string("x.y"),
                                   absl::StrCat("99.", std::string(64, '0'), ".", std::string(64, 'g')),
                                   std::string(4000, '.')}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kRpcAuthKey, value);
    proto::HeartbeatRequest req;
    proto::HeartbeatReply reply;
    const grpc::Status st = plain->Heartbeat(&ctx, req, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << value.substr(0, 40);
  }
  // Metadata beyond gRPC's own limit (8 KiB) never reaches the coordinator's code.
  grpc::ClientContext ctx;
  ctx.AddMetadata(kRpcAuthKey, std::string(10000, '.'));
  proto::HeartbeatRequest req;
  proto::HeartbeatReply reply;
  EXPECT_EQ(plain->Heartbeat(&ctx, req, &reply).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.service.answered.load(), 0);
}

TEST(RpcAuth, WithoutASecretNothingIsChecked) {
  Server s{JobSecret()};
  EXPECT_TRUE(Beat(Unsigned(s.address, JobSecret())).ok());
  EXPECT_TRUE(Beat(Signed(s.address, JobSecret())).ok());
  // A client with a secret and a gate without one refuse each other, as the tensor ports do.
  const JobSecret d = NewSecret("d");
  const grpc::Status st = Beat(Signed(s.address, d));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find(d.source()), std::string::npos) << st.error_message();
}

TEST(RpcAuth, TlsSettingsThatCannotWorkAreNamed) {
  TlsFiles cert_only;
  cert_only.cert = "/nonexistent/cert.pem";
  auto server = CoordinatorCredentials(cert_only);
  EXPECT_TRUE(absl::IsInvalidArgument(server.status())) << server.status();
  EXPECT_NE(server.status().message().find("--tls-key"), std::string::npos) << server.status();
  TlsFiles client;
  client.cert = "/nonexistent/cert.pem";
  auto channel = CoordinatorChannel("127.0.0.1:1", JobSecret(), client, grpc::ChannelArguments());
  EXPECT_NE(channel.status().message().find("--tls-ca"), std::string::npos) << channel.status();
  const std::string not_pem = absl::StrCat(::testing::TempDir(), "/rpc_auth_test_not_pem");
  std::ofstream(not_pem) << "hello";
  client.ca = not_pem;
  channel = CoordinatorChannel("127.0.0.1:1", JobSecret(), client, grpc::ChannelArguments());
  EXPECT_NE(channel.status().message().find("not a PEM file"), std::string::npos) << channel.status();
  EXPECT_TRUE(CoordinatorCredentials(TlsFiles()).ok());
}

}  // namespace
}  // namespace longhaul
