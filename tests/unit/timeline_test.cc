// A written trace reports its size and CRC, by which the coordinator tells it from another file
// at the same path (a worker's own disk names paths its machine may hold other files at); it moves
// onto another clock by the offset the shortest round trip to it gives.
#include "metrics/timeline.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// The remote clock runs 1 s ahead: each round trip bounds the offset within half its length, and
// the shortest one's stands.
TEST(Timeline, TheShortestRoundTripGivesTheOffsetToAnotherClock) {
  ClockOffset clock;
  EXPECT_FALSE(clock.offset_us().has_value());
  clock.Sample(1000, 1'001'900, 5000);  // 4 ms there and back; read 900 µs after sending
  EXPECT_EQ(clock.offset_us(), 1'001'900 - 3000);
  EXPECT_EQ(clock.error_us(), 2000);
  clock.Sample(10'000, 1'010'100, 10'200);  // 200 µs: this one stands
  EXPECT_EQ(clock.offset_us(), 1'010'100 - 10'100);
  EXPECT_EQ(clock.error_us(), 100);
  clock.Sample(20'000, 2'000'000, 21'000);  // longer: ignored, however far off
  EXPECT_EQ(clock.offset_us(), 1'000'000);
  clock.Sample(30'000, 0, 29'000);  // a clock gone backwards: ignored
  EXPECT_EQ(clock.offset_us(), 1'000'000);

  Timeline t;
  t.Add("F0", Track::kCompute, 100, 250, 0, 0);
  const fs::path path = fs::temp_directory_path() / ("timeline_shift_" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(t.Write(path.string(), 1, "worker 1", *clock.offset_us()).ok());
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["traceEvents"][0]["ts"], 1'000'100);
  EXPECT_EQ(j["traceEvents"][0]["dur"], 150);
  fs::remove(path);

  clock.SameKernel();  // one kernel, one monotonic clock
  EXPECT_EQ(clock.offset_us(), 0);
  EXPECT_EQ(clock.error_us(), 0);
  clock.Sample(40'000, 9'999'999, 40'001);
  EXPECT_EQ(clock.offset_us(), 0);
}

}  // namespace
}  // namespace longhaul
