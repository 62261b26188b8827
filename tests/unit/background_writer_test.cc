// Files written on the writer's own thread: whole and the latest after Flush, the posts numbered
// as they reach the disk, every posted file written before the writer is gone, and a failed write
// reported rather than lost.
#include "util/background_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"

namespace longhaul {
namespace {

namespace fs = std::filesystem;

fs::path Dir() {
  const fs::path d = fs::path(::testing::TempDir()) / ("background_writer_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string Read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(BackgroundWriter, FlushLeavesTheLatestContentsOfEveryFile) {
  const fs::path d = Dir();
  BackgroundWriter w;
  for (int i = 0; i < 200; ++i) w.Post({{(d / "state").string(), "state " + std::to_string(i)}, {(d / "record").string(), "record " + std::to_string(i)}});
  w.Flush();
  EXPECT_EQ(Read(d / "state"), "state 199");
  EXPECT_EQ(Read(d / "record"), "record 199");
  EXPECT_FALSE(fs::exists(d / "state.tmp")) << "written aside and renamed";
  EXPECT_TRUE(w.status().ok()) << w.status();
}

// Posts are numbered in order, and written() says how far the disk has them: a caller waits
// only where the post it needs is not written yet.
TEST(BackgroundWriter, WrittenCountsThePostsOnDisk) {
  const fs::path d = Dir();
  BackgroundWriter w;
  EXPECT_EQ(w.written(), 0u);
  const uint64_t first = w.Post({{(d / "state").string(), "one"}});
  const uint64_t second = w.Post({{(d / "state").string(), "two"}, {(d / "record").string(), "r"}});
  EXPECT_EQ(first, 1u);
  EXPECT_EQ(second, 2u);
  w.Flush();
  EXPECT_EQ(w.written(), second) << "a post merged into a later one is written with it";
  EXPECT_EQ(Read(d / "state"), "two");
  const uint64_t failed = w.Post({{(d / "no_such_directory" / "state").string(), "x"}});
  w.Flush();
  EXPECT_EQ(w.written(), failed) << "a failed post is done too, its failure in status()";
  EXPECT_FALSE(w.status().ok());
}

TEST(BackgroundWriter, WhatWasPostedIsWrittenBeforeTheWriterIsGone) {
  const fs::path d = Dir();
  {
    BackgroundWriter w;
    w.Post({{(d / "a").string(), "first"}});
    w.Post({{(d / "b").string(), "second"}});
  }
  EXPECT_EQ(Read(d / "a"), "first");
  EXPECT_EQ(Read(d / "b"), "second");
}

TEST(BackgroundWriter, AFailedWriteIsReported) {
  const fs::path d = Dir();
  BackgroundWriter w;
  w.Post({{(d / "no_such_directory" / "state").string(), "x"}, {(d / "fine").string(), "y"}});
  w.Flush();
  const absl::Status s = w.status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no_such_directory"), std::string::npos) << s;
  EXPECT_EQ(Read(d / "fine"), "y") << "one file's failure does not stop the others";
}

}  // namespace
}  // namespace longhaul
