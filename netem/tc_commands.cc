#include "netem/tc_commands.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace longhaul::netem {

int QueueLimitPackets(double rate_mbit, double delay_ms) {
  const double bytes = rate_mbit * 1e6 / 8 * (2 * delay_ms) / 1e3;  // a round trip's worth in flight
  return std::max(1000, static_cast<int>(std::ceil(bytes / 1500)));
}

std::vector<std::string> TcCommandsForHost(const Scenario& s, const std::vector<std::string>& hosts, int self,
                                           const std::string& dev, DelayBy by) {
  std::vector<std::string> cmds;
  cmds.push_back(absl::StrFormat("tc qdisc replace dev %s root handle 1: htb default 1", dev));
  cmds.push_back(absl::StrFormat("tc class replace dev %s parent 1: classid 1:1 htb rate 100gbit", dev));
  for (int to = 0; to < static_cast<int>(hosts.size()); ++to) {
    if (to == self) continue;
    const Link l = s.Between(self, to);
    const int cls = 10 + to;
    const double rate = l.rate_mbit > 0 ? l.rate_mbit : 100000;
    cmds.push_back(absl::StrFormat("tc class replace dev %s parent 1: classid 1:%d htb rate %gmbit ceil %gmbit", dev,
                                   cls, rate, rate));
    const int limit = QueueLimitPackets(rate, l.delay_ms);
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
  std::vector<std::string> cmds = {absl::StrFormat("tc qdisc del dev %s root", dev)};
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
