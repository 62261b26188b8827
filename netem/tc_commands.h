#pragma once
// `tc` commands that make a real host's kernel emulate a scenario towards its peers: an htb root on
// the device, one class per destination with the link's rate (under one class of the host's
// egress card where the scenario gives one), a netem child with the link's delay, jitter and loss
// (or the delay daemon, below), and a u32 filter on the destination address; an ingress card
// shapes what arrives from the peers on an IFB device. Queue
// limits are sized to rate x delay, so the queue holds a full window instead of dropping it.
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "netem/delay_daemon.h"
#include "scenario/scenario.h"

namespace longhaul::netem {

// How packets get their delay: netem's child qdisc, or, on kernels without sch_netem (containers
// on such hosts included), a plain pfifo under htb's rate while iptables hands every packet that
// arrives from a peer (chain LONGHAUL, from INPUT) to NFQUEUE kDelayQueue, where `longhaul netem
// delayd` holds it for the link's delay (DaemonLinksForHost). On arrival, not on departure: a
// packet held on its sender's own path still counts against the socket's TCP small queues, which
// then let only a couple of packets out per delay: a small fraction of the link's rate.
enum class DelayBy { kNetem, kDaemon };
inline constexpr int kDelayQueue = 7;
// Where a host with an ingress card (scenario.h) shapes what its peers send: an IFB device.
inline constexpr char kIngressDevice[] = "ifb-longhaul";

// Commands for host `self` of `hosts` (their addresses, in placement order; IPv4 for kDaemon) on
// device `dev`.
std::vector<std::string> TcCommandsForHost(const Scenario& s, const std::vector<std::string>& hosts, int self,
                                           const std::string& dev, DelayBy by = DelayBy::kNetem);
// Removes what TcCommandsForHost installed.
std::vector<std::string> TcClearCommands(const std::string& dev, DelayBy by = DelayBy::kNetem);
// What the delay daemon holds a packet of link `l` from `src` to `dst` (ParseIpv4's) for.
PairDelay DaemonLink(const Link& l, uint32_t src, uint32_t dst);
// The delay daemon's links into host `self` from every other (IPv4 addresses, else an error).
absl::StatusOr<std::vector<PairDelay>> DaemonLinksForHost(const Scenario& s, const std::vector<std::string>& hosts,
                                                          int self);

// Packets a queue must hold for a link: a round trip at its rate (in 1500-byte packets), and at
// least 1000, or what the link drains in kMaxExtraQueueSeconds where that is less (16 at least).
inline constexpr double kMaxExtraQueueSeconds = 0.1;
int QueueLimitPackets(double rate_mbit, double delay_ms);
// The segments a host of the emulation (EmulatedNetwork) lets TCP put in one GSO packet where its
// slowest link runs at `rate_mbit`: what that link carries in a millisecond, at least one; 0 (the
// kernel's 64 KiB) where that is as much or more, or the link is not shaped. htb lets a packet
// through whole once its bucket holds it, so a 64 KiB packet on a slow link is a burst of the
// link's time (0.46 s at 1.1 Mbit/s) crossing at once, and a short message after a pause would
// cross far faster than the link carries it.
int GsoSegments(double rate_mbit);
// An htb class's burst: 1 ms at its rate, and at least its source's largest packet
// (GsoSegments' at the same rate or a slower one) and a frame more, so htb keeps up with them.
long HtbBurstBytes(double rate_mbit);

// A link's htb class where a host's card (egress or ingress, Mbit/s; <= 0: none) is shared by
// `peers` links: its ceiling is the link's own rate (<= 0: unshaped) capped by the card, and it is
// guaranteed an equal part of the card, free to borrow what the others leave, as flows are on a
// host whose queue is fair per flow. Both <= 0: a ceiling of 0, the link is not shaped.
struct HtbShare {
  double rate_mbit, ceil_mbit;
};
HtbShare LinkShare(double link_mbit, double card_mbit, int peers);

}  // namespace longhaul::netem
