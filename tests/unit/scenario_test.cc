#include "scenario/scenario.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace longhaul::netem {
namespace {

TEST(Scenario, RoundTripDelaysAreHalvedAndHostsPlacedRoundRobin) {
  auto s = ParseScenario(R"(
delays_are = "round-trip"
sites = ["a", "b"]
delay_ms = [[0.2, 30], [30, 0.2]]
rate_mbit = [[10000, 1000], [500, 10000]]
jitter_ms = [[0, 4], [4, 0]]
)",
                         "x");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->SiteOf(0), 0);
  EXPECT_EQ(s->SiteOf(3), 1);
  const Link ab = s->Between(0, 1);
  EXPECT_DOUBLE_EQ(ab.delay_ms, 15);
  EXPECT_DOUBLE_EQ(ab.jitter_ms, 2);
  EXPECT_DOUBLE_EQ(ab.rate_mbit, 1000);
  EXPECT_DOUBLE_EQ(s->Between(1, 0).rate_mbit, 500);  // asymmetric rates stay as written
  EXPECT_DOUBLE_EQ(s->Between(0, 2).delay_ms, 0.1);    // same site
}

TEST(Scenario, MistakesAreNamed) {
  auto no_kind = ParseScenario("sites=[\"a\"]\ndelay_ms=[[1]]\nrate_mbit=[[1]]\n", "x");
  EXPECT_NE(no_kind.status().message().find("\"one-way\" or \"round-trip\""), std::string::npos);
  auto shape = ParseScenario("delays_are=\"one-way\"\nsites=[\"a\",\"b\"]\ndelay_ms=[[1]]\nrate_mbit=[[1]]\n", "x");
  EXPECT_NE(shape.status().message().find("delay_ms has 1 rows for 2 sites"), std::string::npos);
  auto typo = ParseScenario("delays_are=\"one-way\"\nsites=[\"a\"]\ndelay_ms=[[1]]\nrate_mbit=[[1]]\nrates=1\n", "x");
  EXPECT_NE(typo.status().message().find("unknown key rates"), std::string::npos);
}

TEST(Scenario, EveryShippedScenarioLoads) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(LONGHAUL_SOURCE_DIR "/netem/scenarios")) {
    auto s = LoadScenario(e.path().string());
    EXPECT_TRUE(s.ok()) << e.path() << ": " << s.status();
    ++n;
  }
  EXPECT_GE(n, 10);
  auto wan = LoadScenario(LONGHAUL_SOURCE_DIR "/netem/scenarios/source-10ms-1gbit.toml");
  ASSERT_TRUE(wan.ok());
  EXPECT_DOUBLE_EQ(wan->Between(0, 5).delay_ms, 10);
  EXPECT_DOUBLE_EQ(wan->Between(0, 5).rate_mbit, 1000);
}

}  // namespace
}  // namespace longhaul::netem
