#pragma once
// The delay daemon of tier-2 emulation. It runs in the router namespace and binds an NFQUEUE that
// the router's FORWARD chain feeds every forwarded packet into. Each packet's verdict is held for
// the one-way delay of its (source, destination) pair, plus jitter kept monotone per pair so a pair
// never reorders, and a packet is dropped with the pair's loss probability. Rates are not its job:
// htb classes on the router's egress do that after the verdict. The hold counts from the kernel's
// arrival timestamp and ends on a TimerQueue; the daemon runs at a real-time priority, so the
// workers' compute does not delay its wake-ups.
//
// It asks the kernel for whole GSO packets and only their first 20 bytes (the IPv4 header), so a
// 10 Gbit/s flow costs it a few thousand packets a second. The chain has no --queue-bypass: if the
// daemon dies, packets are dropped rather than passed undelayed, and the launcher, which watches
// it, stops the experiment.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace longhaul::netem {

struct PairDelay {
  uint32_t src = 0, dst = 0;  // IPv4 addresses, host byte order
  int64_t delay_ns = 0, jitter_ns = 0;
  double loss = 0;
};

// A dotted-quad IPv4 address in host byte order, as PairDelay holds it; nullopt for anything else.
std::optional<uint32_t> ParseIpv4(const std::string& dotted);

// Links file: one line per pair, "src dst delay_ns jitter_ns loss" (dotted quads).
absl::Status WriteLinksFile(const std::string& path, const std::vector<PairDelay>& links);

// Serves queue `queue` until SIGTERM/SIGINT; prints "ready" on stdout once bound.
absl::Status RunDelayDaemon(int queue, const std::string& links_file, uint64_t seed);

}  // namespace longhaul::netem
