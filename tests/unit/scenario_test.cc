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

// A card is one number for every host or one per site, both directions unless a direction is named.
TEST(Scenario, CardsAreReadPerSiteAndPerDirection) {
  const std::string base = "delays_are=\"one-way\"\nsites=[\"a\",\"b\"]\ndelay_ms=[[0,5],[5,0]]\n"
                           "rate_mbit=[[1000,1000],[1000,1000]]\n";
  auto none = ParseScenario(base, "x");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->HasCards());
  EXPECT_EQ(none->EgressMbit(0), 0);
  auto every = ParseScenario(base + "nic_gbps = 2.5\n", "x");
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_DOUBLE_EQ(every->EgressMbit(3), 2500);
  EXPECT_DOUBLE_EQ(every->IngressMbit(3), 2500);
  auto per_site = ParseScenario(base + "nic_gbps = [1, 10]\negress_gbps = [0.5, 10]\n", "x");
  ASSERT_TRUE(per_site.ok()) << per_site.status();
  EXPECT_DOUBLE_EQ(per_site->EgressMbit(0), 500);   // site a's egress named on its own
  EXPECT_DOUBLE_EQ(per_site->IngressMbit(0), 1000);  // its card's rate the other way
  EXPECT_DOUBLE_EQ(per_site->IngressMbit(1), 10000);
  auto wrong_length = ParseScenario(base + "nic_gbps = [1, 2, 3]\n", "x");
  EXPECT_NE(wrong_length.status().message().find("nic_gbps has 3 entries for 2 sites"), std::string::npos)
      << wrong_length.status();
  auto zero = ParseScenario(base + "ingress_gbps = 0\n", "x");
  EXPECT_NE(zero.status().message().find("ingress_gbps entries must be Gbit/s above 0"), std::string::npos)
      << zero.status();
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
