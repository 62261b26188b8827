#include "worker/link_probe.h"

#include <algorithm>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace longhaul {
namespace {

absl::StatusOr<proto::LinkMeasurement> ProbeOne(const proto::Peer& peer, TransportOptions transport,
                                                const LinkProbeOptions& opt, const std::vector<float>& data) {
  transport.connections = 1;
  transport.dtype = WireDtype::kF32;
  TensorClient client(peer.address(), transport, {peer.worker_id(), peer.public_key()});
  int64_t seq = 0;
  auto header = [&] {
    proto::TensorHeader h;
    h.set_kind(proto::LINK_PROBE);
    h.set_iteration(seq++);
    return h;
  };
  auto timed = [&](size_t elements) -> absl::StatusOr<double> {
    std::shared_ptr<SendOp> op = client.Send(header(), data.data(), elements);
    if (absl::Status s = op->Wait(); !s.ok()) return s;
    return op->seconds();
  };
  if (absl::StatusOr<double> warm = timed(1); !warm.ok()) return warm.status();  // connects
  double rtt = 1e9;
  for (int i = 0; i < opt.round_trips; ++i) {
    absl::StatusOr<double> t = timed(1);
    if (!t.ok()) return t.status();
    rtt = std::min(rtt, *t);
  }
  proto::LinkMeasurement m;
  m.set_to_worker(peer.worker_id());
  m.set_round_trip_s(rtt);
  const auto start = std::chrono::steady_clock::now();
  size_t spent = 0;
  double rate = 0;
  for (size_t bytes = 256 << 10; bytes <= (4u << 20) && spent + bytes <= opt.max_bytes; bytes *= 4) {
    absl::StatusOr<double> t = timed(bytes / 4);
    if (!t.ok()) return t.status();
    spent += bytes;
    // Acknowledged a round trip after the last byte left: what remains is the bytes' time (at least
    // half the whole, where scheduling noise makes the round trip look as long as the transfer).
    rate = std::max(rate, static_cast<double>(bytes) / std::max(*t - rtt, *t / 2));
    if (std::chrono::steady_clock::now() - start > opt.max_time) break;
  }
  // Two equal tensors back to back, the window already opened by the ones before: from the first's
  // start to the second's acknowledgement is both tensors' bytes' time and a round trip. Not the
  // gap between the two acknowledgements: on a fast link both come in one read, a microsecond
  // apart, which read as 13 TB/s on loopback and had the coordinator refuse the report.
  const size_t pair = std::min<size_t>({(opt.max_bytes - std::min(spent, opt.max_bytes)) / 2, data.size() * 4, 8u << 20});
  if (pair >= (256u << 10) && std::chrono::steady_clock::now() - start <= opt.max_time) {
    std::shared_ptr<SendOp> first = client.Send(header(), data.data(), pair / 4);
    std::shared_ptr<SendOp> second = client.Send(header(), data.data(), pair / 4);
    if (absl::Status s = first->Wait(); !s.ok()) return s;
    if (absl::Status s = second->Wait(); !s.ok()) return s;
    const double span = std::chrono::duration<double>(second->start() - first->start()).count() + second->seconds();
    if (span > 0) rate = std::max(rate, 2.0 * static_cast<double>(pair) / std::max(span - rtt, span / 2));
  }
  m.set_bytes_per_s(rate);
  return m;
}

}  // namespace

absl::StatusOr<std::vector<proto::LinkMeasurement>> ProbeLinks(const std::vector<proto::Peer>& peers,
                                                                const TransportOptions& transport,
                                                                const LinkProbeOptions& opt) {
  // One buffer, read by every peer's probe: 16 MiB, not 16 MiB per peer.
  const std::vector<float> data(std::min<size_t>(kLinkProbeMaxElements, opt.max_bytes / 4), 1.0f);
  std::vector<absl::StatusOr<proto::LinkMeasurement>> results(peers.size(), absl::UnknownError("not probed"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < peers.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = ProbeOne(peers[i], transport, opt, data); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<proto::LinkMeasurement> out;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!results[i].ok()) {
      return absl::Status(results[i].status().code(),
                          absl::StrFormat("probing the link to worker %d at %s: %s", peers[i].worker_id(),
                                          peers[i].address(), results[i].status().message()));
    }
    out.push_back(*results[i]);
  }
  return out;
}

}  // namespace longhaul
