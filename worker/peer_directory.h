#pragma once
// Where each worker of the plan listens, and the connections to them: one TensorClient per peer
// address (dialled through the dial map where one is given: an emulated link's proxy), the sends
// in flight, and when each finished (for the timeline).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul.pb.h"
#include "metrics/timeline.h"
#include "transport/tensor_transport.h"
#include "transport/link_connections.h"
#include "transport/wire_plan.h"

namespace longhaul {

// The clients of the peers this worker sends to, kept from one plan version to the next: a
// connection its version's end found between tensors stays open, so the next version's first
// tensors on it pay no connect and no handshake (a round trip before the data, on a long link)
// nor TCP's slow start. A client is the peer's by worker id, which the coordinator never gives
// again: a restarted process is a new worker with new connections. Each client checks that its
// receiver proves it is that worker, by the key the job registered for it.
class ClientPool {
 public:
  // The client of worker `to`, dialled at `dial` over transport.connections connections, serving
  // transport.canceller (a kept client is rearmed with it).
  // REQUIRES: every send of the previous version is done (NetworkChannel::Drain).
  TensorClient& Get(const PeerIdentity& to, const std::string& dial, const TransportOptions& transport);
  // Opens the connections to worker `to` now, where the pool has no such client yet: a peer that
  // may have a place in the next version (a spare), or in the first.
  void Warm(const PeerIdentity& to, const std::string& dial, const TransportOptions& transport);
  // Closes the clients of every other worker. Their threads are joined at the next call (or with
  // the pool): joined here, a recovery's set-up would wait for a lost peer's client thread to be
  // scheduled on busy cores, before the survivor's first tensor of the new version.
  // REQUIRES: no PeerDirectory uses them.
  void KeepOnly(const std::set<int>& workers);

 private:
  std::map<std::tuple<int, std::string, int>, std::unique_ptr<TensorClient>> clients_;  // worker, dial, connections
  std::vector<std::unique_ptr<TensorClient>> closed_;  // by the last KeepOnly, their threads ending
};

class PeerDirectory {
 public:
  // This worker runs (stage, replica) of `plan`; `dial_map` maps a peer's address to the address
  // to dial instead. The clients come from `pool`, which must outlive the directory.
  PeerDirectory(const proto::Plan& plan, int stage, int replica, TransportOptions transport,
                std::map<std::string, std::string> dial_map, ClientPool* pool);
  // Reads a dial map: "peer_address dial_instead" per line.
  static absl::StatusOr<std::map<std::string, std::string>> ReadDialMap(const std::string& path);
  // Where to dial the peer at `address`.
  static std::string Dial(const std::map<std::string, std::string>& dial_map, const std::string& address);

  const TransportOptions& transport() const { return transport_; }
  // What this worker's tensor of `kind`, micro-batch (a push: group) `micro` and push shard
  // `shard`, to the one running (stage, replica) travels in: the plan's (transport/wire_plan.h).
  WireDtype WireTo(int stage, int replica, proto::TensorKind kind, int micro, int shard) const;
  // The address of the worker running (stage, replica), or empty when the plan has none.
  std::string AddressOf(int stage, int replica) const;

  // Opens the connections every iteration uses now (TensorClient::OpenSoon): to this replica's
  // neighbouring stages, to this stage's other replicas (pushes and parameters) and, from a
  // parameter-server host, to every other host (partial norms). A new plan version's first
  // iteration then does not wait for them.
  void OpenLinks();

  // Called with the peer's (stage, replica) as a send to it fails other than by a cancellation
  // (TensorClient::Send's on_failure), from whichever thread saw it.
  void SetFailureObserver(std::function<void(int stage, int replica, const absl::Status&)> observer) {
    on_failure_ = std::move(observer);
  }
  // Sends n floats to the worker running (stage, replica) as a tensor of `kind`, in `dtype` where
  // given (parameters sent as their change), else the plan's; with the fp32 wire, `data` is read in
  // place and must stay unchanged until Flush.
  void Send(int stage, int replica, proto::TensorKind kind, int64_t it, int micro, int shard, const float* data,
            size_t n, WireDtype dtype = WireDtype::kAuto);
  // Waits until every send's bytes are written (its data may change from then on) and, with
  // `acknowledged`, until every send is acknowledged too. Sends that were acknowledged go into
  // `timeline` under their iteration; the first error of those that finished is returned (a send
  // still unacknowledged reports its error at a later Flush). Not waiting for acknowledgements is
  // what lets the next iteration start a round trip earlier on a long link.
  // With `exchange_in_flight` the exchange's sends (pushes, parameters) are not waited for: an
  // overlapped exchange's (NetworkChannel::FlushOverlapped).
  absl::Status Flush(Timeline& timeline, bool acknowledged = false, bool exchange_in_flight = false);
  // Bytes handed to each peer, by its (stage, replica), since the last call: what the metrics
  // report per link.
  std::map<std::pair<int, int>, uint64_t> TakeSentBytes() { return std::exchange(sent_bytes_, {}); }

 private:
  struct InFlight {
    std::shared_ptr<SendOp> op;
    const char* what;
    int64_t iteration;
    int micro;
    proto::TensorKind kind;
  };
  // The client of the worker the plan assigns `to`, over as many connections as the plan gives
  // the link.
  TensorClient& Client(const proto::Assignment& to);

  const proto::Plan plan_;
  const int self_;  // this worker's id in the plan
  const WirePlan wires_;
  const std::map<std::pair<int, int>, int> connections_;  // (from, to) worker: the plan's, where more than one
  const int stage_, replica_;
  TransportOptions transport_;
  std::map<std::string, std::string> dial_map_;
  ClientPool* pool_;
  std::map<std::string, TensorClient*> clients_;  // this version's, by the peer's address
  std::map<std::pair<int, int>, uint64_t> sent_bytes_;
  std::vector<InFlight> in_flight_;
  absl::Status unaddressed_;  // a send to a (stage, replica) the plan does not have
  std::function<void(int, int, const absl::Status&)> on_failure_;
};

}  // namespace longhaul
