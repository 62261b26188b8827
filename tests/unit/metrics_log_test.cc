// metrics.csv: rows round-trip by column name, foreign layouts are read, malformed files are a
// Status naming the line, and a resumed log keeps the steps its checkpoint covers.
#include "metrics/metrics_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/status/status.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

fs::path Dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / ("metrics_log_" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string Slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Values with at most 6 decimals (lr: 6 significant digits) come back exactly.
MetricsRow Row(int64_t step) {
  return {.step = step, .loss = 3.0 - 0.125 * step, .floor = 1.25, .val_loss = -1, .lr = 3e-3, .grad_norm = 0.75,
          .seconds = 0.5, .tokens_per_s = 1024.5};
}

TEST(MetricsLog, RowsRoundTripByColumnName) {
  const std::string path = (Dir("roundtrip") / "metrics.csv").string();
  auto log = MetricsLog::Create(path);
  ASSERT_TRUE(log.ok()) << log.status();
  std::vector<MetricsRow> want = {Row(1), Row(2), Row(3)};
  want[0].floor = -1;
  want[1].val_loss = 1.5;
  want[2].skipped = true;
  for (const MetricsRow& r : want) ASSERT_TRUE(log->Append(r).ok());
  // Read while the log is still open: every appended row is already on disk.
  auto got = ReadMetrics(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
  EXPECT_EQ(log->rows(), want);
  const std::string text = Slurp(path);
  EXPECT_EQ(text.substr(0, text.find('\n')), "step,loss,floor,val_loss,lr,grad_norm,seconds,tokens_per_s,skipped");
  EXPECT_NE(text.find("\n1,2.875000,,,0.003,"), std::string::npos) << "unknown values are empty cells:\n" << text;
}

TEST(MetricsLog, ReordersExtraAndMissingColumnsAreRead) {
  const fs::path dir = Dir("foreign");
  std::ofstream(dir / "reordered.csv") << "loss,comment,step, grad_norm\n2.5,first,1,0.25\n2.25,second,2,0.5\n";
  auto rows = ReadMetrics((dir / "reordered.csv").string());
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1].step, 2);
  EXPECT_EQ((*rows)[1].loss, 2.25);
  EXPECT_EQ((*rows)[1].grad_norm, 0.5);
  EXPECT_EQ((*rows)[1].floor, -1) << "a missing column keeps its default";
  EXPECT_EQ((*rows)[1].val_loss, -1);
  // The layout the coordinator wrote before there was one schema.
  std::ofstream(dir / "old.csv") << "step,loss,floor,seconds,lr,grad_norm\n1,2.500000,1.330000,0.100000,0.001,0.700000\n";
  rows = ReadMetrics((dir / "old.csv").string());
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].seconds, 0.1);
  EXPECT_EQ((*rows)[0].lr, 0.001);
}

TEST(MetricsLog, MalformedFileIsAStatusNamingFileAndLine) {
  const fs::path dir = Dir("malformed");
  const struct {
    const char* text;
    const char* line;
    const char* problem;
  } cases[] = {
      {"step,loss\n1,2.5\n2,abc\n", "line 3", "'abc' is not a value of column loss"},
      {"step,loss\n1,2.5,7\n", "line 2", "3 cells, the header names 2"},
      {"loss,lr\n2.5,0.1\n", "line 1", "the header has no column step"},
      {"step,loss,step\n1,2.5,1\n", "line 1", "column step appears twice"},
      {"step,loss\n2,2.5\n1,2.4\n", "line 3", "step 1 follows step 2"},
      {"step,loss,skipped\n1,2.5,yes\n", "line 2", "'yes' is not a value of column skipped"},
      {"step,loss\n1,\n", "line 2", "'' is not a value of column loss"},
  };
  for (const auto& c : cases) {
    const std::string path = (dir / "metrics.csv").string();
    std::ofstream(path, std::ios::trunc) << c.text;
    auto rows = ReadMetrics(path);
    ASSERT_FALSE(rows.ok()) << c.text;
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss) << rows.status();
    const std::string msg(rows.status().message());
    EXPECT_NE(msg.find(path + " " + c.line + ": " + c.problem), std::string::npos) << msg;
    EXPECT_NE(msg.find("move it away"), std::string::npos) << "the fix is named: " << msg;
    // Resuming over such a file is refused the same way, and the file is left as it was.
    EXPECT_EQ(MetricsLog::Resume(path, 5).status(), rows.status());
    EXPECT_EQ(Slurp(path), c.text);
  }
  EXPECT_TRUE(absl::IsNotFound(ReadMetrics((dir / "absent.csv").string()).status()));
}

TEST(MetricsLog, ResumeKeepsTheRowsItsCheckpointCoversAndAppendsAfterThem) {
  const std::string path = (Dir("resume") / "metrics.csv").string();
  {
    auto first = MetricsLog::Create(path);
    ASSERT_TRUE(first.ok()) << first.status();
    for (int64_t s = 1; s <= 5; ++s) ASSERT_TRUE(first->Append(Row(s)).ok());
  }
  // The interrupted run was killed while writing step 6.
  std::ofstream(path, std::ios::app) << "6,2.12";
  auto resumed = MetricsLog::Resume(path, 3);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->rows().size(), 3u) << "steps 4 and 5 belong to the interrupted run";
  std::vector<MetricsRow> want = {Row(1), Row(2), Row(3)};
  for (int64_t s = 4; s <= 6; ++s) {
    MetricsRow r = Row(s);
    r.seconds = 0.25;  // the resumed run's own timing
    want.push_back(r);
    ASSERT_TRUE(resumed->Append(r).ok());
  }
  auto got = ReadMetrics(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(MetricsLog, ResumeWithoutAFileStartsEmpty) {
  const std::string path = (Dir("resume_nofile") / "metrics.csv").string();
  auto log = MetricsLog::Resume(path, 3);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_TRUE(log->rows().empty());
  ASSERT_TRUE(log->Append(Row(4)).ok());
  auto got = ReadMetrics(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::vector<MetricsRow>{Row(4)});
}

TEST(MetricsLog, StepsMustIncrease) {
  auto log = MetricsLog::Create((Dir("order") / "metrics.csv").string());
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE(log->Append(Row(2)).ok());
  const absl::Status st = log->Append(Row(2));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_EQ(log->rows().size(), 1u);
}

TEST(MetricsLog, LongHistoryDrawsABoundedLossCurve) {
  const fs::path dir = Dir("curve");
  auto log = MetricsLog::Create((dir / "metrics.csv").string());
  ASSERT_TRUE(log.ok());
  for (int64_t s = 1; s <= 100000; ++s) {
    MetricsRow r = Row(s);
    r.loss = 2 + 1.0 / s;
    r.val_loss = s % 1000 == 0 ? 2.1 : -1;
    ASSERT_TRUE(log->Append(r).ok());
  }
  ASSERT_TRUE(log->DrawLossCurve((dir / "loss.svg").string()).ok());
  const std::string svg = Slurp(dir / "loss.svg");
  std::cout << "loss.svg of 100000 steps: " << svg.size() << " bytes\n";
  // About 13 bytes a point: 100000 points would take 1.3 MB; 2 per pixel column, under 25 KB.
  EXPECT_LT(svg.size(), 40000u);
  EXPECT_NE(svg.find("stroke=\"#ff7f0e\""), std::string::npos) << "the validation curve is drawn";
  EXPECT_FALSE(fs::exists(dir / "loss.svg.tmp"));
}

// A synchronous run's steady step is the median after the first two steps; with local updates,
// the mean over its whole rounds but the first and the last, which end slower by design.
TEST(MetricsLog, SteadyStepsAreAMedianOrTheMiddleRoundsMean) {
  std::vector<MetricsRow> rows;
  auto add = [&](std::initializer_list<double> seconds) {
    for (double s : seconds) rows.push_back({.step = static_cast<int64_t>(rows.size()) + 1, .seconds = s});
  };
  add({9, 5, 1, 7, 2});
  EXPECT_EQ(SteadyStepSeconds(rows, 1), 2.0);
  EXPECT_EQ(SteadyStepSeconds({rows.begin(), rows.begin() + 2}, 1), std::nullopt);
  // Rounds of 2: (9, 5) the first, (1, 7) and (2, 4) in the middle, (8, 6) the last, 3 left over.
  add({4, 8, 6, 3});
  EXPECT_EQ(SteadyStepSeconds(rows, 2), (1.0 + 7 + 2 + 4) / 4);
  EXPECT_EQ(SteadyStepSeconds(rows, 3), (7.0 + 2 + 4) / 3);  // rounds (9, 5, 1), (7, 2, 4), (8, 6, 3)
  EXPECT_EQ(SteadyStepSeconds(rows, 4), std::nullopt);  // 2 whole rounds
}

}  // namespace
}  // namespace longhaul
