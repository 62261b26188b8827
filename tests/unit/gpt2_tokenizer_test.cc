// GPT-2's byte-level BPE tokenizer against the reference in tests/reference/gpt2_bpe.py (GPT-2's
// own pattern through the regex module, OpenAI's merge loop) on a corpus with Unicode in several
// scripts, combining marks, digits of several kinds, white space runs, tabs, CR LF, contractions
// and emoji the tiny vocabulary never saw: the same pieces, the same ids, and every byte back.
#include "data/gpt2_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

#include "util/files.h"

namespace longhaul {
namespace {
namespace fs = std::filesystem;

const std::string kFixture = std::string(LONGHAUL_FIXTURES) + "/gpt2_bpe";

std::string Corpus() { return *ReadWholeFile(kFixture + "/corpus.txt"); }
nlohmann::json Expected() { return nlohmann::json::parse(*ReadWholeFile(kFixture + "/expected.json")); }

TEST(Gpt2Tokenizer, SplitsAsGpt2sPattern) {
  const std::string corpus = Corpus();
  std::vector<std::string> pieces;
  for (std::string_view p : SplitGpt2(corpus)) pieces.emplace_back(p);
  EXPECT_EQ(pieces, Expected()["pieces"].get<std::vector<std::string>>());
}

TEST(Gpt2Tokenizer, GivesTheReferencesIdsAndEveryByteBack) {
  const absl::StatusOr<Gpt2Tokenizer> t = Gpt2Tokenizer::Load(kFixture);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string corpus = Corpus();
  const std::vector<int> ids = t->Encode(corpus);
  EXPECT_EQ(ids, Expected()["ids"].get<std::vector<int>>());
  EXPECT_EQ(*t->Decode(ids), corpus);
  EXPECT_EQ(t->end_of_text(), t->vocab_size() - 1);
  // Bytes that are not UTF-8 are kept.
  const std::string broken = "ab\xff\xfe c\xc3 \xe2\x82 d\xed\xa0\x80 \xf4\x90\x80\x80!";
  EXPECT_EQ(*t->Decode(t->Encode(broken)), broken);
  EXPECT_EQ(t->Decode({t->vocab_size()}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Gpt2Tokenizer, FilesThatAreNotATokenizersAreNamed) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("gpt2_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kFixture + "/vocab.json", dir / "vocab.json");
  auto merges = [&](const std::string& text) { std::ofstream(dir / "merges.txt") << text; };
  auto error = [&] { return std::string(Gpt2Tokenizer::Load(dir.string()).status().message()); };
  // A merge of the fixture's, then one its vocabulary cannot hold.
  std::ifstream fixture_merges(kFixture + "/merges.txt");
  std::string version, first_merge;
  std::getline(fixture_merges, version);
  std::getline(fixture_merges, first_merge);
  merges("#version: 0.2\n" + first_merge + "\nzq xj\n");
  EXPECT_NE(error().find("line 3 merges \"zq xj\""), std::string::npos) << error();
  merges("#version: 0.2\nĠ t h\n");
  EXPECT_NE(error().find("line 2 is \"Ġ t h\", not two tokens and one space"), std::string::npos) << error();
  fs::remove(dir / "merges.txt");
  EXPECT_NE(error().find("cannot open"), std::string::npos) << error();
  merges("");
  std::ofstream(dir / "vocab.json") << R"({"a": 0, "b": 0})";
  EXPECT_NE(error().find("the ids must be 0 to 1, each once"), std::string::npos) << error();
  std::ofstream(dir / "vocab.json") << R"({"a": 0, "b": 1})";
  EXPECT_NE(error().find("has no token for byte 0x00"), std::string::npos) << error();
  std::ofstream(dir / "vocab.json") << "{\"\xe4\xb8\xad\": 0}";
  EXPECT_NE(error().find("stands for no byte"), std::string::npos) << error();
}

}  // namespace
}  // namespace longhaul
