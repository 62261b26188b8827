#include "netem/tc_commands.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace longhaul::netem {

int QueueLimitPackets(double rate_mbit, double delay_ms) {
  const double bytes = rate_mbit * 1e6 / 8 * (2 * delay_ms) / 1e3;  // a round trip's worth in flight
  // Past the round trip's worth, 1000 packets, or what drains in kMaxExtraQueueSeconds where that
  // is less: on a slow link 1000 packets are seconds of queue (9 s at 1.3 Mbit/s), which one bulk
  // flow fills; its round trip then jumps by seconds, it times out while its packets still queue,
  // and starts over from one packet, stalling the link for seconds.
  const double drains = rate_mbit * 1e6 / 8 * kMaxExtraQueueSeconds / 1500;
  const int extra = std::max(16, std::min(1000, static_cast<int>(std::ceil(drains))));
  return std::max(extra, static_cast<int>(std::ceil(bytes / 1500)));
}

namespace {
constexpr long kFrameBytes = 1514;  // an Ethernet frame of a 1500-byte packet
constexpr long kGsoDefaultBytes = 65536;
double BytesPerMs(double rate_mbit) { return rate_mbit * 1e6 / 8 / 1000; }
}  // namespace

int GsoSegments(double rate_mbit) {
  if (rate_mbit <= 0) return 0;
  const long segments = static_cast<long>(BytesPerMs(rate_mbit) / kFrameBytes);
  return segments * kFrameBytes >= kGsoDefaultBytes ? 0 : static_cast<int>(std::max<long>(1, segments));
}

long HtbBurstBytes(double rate_mbit) {
  const int segments = GsoSegments(rate_mbit);
  const long packet = segments > 0 ? segments * kFrameBytes : kGsoDefaultBytes;
  return std::max<long>(packet + kFrameBytes, static_cast<long>(BytesPerMs(rate_mbit)));
}

HtbShare LinkShare(double link_mbit, double card_mbit, int peers) {
  if (card_mbit <= 0) return {link_mbit, link_mbit};
  const double ceil = link_mbit > 0 ? std::min(link_mbit, card_mbit) : card_mbit;
  return {std::min(ceil, card_mbit / std::max(peers, 1)), ceil};
}

std::vector<std::string> TcCommandsForHost(const Scenario& s, const std::vector<std::string>& hosts, int self,
                                           const std::string& dev, DelayBy by) {
  std::vector<std::string> cmds;
  const int peers = static_cast<int>(hosts.size()) - 1;
  cmds.push_back(absl::StrFormat("tc qdisc replace dev %s root handle 1: htb default 1", dev));
  cmds.push_back(absl::StrFormat("tc class replace dev %s parent 1: classid 1:1 htb rate 100gbit", dev));
  // The card's egress: one class of its rate over the peers' classes, which share it (each
  // guaranteed an equal part, free to borrow what the others leave).
  const double egress = s.EgressMbit(self);
  if (egress > 0) {
    cmds.push_back(absl::StrFormat("tc class replace dev %s parent 1: classid 1:2 htb rate %gmbit ceil %gmbit", dev,
                                   egress, egress));
  }
  for (int to = 0; to < static_cast<int>(hosts.size()); ++to) {
    if (to == self) continue;
    const Link l = s.Between(self, to);
    const int cls = 10 + to;
    const HtbShare share = LinkShare(l.rate_mbit > 0 ? l.rate_mbit : 100000, egress, peers);
    cmds.push_back(absl::StrFormat("tc class replace dev %s parent %s classid 1:%d htb rate %gmbit ceil %gmbit", dev,
                                   egress > 0 ? "1:2" : "1:", cls, share.rate_mbit, share.ceil_mbit));
    const int limit = QueueLimitPackets(share.ceil_mbit, l.delay_ms);
    if (by == DelayBy::kDaemon) {
      cmds.push_back(absl::StrFormat("tc qdisc replace dev %s parent 1:%d handle %d: pfifo limit %d", dev, cls, cls, limit));
    } else {
      std::string netem = absl::StrFormat("tc qdisc replace dev %s parent 1:%d handle %d: netem limit %d delay %gms",
                                          dev, cls, cls, limit, l.delay_ms);
      if (l.jitter_ms > 0) netem += absl::StrFormat(" %gms", l.jitter_ms);
      if (l.loss > 0) netem += absl::StrFormat(" loss %g%%", 100 * l.loss);
      cmds.push_back(netem);
    }
    cmds.push_back(absl::StrFormat("tc filter replace dev %s parent 1: protocol ip prio 1 u32 match ip dst %s/32 "
                                   "flowid 1:%d",
                                   dev, hosts[to], cls));
  }
  // The card's ingress: what the peers send is redirected through an IFB device, whose egress
  // holds it to the card's rate (a device shapes only what leaves it).
  if (const double ingress = s.IngressMbit(self); ingress > 0) {
    cmds.push_back(absl::StrFormat("ip link show %s >/dev/null 2>&1 || ip link add %s type ifb", kIngressDevice,
                                   kIngressDevice));
    cmds.push_back(absl::StrFormat("ip link set %s up", kIngressDevice));
    cmds.push_back(absl::StrFormat("tc qdisc replace dev %s handle ffff: ingress", dev));
    for (int from = 0; from < static_cast<int>(hosts.size()); ++from) {
      if (from == self) continue;
      cmds.push_back(absl::StrFormat("tc filter replace dev %s parent ffff: protocol ip prio 1 u32 match ip src %s/32 "
                                     "action mirred egress redirect dev %s",
                                     dev, hosts[from], kIngressDevice));
    }
    double longest_ms = 0;
    for (int from = 0; from < static_cast<int>(hosts.size()); ++from) {
      if (from != self) longest_ms = std::max(longest_ms, s.Between(from, self).delay_ms);
    }
    cmds.push_back(absl::StrFormat("tc qdisc replace dev %s root handle 1: htb default 1", kIngressDevice));
    cmds.push_back(absl::StrFormat("tc class replace dev %s parent 1: classid 1:1 htb rate %gmbit ceil %gmbit",
                                   kIngressDevice, ingress, ingress));
    cmds.push_back(absl::StrFormat("tc qdisc replace dev %s parent 1:1 handle 2: pfifo limit %d", kIngressDevice,
                                   QueueLimitPackets(ingress, longest_ms)));
  }
  if (by == DelayBy::kDaemon) {
    cmds.push_back("iptables -N LONGHAUL");
    cmds.push_back("iptables -A INPUT -j LONGHAUL");
    for (int from = 0; from < static_cast<int>(hosts.size()); ++from) {
      if (from != self) {
        cmds.push_back(
            absl::StrFormat("iptables -A LONGHAUL -s %s/32 -j NFQUEUE --queue-num %d", hosts[from], kDelayQueue));
      }
    }
  }
  return cmds;
}

std::vector<std::string> TcClearCommands(const std::string& dev, DelayBy by) {
  std::vector<std::string> cmds = {
      absl::StrFormat("tc qdisc del dev %s root", dev),
      // An ingress card's redirect and device, where the scenario gave one.
      absl::StrFormat("tc qdisc del dev %s ingress 2>/dev/null || true", dev),
      absl::StrFormat("ip link del %s 2>/dev/null || true", kIngressDevice)};
  if (by == DelayBy::kDaemon) {
    cmds.insert(cmds.end(), {"iptables -D INPUT -j LONGHAUL", "iptables -F LONGHAUL", "iptables -X LONGHAUL"});
  }
  return cmds;
}

absl::StatusOr<std::vector<PairDelay>> DaemonLinksForHost(const Scenario& s, const std::vector<std::string>& hosts,
                                                          int self) {
  std::vector<uint32_t> ip;
  for (const std::string& h : hosts) {
    const std::optional<uint32_t> a = ParseIpv4(h);
    if (!a) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the delay daemon needs IPv4 addresses in --hosts; '%s' is none (resolve names first)", h));
    }
    ip.push_back(*a);
  }
  std::vector<PairDelay> links;
  for (int from = 0; from < static_cast<int>(hosts.size()); ++from) {
    if (from != self) links.push_back(DaemonLink(s.Between(from, self), ip[from], ip[self]));
  }
  return links;
}

PairDelay DaemonLink(const Link& l, uint32_t src, uint32_t dst) {
  return {src, dst, static_cast<int64_t>(l.delay_ms * 1e6), static_cast<int64_t>(l.jitter_ms * 1e6), l.loss};
}

}  // namespace longhaul::netem
