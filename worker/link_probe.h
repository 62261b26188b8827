#pragma once
// Link probes at join: before the plan, each worker times tensors to every other worker through
// the real tensor transport and reports a round trip and a bandwidth per peer, which the
// coordinator plans with where it has no scenario's links (cluster.link_probe).
//
// Per peer, on a connection of its own and all peers at once: one tensor to connect, then
// `round_trips` one-element tensors one after another (the round trip is the shortest
// acknowledgement), then tensors of 256 KiB, 1 and 4 MiB (each one's bytes over its time less a
// round trip), then two equal tensors of up to 8 MiB back to back (the second's bytes over the
// gap between their acknowledgements), within the byte and time budgets; the bandwidth is the
// best of these. TCP's slow start means a link whose bandwidth-delay product is more than the
// probe's bytes can fill reads slower than it is: the bandwidth is a floor, the further below the
// link's rate the larger that product.
//
// Pairwise probes cannot see a host's network card, which all of its links share (and the ones
// above, run at once, each read their share of it). So with two peers or more, one tensor of
// `card_bytes` goes to each peer alone, one after another in the order given, kAlonePasses times
// round (a link's rate is the best of those and the above), and then one to every peer at once,
// each timed on its own: where their rates at once add up to less than kCardBindsBelow of their
// rates alone, the card binds, and that sum is the host's egress. Every worker probes at the same
// time: so that none still probes all its links at once while another times its peers alone,
// each reports its links and waits for every other worker's before its card's probe (the
// coordinator is the barrier: `before_card`). Receivers' cards may still count in where two
// workers time one receiver alone at once; the workers' orders are rotations of one list
// (Worker::ProbeLinks), so peers probed alone in step each reach another receiver.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul.pb.h"
#include "transport/tensor_transport.h"

namespace longhaul {

// The largest probe tensor a worker admits (16 MiB of fp32).
inline constexpr uint64_t kLinkProbeMaxElements = uint64_t{4} << 20;

// How many times round the peers alone go, each peer's best counting.
inline constexpr int kAlonePasses = 2;

// All peers at once carrying less than this share of their rates alone: a card binds.
inline constexpr double kCardBindsBelow = 0.8;

struct LinkProbeOptions {
  int round_trips = 5;
  size_t card_bytes = size_t{4} << 20;  // per peer, alone and all at once; 0: no card probe
  size_t max_bytes = size_t{24} << 20;  // per peer
  std::chrono::milliseconds max_time{4000};  // per peer; the transfer that crosses it is the last
};

struct LinkProbeResult {
  std::vector<proto::LinkMeasurement> links;
  double egress_bytes_per_s = 0;  // the host's card where it binds; 0: none seen
};

// Called with the links measured all at once where the card's probe follows, before it: an error
// stops the probes.
using BeforeCardProbe = std::function<absl::Status(const std::vector<proto::LinkMeasurement>& links)>;

// Measures the link from this worker to each of `peers`, and its card; fails naming the peer that
// could not be reached within `transport.timeout`.
absl::StatusOr<LinkProbeResult> ProbeLinks(const std::vector<proto::Peer>& peers, const TransportOptions& transport,
                                           const LinkProbeOptions& opt = {},
                                           const BeforeCardProbe& before_card = nullptr);

}  // namespace longhaul
