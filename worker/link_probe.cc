#include "worker/link_probe.h"

#include <algorithm>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

// One peer's link: a client of one connection, and what is known of it so far.
struct Probe {
  std::unique_ptr<TensorClient> client;
  int64_t seq = 0;
  proto::LinkMeasurement m;

  std::shared_ptr<SendOp> Send(const std::vector<float>& data, size_t elements) {
    proto::TensorHeader h;
    h.set_kind(proto::LINK_PROBE);
    h.set_iteration(seq++);
    return client->Send(h, data.data(), elements);
  }
  absl::StatusOr<double> Timed(const std::vector<float>& data, size_t elements) {
    std::shared_ptr<SendOp> op = Send(data, elements);
    if (absl::Status s = op->Wait(); !s.ok()) return s;
    return op->seconds();
  }
};

// Bytes over the time they took, acknowledged a round trip after the last byte left: what remains
// is the bytes' time (at least half the whole, where scheduling noise makes the round trip look
// as long as the transfer).
double RateOf(double bytes, double seconds, double rtt) { return bytes / std::max(seconds - rtt, seconds / 2); }

absl::Status ProbeOne(Probe& p, const LinkProbeOptions& opt, const std::vector<float>& data) {
  if (absl::StatusOr<double> warm = p.Timed(data, 1); !warm.ok()) return warm.status();  // connects
  double rtt = 1e9;
  for (int i = 0; i < opt.round_trips; ++i) {
    absl::StatusOr<double> t = p.Timed(data, 1);
    if (!t.ok()) return t.status();
    rtt = std::min(rtt, *t);
  }
  p.m.set_round_trip_s(rtt);
  const auto start = std::chrono::steady_clock::now();
  size_t spent = 0;
  double rate = 0;
  for (size_t bytes = 256 << 10; bytes <= (4u << 20) && spent + bytes <= opt.max_bytes; bytes *= 4) {
    absl::StatusOr<double> t = p.Timed(data, bytes / 4);
    if (!t.ok()) return t.status();
    spent += bytes;
    rate = std::max(rate, RateOf(bytes, *t, rtt));
    if (std::chrono::steady_clock::now() - start > opt.max_time) break;
  }
  // Two equal tensors back to back, the window already opened by the ones before: from the first's
  // start to the second's acknowledgement is both tensors' bytes' time and a round trip. Not the
  // gap between the two acknowledgements: on a fast link both come in one read, a microsecond
  // apart, which read as 13 TB/s on loopback and had the coordinator refuse the report.
  const size_t pair = std::min<size_t>({(opt.max_bytes - std::min(spent, opt.max_bytes)) / 2, data.size() * 4, 8u << 20});
  if (pair >= (256u << 10) && std::chrono::steady_clock::now() - start <= opt.max_time) {
    std::shared_ptr<SendOp> first = p.Send(data, pair / 4);
    std::shared_ptr<SendOp> second = p.Send(data, pair / 4);
    if (absl::Status s = first->Wait(); !s.ok()) return s;
    if (absl::Status s = second->Wait(); !s.ok()) return s;
    const double span = std::chrono::duration<double>(second->start() - first->start()).count() + second->seconds();
    if (span > 0) rate = std::max(rate, RateOf(2.0 * static_cast<double>(pair), span, rtt));
  }
  p.m.set_bytes_per_s(rate);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LinkProbeResult> ProbeLinks(const std::vector<proto::Peer>& peers, const TransportOptions& transport,
                                           const LinkProbeOptions& opt, const BeforeCardProbe& before_card) {
  // One buffer, read by every peer's probe: 16 MiB, not 16 MiB per peer.
  const std::vector<float> data(std::min<size_t>(kLinkProbeMaxElements, opt.max_bytes / 4), 1.0f);
  TransportOptions one = transport;
  one.connections = 1;
  one.dtype = WireDtype::kF32;
  std::vector<Probe> probes(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    probes[i].client =
        std::make_unique<TensorClient>(peers[i].address(), one, PeerIdentity{peers[i].worker_id(), peers[i].public_key()});
    probes[i].m.set_to_worker(peers[i].worker_id());
  }
  auto failed = [&](size_t i, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrFormat("probing the link to worker %d at %s: %s", peers[i].worker_id(),
                                                  peers[i].address(), s.message()));
  };
  std::vector<absl::Status> results(peers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < peers.size(); ++i) threads.emplace_back([&, i] { results[i] = ProbeOne(probes[i], opt, data); });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < peers.size(); ++i)
    if (!results[i].ok()) return failed(i, results[i]);
  LinkProbeResult out;
  for (Probe& p : probes) out.links.push_back(p.m);
  // The card: the peers above were probed at once, so each rate is its share where this host's
  // card binds. Each peer alone, then all at once, one equal tensor each: where all at once carry
  // clearly less than the peers alone add up to, the card binds, and what they carried is its rate.
  const size_t card_elements = std::min<size_t>(data.size(), opt.card_bytes / 4);
  if (peers.size() >= 2 && card_elements > 0) {
    if (before_card) LH_RETURN_IF_ERROR(before_card(out.links));
    const double bytes = 4.0 * static_cast<double>(card_elements);
    // Twice round, each peer's best: other workers' probes into the same receiver at that moment
    // take their share of its card, and seldom at both passes.
    std::vector<double> alone(probes.size(), 0.0);
    for (int pass = 0; pass < kAlonePasses; ++pass) {
      for (size_t i = 0; i < probes.size(); ++i) {
        Probe& p = probes[i];
        absl::StatusOr<double> t = p.Timed(data, card_elements);
        if (!t.ok()) return failed(i, t.status());
        alone[i] = std::max(alone[i], RateOf(bytes, *t, p.m.round_trip_s()));
      }
    }
    double alone_sum = 0;
    for (size_t i = 0; i < probes.size(); ++i) {
      probes[i].m.set_bytes_per_s(std::max(probes[i].m.bytes_per_s(), alone[i]));
      alone_sum += alone[i];
    }
    // Each one's rate all at once, over its own time: a link slower than the others finishes
    // later, and the span of them all would read as a card that is not there.
    std::vector<std::shared_ptr<SendOp>> ops;
    for (Probe& p : probes) ops.push_back(p.Send(data, card_elements));
    double together = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (absl::Status s = ops[i]->Wait(); !s.ok()) return failed(i, s);
      together += RateOf(bytes, ops[i]->seconds(), probes[i].m.round_trip_s());
    }
    if (together < kCardBindsBelow * alone_sum) out.egress_bytes_per_s = together;
    for (size_t i = 0; i < probes.size(); ++i) out.links[i] = probes[i].m;
  }
  return out;
}

}  // namespace longhaul
