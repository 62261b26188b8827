// A written trace reports its size and CRC, by which the coordinator tells it from another file
// at the same path (a worker's own disk names paths its machine may hold other files at).
#include "metrics/timeline.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace longhaul {
namespace {

namespace fs = std::filesystem;

TEST(Timeline, AWrittenTraceIsKnownByItsSizeAndCrcAndAnotherFileIsNot) {
  const fs::path dir = fs::temp_directory_path() / ("timeline_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "worker_3.json").string();
  Timeline t;
  t.Add("F0", Track::kCompute, 100, 250, 7, 0);
  t.Add("send act", Track::kSend, 260, 400, 7, 0);
  const absl::StatusOr<TraceFile> written = t.Write(path, 3, "worker 3 (stage 1, replica 0)");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->path, path);
  EXPECT_EQ(written->bytes, fs::file_size(path));
  EXPECT_TRUE(CheckTraceFile(*written).ok());
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["traceEvents"][0]["name"], "F0");
  EXPECT_EQ(j["traceEvents"][0]["dur"], 150);
  EXPECT_EQ(j["traceEvents"][1]["tid"], static_cast<int>(Track::kSend));

  // Another job's trace of the same length at that path: the CRC tells them apart.
  std::string other(written->bytes, ' ');
  std::ofstream(path, std::ios::trunc) << other;
  const absl::Status changed = CheckTraceFile(*written);
  EXPECT_EQ(changed.code(), absl::StatusCode::kDataLoss) << changed;
  EXPECT_NE(changed.message().find(path), std::string::npos) << changed;
  fs::remove(path);
  EXPECT_EQ(CheckTraceFile(*written).code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace longhaul
