// The coordinator's gRPC layer over a live loopback port: a call without the job secret is refused
// before the job hears of it; a signed one reaches the job and comes back with the job's answer,
// its refusals keeping their codes and reasons.
#include "coordinator/service.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "coordinator/job.h"
#include "tests/support/grpc_server.h"
#include "transport/tensor_transport.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("service_test_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "checkpoints");
    const std::string secret_file = (dir / "secret").string();
    ASSERT_TRUE(JobSecret::WriteNew(secret_file).ok());
    secret = *JobSecret::Load(secret_file);
    absl::StatusOr<JobConfig> cfg =
        ParseJobConfig("[model]\nn_layer = 2\nd_model = 16\nn_head = 2\n[cluster]\njob_id = \"j\"\nstages = 2\n",
                       "job.toml", {"train.out_dir=\"" + dir.string() + "\""});
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    verifier = std::make_unique<RpcVerifier>(secret);
    job = std::make_unique<Job>(JobStart{*cfg, 0, "", 0, *MetricsLog::Create((dir / "metrics.csv").string()),
                                         *SampleAudit::Open((dir / "samples.csv").string(), 1, 0), std::nullopt,
                                         "token", [this] { return verifier->refused(); }});
    service = std::make_unique<Service>(*verifier, *job);
    server = testing::StartLoopbackServer(service.get(), &address);
  }
  void TearDown() override {
    server->Shutdown();
    service.reset();
    job.reset();
    fs::remove_all(dir);
  }
  std::unique_ptr<proto::Coordinator::Stub> Stub(const JobSecret& with) const {
    return proto::Coordinator::NewStub(*CoordinatorChannel(address, with, {}, grpc::ChannelArguments()));
  }

  fs::path dir;
  JobSecret secret;
  std::unique_ptr<RpcVerifier> verifier;
  std::unique_ptr<Job> job;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

TEST_F(ServiceTest, AnUnsignedCallIsRefusedBeforeTheJobHearsOfIt) {
  proto::RegisterRequest req;
  req.set_job_id("j");
  req.set_protocol_version(kProtocolVersion);
  req.set_address("127.0.0.1:1");
  proto::RegisterReply reply;
  grpc::ClientContext ctx;
  const grpc::Status st = Stub(JobSecret())->Register(&ctx, req, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_EQ(verifier->refused(), 1);
  absl::MutexLock lock(&job->mu);
  EXPECT_EQ(job->members.registered(), 0);
}

TEST_F(ServiceTest, ASignedCallGetsTheJobsAnswer) {
  const auto stub = Stub(secret);
  proto::RegisterRequest req;
  req.set_job_id("j");
  req.set_protocol_version(kProtocolVersion);
  req.set_address("127.0.0.1:1");
  proto::RegisterReply reply;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Register(&ctx, req, &reply).ok());
  }
  EXPECT_EQ(reply.worker_id(), 0);
  {
    absl::MutexLock lock(&job->mu);
    EXPECT_EQ(reply.config_toml(), job->cfg.toml_text);
  }
  proto::HeartbeatRequest hb;
  hb.set_worker_id(7);
  proto::HeartbeatReply hb_reply;
  grpc::ClientContext ctx;
  const grpc::Status st = stub->Heartbeat(&ctx, hb, &hb_reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_NE(st.error_message().find("7"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace longhaul
