// The audit of which global micro-batches each stage ran per committed step: a step every stage
// ran once counts nothing, a missing or doubled (stage, micro-batch) pair counts; a step run by a
// re-cut pipeline of fewer stages is whole with those; the file reads back as written, a rewind
// drops the steps redone, and a damaged row is refused naming the line.
#include "coordinator/sample_audit.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

// Workers 0..stages-1, one per stage of one replica, each reporting micro-batches 0..3.
std::map<int, proto::IterationReport> Reports(int stages) {
  std::map<int, proto::IterationReport> reports;
  for (int s = 0; s < stages; ++s) {
    proto::IterationReport& r = reports[s];
    r.set_stage(s);
    for (int g = 0; g < 4; ++g) r.add_micro_batches(g);
  }
  return reports;
}

std::string Path() {
  const fs::path p = fs::path(::testing::TempDir()) /
                     ("samples_" + std::to_string(::getpid()) + "_" +
                      ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".csv");
  fs::remove(p);
  return p.string();
}

TEST(SampleAudit, AStepOfEveryStageAndMicroBatchOnceCountsNothingWhateverTheStages) {
  const std::string path = Path();
  absl::StatusOr<SampleAudit> audit = SampleAudit::Open(path, 4, 0);
  ASSERT_TRUE(audit.ok()) << audit.status();
  absl::StatusOr<SampleAudit::Count> c = audit->Record(0, 3, Reports(3));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->lost, 0);
  EXPECT_EQ(c->repeated, 0);
  // After a re-cut, two stages run the step whole.
  c = audit->Record(1, 2, Reports(2));
  EXPECT_EQ(c->lost, 0);
  EXPECT_EQ(c->repeated, 0);
  // Under 3 stages, a step only two ran lost the third's 4 pairs; one micro-batch run twice repeats.
  c = audit->Record(2, 3, Reports(2));
  EXPECT_EQ(c->lost, 4);
  std::map<int, proto::IterationReport> twice = Reports(2);
  twice[1].add_micro_batches(3);
  c = audit->Record(3, 2, twice);
  EXPECT_EQ(c->repeated, 1);
  // A stage beyond the plan's counts as repeated, not out of bounds.
  std::map<int, proto::IterationReport> beyond = Reports(2);
  beyond[1].set_stage(5);
  c = audit->Record(4, 2, beyond);
  EXPECT_EQ(c->lost, 4);
  EXPECT_EQ(c->repeated, 4);
  EXPECT_EQ(audit->totals().steps, 5);

  // A rewind to the last step leaves the file as it is (a recovery's, before its plan goes out:
  // the file is of every step so far); the file reads back as written, each step with its own
  // stage count; a rewind drops steps 4, 5.
  const auto inode = [&] {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
  };
  const auto before = inode();
  ASSERT_TRUE(audit->Rewind(5).ok());
  EXPECT_EQ(inode(), before) << "rewritten with nothing to forget";
  ASSERT_TRUE(audit->Rewind(3).ok());
  EXPECT_NE(inode(), before);
  absl::StatusOr<SampleAudit> again = SampleAudit::Open(path, 4, 100);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->totals().steps, 3);
  EXPECT_EQ(again->totals().lost, 4);
  EXPECT_EQ(again->totals().repeated, 0);
  std::ifstream in(path);
  std::string header, row;
  std::getline(in, header);
  std::getline(in, row);
  EXPECT_EQ(header, "step,stages,stage,replica,worker,micro_batches");
  EXPECT_EQ(row, "1,3,0,0,0,0 1 2 3");
}

TEST(SampleAudit, ADamagedRowIsRefusedNamingTheLine) {
  const std::string path = Path();
  for (const char* bad : {"1,2,2,0,0,0 1 2 3\n", "1,3,0,0,0,0 1\n1,2,1,0,1,0 1\n", "1,2,0,0,0,0 9\n", "1,2,0\n"}) {
    std::ofstream(path) << "step,stages,stage,replica,worker,micro_batches\n" << bad;
    const absl::Status s = SampleAudit::Open(path, 4, 100).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(s.message().find(path + " line "), std::string::npos) << s;
  }
}

// A row a killed coordinator was writing (no newline yet) is dropped, not refused: the audit
// reads back every whole row before it.
TEST(SampleAudit, ATornLastRowIsDroppedAndTheRowsBeforeKept) {
  const std::string path = Path();
  std::ofstream(path) << "step,stages,stage,replica,worker,micro_batches\n1,1,0,0,0,0 1 2 3\n2,1,0,0,0,0 1";
  const absl::StatusOr<SampleAudit> audit = SampleAudit::Open(path, 4, 100);
  ASSERT_TRUE(audit.ok()) << audit.status();
  EXPECT_EQ(audit->totals().steps, 1);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "step,stages,stage,replica,worker,micro_batches\n1,1,0,0,0,0 1 2 3\n");
}

// An audit that cannot be read is an error, not an empty audit written over it.
TEST(SampleAudit, AnUnreadableFileIsAnErrorAndKeepsWhatItHolds) {
  const std::string path = Path();
  fs::create_directories(path);  // read(2) fails on a directory
  const absl::Status s = SampleAudit::Open(path, 4, 100).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot read " + path), std::string::npos) << s;
  EXPECT_TRUE(fs::is_directory(path));
  fs::remove(path);
}

}  // namespace
}  // namespace longhaul
