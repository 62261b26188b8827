#include "data/token_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace longhaul {
namespace {
namespace fs = std::filesystem;

fs::path TempDir(const char* name) {
  fs::path d = fs::path(::testing::TempDir()) / (std::string(name) + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(TokenDataset, LlmcShardsRoundTripInSortedOrder) {
  const fs::path d = TempDir("llmc");
  ASSERT_TRUE(WriteLlmcShard((d / "train_001.bin").string(), {4, 5, 6}).ok());
  ASSERT_TRUE(WriteLlmcShard((d / "train_000.bin").string(), {1, 2, 50256}).ok());
  ASSERT_TRUE(WriteLlmcShard((d / "val_000.bin").string(), {7, 8}).ok());
  auto ds = TokenDataset::LlmcShards((d / "train_*.bin").string(), (d / "val_*.bin").string(), 0.1);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->train(), (std::vector<uint16_t>{1, 2, 50256, 4, 5, 6}));
  EXPECT_EQ(ds->val(), (std::vector<uint16_t>{7, 8}));
  EXPECT_EQ(ds->max_token(), 50256);
}

TEST(TokenDataset, LlmcErrorsNameTheFile) {
  const fs::path d = TempDir("llmc_bad");
  std::ofstream(d / "text.bin") << std::string(2000, 'x');
  auto bad = TokenDataset::LlmcShards((d / "text.bin").string(), "", 0.1);
  EXPECT_NE(bad.status().message().find("text.bin: magic"), std::string::npos) << bad.status();

  ASSERT_TRUE(WriteLlmcShard((d / "short.bin").string(), std::vector<uint16_t>(100, 3)).ok());
  fs::resize_file(d / "short.bin", fs::file_size(d / "short.bin") - 4);
  auto trunc = TokenDataset::LlmcShards((d / "short.bin").string(), "", 0.1);
  EXPECT_NE(trunc.status().message().find("truncated"), std::string::npos) << trunc.status();

  auto missing = TokenDataset::LlmcShards((d / "nope_*.bin").string(), "", 0.1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("data.path"), std::string::npos);
}

TEST(TokenDataset, BytesHoldOutTheTail) {
  const fs::path d = TempDir("bytes");
  std::ofstream(d / "a.txt") << "hello world!";  // 12 bytes
  auto ds = TokenDataset::Bytes((d / "a.txt").string(), "", 0.25);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->train().size(), 9u);
  EXPECT_EQ(ds->val(), (std::vector<uint16_t>{'l', 'd', '!'}));
}

TEST(TokenDataset, BuiltInKnowsItsSource) {
  auto ds = TokenDataset::BuiltIn({1, 24, 2, 4}, 5000, 500);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->train().size(), 5000u);
  EXPECT_EQ(ds->val().size(), 500u);
  ASSERT_TRUE(ds->source().has_value());
  EXPECT_GT(ds->source()->EntropyRate(), 0.0);
  EXPECT_NE(ds->train(), std::vector<uint16_t>(ds->val().begin(), ds->val().end()));
}

}  // namespace
}  // namespace longhaul
