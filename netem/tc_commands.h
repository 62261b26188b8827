#pragma once
// `tc` commands that make a real host's kernel (one with sch_netem) emulate a scenario towards its
// peers: an htb root on the device, one class per destination with the link's rate, a netem child
// with the link's delay, jitter and loss, and a u32 filter on the destination address. Queue
// limits are sized to rate x delay, so the queue holds a full window instead of dropping it.
#include <string>
#include <vector>

#include "netem/scenario.h"

namespace longhaul::netem {

// Commands for host `self` of `hosts` (their addresses, in placement order) on device `dev`.
std::vector<std::string> TcCommandsForHost(const Scenario& s, const std::vector<std::string>& hosts, int self,
                                           const std::string& dev);
// Removes what TcCommandsForHost installed.
std::vector<std::string> TcClearCommands(const std::string& dev);

// Packets a queue must hold for a link (rate x delay, in 1500-byte packets, at least 1000).
int QueueLimitPackets(double rate_mbit, double delay_ms);

}  // namespace longhaul::netem
