// JSON from files and peers: parsed as nlohmann parses it up to kMaxJsonDepth levels, refused
// (discarded, as unparseable JSON) beyond, where dumping the value would overflow the stack.
#include "util/bounded_json.h"

#include <gtest/gtest.h>

#include <string>

namespace longhaul {
namespace {

std::string Nested(int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

TEST(BoundedJson, ParsesWhatLonghaulWritesAndRefusesDeepNesting) {
  const nlohmann::json j = ParseBoundedJson(R"({"files": {"model.safetensors": {"bytes": 3, "crc32": 7}}})");
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["files"]["model.safetensors"]["bytes"], 3);
  EXPECT_FALSE(ParseBoundedJson(Nested(kMaxJsonDepth)).is_discarded());
  EXPECT_TRUE(ParseBoundedJson(Nested(kMaxJsonDepth + 1)).is_discarded());
  const nlohmann::json deep = ParseBoundedJson(Nested(300000));
  EXPECT_TRUE(deep.is_discarded());
  EXPECT_EQ(deep.dump(), "<discarded>");
  EXPECT_TRUE(ParseBoundedJson("{\"a\": ").is_discarded());
}

}  // namespace
}  // namespace longhaul
