// Prometheus's text format as longhaul writes it, read back by a strict reader.
#include "metrics/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/support/prometheus_parse.h"

namespace longhaul {
namespace {

TEST(PrometheusText, FamiliesSamplesAndEscapesReadBack) {
  PrometheusText t;
  t.Family("lh_a", "gauge", "A help text with a \\ backslash\nand a newline.");
  t.Sample({}, 1.5);
  t.Family("lh_b_total", "counter", "Counted.");
  t.Sample({{"host", "a \"quoted\" \\ name\nwith a newline"}, {"worker", "3"}}, 1e20);
  t.Sample({{"host", "b"}}, std::numeric_limits<double>::infinity());
  t.Sample({{"host", "c"}}, std::nan(""));
  auto parsed = testing::ParsePrometheusText(t.text());
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << t.text();
  EXPECT_EQ(parsed->at("lh_a"), 1.5);
  EXPECT_EQ(parsed->at(R"(lh_b_total{host="a \"quoted\" \\ name\nwith a newline",worker="3"})"), 1e20);
  EXPECT_TRUE(std::isinf(parsed->at(R"(lh_b_total{host="b"})")));
  EXPECT_TRUE(std::isnan(parsed->at(R"(lh_b_total{host="c"})")));
  EXPECT_NE(t.text().find("# HELP lh_a A help text with a \\\\ backslash\\nand a newline.\n"), std::string::npos);
}

// The reader is strict enough to catch what a Prometheus server would reject.
TEST(PrometheusText, TheReaderRefusesWhatPrometheusWould) {
  for (const char* bad : {"lh_a 1\n", "# TYPE lh_a gauge\nlh_a{x=\"1} 1\n", "# TYPE lh_a gauge\nlh_a one\n",
                          "# TYPE lh_a gauge\n9lh 1\n", "# TYPE lh_a gauge\nlh_a 1", "# TYPE lh_a gauge\n# odd\n",
                          "# TYPE lh_a gauge\nlh_a{x=\"1\"y=\"2\"} 1\n", "# TYPE lh_a gauge\nlh_a 1\nlh_a 2\n"}) {
    EXPECT_FALSE(testing::ParsePrometheusText(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace longhaul
