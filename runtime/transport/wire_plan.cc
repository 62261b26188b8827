#include "transport/wire_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "layout/plan_layout.h"

namespace longhaul {

WireDtype WirePlan::Of(int from, int to, int kind) const {
  if (kind == proto::PARAMS) return params_dtype;
  if (kind == proto::NORM) return WireDtype::kF32;  // doubles as float pairs, bit for bit
  // Rare, and the validation loss is to be the one-process run's for the same parameters.
  if (kind == proto::EVAL_ACTIVATION) return WireDtype::kF32;
  if (kind == proto::GRAD_PUSH && push_dtype != WireDtype::kAuto) return push_dtype;
  if (kind == proto::GRADIENT && gradient_dtype != WireDtype::kAuto) return gradient_dtype;
  auto it = links.find({from, to});
  return it == links.end() ? default_dtype : it->second;
}

WireDtype WirePlan::Of(int from, int to, int kind, int stage, int replica, int micro, int shard) const {
  if (group_micro_batches <= 0 || (kind != proto::ACTIVATION && kind != proto::GRADIENT && kind != proto::GRAD_PUSH)) {
    return Of(from, to, kind);
  }
  const bool push = kind == proto::GRAD_PUSH;
  const int job_replica = replica * groups + (push ? micro : micro / group_micro_batches);
  auto it = streams.find({kind, stage, job_replica, push ? shard : 0});
  return it == streams.end() ? default_dtype : it->second;
}

const char* WirePlan::KeyOf(int kind) const {
  if (kind == proto::GRAD_PUSH && push_dtype != WireDtype::kAuto) return "transport.exchange_dtype";
  if (kind == proto::GRADIENT && gradient_dtype != WireDtype::kAuto) return "transport.gradient_dtype";
  return "transport.wire_dtype";
}

std::vector<std::pair<int, int>> TensorPairs(const std::vector<std::vector<int>>& at) {
  std::vector<std::pair<int, int>> pairs;
  for (size_t s = 0; s < at.size(); ++s)
    for (size_t r = 0; r < at[s].size(); ++r) {
      if (s + 1 < at.size()) {
        pairs.push_back({at[s][r], at[s + 1][r]});
        pairs.push_back({at[s + 1][r], at[s][r]});
      }
      for (size_t q = 0; q < at[s].size(); ++q)
        if (q != r) pairs.push_back({at[s][r], at[s][q]});
    }
  return pairs;
}

WirePlan ResolveWires(WireDtype configured, WireDtype fast, const std::vector<std::pair<int, int>>& pairs,
                      const std::function<double(int, int)>& rate, bool local_updates, WireDtype exchange,
                      WireDtype gradient) {
  WirePlan w;
  w.gradient_dtype = gradient;
  WireDtype lossy = WireDtype::kAuto;  // the lossy dtype the exchange uses somewhere, if any
  if (configured != WireDtype::kAuto) {
    w.default_dtype = configured;
    w.params_dtype = WireDtypeFor(configured, proto::PARAMS);
    if (IsLossy(configured)) lossy = configured;
  } else {
    w.default_dtype = w.params_dtype = fast;
    for (const auto& [from, to] : pairs) {
      if (from == to || rate(from, to) >= kAutoInt8Below) continue;
      w.links[{from, to}] = lossy = WireDtype::kInt8;
      w.params_dtype = WireDtypeFor(WireDtype::kInt8, proto::PARAMS);
    }
  }
  if (exchange != WireDtype::kAuto) {
    w.push_dtype = exchange;
    w.params_dtype = WireDtypeFor(exchange, proto::PARAMS);
    lossy = IsLossy(exchange) ? exchange : WireDtype::kAuto;
  }
  if (local_updates && lossy != WireDtype::kAuto) {
    // The change between exchanges travels lossy; whole parameters must be exact, for the
    // replicas to hold what the shard holds.
    w.change_dtype = lossy;
    w.params_dtype = WireDtype::kF32;
  }
  return w;
}

bool BoundaryMayBeLossy(WireDtype configured, WireDtype gradient) {
  return configured == WireDtype::kAuto || IsLossy(configured) || IsLossy(gradient);
}

bool ExchangeMayBeLossy(WireDtype configured, WireDtype exchange) {
  if (exchange != WireDtype::kAuto) return IsLossy(exchange);
  return BoundaryMayBeLossy(configured);
}

std::string DescribeWires(const WirePlan& wires) {
  std::string line = WireDtypeName(wires.default_dtype);
  if (!wires.links.empty()) {
    line = absl::StrFormat("%s; %s on %d links slower than %.0f Gbit/s; parameters %s", line,
                           WireDtypeName(wires.links.begin()->second), wires.links.size(), kAutoInt8Below * 8 / 1e9,
                           WireDtypeName(wires.params_dtype));
  }
  if (wires.push_dtype != WireDtype::kAuto) {
    line += absl::StrFormat("; the data-parallel exchange %s", WireDtypeName(wires.push_dtype));
  }
  if (wires.gradient_dtype != WireDtype::kAuto) {
    line += absl::StrFormat("; the boundaries' gradients %s", WireDtypeName(wires.gradient_dtype));
  }
  if (wires.change_dtype != WireDtype::kAuto) {
    line += absl::StrFormat(" (parameters as their change in %s)", WireDtypeName(wires.change_dtype));
  }
  return line;
}

bool ParamsTravelWhole(const WirePlan& wires, int64_t it, int64_t start) {
  return wires.change_dtype == WireDtype::kAuto || it == start - 1;
}

void SetWires(const WirePlan& wires, proto::Plan& plan) {
  plan.set_wire_dtype(static_cast<proto::WireDtype>(wires.default_dtype));
  plan.set_params_wire_dtype(static_cast<proto::WireDtype>(wires.params_dtype));
  plan.set_params_change_wire_dtype(static_cast<proto::WireDtype>(wires.change_dtype));
  plan.set_push_wire_dtype(static_cast<proto::WireDtype>(wires.push_dtype));
  plan.set_gradient_wire_dtype(static_cast<proto::WireDtype>(wires.gradient_dtype));
  plan.clear_link_wires();
  for (const auto& [pair, dtype] : wires.links) {
    proto::LinkWire* l = plan.add_link_wires();
    l->set_from_worker(pair.first);
    l->set_to_worker(pair.second);
    l->set_dtype(static_cast<proto::WireDtype>(dtype));
  }
}

WirePlan WiresOf(const proto::Plan& plan) {
  WirePlan w;
  w.default_dtype = static_cast<WireDtype>(plan.wire_dtype());
  w.params_dtype = static_cast<WireDtype>(plan.params_wire_dtype());
  w.change_dtype = static_cast<WireDtype>(plan.params_change_wire_dtype());
  w.push_dtype = static_cast<WireDtype>(plan.push_wire_dtype());
  w.gradient_dtype = static_cast<WireDtype>(plan.gradient_wire_dtype());
  for (const proto::LinkWire& l : plan.link_wires()) {
    w.links[{l.from_worker(), l.to_worker()}] = static_cast<WireDtype>(l.dtype());
  }
  // A plan running a cut of its own has streams of its own: its links decide.
  if (plan.stream_group_micro_batches() > 0 && plan.job_config_toml().empty()) {
    w.group_micro_batches = plan.stream_group_micro_batches();
    w.groups = std::max(1, plan.micro_batches() / w.group_micro_batches);
    for (const proto::StreamWire& sw : plan.stream_wires()) {
      w.streams[{sw.kind(), sw.stage(), sw.job_replica(), sw.shard()}] = static_cast<WireDtype>(sw.dtype());
    }
  }
  return w;
}

void FixStreamWires(const std::vector<std::vector<int>>& at, int micro_batches, proto::Plan& plan) {
  const WirePlan wires = WiresOf(plan);
  plan.clear_stream_wires();
  plan.set_stream_group_micro_batches(micro_batches);
  auto fix = [&](proto::TensorKind kind, int stage, int replica, int shard, int to) {
    const WireDtype dtype = wires.Of(at[stage][replica], to, kind);
    if (dtype == wires.default_dtype) return;
    proto::StreamWire* sw = plan.add_stream_wires();
    sw->set_kind(kind);
    sw->set_stage(stage);
    sw->set_job_replica(replica);
    sw->set_shard(shard);
    sw->set_dtype(static_cast<proto::WireDtype>(dtype));
  };
  const int stages = static_cast<int>(at.size());
  for (int s = 0; s < stages; ++s)
    for (int r = 0; r < static_cast<int>(at[s].size()); ++r) {
      if (s + 1 < stages) fix(proto::ACTIVATION, s, r, 0, at[s + 1][r]);
      if (s > 0) fix(proto::GRADIENT, s, r, 0, at[s - 1][r]);
      for (const proto::ShardPlacement& sp : plan.shards())
        if (sp.stage() == s) fix(proto::GRAD_PUSH, s, r, sp.shard(), at[s][sp.owner_replica()]);
    }
}

std::set<std::pair<int, int>> FeedbackStreams(const proto::Plan& plan, const JobConfig& cfg) {
  const WirePlan wires = WiresOf(plan);
  const int groups = GroupsPerReplica(plan, cfg);
  std::set<std::pair<int, int>> streams;
  for (const proto::Assignment& a : plan.assignments())
    for (const proto::ShardPlacement& sp : plan.shards()) {
      if (sp.stage() != a.stage()) continue;
      const int owner = WorkerAt(plan, sp.stage(), sp.owner_replica());
      for (int g = 0; g < groups; ++g)
        if (IsLossy(wires.Of(a.worker_id(), owner, proto::GRAD_PUSH, a.stage(), a.replica(), g, sp.shard()))) {
          streams.insert({a.stage(), a.replica() * groups + g});
        }
    }
  return streams;
}

}  // namespace longhaul
