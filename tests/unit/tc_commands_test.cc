#include "netem/tc_commands.h"

#include <gtest/gtest.h>

namespace longhaul::netem {
namespace {

TEST(TcCommands, ThreeHostMatrix) {
  auto s = ParseScenario(R"(
delays_are = "one-way"
sites = ["a", "b", "c"]
delay_ms = [[0.1, 10, 40], [10, 0.1, 25], [40, 25, 0.1]]
rate_mbit = [[10000, 1000, 200], [1000, 10000, 500], [200, 500, 10000]]
jitter_ms = [[0, 1, 0], [1, 0, 0], [0, 0, 0]]
loss = 0.001
)",
                         "three");
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<std::string> hosts = {"192.0.2.1", "192.0.2.2", "192.0.2.3"};
  // Host 0: to host 1 at 10 ms ± 1 ms / 1 Gbit/s, to host 2 at 40 ms / 200 Mbit/s; queues hold a
  // round trip at the rate (1 Gbit/s x 20 ms = 1667 packets; 200 Mbit/s x 80 ms = 1334).
  const std::vector<std::string> want = {
      "tc qdisc replace dev ens5 root handle 1: htb default 1",
      "tc class replace dev ens5 parent 1: classid 1:1 htb rate 100gbit",
      "tc class replace dev ens5 parent 1: classid 1:11 htb rate 1000mbit ceil 1000mbit",
      "tc qdisc replace dev ens5 parent 1:11 handle 11: netem limit 1667 delay 10ms 1ms loss 0.1%",
      "tc filter replace dev ens5 parent 1: protocol ip prio 1 u32 match ip dst 192.0.2.2/32 flowid 1:11",
      "tc class replace dev ens5 parent 1: classid 1:12 htb rate 200mbit ceil 200mbit",
      "tc qdisc replace dev ens5 parent 1:12 handle 12: netem limit 1334 delay 40ms loss 0.1%",
      "tc filter replace dev ens5 parent 1: protocol ip prio 1 u32 match ip dst 192.0.2.3/32 flowid 1:12",
  };
  EXPECT_EQ(TcCommandsForHost(*s, hosts, 0, "ens5"), want);
  // Host 2 has its own view: classes for hosts 0 and 1.
  const auto host2 = TcCommandsForHost(*s, hosts, 2, "eth0");
  ASSERT_EQ(host2.size(), 8u);
  EXPECT_EQ(host2[2], "tc class replace dev eth0 parent 1: classid 1:10 htb rate 200mbit ceil 200mbit");
  // 500 Mbit/s x 50 ms round trip = 3.1 MB = 2084 packets.
  EXPECT_EQ(host2[6], "tc qdisc replace dev eth0 parent 1:11 handle 11: netem limit 2084 delay 25ms loss 0.1%");
  EXPECT_EQ(TcClearCommands("eth0"),
            (std::vector<std::string>{"tc qdisc del dev eth0 root", "tc qdisc del dev eth0 ingress 2>/dev/null || true",
                                      "ip link del ifb-longhaul 2>/dev/null || true"}));
}

// Without sch_netem: the same rates, a pfifo where netem was, and every packet from a peer through
// the delay daemon's queue, which holds it for the link's delay and jitter and drops its loss.
TEST(TcCommands, DelayDaemonInsteadOfNetem) {
  auto s = ParseScenario(R"(
delays_are = "one-way"
sites = ["a", "b"]
delay_ms = [[0.1, 10], [10, 0.1]]
rate_mbit = [[10000, 1000], [1000, 10000]]
jitter_ms = [[0, 1], [1, 0]]
loss = 0.001
)",
                         "two");
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<std::string> hosts = {"192.0.2.1", "192.0.2.2"};
  const std::vector<std::string> want = {
      "tc qdisc replace dev eth0 root handle 1: htb default 1",
      "tc class replace dev eth0 parent 1: classid 1:1 htb rate 100gbit",
      "tc class replace dev eth0 parent 1: classid 1:11 htb rate 1000mbit ceil 1000mbit",
      "tc qdisc replace dev eth0 parent 1:11 handle 11: pfifo limit 1667",
      "tc filter replace dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 192.0.2.2/32 flowid 1:11",
      "iptables -N LONGHAUL",
      "iptables -A INPUT -j LONGHAUL",
      "iptables -A LONGHAUL -s 192.0.2.2/32 -j NFQUEUE --queue-num 7",
  };
  EXPECT_EQ(TcCommandsForHost(*s, hosts, 0, "eth0", DelayBy::kDaemon), want);
  auto links = DaemonLinksForHost(*s, hosts, 0);
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_EQ(links->size(), 1u);
  EXPECT_EQ((*links)[0].src, 0xC0000202u);  // what arrives from host 1
  EXPECT_EQ((*links)[0].dst, 0xC0000201u);
  EXPECT_EQ((*links)[0].delay_ns, 10'000'000);
  EXPECT_EQ((*links)[0].jitter_ns, 1'000'000);
  EXPECT_EQ((*links)[0].loss, 0.001);
  auto named = DaemonLinksForHost(*s, {"192.0.2.1", "worker1"}, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(named.status())) << named.status();
  EXPECT_NE(named.status().message().find("'worker1'"), std::string::npos) << named.status();
  EXPECT_EQ(TcClearCommands("eth0", DelayBy::kDaemon),
            (std::vector<std::string>{"tc qdisc del dev eth0 root", "tc qdisc del dev eth0 ingress 2>/dev/null || true",
                                      "ip link del ifb-longhaul 2>/dev/null || true", "iptables -D INPUT -j LONGHAUL",
                                      "iptables -F LONGHAUL", "iptables -X LONGHAUL"}));
}

// A round trip at the rate, and past it 1000 packets or 100 ms of the link's, whichever is less.
TEST(TcCommands, QueueLimitIsARoundTripAtTheRate) {
  EXPECT_EQ(QueueLimitPackets(10000, 50), 83334);
  EXPECT_EQ(QueueLimitPackets(1000, 0.05), 1000);
  EXPECT_EQ(QueueLimitPackets(100, 1), 834);   // 100 ms at 100 Mbit/s
  EXPECT_EQ(QueueLimitPackets(1.332, 176), 40);  // a round trip at 1.3 Mbit/s, not 9 s of queue
  EXPECT_EQ(QueueLimitPackets(0.1, 1), 16);
}

// On a slow link a GSO packet is a millisecond of its rate (at least one segment), and the htb
// burst just holds one; at 1 Gbit/s and up the kernel's 64 KiB stand, and the burst is 1 ms.
TEST(TcCommands, SlowLinksTakeSmallPacketsAndBursts) {
  EXPECT_EQ(GsoSegments(1.132), 1);
  EXPECT_EQ(HtbBurstBytes(1.132), 2 * 1514);  // 21 ms at 1.1 Mbit/s, not 0.46 s
  EXPECT_EQ(GsoSegments(100), 8);             // 12.5 kB a millisecond
  EXPECT_EQ(HtbBurstBytes(100), 9 * 1514);
  EXPECT_EQ(GsoSegments(1000), 0);
  EXPECT_EQ(HtbBurstBytes(1000), 125000);
  EXPECT_EQ(GsoSegments(400), 33);  // 50 kB a millisecond, under 64 KiB
  EXPECT_EQ(GsoSegments(0), 0);     // not shaped
}

// Under a card a link is capped by it and guaranteed an equal part; without one, its own rate.
TEST(TcCommands, LinkShareOfACard) {
  const HtbShare fast = LinkShare(1000, 1500, 2);
  EXPECT_EQ(fast.rate_mbit, 750);
  EXPECT_EQ(fast.ceil_mbit, 1000);
  const HtbShare capped = LinkShare(5000, 1000, 4);
  EXPECT_EQ(capped.rate_mbit, 250);
  EXPECT_EQ(capped.ceil_mbit, 1000);
  const HtbShare unshaped_link = LinkShare(0, 1000, 3);
  EXPECT_NEAR(unshaped_link.rate_mbit, 333.33, 0.01);
  EXPECT_EQ(unshaped_link.ceil_mbit, 1000);
  const HtbShare no_card = LinkShare(200, 0, 3);
  EXPECT_EQ(no_card.rate_mbit, 200);
  EXPECT_EQ(no_card.ceil_mbit, 200);
  EXPECT_LE(LinkShare(0, 0, 3).ceil_mbit, 0);
}

// A card: the peers' classes share one class of the egress rate, each guaranteed an equal part;
// what the peers send is redirected to an IFB device held to the ingress rate.
TEST(TcCommands, CardSharedByThePeers) {
  auto s = ParseScenario(R"(
delays_are = "one-way"
sites = ["a"]
delay_ms = [[10]]
rate_mbit = [[1000]]
egress_gbps = 1.5
ingress_gbps = 2
)",
                         "card");
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<std::string> hosts = {"192.0.2.1", "192.0.2.2", "192.0.2.3"};
  const std::vector<std::string> want = {
      "tc qdisc replace dev eth0 root handle 1: htb default 1",
      "tc class replace dev eth0 parent 1: classid 1:1 htb rate 100gbit",
      "tc class replace dev eth0 parent 1: classid 1:2 htb rate 1500mbit ceil 1500mbit",
      "tc class replace dev eth0 parent 1:2 classid 1:11 htb rate 750mbit ceil 1000mbit",
      "tc qdisc replace dev eth0 parent 1:11 handle 11: netem limit 1667 delay 10ms",
      "tc filter replace dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 192.0.2.2/32 flowid 1:11",
      "tc class replace dev eth0 parent 1:2 classid 1:12 htb rate 750mbit ceil 1000mbit",
      "tc qdisc replace dev eth0 parent 1:12 handle 12: netem limit 1667 delay 10ms",
      "tc filter replace dev eth0 parent 1: protocol ip prio 1 u32 match ip dst 192.0.2.3/32 flowid 1:12",
      "ip link show ifb-longhaul >/dev/null 2>&1 || ip link add ifb-longhaul type ifb",
      "ip link set ifb-longhaul up",
      "tc qdisc replace dev eth0 handle ffff: ingress",
      "tc filter replace dev eth0 parent ffff: protocol ip prio 1 u32 match ip src 192.0.2.2/32 action mirred egress "
      "redirect dev ifb-longhaul",
      "tc filter replace dev eth0 parent ffff: protocol ip prio 1 u32 match ip src 192.0.2.3/32 action mirred egress "
      "redirect dev ifb-longhaul",
      "tc qdisc replace dev ifb-longhaul root handle 1: htb default 1",
      "tc class replace dev ifb-longhaul parent 1: classid 1:1 htb rate 2000mbit ceil 2000mbit",
      "tc qdisc replace dev ifb-longhaul parent 1:1 handle 2: pfifo limit 3334",
  };
  EXPECT_EQ(TcCommandsForHost(*s, hosts, 0, "eth0"), want);
}

}  // namespace
}  // namespace longhaul::netem
