// The worker's coordinator client against a coordinator faked in-process: it registers, waits
// out "no plan yet", heartbeats from registration on, hears a stop within a heartbeat and a newer
// plan once, takes the plan its lifeline brought without asking, hears that the job finished,
// gives up waiting for a plan when told to, tells of the members as its lifeline brings them,
// notices a coordinator that went away after dead_after_s, and names an unreachable one and one
// that holds another job secret.
#include "worker/coordinator_client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/support/grpc_server.h"
#include "util/ports.h"

namespace longhaul {
namespace {

class FakeCoordinator final : public proto::Coordinator::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const proto::RegisterRequest*, proto::RegisterReply* reply) override {
    reply->set_worker_id(3);
    reply->set_heartbeat_s(heartbeat_s);
    reply->set_dead_after_s(dead_after_s);
    return grpc::Status::OK;
  }
  grpc::Status GetPlan(grpc::ServerContext*, const proto::PlanRequest* req, proto::Plan* plan) override {
    if (req->worker_id() != 3) return grpc::Status(grpc::StatusCode::NOT_FOUND, "who?");
    if (finished) return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "the job finished");
    if (++plan_polls < 3 || req->known_version() >= 9) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no plan yet");
    plan->set_version(9);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    ++heartbeats;
    last_iteration = req->iteration();
    reply->set_abort(abort);
    reply->set_reason("worker 1 failed");
    reply->set_plan_version(plan_version);
    return grpc::Status::OK;
  }
  // Writes each new plan version until the client ends the call (with the plan itself up to
  // version lifeline_plans_through, as the coordinator does to a worker the plan places), and
  // workers 0 to `members` - 1 as the members whenever that grows.
  grpc::Status Lifeline(grpc::ServerContext* ctx, const proto::LifelineRequest*,
                        grpc::ServerWriter<proto::LifelineNews>* writer) override {
    uint64_t told = plan_version;
    int told_members = 0;
    while (!ctx->IsCancelled()) {
      if (members > told_members) {
        told_members = members;
        proto::LifelineNews news;
        news.set_plan_version(told);
        for (int w = 0; w < told_members; ++w) {
          proto::Peer* p = news.add_members();
          p->set_worker_id(w);
          p->set_public_key(std::string(32, static_cast<char>('a' + w)));
        }
        if (!writer->Write(news)) break;
      }
      if (plan_version > told) {
        told = plan_version;
        proto::LifelineNews news;
        news.set_plan_version(told);
        if (told <= lifeline_plans_through) {
          news.mutable_plan()->set_version(told);
          news.mutable_plan()->set_job_id("from the lifeline");
        }
        if (!writer->Write(news)) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return grpc::Status::OK;
  }
  std::atomic<double> heartbeat_s{0.05}, dead_after_s{0.5};
  std::atomic<int> plan_polls{0}, heartbeats{0}, members{0};
  std::atomic<int64_t> last_iteration{-1};
  std::atomic<bool> abort{false}, finished{false};
  std::atomic<uint64_t> plan_version{0}, lifeline_plans_through{0};
};

struct Running {
  FakeCoordinator service;
  std::unique_ptr<CoordinatorServer> server;
  std::string address;
  explicit Running(const JobSecret& secret = JobSecret()) {
    server = testing::StartLoopbackServer(&service, &address, secret);
  }
};

// Records the stop reason and when it came.
struct StopRecorder {
  std::mutex mu;
  std::condition_variable cv;
  std::string reason;
  std::vector<uint64_t> newer_plans;
  void operator()(const std::string& why, uint64_t newer_plan) {
    std::lock_guard<std::mutex> lock(mu);
    reason = why;
    if (newer_plan > 0) newer_plans.push_back(newer_plan);
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
  CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 5, [&](const std::string& why, uint64_t newer) { stop(why, newer); });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  EXPECT_EQ(client.worker_id(), 3);
  auto plan = client.AwaitPlan(0);
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

// A worker of plan 9 hears of plan 10 from the heartbeats once, and keeps heartbeating: it goes on
// to ask for the new plan. One waiting for a plan newer than the newest gives up when told to; one
// left out of a newer plan waits on as a spare and hears when the job finished.
TEST(CoordinatorClient, HearsANewerPlanOnceAndThatTheJobFinished) {
  Running coordinator;
  StopRecorder stop;
  CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 5,
                           [&](const std::string& why, uint64_t newer) { stop(why, newer); });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  client.SetPlanVersion(9);
  coordinator.service.plan_version = 9;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(stop.reason.empty()) << stop.reason;
  coordinator.service.plan_version = 10;
  ASSERT_TRUE(stop.Await(std::chrono::seconds(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int beats = coordinator.service.heartbeats;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_GT(coordinator.service.heartbeats, beats) << "the heartbeats go on after a newer plan";
  {
    std::lock_guard<std::mutex> lock(stop.mu);
    EXPECT_EQ(stop.newer_plans, std::vector<uint64_t>{10});
    EXPECT_EQ(stop.reason, "plan version 10 replaces version 9");
  }
  auto t0 = std::chrono::steady_clock::now();
  const absl::Status none = client.AwaitPlan(10, 0.3).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnavailable) << none;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));

  // Plan 10 has no place for this worker of plan 9 (a spare took it): it waits on past max_wait_s,
  // as a spare, until the job finishes.
  t0 = std::chrono::steady_clock::now();
  std::thread finish([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    coordinator.service.finished = true;
  });
  const absl::Status spare = client.AwaitPlan(9, 0.3).status();
  finish.join();
  EXPECT_EQ(spare.code(), absl::StatusCode::kOutOfRange) << spare;
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(800));
}

// With heartbeats 5 s apart, a newer plan still reaches the worker at once: on its lifeline, which
// brings the plan itself too, taken without asking for it.
TEST(CoordinatorClient, HearsOfANewerPlanOnItsLifelineBeforeTheNextHeartbeat) {
  Running coordinator;
  coordinator.service.lifeline_plans_through = 100;
  coordinator.service.heartbeat_s = 5;
  coordinator.service.dead_after_s = 30;
  StopRecorder stop;
  CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 5,
                           [&](const std::string& why, uint64_t newer) { stop(why, newer); });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  client.SetPlanVersion(9);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int beats = coordinator.service.heartbeats;
  const auto t0 = std::chrono::steady_clock::now();
  coordinator.service.plan_version = 10;
  ASSERT_TRUE(stop.Await(std::chrono::seconds(3))) << "the lifeline carried no news";
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "plan 10 reached the worker " << took << " s after it was made (heartbeats 5 s apart)\n";
  EXPECT_EQ(coordinator.service.heartbeats, beats) << "no heartbeat came between: the lifeline carried it";
  {
    std::lock_guard<std::mutex> lock(stop.mu);
    EXPECT_EQ(stop.newer_plans, std::vector<uint64_t>{10});
  }
  const int polls = coordinator.service.plan_polls;
  // The fake's GetPlan has nothing past version 9, and says the job finished after a second:
  // only the lifeline's plan answers before that.
  std::thread finish([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    coordinator.service.finished = true;
  });
  absl::StatusOr<proto::Plan> plan = client.AwaitPlan(9, 1.0);
  EXPECT_EQ(coordinator.service.plan_polls, polls) << "the plan the lifeline brought is taken without asking";
  finish.join();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->version(), 10u);
  EXPECT_EQ(plan->job_id(), "from the lifeline");
  // Taken once: the next wait asks the coordinator again, which says the job finished.
  EXPECT_EQ(client.AwaitPlan(10, 0.3).status().code(), absl::StatusCode::kOutOfRange);
}

// Plan 10 places this worker and came on the lifeline; plan 11, heard of before the worker asks,
// does not: the worker is a spare now and asks the coordinator until a plan places it (here, until
// the job finishes), rather than set up plan 10, whose peers have moved on.
TEST(CoordinatorClient, ALifelinesPlanThatANewerVersionReplacedIsNotTaken) {
  Running coordinator;
  coordinator.service.lifeline_plans_through = 10;
  StopRecorder stop;
  CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 5,
                           [&](const std::string& why, uint64_t newer) { stop(why, newer); });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  client.SetPlanVersion(9);
  coordinator.service.plan_version = 10;
  ASSERT_TRUE(stop.Await(std::chrono::seconds(3)));
  coordinator.service.plan_version = 11;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (client.newest_plan() < 11 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(client.newest_plan(), 11u);
  std::thread finish([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    coordinator.service.finished = true;
  });
  const absl::StatusOr<proto::Plan> plan = client.AwaitPlan(9, 0.3);
  finish.join();
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kOutOfRange)
      << (plan.ok() ? absl::StrCat("took plan ", plan->version()) : plan.status().ToString());
}

// The members the lifeline brings reach the observer as they come, from the lifeline's thread,
// whatever the worker's own thread does meanwhile: whom the worker's tensor port admits.
TEST(CoordinatorClient, TellsOfTheMembersAsTheLifelineBringsThem) {
  Running coordinator;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::Peer> told;
  CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 5, [](const std::string&, uint64_t) {},
                           nullptr, [&](const std::vector<proto::Peer>& members) {
                             std::lock_guard<std::mutex> lock(mu);
                             told = members;
                             cv.notify_all();
                           });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  coordinator.service.members = 2;
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(3), [&] { return told.size() == 2; })) << "no news of them";
    EXPECT_EQ(told[1].worker_id(), 1);
    EXPECT_EQ(told[1].public_key(), std::string(32, 'b'));
  }
  const std::optional<std::vector<proto::Peer>> taken = client.TakeMembers();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->size(), 2u);
}

TEST(CoordinatorClient, ACoordinatorThatGoesAwayIsNoticedAfterDeadAfter) {
  auto coordinator = std::make_unique<Running>();
  StopRecorder stop;
  CoordinatorClient client(coordinator->address, JobSecret(), TlsFiles(), 5, [&](const std::string& why, uint64_t newer) { stop(why, newer); });
  ASSERT_TRUE(client.Register(proto::RegisterRequest()).ok());
  coordinator->server->Shutdown();
  coordinator.reset();
  ASSERT_TRUE(stop.Await(std::chrono::seconds(10)));
  EXPECT_NE(stop.reason.find("lost the coordinator at 127.0.0.1:"), std::string::npos) << stop.reason;
}

// Periods a worker would spin on (0) or overflow with (NaN) are refused at the registration.
TEST(CoordinatorClient, ACoordinatorsAbsurdPeriodsAreRefused) {
  for (const double period : {0.0, std::nan(""), 1e300}) {
    Running coordinator;
    coordinator.service.heartbeat_s = period;
    CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 5, [](const std::string&, uint64_t) {});
    const absl::Status s = client.Register(proto::RegisterRequest()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << period;
    EXPECT_NE(s.message().find("run one longhaul version on every host"), std::string::npos) << s;
  }
}

TEST(CoordinatorClient, ACoordinatorOfAnotherSecretIsNamed) {
  const std::string path = ::testing::TempDir() + "/coordinator_client_test_" + std::to_string(getpid()) + "_secret";
  std::remove(path.c_str());
  ASSERT_TRUE(JobSecret::WriteNew(path).ok());
  Running coordinator(*JobSecret::Load(path));
  CoordinatorClient client(coordinator.address, JobSecret(), TlsFiles(), 0.5, [](const std::string&, uint64_t) {});
  const absl::Status s = client.Register(proto::RegisterRequest()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_NE(s.message().find("holds another job secret than this process's (no secret file)"), std::string::npos) << s;
  EXPECT_EQ(coordinator.service.heartbeats.load(), 0);
}

TEST(CoordinatorClient, AnUnreachableCoordinatorIsNamed) {
  const std::string nowhere = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  CoordinatorClient client(nowhere, JobSecret(), TlsFiles(), 0.5, [](const std::string&, uint64_t) {});
  const absl::Status s = client.Register(proto::RegisterRequest()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cannot reach the coordinator at " + nowhere), std::string::npos) << s;
}

}  // namespace
}  // namespace longhaul
