// The coordinator port's authentication (rpc_auth.h) on a real gRPC server in this process: signed
// channels get through, everything else is refused; TLS settings that cannot work are named.
#include "transport/rpc_auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

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
  explicit Server(JobSecret secret) : service(std::move(secret)) {
    server = testing::StartLoopbackServer(&service, &address);
  }
  Checked service;
  std::unique_ptr<grpc::Server> server;
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

TEST(RpcAuth, SignedCallsPassAndEveryOtherIsRefused) {
  const JobSecret secret = NewSecret("a"), other = NewSecret("b");
  Server s(secret);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(Beat(Signed(s.address, secret), i).ok());
  const grpc::Status unsigned_call = Beat(grpc::CreateChannel(s.address, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(unsigned_call.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(unsigned_call.error_message().find("carries no proof"), std::string::npos) << unsigned_call.error_message();
  const grpc::Status wrong = Beat(Signed(s.address, other));
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status none = Beat(Signed(s.address, JobSecret()));
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.service.answered.load(), 20);
}

TEST(RpcAuth, MalformedProofsAreRefused) {
  const JobSecret secret = NewSecret("c");
  Server s(secret);
  auto plain = proto::Coordinator::NewStub(grpc::CreateChannel(s.address, grpc::InsecureChannelCredentials()));
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
  EXPECT_TRUE(Beat(grpc::CreateChannel(s.address, grpc::InsecureChannelCredentials())).ok());
  EXPECT_TRUE(Beat(Signed(s.address, NewSecret("d"))).ok());
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
