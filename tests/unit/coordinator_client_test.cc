// The worker's coordinator client against a coordinator faked in-process: it registers, waits
// out "no plan yet", heartbeats from registration on, hears a stop within a heartbeat, notices a
// coordinator that went away after dead_after_s, and names an unreachable one.
#include "worker/coordinator_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/support/grpc_server.h"
#include "util/ports.h"

namespace longhaul {
namespace {

class FakeCoordinator final : public proto::Coordinator::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const proto::RegisterRequest*, proto::RegisterReply* reply) override {
    reply->set_worker_id(3);
    reply->set_heartbeat_s(0.05);
    reply->set_dead_after_s(0.5);
    return grpc::Status::OK;
  }
  grpc::Status GetPlan(grpc::ServerContext*, const proto::PlanRequest* req, proto::Plan* plan) override {
    if (req->worker_id() != 3) return grpc::Status(grpc::StatusCode::NOT_FOUND, "who?");
    if (++plan_polls < 3) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no plan yet");
    plan->set_version(9);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    ++heartbeats;
    last_iteration = req->iteration();
    reply->set_abort(abort);
    reply->set_reason("worker 1 failed");
    return grpc::Status::OK;
  }
  std::atomic<int> plan_polls{0}, heartbeats{0};
  std::atomic<int64_t> last_iteration{-1};
  std::atomic<bool> abort{false};
};

struct Running {
  FakeCoordinator service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  Running() { server = testing::StartLoopbackServer(&service, &address); }
};

// Records the stop reason and when it came.
struct StopRecorder {
  std::mutex mu;
  std::condition_variable cv;
  std::string reason;
  void operator()(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    reason = why;
    cv.notify_all();
  }
  bool Await(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return !reason.empty(); });
  }
};

TEST(CoordinatorClient, RegistersHeartbeatsWhileWaitingForThePlanAndHearsAStop) {
  Running coordinator;
  StopRecorder stop;
  CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 5, [&](const std::string& why) { stop(why); });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  EXPECT_EQ(client.worker_id(), 3);
  auto plan = client.AwaitPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version(), 9u);
  EXPECT_GE(coordinator.service.plan_polls, 3);
  client.SetIteration(41);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GE(coordinator.service.heartbeats, 3) << "heartbeats run from registration on";
  EXPECT_EQ(coordinator.service.last_iteration, 41);

  const auto t0 = std::chrono::steady_clock::now();
  coordinator.service.abort = true;
  ASSERT_TRUE(stop.Await(std::chrono::seconds(5)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "the stop reached the worker " << took << " s after the coordinator decided it (heartbeat 0.05 s)\n";
  EXPECT_EQ(stop.reason, "the coordinator stopped the job: worker 1 failed");
}

TEST(CoordinatorClient, ACoordinatorThatGoesAwayIsNoticedAfterDeadAfter) {
  auto coordinator = std::make_unique<Running>();
  StopRecorder stop;
  CoordinatorClient client(coordinator->address, JobSecret(), TlsFiles(), 5, [&](const std::string& why) { stop(why); });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  coordinator->server->Shutdown();
  coordinator.reset();
  ASSERT_TRUE(stop.Await(std::chrono::seconds(10)));
  EXPECT_NE(stop.reason.find("lost the coordinator at 127.0.0.1:"), std::string::npos) << stop.reason;
}

TEST(CoordinatorClient, AnUnreachableCoordinatorIsNamed) {
  const std::string nowhere = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  CoordinatorClient client(nowhere, JobSecret(), TlsFiles(), 0.5, [](const std::string&) {});
  const absl::Status s = client.Register(proto::RegisterRequest()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cannot reach the coordinator at " + nowhere), std::string::npos) << s;
}

}  // namespace
}  // namespace longhaul
