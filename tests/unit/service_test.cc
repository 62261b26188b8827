// The coordinator's gRPC layer over a live loopback port: a call without the job secret is refused
// before the job hears of it; a call that speaks for a worker is refused unless that worker's key
// signed it (another holder of the secret cannot report a failure for it); a signed one reaches
// the job and comes back with the job's answer, its refusals keeping their codes and reasons.
#include "coordinator/service.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

#include "coordinator/job.h"
#include "tests/support/grpc_server.h"
#include "transport/identity.h"
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
                                         "token", [this] { return verifier->refused(); }, std::nullopt});
    service = std::make_unique<Service>(*verifier, *job);
    server = testing::StartLoopbackServer(service.get(), &address, secret);
  }
  void TearDown() override {
    server->Shutdown();
    service.reset();
    job.reset();
    fs::remove_all(dir);
  }
  std::unique_ptr<proto::Coordinator::Stub> Stub(const JobSecret& with,
                                                 std::shared_ptr<const WorkerKey> key = nullptr) const {
    return proto::Coordinator::NewStub(*CoordinatorChannel(address, with, {}, grpc::ChannelArguments(), std::move(key)));
  }
  static std::shared_ptr<const WorkerKey> NewKey() { return std::make_shared<const WorkerKey>(*WorkerKey::Generate()); }
  // Registers the holder of `key` through `stub`: its worker id.
  static int Register(proto::Coordinator::Stub& stub, const WorkerKey& key) {
    proto::RegisterRequest req;
    req.set_job_id("j");
    req.set_protocol_version(kProtocolVersion);
    req.set_address("127.0.0.1:1");
    req.set_public_key(key.public_key());
    proto::RegisterReply reply;
    grpc::ClientContext ctx;
    const grpc::Status st = stub.Register(&ctx, req, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return reply.worker_id();
  }

  fs::path dir;
  JobSecret secret;
  std::unique_ptr<RpcVerifier> verifier;
  std::unique_ptr<Job> job;
  std::unique_ptr<Service> service;
  std::unique_ptr<CoordinatorServer> server;
  std::string address;
};

TEST_F(ServiceTest, AnUnsignedCallIsRefusedBeforeTheJobHearsOfIt) {
  proto::RegisterRequest req;
  req.set_job_id("j");
  req.set_protocol_version(kProtocolVersion);
  req.set_address("127.0.0.1:1");
  proto::RegisterReply reply;
  grpc::ClientContext ctx;
  // Past the gate (the secret proved there), the call itself unsigned.
  const grpc::Status st =
      proto::Coordinator::NewStub(*UnsignedCoordinatorChannel(address, secret, {}, grpc::ChannelArguments()))
          ->Register(&ctx, req, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_EQ(verifier->refused(), 1);
  absl::MutexLock lock(&job->mu);
  EXPECT_EQ(job->members.registered(), 0);
}

TEST_F(ServiceTest, ASignedCallGetsTheJobsAnswer) {
  const std::shared_ptr<const WorkerKey> key = NewKey();
  const auto stub = Stub(secret, key);
  EXPECT_EQ(Register(*stub, *key), 0);
  proto::HeartbeatRequest hb;
  hb.set_worker_id(7);
  proto::HeartbeatReply hb_reply;
  grpc::ClientContext ctx;
  const grpc::Status st = stub->Heartbeat(&ctx, hb, &hb_reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_NE(st.error_message().find("7"), std::string::npos) << st.error_message();
  grpc::ClientContext ok_ctx;
  hb.set_worker_id(0);
  EXPECT_TRUE(stub->Heartbeat(&ok_ctx, hb, &hb_reply).ok());
}

TEST_F(ServiceTest, AHolderOfTheSecretCannotSpeakForAnotherWorker) {
  const std::shared_ptr<const WorkerKey> real = NewKey(), other = NewKey();
  const auto real_stub = Stub(secret, real), other_stub = Stub(secret, other);
  EXPECT_EQ(Register(*real_stub, *real), 0);
  EXPECT_EQ(Register(*other_stub, *other), 1);
  // Worker 1, which holds the job secret, reports worker 0's failure.
  proto::DoneReport forged;
  forged.set_worker_id(0);
  forged.set_ok(false);
  forged.set_error("forged");
  proto::Empty empty;
  grpc::ClientContext ctx;
  const grpc::Status st = other_stub->ReportDone(&ctx, forged, &empty);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("speaks for worker 0 but is not signed with the key worker 0 registered"),
            std::string::npos)
      << st.error_message();
  // Nor without a worker's key at all, nor registering a key it does not hold.
  grpc::ClientContext bare_ctx;
  EXPECT_EQ(Stub(secret)->ReportDone(&bare_ctx, forged, &empty).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  proto::RegisterRequest stolen;
  stolen.set_job_id("j");
  stolen.set_protocol_version(kProtocolVersion);
  stolen.set_address("127.0.0.1:1");
  stolen.set_public_key(real->public_key());
  proto::RegisterReply reply;
  grpc::ClientContext reg_ctx;
  const grpc::Status reg = other_stub->Register(&reg_ctx, stolen, &reply);
  EXPECT_EQ(reg.error_code(), grpc::StatusCode::UNAUTHENTICATED) << reg.error_message();
  EXPECT_NE(reg.error_message().find("not signed with the key it registers"), std::string::npos) << reg.error_message();
  absl::MutexLock lock(&job->mu);
  EXPECT_TRUE(job->abort.empty()) << job->abort;
  EXPECT_EQ(job->members.registered(), 2);
}

}  // namespace
}  // namespace longhaul
