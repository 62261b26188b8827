#include "plan/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "metrics/flops.h"
#include "model/param_layout.h"
#include "transport/tensor_transport.h"
#include "transport/wire_plan.h"
#include "util/status_macros.h"

namespace longhaul {

StageSpec Layout::Spec(int stage) const {
  return blocks_per_stage.empty() ? StageSpec::Even(work.model, stage, stages)
                                  : StageSpec::OfCut(blocks_per_stage, stage);
}

BoundaryShape Layout::Boundary(bool gradient) const {
  return BoundaryOf(work.model, static_cast<size_t>(work.micro_batch) * work.seq_len,
                    RankDivisor(gradient, boundary_rank_divisor, gradient_rank_divisor), shared_directions);
}

double Layout::BoundaryBytes() const {
  return static_cast<double>(
      WireBytes(static_cast<size_t>(BoundaryElements(false)), wire == WireDtype::kAuto ? WireDtype::kInt8 : wire));
}

Placement DefaultPlacement(const Layout& layout, bool central_ps) {
  Placement p;
  p.worker.assign(layout.stages, std::vector<int>(layout.replicas));
  for (int r = 0; r < layout.replicas; ++r)
    for (int s = 0; s < layout.stages; ++s) {
      p.worker[s][r] = r * layout.stages + s;
      p.host.push_back(r * layout.stages + s);
    }
  for (int s = 0; s < layout.stages; ++s) {
    for (const ParamLayout::PsShardCut& cut :
         ParamLayout(layout.work.model, layout.Spec(s)).PsShards(layout.replicas, central_ps)) {
      p.shards.push_back({s, static_cast<double>(cut.floats), p.worker[s][cut.owner_replica]});
    }
  }
  return p;
}

namespace {

enum class EventKind {
  kRun,        // a worker goes on with its instruction list
  kTensorIn,   // an activation or its gradient reached the worker `who` (`aux`: its slot)
  kGradIn,     // one replica's gradient of a shard reached the shard's host
  kParamIn,    // a shard's parameters reached the worker `who` (`aux`: the shard's index in its stage)
  kPushOut,    // a worker's backward finished a shard's gradients: they leave for the host
  kParamsOut,  // a host stepped a shard: its parameters leave for every replica
  kFlows,      // with cards: the first message in flight may be through (`iter`: the rates' generation),
               // or new messages need rates (`iter`: kReflow)
};

struct Event {
  double t;
  int64_t seq;  // ties break in the order events were made, so runs are deterministic
  EventKind kind;
  int who;  // worker or shard
  int iter;
  int aux = -1;  // kPushOut: the worker that pushes; kTensorIn, kParamIn: where it lands
};

struct Later {
  bool operator()(const Event& a, const Event& b) const { return a.t != b.t ? a.t > b.t : a.seq > b.seq; }
};

struct WorkerState {
  int stage = -1, replica = -1, host = 0, device = 0;
  std::vector<Instr> program;  // one iteration; with local updates, one that exchanges
  std::map<IterationEnd, std::vector<Instr>> local_programs;  // with local updates, the others
  ComputeTimes cost;
  int iter = 0;
  size_t pc = 0;
  double t = 0;
  // Blocked on the receive into arrival[waiting_for], on its stage's parameters (kPull: in
  // PullParams, or in the first Forward after a deferred pull until every shard is on its way),
  // on its shards' pushes (kPushes) or on the global norm (kNorm) in ReduceNorm; kNone when
  // running.
  static constexpr int kNone = -1, kPull = -2, kPushes = -3, kNorm = -4;
  int waiting_for = kNone;
  int waiting_on = 0;  // kPull, kPushes: the iteration whose parameters or pushes
  double blocked_since = 0;
  std::vector<double> arrival;  // [iter][activation, gradient][micro]: when it arrives, -1 unknown
  // The exchange overlaps its compute (a CPU backend's block hooks, in step): the last backward
  // pushes each shard when its gradients are complete, and the next iteration's first forward
  // pulls each shard just before it reads it.
  bool overlaps = false;
  bool pushes_early = false;  // only stage 0: a later stage's last backward holds up its input gradient
  std::vector<double> needed_after;           // [shard of the stage]: forward seconds before it is read
  std::vector<double> complete_after;         // [shard of the stage]: backward seconds until it is complete
  double forward_from = -1;                   // where a forward blocked on a deferred pull began
  int pushed_early = -1;                      // the iteration whose pushes left during backward
  int deferred_pull = -1;                     // the iteration whose parameters the next forward pulls
  std::vector<std::vector<double>> param_at;  // [iter][shard of the stage]: when it arrives, -1 unknown
  std::vector<int> params_in;                 // [iter]: shards arrived
  std::vector<int> hosted;      // the shards it hosts
  bool reported = false;        // its partial norm of the current iteration is on its way to the others
  std::vector<double> iteration_end;
  double busy = 0, waiting = 0, ps_busy = 0;
};

struct ShardState {
  std::vector<int> grads_in;  // [iter]
};

class Engine {
 public:
  explicit Engine(const Simulation& sim)
      : sim_(sim), L_(sim.layout), P_(sim.placement),
        round_(Overlapped() ? std::max(4, L_.overlap_steps + 2) : std::min(std::max(L_.local_steps, 1), 4)),
        iterations_(round_ > 1 ? (Overlapped() ? 3 : 2) * round_ : sim.iterations) {}

  absl::StatusOr<SimulationReport> Run() {
    if (auto st = Setup(); !st.ok()) return st;
    for (size_t w = 0; w < workers_.size(); ++w)
      if (workers_[w].stage >= 0) Push(0, EventKind::kRun, static_cast<int>(w), 0);
    int64_t events = 0;
    while (!queue_.empty()) {
      const Event e = queue_.top();
      queue_.pop();
      ++events;
      switch (e.kind) {
        case EventKind::kRun: Advance(e.who); break;
        case EventKind::kTensorIn: Deliver(e.who, static_cast<size_t>(e.aux), e.t); break;
        case EventKind::kGradIn: GradIn(e.who, e.iter, e.t); break;
        case EventKind::kParamIn: ParamIn(e.who, e.iter, e.aux, e.t); break;
        case EventKind::kPushOut: PushShard(e.aux, e.who, e.iter, e.t); break;
        case EventKind::kParamsOut: ParamsOut(e.who, e.iter, e.t); break;
        case EventKind::kFlows: FlowsThrough(e.t, e.iter); break;
      }
    }
    for (const WorkerState& w : workers_) {
      if (w.stage >= 0 && w.iter < iterations_) {
        return absl::InternalError(absl::StrFormat(
            "simulation stalled: stage %d replica %d waits at instruction %d of iteration %d (%s); the schedules "
            "do not match",
            w.stage, w.replica, w.pc, w.iter, ToString({Program(w)[w.pc]})));
      }
    }
    return Report(events);
  }

 private:
  absl::Status Setup() {
    auto bad = [](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("simulation: ", why)); };
    const int S = L_.stages, D = L_.replicas, M = L_.micro_batches;
    if (S < 1 || D < 1 || M < 1) return bad("stages, replicas and micro_batches must be >= 1");
    if (!L_.replica_micro_batches.empty() &&
        (static_cast<int>(L_.replica_micro_batches.size()) != D ||
         *std::min_element(L_.replica_micro_batches.begin(), L_.replica_micro_batches.end()) < 1 ||
         *std::max_element(L_.replica_micro_batches.begin(), L_.replica_micro_batches.end()) != M)) {
      return bad("replica_micro_batches needs one entry >= 1 per replica, the largest micro_batches");
    }
    if (sim_.iterations < 1) return bad("iterations must be >= 1");
    if (!L_.blocks_per_stage.empty()) {
      if (static_cast<int>(L_.blocks_per_stage.size()) != S) return bad("blocks_per_stage needs one entry per stage");
      int sum = 0;
      for (int b : L_.blocks_per_stage) {
        if (b < 0) return bad("blocks_per_stage entries must be >= 0");
        sum += b;
      }
      if (sum != L_.work.model.n_layer) {
        return bad(absl::StrFormat("blocks_per_stage sums to %d, the model has %d layers", sum, L_.work.model.n_layer));
      }
    } else if (S > L_.work.model.n_layer) {
      return bad(absl::StrFormat("%d stages for %d layers", S, L_.work.model.n_layer));
    }
    if (sim_.devices.empty()) return bad("no devices");
    const int W = static_cast<int>(P_.host.size());
    if (static_cast<int>(P_.worker.size()) != S) return bad("placement.worker needs one row per stage");
    if (!P_.device.empty() && static_cast<int>(P_.device.size()) != W) return bad("placement.device needs one entry per worker");
    workers_.assign(W, WorkerState());
    hosts_ = 0;
    for (int w = 0; w < W; ++w) {
      if (P_.host[w] < 0) return bad("hosts are numbered from 0");
      hosts_ = std::max(hosts_, P_.host[w] + 1);
      workers_[w].host = P_.host[w];
      workers_[w].device = P_.device.empty() ? 0 : P_.device[w];
      if (workers_[w].device < 0 || workers_[w].device >= static_cast<int>(sim_.devices.size())) {
        return bad(absl::StrFormat("worker %d names device %d of %d", w, workers_[w].device, sim_.devices.size()));
      }
      workers_[w].params_in.assign(iterations_, 0);
    }
    for (int s = 0; s < S; ++s) {
      if (static_cast<int>(P_.worker[s].size()) != D) return bad(absl::StrFormat("stage %d needs %d replicas placed", s, D));
      for (int r = 0; r < D; ++r) {
        const int w = P_.worker[s][r];
        if (w < 0 || w >= W) return bad(absl::StrFormat("stage %d replica %d: no worker %d", s, r, w));
        WorkerState& k = workers_[w];
        if (k.stage >= 0) return bad(absl::StrFormat("worker %d runs two stages", w));
        k.stage = s;
        k.replica = r;
        k.arrival.assign(static_cast<size_t>(iterations_) * 2 * M, -1);
        auto cost = sim_.devices[k.device].Stage(L_.work, L_.Spec(s));
        if (!cost.ok()) return cost.status();
        k.cost = *cost;
        LH_RETURN_IF_ERROR(AddLowRankCodec(sim_.devices[k.device], s, k.cost));
        k.overlaps = L_.overlap && round_ == 1 && sim_.devices[k.device].backend() == Backend::kCpu;
        k.pushes_early = k.overlaps && s == 0;
      }
    }
    stage_shards_.assign(S, {});
    shards_.assign(P_.shards.size(), ShardState());
    for (size_t i = 0; i < P_.shards.size(); ++i) {
      const ShardPlacement& sh = P_.shards[i];
      if (sh.stage < 0 || sh.stage >= S || sh.worker < 0 || sh.worker >= W || !(sh.params > 0)) {
        return bad(absl::StrFormat("shard %d: stage %d, worker %d, %g parameters", i, sh.stage, sh.worker, sh.params));
      }
      if (workers_[sh.worker].stage < 0) {
        return bad(absl::StrFormat("shard %d is hosted by worker %d, which runs no stage (and so no exchange)", i,
                                   sh.worker));
      }
      shard_begin_.push_back(0);
      for (int j : stage_shards_[sh.stage]) shard_begin_.back() += P_.shards[j].params;
      stage_shards_[sh.stage].push_back(static_cast<int>(i));
      shards_[i].grads_in.assign(iterations_, 0);
      if (workers_[sh.worker].hosted.empty()) ++shard_hosts_;
      workers_[sh.worker].hosted.push_back(static_cast<int>(i));
    }
    // The wire dtype of each link that carries tensors, as the coordinator would resolve it.
    wires_ = LayoutWires(L_, P_, sim_.network);
    // Each worker runs the lists its executor would: the parameter-server exchange where it hosts.
    for (WorkerState& k : workers_) {
      if (k.stage < 0) continue;
      const int mine = L_.MicroBatchesOf(k.replica);
      if (round_ == 1) {
        k.program = MakeSchedule(L_.schedule, S, k.stage, mine, !k.hosted.empty());
        continue;
      }
      k.program = MakeSchedule(L_.schedule, S, k.stage, mine, !k.hosted.empty(), IterationEnd::kLocalStepThenExchange);
      for (const IterationEnd end : {IterationEnd::kLocalStep, IterationEnd::kLocalStepThenPush,
                                     IterationEnd::kLocalStepThenOuterStep, IterationEnd::kLocalStepThenLand}) {
        k.local_programs[end] = MakeSchedule(L_.schedule, S, k.stage, mine, !k.hosted.empty(), end, L_.overlap_steps);
      }
    }
    stage_params_.assign(S, 0);
    for (const ShardPlacement& sh : P_.shards) stage_params_[sh.stage] += sh.params;
    for (WorkerState& k : workers_) {
      if (k.stage < 0) continue;
      k.param_at.assign(iterations_, std::vector<double>(stage_shards_[k.stage].size(), -1));
      if (absl::Status st = BlockTimes(k); !st.ok()) return st;
    }
    partials_in_.assign(iterations_, 0);
    partial_at_.assign(iterations_, std::vector<double>(W, 0));
    link_free_.assign(static_cast<size_t>(hosts_) * hosts_, 0);
    if (sim_.network.HasCards()) {
      cards_ = true;
      link_queue_.assign(link_free_.size(), {});
      link_next_.assign(link_free_.size(), 0);
      // Cards: egress of host h at h, ingress at hosts_ + h.
      card_rate_.assign(2 * static_cast<size_t>(hosts_), kUnlimited);
      for (int h = 0; h < hosts_; ++h) {
        if (const double e = sim_.network.EgressRate(h); e > 0) card_rate_[h] = e;
        if (const double g = sim_.network.IngressRate(h); g > 0) card_rate_[hosts_ + h] = g;
      }
    }
    link_bytes_.assign(link_free_.size(), 0);
    link_busy_.assign(link_free_.size(), 0);
    return absl::OkStatus();
  }

  void Push(double t, EventKind kind, int who, int iter, int aux = -1) { queue_.push({t, seq_++, kind, who, iter, aux}); }

  bool Last(int iter) const { return iter == iterations_ - 1; }
  bool Overlapped() const { return L_.overlap_outer && L_.local_steps > L_.overlap_steps; }

  // The list worker k runs in its current iteration: with local updates, every round_-th exchanges;
  // overlapped, it pushes, the OuterStepDelay-th after steps the shards and the overlap_steps-th
  // after it lands.
  const std::vector<Instr>& Program(const WorkerState& k) const {
    if (round_ == 1) return k.program;
    const int i = k.iter % round_;
    if (!Overlapped()) {
      return i == round_ - 1 ? k.program : k.local_programs.at(IterationEnd::kLocalStep);
    }
    IterationEnd end = IterationEnd::kLocalStep;
    if (i == round_ - 1) end = IterationEnd::kLocalStepThenPush;
    if (k.iter >= round_ && i == OuterStepDelay(L_.overlap_steps) - 1) end = IterationEnd::kLocalStepThenOuterStep;
    if (k.iter >= round_ && i == L_.overlap_steps - 1) end = IterationEnd::kLocalStepThenLand;
    return k.local_programs.at(end);
  }

  // Puts a message of `elements` values of `kind` on the link at time t (the current time: events
  // run in time order, so the link sees messages in the order they were sent); `in` happens when
  // it has arrived.
  void Send(int from_host, int to_host, double elements, proto::TensorKind kind, double t, Event in) {
    in.seq = seq_++;
    if (from_host == to_host) {
      in.t = t;
      queue_.push(in);
      return;
    }
    // Parameters that travel as their change are priced so at every exchange (the whole ones start
    // a run only).
    const WireDtype dtype = kind == proto::PARAMS && wires_.change_dtype != WireDtype::kAuto
                                ? wires_.change_dtype
                                : wires_.Of(from_host, to_host, kind);
    const double bytes = static_cast<double>(WireBytes(static_cast<size_t>(elements), dtype));
    const LinkCost link = sim_.network.Between(from_host, to_host);
    const size_t i = static_cast<size_t>(from_host) * hosts_ + to_host;
    const double hold = link.SerializeSeconds(bytes);
    if (Last(in.iter)) link_bytes_[i] += bytes, link_busy_[i] += hold;
    // A boundary tensor is encoded part by part by the connection's thread as it writes, and each
    // part decoded by the receiver's as it comes (transport/tensor_transport.h): P parts through
    // three stages in turn, each part entering one once it is done with the last. The link is
    // held until the last byte is written, e + s + (P - 1)·max(e, s) with e, s and d a part's
    // encoding, bytes and decoding, and the last part is decoded d + (P - 1)·(max(e, s, d) -
    // max(e, s)) after that.
    double held = hold, decoded_after = 0;
    if (kind == proto::ACTIVATION || kind == proto::GRADIENT) {
      const CodecSeconds codec = HostCodecSeconds(elements, dtype, kind == proto::GRADIENT && FewLevels(dtype));
      const double P = static_cast<double>(TensorParts(static_cast<size_t>(elements), kind, dtype, 1));
      const double e = codec.encode_s / P, s = hold / P, d = codec.decode_s / P;
      held = e + s + (P - 1) * std::max(e, s);
      decoded_after = d + (P - 1) * (std::max({e, s, d}) - std::max(e, s));
    }
    if (!cards_) {  // a link's messages share nothing with other links'
      const double start = std::max(t, link_free_[i]);
      link_free_[i] = start + held;
      in.t = link_free_[i] + link.latency_s + decoded_after;
      queue_.push(in);
      return;
    }
    // No FlowsTo here: the kReflow event at this same moment brings the others' bytes up to t. The
    // encoding holds the link as many bytes as it would carry meanwhile at its own rate.
    const int id = static_cast<int>(flows_.size());
    const double rate = link.Rate();
    const double encoding = std::isinf(rate) ? 0 : (held - hold) * rate;
    flows_.push_back({from_host, to_host, i, bytes, bytes + encoding, rate,
                      link.latency_s + decoded_after + (std::isinf(rate) ? held : 0), in});
    link_queue_[i].push_back(id);
    if (link_queue_[i].size() - link_next_[i] == 1) in_flight_.push_back(id);  // else it waits for the link
    // Once for everything sent at this moment (a push of many shards, parameters to every replica).
    if (!reflow_due_) {
      reflow_due_ = true;
      Push(t, EventKind::kFlows, 0, kReflow);
    }
  }

  // With cards, messages are flows: each link sends its messages one at a time, and the ones in
  // flight share every card they cross fairly (max-min, by progressive filling), each also held
  // to its link's own rate. Rates change only when a message starts or ends.
  struct Flow {
    int from = 0, to = 0;
    size_t link = 0;
    double bytes = 0, left = 0;
    double link_rate = 0;  // bytes/s; infinity: the link does not limit it
    double latency_s = 0;
    Event in;
  };

  // Brings the bytes left of every message in flight up to time t (the ones sent since the last
  // Reflow have no rate yet, and no time has passed for them).
  void FlowsTo(double t) {
    for (size_t k = 0; k < rate_.size(); ++k) {
      Flow& f = flows_[in_flight_[k]];
      f.left = std::isinf(rate_[k]) ? 0 : f.left - rate_[k] * (t - flows_at_);
    }
    flows_at_ = t;
  }

  // The fair rates of the messages in flight, and an event where the first of them is through.
  void Reflow(double t) {
    const size_t n = in_flight_.size();
    rate_.assign(n, 0);
    const std::vector<double>& capacity = card_rate_;
    std::vector<double>& left = card_left_;
    left = capacity;
    std::vector<char>& fixed = fixed_;
    fixed.assign(n, 0);
    auto card = [&](size_t k, int side) {
      const Flow& f = flows_[in_flight_[k]];
      return side == 0 ? static_cast<size_t>(f.from) : static_cast<size_t>(hosts_ + f.to);
    };
    size_t open = n;
    for (size_t k = 0; k < n; ++k) {
      const Flow& f = flows_[in_flight_[k]];
      if (std::isinf(f.link_rate) && std::isinf(capacity[card(k, 0)]) && std::isinf(capacity[card(k, 1)])) {
        rate_[k] = kUnlimited, fixed[k] = 1, --open;  // nothing holds it back
      }
    }
    std::vector<int>& users = card_users_;
    users.resize(capacity.size());
    while (open > 0) {
      std::fill(users.begin(), users.end(), 0);
      for (size_t k = 0; k < n; ++k)
        if (!fixed[k]) ++users[card(k, 0)], ++users[card(k, 1)];
      double raise = kUnlimited;
      for (size_t c = 0; c < left.size(); ++c)
        if (users[c] > 0 && !std::isinf(left[c])) raise = std::min(raise, std::max(0.0, left[c]) / users[c]);
      for (size_t k = 0; k < n; ++k)
        if (!fixed[k]) raise = std::min(raise, flows_[in_flight_[k]].link_rate - rate_[k]);
      size_t fixed_now = 0;
      for (size_t k = 0; k < n; ++k) {
        if (fixed[k]) continue;
        rate_[k] += raise;
        left[card(k, 0)] -= raise;
        left[card(k, 1)] -= raise;
      }
      // A message is at its rate once its link or either card it crosses is full.
      auto full = [&](size_t c) { return left[c] <= 1e-9 * capacity[c]; };
      for (size_t k = 0; k < n; ++k) {
        if (fixed[k]) continue;
        const double link_rate = flows_[in_flight_[k]].link_rate;
        if (rate_[k] >= link_rate * (1 - 1e-9) || full(card(k, 0)) || full(card(k, 1))) fixed[k] = 1, ++fixed_now;
      }
      if (fixed_now == 0) break;  // rounding left every constraint a hair short: the rates stand
      open -= fixed_now;
    }
    double next = kUnlimited;
    for (size_t k = 0; k < n; ++k) {
      const Flow& f = flows_[in_flight_[k]];
      next = std::min(next, std::isinf(rate_[k]) ? t : t + std::max(0.0, f.left) / rate_[k]);
    }
    ++flow_generation_;
    if (!std::isinf(next)) Push(next, EventKind::kFlows, 0, flow_generation_);
  }

  // The first message in flight to end may be through at t (unless rates changed since): every
  // message through arrives one latency later, and its link takes its next.
  void FlowsThrough(double t, int generation) {
    if (generation == kReflow) reflow_due_ = false;
    else if (generation != flow_generation_) return;
    FlowsTo(t);
    std::vector<int>& still = still_;
    still.clear();
    for (int id : in_flight_) {
      const Flow& f = flows_[id];
      if (f.left > 1e-9 * f.bytes) {
        still.push_back(id);
        continue;
      }
      Event in = f.in;
      in.t = t + f.latency_s;
      queue_.push(in);
      const std::vector<int>& q = link_queue_[f.link];
      if (++link_next_[f.link] < q.size()) still.push_back(q[link_next_[f.link]]);
    }
    in_flight_.swap(still);
    Reflow(t);
  }

  size_t Slot(int iter, bool grad, int micro) const {
    return (static_cast<size_t>(iter) * 2 + (grad ? 1 : 0)) * L_.micro_batches + micro;
  }

  // Worker k stops at its current instruction until `on` (WorkerState::waiting_for) happens.
  void Block(WorkerState& k, int on) {
    k.waiting_for = on;
    k.blocked_since = k.t;
  }

  // Worker w, blocked, goes on at t: past the instruction it waited in (`next`), or back into it
  // (ReduceNorm looks again at what it waits for).
  void Resume(int w, double t, bool next) {
    WorkerState& k = workers_[w];
    if (Last(k.iter)) k.waiting += t - k.blocked_since;
    k.waiting_for = WorkerState::kNone;
    k.t = t;
    if (next) ++k.pc;
    Push(t, EventKind::kRun, w, k.iter);
  }

  void Deliver(int w, size_t slot, double at) {
    WorkerState& k = workers_[w];
    k.arrival[slot] = at;
    if (k.waiting_for == static_cast<int>(slot)) Resume(w, at, true);
  }

  // Runs worker w from its current time until it computes (it goes on at the compute's end) or
  // blocks (it goes on when what it waits for arrives).
  void Advance(int w) {
    WorkerState& k = workers_[w];
    while (k.iter < iterations_) {
      const std::vector<Instr>& program = Program(k);
      if (k.pc == program.size()) {
        k.iteration_end.push_back(k.t);
        ++k.iter;
        k.pc = 0;
        continue;
      }
      const Instr& in = program[k.pc];
      switch (in.op) {
        case Op::kForward:
        case Op::kBackward: {
          const double d = in.op == Op::kForward ? k.cost.forward_s : k.cost.backward_s;
          double start = k.t, end = k.t + d;
          if (in.op == Op::kForward && k.deferred_pull >= 0) {
            const int from = k.deferred_pull;
            if (k.params_in[from] < static_cast<int>(stage_shards_[k.stage].size())) {  // ParamIn wakes it
              k.forward_from = k.t;
              Block(k, WorkerState::kPull);
              return;
            }
            // The forward computed its first blocks while it waited for the last shards to arrive:
            // it started where it blocked, and that wait counts by what the forward itself waits.
            if (k.forward_from >= 0) {
              start = k.forward_from;
              if (Last(k.iter)) k.waiting -= k.t - start;
              k.forward_from = -1;
            }
            end = start + d;
            // It reaches shard j's first block after the blocks before it.
            for (size_t j = 0; j < stage_shards_[k.stage].size(); ++j) {
              end = std::max(end, k.param_at[from][j] + d - k.needed_after[j]);
            }
            k.deferred_pull = -1;
          }
          if (in.op == Op::kBackward && k.pushes_early && in.micro == L_.MicroBatchesOf(k.replica) - 1) {
            // Backward completes the stage's gradients from its last block to its first.
            for (size_t j = 0; j < stage_shards_[k.stage].size(); ++j) {
              Push(start + k.complete_after[j], EventKind::kPushOut, stage_shards_[k.stage][j], k.iter, w);
            }
            k.pushed_early = k.iter;
          }
          if (Last(k.iter)) k.busy += d, k.waiting += end - (start + d);
          k.t = end;
          ++k.pc;
          Push(k.t, EventKind::kRun, w, k.iter);
          return;
        }
        case Op::kSendAct:
        case Op::kSendGrad: {
          const bool grad = in.op == Op::kSendGrad;
          const int peer = P_.worker[k.stage + (grad ? -1 : 1)][k.replica];
          Send(k.host, workers_[peer].host, L_.BoundaryElements(grad), grad ? proto::GRADIENT : proto::ACTIVATION, k.t,
               {0, 0, EventKind::kTensorIn, peer, k.iter, static_cast<int>(Slot(k.iter, grad, in.micro))});
          ++k.pc;
          break;
        }
        case Op::kRecvAct:
        case Op::kRecvGrad: {
          const size_t slot = Slot(k.iter, in.op == Op::kRecvGrad, in.micro);
          if (k.arrival[slot] < 0) {  // not in yet: Deliver wakes it
            Block(k, static_cast<int>(slot));
            return;
          }
          ++k.pc;
          break;
        }
        case Op::kPushGrads:
          for (int i : stage_shards_[k.stage]) {
            if (k.pushed_early == k.iter) break;  // they left during the last backward
            PushShard(w, i, k.iter, k.t);
          }
          ++k.pc;
          break;
        case Op::kReduceNorm:
          if (!PushesIn(k, k.iter - in.back)) {  // GradIn wakes it
            k.waiting_on = k.iter - in.back;
            Block(k, WorkerState::kPushes);
            return;
          }
          if (!P_.clip_norm || round_ > 1) {
            ++k.pc;
            break;
          }
          if (!k.reported) {  // its partial squares go to every other host; the last host's wakes all
            k.reported = true;
            Block(k, WorkerState::kNorm);
            PartialOut(w);
            return;
          }
          k.reported = false;
          ++k.pc;
          break;
        case Op::kStep: {
          // Sum and AdamW over each hosted shard at memory bandwidth, on the worker's own thread;
          // each shard's parameters leave once it is stepped.
          double d = 0;
          for (int i : k.hosted) {
            d += sim_.devices[k.device].StepSeconds(P_.shards[i].params, L_.replicas);
            Push(k.t + d, EventKind::kParamsOut, i, k.iter - in.back);
          }
          if (Last(k.iter)) k.ps_busy += d;
          k.t += d;
          ++k.pc;
          Push(k.t, EventKind::kRun, w, k.iter);
          return;
        }
        case Op::kLocalStep: {
          // AdamW over the worker's whole stage, as its own parameter server.
          const double d = sim_.devices[k.device].StepSeconds(stage_params_[k.stage], 1);
          if (Last(k.iter)) k.ps_busy += d;
          k.t += d;
          ++k.pc;
          Push(k.t, EventKind::kRun, w, k.iter);
          return;
        }
        case Op::kPullParams: {
          if (k.overlaps) {
            k.deferred_pull = k.iter;
            ++k.pc;
            break;
          }
          if (k.params_in[k.iter - in.back] < static_cast<int>(stage_shards_[k.stage].size())) {  // ParamIn wakes it
            k.waiting_on = k.iter - in.back;
            Block(k, WorkerState::kPull);
            return;
          }
          ++k.pc;
          break;
        }
      }
    }
  }


  // Every replica's push of iteration `iter` of every shard `k` hosts is in.
  bool PushesIn(const WorkerState& k, int iter) const {
    for (int i : k.hosted)
      if (shards_[i].grads_in[iter] < L_.replicas) return false;
    return true;
  }

  void GradIn(int shard, int iter, double t) {
    ++shards_[shard].grads_in[iter];
    const int w = P_.shards[shard].worker;
    WorkerState& k = workers_[w];
    if (k.waiting_for == WorkerState::kPushes && k.waiting_on == iter && PushesIn(k, iter)) Resume(w, t, false);
  }

  // Host w sent its partial norm to every other host at its current time. Once the last host's
  // is out, each host goes on when the last partial to reach it has arrived.
  void PartialOut(int w) {
    const int iter = workers_[w].iter;
    partial_at_[iter][w] = workers_[w].t;
    if (++partials_in_[iter] < shard_hosts_) return;
    for (size_t j = 0; j < workers_.size(); ++j) {
      if (workers_[j].hosted.empty()) continue;
      double ready = partial_at_[iter][j];
      for (size_t i = 0; i < workers_.size(); ++i) {
        if (i == j || workers_[i].hosted.empty()) continue;
        const int from = workers_[i].host, to = workers_[j].host;
        ready = std::max(ready, partial_at_[iter][i] + (from == to ? 0 : sim_.network.Between(from, to).latency_s));
      }
      Resume(static_cast<int>(j), ready, false);
    }
  }

  // Stage s's boundaries in low rank: putting each micro-batch's activations (after its forward)
  // and gradients (after its backward) in low rank, and multiplying out what it receives, where
  // the worker does it: a CPU at the rate it runs a block (the block's FLOPs over its time), a GPU
  // worker on the device (kDeviceLowRankShare of that rate, and the pivots) or, for a subspace
  // model's narrowed boundaries, on its host (kHostLowRankFlops).
  absl::Status AddLowRankCodec(const DeviceCost& device, int s, ComputeTimes& cost) const {
    const BoundaryShape acts = L_.Boundary(false), grads = L_.Boundary(true);
    if (!acts.low_rank() && !grads.low_rank()) return absl::OkStatus();
    const bool sends = s + 1 < L_.stages, receives = s > 0;
    const int M = L_.micro_batches;
    const double forward = (sends ? acts.LowRankFlops(true, M) : 0) + (receives ? acts.LowRankFlops(false) : 0);
    const double backward = (receives ? grads.LowRankFlops(true, M) : 0) + (sends ? grads.LowRankFlops(false) : 0);
    const bool on_host = device.backend() == Backend::kCuda && acts.narrowed();
    double rate = kHostLowRankFlops, forward_s = 0, backward_s = 0;
    if (!on_host) {
      auto block = device.Block(L_.work);
      if (!block.ok()) return block.status();
      rate = BlockFlops(L_.work.model, L_.work.micro_batch, L_.work.seq_len, L_.work.recompute) /
             (block->forward_s + block->backward_s);
      if (device.backend() == Backend::kCuda) {
        if (L_.work.precision != Precision::kFp32) rate *= kDeviceLowRankShare;
        forward_s = sends ? acts.LowRankPivots(M) * kDevicePivotSeconds : 0;
        backward_s = receives ? grads.LowRankPivots(M) * kDevicePivotSeconds : 0;
      }
    }
    cost.forward_s += forward / rate + forward_s;
    cost.backward_s += backward / rate + backward_s;
    return absl::OkStatus();
  }

  // Where worker k's forward needs, and its backward completes, each shard of its stage: the stage
  // calls the executor's hooks between blocks (model/exchange_hooks.h). The embedding costs
  // nothing (cost_model.h), each block its own time, the head after the blocks.
  absl::Status BlockTimes(WorkerState& k) {
    const DeviceCost& device = sim_.devices[k.device];
    auto block = device.Block(L_.work);
    if (!block.ok()) return block.status();
    ComputeTimes head;
    const StageSpec spec = L_.Spec(k.stage);
    if (spec.has_head) {
      auto h = device.Head(L_.work);
      if (!h.ok()) return h.status();
      head = *h;
    }
    const ParamLayout layout(L_.work.model, spec);
    for (int i : stage_shards_[k.stage]) {
      const double begin = shard_begin_[i];
      double needed = 0, complete = head.backward_s;
      for (int b = spec.first_block; b < spec.end_block; ++b) {
        if (static_cast<double>(layout.BlockRange(b).second) <= begin) {
          needed += block->forward_s;  // a block wholly before the shard
        } else {
          complete += block->backward_s;  // the shard's gradients are complete after this one
        }
      }
      k.needed_after.push_back(needed);
      k.complete_after.push_back(begin == 0 ? k.cost.backward_s : complete);
    }
    return absl::OkStatus();
  }

  // Worker w pushes its gradient of shard `shard` to the shard's host at t.
  void PushShard(int w, int shard, int iter, double t) {
    Send(workers_[w].host, workers_[P_.shards[shard].worker].host, P_.shards[shard].params, proto::GRAD_PUSH, t,
         {0, 0, EventKind::kGradIn, shard, iter});
  }

  // Shard `shard`'s host sends its parameters to every replica of the stage at t.
  void ParamsOut(int shard, int iter, double t) {
    const ShardPlacement& sh = P_.shards[shard];
    const std::vector<int>& of_stage = stage_shards_[sh.stage];
    const int j = static_cast<int>(std::find(of_stage.begin(), of_stage.end(), shard) - of_stage.begin());
    for (int r = 0; r < L_.replicas; ++r) {
      const int w = P_.worker[sh.stage][r];
      Send(workers_[sh.worker].host, workers_[w].host, sh.params, proto::PARAMS, t, {0, 0, EventKind::kParamIn, w, iter, j});
    }
  }

  // The j-th shard of its stage reached worker w at t. A worker that waits for its stage's
  // parameters goes on once the last is in: past PullParams, or back into its Forward, which works
  // out its own waits, after a deferred pull.
  void ParamIn(int w, int iter, int j, double t) {
    WorkerState& k = workers_[w];
    k.param_at[iter][j] = t;
    if (++k.params_in[iter] < static_cast<int>(stage_shards_[k.stage].size()) || k.waiting_for != WorkerState::kPull) {
      return;
    }
    if (k.deferred_pull == iter) {
      Resume(w, t, false);
    } else if (k.waiting_on == iter) {
      Resume(w, t, true);
    }
  }

  SimulationReport Report(int64_t events) const {
    SimulationReport r;
    r.events = events;
    const std::vector<double>& ends = workers_[P_.worker[0][0]].iteration_end;
    r.iteration_s = ends.size() == 1 ? ends[0] : ends.back() - ends[ends.size() - 2];
    if (round_ > 1) {
      // The last round: round_ - 1 local iterations, then the exchange; a round of H has H - 1.
      const double local = ends[iterations_ - 2] - ends[iterations_ - 3];
      const double exchange = ends.back() - ends[iterations_ - round_ - 1] - (round_ - 1) * local;
      r.iteration_s = ((L_.local_steps - 1) * local + exchange) / L_.local_steps;
    }
    for (const WorkerState& k : workers_) {
      WorkerReport w;
      w.stage = k.stage, w.replica = k.replica;
      w.busy_s = k.busy, w.waiting_s = k.waiting, w.ps_busy_s = k.ps_busy;
      for (int i : k.hosted) w.ps_bytes += kPsShardBytesPerParam * P_.shards[i].params;
      const DeviceCost& device = sim_.devices[k.device];
      if (k.stage >= 0) {
        w.memory = device.StageMemory(L_.work, L_.Spec(k.stage),
                                      ActivationSlots(L_.schedule, L_.stages, k.stage, L_.micro_batches));
        // The hosted shards live beside the stage: in host memory on a CPU, on the device on a GPU.
        w.fits = device.memory_bytes() <= 0 || w.memory.total() + w.ps_bytes <= device.memory_bytes();
      }
      r.workers.push_back(w);
    }
    for (int a = 0; a < hosts_; ++a)
      for (int b = 0; b < hosts_; ++b) {
        const size_t i = static_cast<size_t>(a) * hosts_ + b;
        if (link_bytes_[i] > 0) r.links.push_back({a, b, link_bytes_[i], link_busy_[i]});
      }
    return r;
  }

  const Simulation& sim_;
  const Layout& L_;
  const Placement& P_;
  const int round_;       // iterations per exchange simulated: min(local_steps, 4), overlapped 4
  const int iterations_;  // simulated: Simulation::iterations, or two rounds of local updates
  std::vector<WorkerState> workers_;
  std::vector<double> stage_params_;  // [stage]
  std::vector<ShardState> shards_;
  std::vector<std::vector<int>> stage_shards_;
  std::vector<double> shard_begin_;  // [shard]: parameters of its stage before it
  int shard_hosts_ = 0;                            // workers hosting a shard
  std::vector<int> partials_in_;                   // [iter]: hosts whose partial norm is out
  std::vector<std::vector<double>> partial_at_;    // [iter][worker]: when it went out
  int hosts_ = 0;
  WirePlan wires_;
  static constexpr double kUnlimited = std::numeric_limits<double>::infinity();
  bool cards_ = false;                        // the network has cards: messages are flows
  std::vector<Flow> flows_;                   // every message sent, in order
  std::vector<std::vector<int>> link_queue_;  // [from_host * hosts_ + to_host]: its messages in flows_
  std::vector<size_t> link_next_;             // [link]: where in link_queue_ the one on its way is
  std::vector<int> in_flight_, still_;        // messages on their way (each the first of its link)
  std::vector<double> rate_;                  // [in_flight_ index]: bytes/s
  std::vector<double> card_rate_;             // [card]: bytes/s, kUnlimited for none (Setup)
  std::vector<double> card_left_;             // Reflow's: [card] bytes/s not yet given out
  std::vector<int> card_users_;               // Reflow's: [card] messages whose rates still rise
  std::vector<char> fixed_;                   // Reflow's: [in_flight_ index] at its rate
  double flows_at_ = 0;                       // when Flow::left was last brought up to date
  int flow_generation_ = 0;                   // the rates' version; older kFlows events are stale
  static constexpr int kReflow = -1;          // a kFlows event's generation that asks for new rates
  bool reflow_due_ = false;                   // such an event is on its way
  std::vector<double> link_free_, link_bytes_, link_busy_;  // [from_host * hosts_ + to_host]
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  int64_t seq_ = 0;
};

}  // namespace

WirePlan LayoutWires(const Layout& layout, const Placement& placement, const NetworkCost& network) {
  std::vector<std::vector<int>> host_at = placement.worker;
  for (auto& row : host_at)
    for (int& w : row) w = placement.host[static_cast<size_t>(w)];
  return ResolveWires(layout.wire, layout.fast_wire, TensorPairs(host_at),
                      [&](int a, int b) { return network.Between(a, b).Rate(); }, layout.local_steps > 1,
                      layout.exchange, layout.gradient);
}

absl::StatusOr<SimulationReport> Simulate(const Simulation& sim) { return Engine(sim).Run(); }

}  // namespace longhaul
