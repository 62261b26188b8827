// Checkpoint pieces between a worker and a coordinator faked in-process: a piece shipped arrives
// whole, part by part in order with state.json last, and fetches back byte for byte; a fetch the
// coordinator has nothing for, or one it answers with more than the model can weigh, leaves
// nothing behind; the background shipper reports each piece only after shipping it, and after a
// failure ships nothing more until the version's pieces are dropped.
#include "worker/checkpoint_courier.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

#include "checkpoint/checkpoint.h"
#include "tests/support/grpc_server.h"
#include "worker/coordinator_client.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

class FakeCoordinator final : public proto::Coordinator::Service {
 public:
  grpc::Status ShipCheckpoint(grpc::ServerContext*, const proto::CheckpointChunk* req, proto::Empty*) override {
    std::lock_guard<std::mutex> lock(mu);
    if (refuse_ships) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "plan version 2 replaced 1");
    const std::string key = req->piece() + "/" + req->file();
    std::string& file = files[key];
    if (req->offset() == 0) file.clear();
    if (req->offset() != file.size()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "out of order");
    file += req->data();
    ++parts;
    if (file.size() == req->file_bytes()) order.push_back(key);
    return grpc::Status::OK;
  }
  grpc::Status FetchCheckpoint(grpc::ServerContext*, const proto::CheckpointFetch* req,
                               proto::CheckpointChunk* reply) override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = files.find(req->piece() + "/" + req->file());
    if (it == files.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "not here");
    const std::string& file = it->second;
    reply->set_file_bytes(file.size() + inflate);
    reply->set_offset(req->offset());
    reply->set_data(file.substr(req->offset(), kCheckpointChunkBytes));
    return grpc::Status::OK;
  }

  std::mutex mu;
  std::map<std::string, std::string> files;  // "piece/file" -> bytes
  std::vector<std::string> order;            // files completed, in order
  int parts = 0;
  bool refuse_ships = false;
  uint64_t inflate = 0;  // added to every file's size in fetch replies
};

struct Fixture : ::testing::Test {
  void SetUp() override {
    server = testing::StartLoopbackServer(&service, &address);
    root = fs::path(::testing::TempDir()) / ("courier_" + std::to_string(getpid()) + "_" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    client = std::make_unique<CoordinatorClient>(address, JobSecret(), TlsFiles(), 5,
                                                 [](const std::string&, uint64_t) {});
    // A shard of 300,000 parameters: its moments' file travels in parts.
    cfg.vocab_size = 64, cfg.max_seq_len = 16, cfg.n_layer = 2, cfg.n_head = 2, cfg.d_model = 96;
    layout = std::make_unique<ParamLayout>(cfg, StageSpec::Whole(cfg));
    std::vector<float> p(layout->total());
    for (size_t i = 0; i < p.size(); ++i) p[i] = 0.25f * static_cast<float>(i % 1000);
    piece_root = (root / "a" / "checkpoints" / "stage_0_shard_1").string();
    ASSERT_TRUE(SaveCheckpoint(piece_root, {20, {{"k", 1}}}, *layout, p.data(), p.data(), p.data()).ok());
    step_dir = (fs::path(piece_root) / "step_00000020").string();
  }
  static std::string Bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  uint64_t Most() const { return *MaxCheckpointFileBytes("optimizer.safetensors", layout->total(), 64, true); }

  FakeCoordinator service;
  std::unique_ptr<CoordinatorServer> server;
  std::string address;
  fs::path root;
  std::unique_ptr<CoordinatorClient> client;
  ModelConfig cfg;
  std::unique_ptr<ParamLayout> layout;
  std::string piece_root, step_dir;
};

TEST_F(Fixture, AShippedPieceArrivesWholeStateLastAndFetchesBackByteForByte) {
  ASSERT_TRUE(ShipCheckpointPiece(*client, step_dir, 20, 1).ok());
  EXPECT_GT(service.parts, 3) << "the moments' file of " << fs::file_size(fs::path(step_dir) / "optimizer.safetensors")
                              << " bytes travels in parts of " << kCheckpointChunkBytes;
  ASSERT_EQ(service.order.size(), 3u);
  EXPECT_EQ(service.order.back(), "stage_0_shard_1/state.json") << "state.json says the piece is whole: it goes last";
  const fs::path fetched = root / "b" / "checkpoints" / "stage_0_shard_1" / "step_00000020";
  ASSERT_TRUE(FetchCheckpointPiece(*client, fetched.string(), 2, Most()).ok());
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    EXPECT_EQ(Bytes(fetched / file), Bytes(fs::path(step_dir) / file)) << file;
  }
  EXPECT_FALSE(fs::exists(fetched.string() + ".fetch"));
}

TEST_F(Fixture, AFetchOfNothingOrOfTooMuchLeavesNothingBehind) {
  const fs::path absent = root / "b" / "checkpoints" / "stage_1_shard_0" / "step_00000020";
  EXPECT_TRUE(absl::IsNotFound(FetchCheckpointPiece(*client, absent.string(), 2, Most())));
  EXPECT_FALSE(fs::exists(absent));
  EXPECT_FALSE(fs::exists(absent.string() + ".fetch"));

  ASSERT_TRUE(ShipCheckpointPiece(*client, step_dir, 20, 1).ok());
  const fs::path fetched = root / "b" / "checkpoints" / "stage_0_shard_1" / "step_00000020";
  service.inflate = uint64_t{1} << 40;
  const absl::Status st = FetchCheckpointPiece(*client, fetched.string(), 2, Most());
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  std::cout << st.message() << "\n";
  EXPECT_FALSE(fs::exists(fetched));
  EXPECT_FALSE(fs::exists(fetched.string() + ".fetch"));
}

TEST_F(Fixture, TheShipperReportsEachPieceAfterItAndStopsAtAFailureUntilDropped) {
  CheckpointShipper shipper(*client);
  std::vector<size_t> shipped_before_report;
  shipper.Ship(step_dir, 20, 1, [&] {
    std::lock_guard<std::mutex> lock(service.mu);
    shipped_before_report.push_back(service.order.size());
    return absl::OkStatus();
  });
  ASSERT_TRUE(shipper.Flush().ok());
  EXPECT_EQ(shipped_before_report, std::vector<size_t>{3});

  {
    std::lock_guard<std::mutex> lock(service.mu);
    service.refuse_ships = true;
  }
  int reported = 0;
  for (int i = 0; i < 3; ++i) shipper.Ship(step_dir, 20, 1, [&] { return ++reported, absl::OkStatus(); });
  const absl::Status st = shipper.Flush();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_EQ(reported, 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(shipper.Error()));
  shipper.Drop();
  EXPECT_TRUE(shipper.Error().ok());
  {
    std::lock_guard<std::mutex> lock(service.mu);
    service.refuse_ships = false;
  }
  shipper.Ship(step_dir, 20, 2, [&] { return ++reported, absl::OkStatus(); });
  EXPECT_TRUE(shipper.Flush().ok());
  EXPECT_EQ(reported, 1);
}

}  // namespace
}  // namespace longhaul
