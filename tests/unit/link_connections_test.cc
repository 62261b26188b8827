// How many connections a link gets: enough windows for its rate × round trip, where one window is
// the smaller of 70% of the sender's send buffer and half the receiver's receive buffer (Linux's
// defaults where unknown), between 1 and kMaxAutoConnections; the plan carries only the pairs
// above one; this host's limits are read from /proc.
#include "transport/link_connections.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>

namespace longhaul {
namespace {

TEST(LinkConnections, EnoughWindowsForTheRateTimesTheRoundTrip) {
  const double gbit = 1e9 / 8;
  // 1 Gbit/s over a 100 ms round trip is 12.5 MB in flight: 3 windows of 4 MiB, 4 of 3 MiB.
  EXPECT_EQ(ConnectionsFor(gbit, 0.100, 4 << 20), 3);
  EXPECT_EQ(ConnectionsFor(gbit, 0.100, 3 << 20), 4);
  EXPECT_EQ(ConnectionsFor(gbit, 0.001, 4 << 20), 1) << "a short link fills one window";
  EXPECT_EQ(ConnectionsFor(100 * gbit, 0.300, 1 << 20), kMaxAutoConnections) << "bounded";
  for (double unknown : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    EXPECT_EQ(ConnectionsFor(unknown, 0.1, 4 << 20), 1) << unknown;
    EXPECT_EQ(ConnectionsFor(gbit, unknown, 4 << 20), 1) << unknown;
  }
}

TEST(LinkConnections, TheWindowIsMostOfTheSendersBufferOrHalfTheReceiversWhicheverIsSmaller) {
  EXPECT_DOUBLE_EQ(ConnectionWindowBytes({1 << 20, 0}, {0, 8 << 20}), 0.7 * (1 << 20));
  EXPECT_DOUBLE_EQ(ConnectionWindowBytes({16 << 20, 0}, {0, 8 << 20}), 4 << 20);
  EXPECT_DOUBLE_EQ(ConnectionWindowBytes({}, {}),
                   std::min(0.7 * kDefaultSendBufferMax, 0.5 * kDefaultReceiveBufferMax));
}

TEST(LinkConnections, ThePlanCarriesOnlyTheLinksAboveOne) {
  proto::Plan plan;
  SetLinkConnections({{{0, 1}, 1}, {{0, 2}, 3}, {{2, 0}, 5}}, plan);
  EXPECT_EQ(plan.link_connections_size(), 2);
  EXPECT_EQ(LinkConnectionsOf(plan), (std::map<std::pair<int, int>, int>{{{0, 2}, 3}, {{2, 0}, 5}}));
}

TEST(LinkConnections, ThisHostsLimitsAreRead) {
  const SocketBufferLimits l = ReadSocketBufferLimits();
  std::cout << "this host: tcp_wmem max " << l.send_max << " B, tcp_rmem max " << l.receive_max << " B\n";
  EXPECT_GT(l.send_max, 0u);
  EXPECT_GT(l.receive_max, 0u);
}

}  // namespace
}  // namespace longhaul
