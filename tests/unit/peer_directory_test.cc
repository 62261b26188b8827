// The peer directory: addresses from the plan, dialling through the dial map, sends that reach a
// real tensor server and are timed in the timeline, none to a receiver that cannot prove it is the
// worker the plan names, and a send to a worker the plan does not have reported at Flush, and the
// pool closing the clients of workers a version drops.
#include "worker/peer_directory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "transport/identity.h"

namespace longhaul {
namespace {

// Worker s at stage s, its key `keys[s]`.
proto::Plan Plan(const std::vector<std::shared_ptr<const WorkerKey>>& keys = {}) {
  proto::Plan plan;
  plan.set_version(1);
  for (int s = 0; s < 2; ++s) {
    proto::Assignment* a = plan.add_assignments();
    a->set_worker_id(s);
    a->set_stage(s);
    a->set_replica(0);
    a->set_address(s == 0 ? "stage-zero:7071" : "stage-one:7071");
    if (static_cast<size_t>(s) < keys.size()) a->set_public_key(keys[s]->public_key());
  }
  return plan;
}

std::shared_ptr<const WorkerKey> NewKey() { return std::make_shared<const WorkerKey>(WorkerKey::Generate().value()); }

// The tensor server of worker 1, of key `key`.
absl::StatusOr<std::unique_ptr<TensorServer>> WorkerOne(Mailbox* box, const TensorAdmission* admission,
                                                        std::shared_ptr<const WorkerKey> key) {
  auto server = TensorServer::Start("127.0.0.1:0", "job", box, admission, JobSecret(), std::move(key));
  if (server.ok()) (*server)->SetWorkerId(1);
  return server;
}

TEST(PeerDirectory, SendsReachThePeerThroughTheDialMapAndAreTimed) {
  Mailbox box;
  const AnyTensorUpTo admission(1 << 20);
  const std::vector<std::shared_ptr<const WorkerKey>> keys = {NewKey(), NewKey()};
  auto server = WorkerOne(&box, &admission, keys[1]);
  ASSERT_TRUE(server.ok()) << server.status();
  TransportOptions transport;
  transport.job_id = "job";
  transport.timeout = std::chrono::seconds(10);
  // stage-one:7071 names no host: only the dial map leads to the server.
  ClientPool pool;
  PeerDirectory peers(Plan(keys), 0, 0, transport, {{"stage-one:7071", (*server)->address()}}, &pool);
  EXPECT_EQ(peers.AddressOf(1, 0), "stage-one:7071");
  EXPECT_EQ(peers.AddressOf(0, 0), "stage-zero:7071");
  EXPECT_EQ(peers.AddressOf(2, 0), "");

  const std::vector<float> x(1000, 2.5f);
  peers.Send(1, 0, proto::ACTIVATION, 4, 1, 0, x.data(), x.size());
  Timeline timeline;
  ASSERT_TRUE(peers.Flush(timeline, /*acknowledged=*/true).ok());
  auto got = box.Take({proto::ACTIVATION, 4, 1, 0, 0, 0}, std::chrono::seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);
  const nlohmann::json events = timeline.Events(0);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["name"], "send act");
}

// Whatever answers at a peer's address must prove it is the worker the plan names there, by the key
// the plan gives it: another process that holds the job's secret gets nothing.
TEST(PeerDirectory, ASendReachesOnlyTheWorkerThePlanNames) {
  Mailbox box;
  const AnyTensorUpTo admission(1 << 20);
  auto server = WorkerOne(&box, &admission, NewKey());
  ASSERT_TRUE(server.ok()) << server.status();
  TransportOptions transport;
  transport.job_id = "job";
  transport.timeout = std::chrono::seconds(10);
  ClientPool pool;
  PeerDirectory peers(Plan({NewKey(), NewKey()}), 0, 0, transport, {{"stage-one:7071", (*server)->address()}}, &pool);
  const std::vector<float> x(1000, 2.5f);
  peers.Send(1, 0, proto::ACTIVATION, 4, 1, 0, x.data(), x.size());
  Timeline timeline;
  const absl::Status s = peers.Flush(timeline, /*acknowledged=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("is worker 1 with another key than the job's, not worker 1"), std::string::npos) << s;
  EXPECT_EQ(box.HeldFloats(), 0u);
}

TEST(PeerDirectory, ASendToAWorkerThePlanDoesNotHaveFailsAtFlush) {
  ClientPool pool;
  PeerDirectory peers(Plan(), 0, 0, TransportOptions{}, {}, &pool);
  const std::vector<float> x(10, 1.0f);
  peers.Send(5, 0, proto::GRADIENT, 0, 0, 0, x.data(), x.size());
  Timeline timeline;
  const absl::Status s = peers.Flush(timeline);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("plan v1 has no worker for stage 5 replica 0"), std::string::npos) << s;
  EXPECT_TRUE(peers.Flush(timeline).ok()) << "reported once";
}

// A worker the next version drops: its client's sends end at once, the kept worker's go on, and
// the pool joins the dropped one's threads later.
TEST(ClientPool, KeepOnlyClosesTheOthersAtOnce) {
  ClientPool pool;
  TransportOptions transport;
  transport.timeout = std::chrono::seconds(60);
  const std::vector<float> x(10, 1.0f);
  proto::TensorHeader h;
  h.set_kind(proto::ACTIVATION);
  // Nobody listens at port 1: each send waits for its peer to come up.
  auto kept = pool.Get({1, ""}, "127.0.0.1:1", transport).Send(h, x.data(), x.size());
  auto dropped = pool.Get({2, ""}, "127.0.0.1:1", transport).Send(h, x.data(), x.size());
  pool.KeepOnly({1});
  const absl::Status s = dropped->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_FALSE(kept->Done()) << "the kept worker's send ended";
  pool.KeepOnly({});
  EXPECT_EQ(kept->Wait().code(), absl::StatusCode::kCancelled);
}

TEST(PeerDirectory, ReadsADialMapAndNamesAMissingOne) {
  const std::string path = ::testing::TempDir() + "/dial_map_" + std::to_string(getpid());
  std::ofstream(path) << "10.0.0.1:7071 127.0.0.1:40001\n10.0.0.2:7071 127.0.0.1:40002\n";
  auto map = PeerDirectory::ReadDialMap(path);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->at("10.0.0.2:7071"), "127.0.0.1:40002");
  EXPECT_EQ(map->size(), 2u);
  std::filesystem::remove(path);
  EXPECT_EQ(PeerDirectory::ReadDialMap(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace longhaul
