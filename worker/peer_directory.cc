#include "worker/peer_directory.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "layout/plan_layout.h"
#include "worker/norm_exchange.h"

namespace longhaul {

TensorClient& ClientPool::Get(const PeerIdentity& to, const std::string& dial, const TransportOptions& transport) {
  std::unique_ptr<TensorClient>& c = clients_[{to.worker_id, dial, transport.connections}];
  if (c) {
    c->Rearm(transport.canceller);
  } else {
    c = std::make_unique<TensorClient>(dial, transport, to);
  }
  return *c;
}

void ClientPool::Warm(const PeerIdentity& to, const std::string& dial, const TransportOptions& transport) {
  std::unique_ptr<TensorClient>& c = clients_[{to.worker_id, dial, transport.connections}];
  if (c) return;
  c = std::make_unique<TensorClient>(dial, transport, to);
  c->OpenSoon();
}

void ClientPool::KeepOnly(const std::set<int>& workers) {
  // The clients closed at the last call have ended by now: joining them waits for nothing.
  closed_.clear();
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (workers.count(std::get<0>(it->first))) {
      ++it;
      continue;
    }
    it->second->Close();
    closed_.push_back(std::move(it->second));
    it = clients_.erase(it);
  }
}

PeerDirectory::PeerDirectory(const proto::Plan& plan, int stage, int replica, TransportOptions transport,
                             std::map<std::string, std::string> dial_map, ClientPool* pool)
    : plan_(plan), self_(WorkerAt(plan, stage, replica)), wires_(WiresOf(plan)), connections_(LinkConnectionsOf(plan)),
      stage_(stage), replica_(replica), transport_(std::move(transport)), dial_map_(std::move(dial_map)),
      pool_(pool) {}

absl::StatusOr<std::map<std::string, std::string>> PeerDirectory::ReadDialMap(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open --dial-map ", path));
  std::map<std::string, std::string> map;
  std::string from, to;
  while (f >> from >> to) map[from] = to;
  return map;
}

std::string PeerDirectory::Dial(const std::map<std::string, std::string>& dial_map, const std::string& address) {
  auto via = dial_map.find(address);
  return via == dial_map.end() ? address : via->second;
}

std::string PeerDirectory::AddressOf(int stage, int replica) const {
  for (const proto::Assignment& a : plan_.assignments())
    if (a.stage() == stage && a.replica() == replica) return a.address();
  return "";
}

WireDtype PeerDirectory::WireTo(int stage, int replica, proto::TensorKind kind, int micro, int shard) const {
  return wires_.Of(self_, WorkerAt(plan_, stage, replica), kind, stage_, replica_, micro, shard);
}

TensorClient& PeerDirectory::Client(const proto::Assignment& to) {
  TensorClient*& c = clients_[to.address()];
  if (!c) {
    TransportOptions transport = transport_;
    if (auto n = connections_.find({self_, to.worker_id()}); n != connections_.end()) {
      transport.connections = n->second;
    }
    c = &pool_->Get({to.worker_id(), to.public_key()}, Dial(dial_map_, to.address()), transport);
  }
  return *c;
}

void PeerDirectory::OpenLinks() {
  // A parameter-server host also sends its partial norms to every other host, of any stage.
  const std::vector<NormHost> hosts = NormHosts(plan_);
  auto is_host = [&hosts](int stage, int replica) {
    return std::any_of(hosts.begin(), hosts.end(),
                       [&](const NormHost& h) { return h.stage == stage && h.replica == replica; });
  };
  const bool host = is_host(stage_, replica_);
  for (const proto::Assignment& a : plan_.assignments()) {
    const bool neighbour = a.replica() == replica_ && std::abs(a.stage() - stage_) == 1;
    const bool same_stage = a.stage() == stage_ && a.replica() != replica_;
    const bool norm_peer = host && (a.stage() != stage_ || a.replica() != replica_) && is_host(a.stage(), a.replica());
    if (neighbour || same_stage || norm_peer) Client(a).OpenSoon();
  }
}

void PeerDirectory::Send(int stage, int replica, proto::TensorKind kind, int64_t it, int micro, int shard,
                         const float* data, size_t n, WireDtype dtype) {
  const int to_worker = WorkerAt(plan_, stage, replica);
  const proto::Assignment* to = AssignmentOf(plan_, to_worker);
  if (to == nullptr) {
    if (unaddressed_.ok()) {
      unaddressed_ = absl::InternalError(
          absl::StrFormat("plan v%d has no worker for stage %d replica %d", plan_.version(), stage, replica));
    }
    return;
  }
  proto::TensorHeader h;
  h.set_plan_version(plan_.version());
  h.set_kind(kind);
  h.set_iteration(it);
  h.set_micro_batch(micro);
  h.set_from_stage(stage_);
  h.set_from_replica(replica_);
  h.set_shard(shard);
  const WireDtype wire = dtype != WireDtype::kAuto ? dtype : wires_.Of(self_, to_worker, kind, stage_, replica_, micro, shard);
  h.set_dtype(static_cast<proto::WireDtype>(wire));
  sent_bytes_[{stage, replica}] += WireBytes(n, wire);
  static const char* names[] = {"?",           "send act",   "send grad", "push grads",
                                "send params", "send probe", "send norm", "send validation act"};
  std::function<void(const absl::Status&)> failed;
  if (on_failure_) failed = [f = on_failure_, stage, replica](const absl::Status& s) { f(stage, replica, s); };
  in_flight_.push_back({Client(*to).Send(h, data, n, std::move(failed)),
                        names[kind >= 0 && kind <= proto::EVAL_ACTIVATION ? kind : 0], it, micro, kind});
}

absl::Status PeerDirectory::Flush(Timeline& timeline, bool acknowledged, bool exchange_in_flight) {
  absl::Status first = std::exchange(unaddressed_, absl::OkStatus());
  for (InFlight& f : in_flight_) {
    if (exchange_in_flight && (f.kind == proto::GRAD_PUSH || f.kind == proto::PARAMS)) continue;
    f.op->WaitWritten();
    if (acknowledged) f.op->Wait().IgnoreError();  // reported below
  }
  std::erase_if(in_flight_, [&](InFlight& f) {
    if (!f.op->Done()) return false;
    absl::Status s = f.op->Wait();
    if (!s.ok() && first.ok()) first = s;
    const int64_t start = std::chrono::duration_cast<std::chrono::microseconds>(f.op->start().time_since_epoch()).count();
    timeline.Add(f.what, Track::kSend, start, start + static_cast<int64_t>(f.op->seconds() * 1e6), f.iteration, f.micro);
    return true;
  });
  return first;
}

}  // namespace longhaul
