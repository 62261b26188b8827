#pragma once
// Which wire dtype each tensor of a job travels in. transport.wire_dtype names one for every link,
// or "auto": per link, int8 where the link is slower than kAutoInt8Below (its transfer time then
// outweighs the encoding's), else the compute's own dtype (bf16 for a GPU job, fp32 for a CPU one,
// JobConfig::FastWire). Parameters go in one dtype to every replica of a stage, or the replicas
// would drift apart: bf16 wherever any link of the job is int8 (WireDtypeFor). With local updates
// (train.local_steps > 1) over a lossy exchange (IsLossy: the wire's, or
// transport.exchange_dtype's), a shard's host sends the replicas the change of its parameters
// since the last exchange in the pushes' dtype, with error feedback (the
// residual kept with the shard, so checkpoints carry it), and the parameters whole, in fp32, only
// at a run's start (ParamsTravelWhole): the exchange shrinks both ways, and the replicas hold
// exactly what the shard holds. transport.gradient_dtype, where set, is every boundary
// gradient's dtype, apart from the activations'.
//
// The coordinator resolves it once, from the links it knows (a scenario or the link probes), and
// the plan carries the result: a sender encodes by it, a receiver admits by it, and the simulator
// prices each transfer by the same function. The job's first plan also fixes each tensor stream's
// dtype by its place in the job's layout (FixStreamWires): a later version that moves a stream
// onto other workers (a spare, a shrunk replica standing for several, a push to the pusher's own
// shard) keeps its rounding and error feedback, so the run stays bitwise the uninterrupted one.
// Where that puts a stream in fp32 over a slow link, the price is paid only while the layout
// differs from the first.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/job_config.h"
#include "format/wire_dtype.h"
#include "longhaul.pb.h"

namespace longhaul {

inline constexpr double kAutoInt8Below = 10e9 / 8;  // bytes/s: 10 Gbit/s

struct WirePlan {
  WireDtype default_dtype = WireDtype::kF32;  // any pair not in `links`
  WireDtype params_dtype = WireDtype::kF32;   // PARAMS sent whole, on every link
  // PARAMS sent as their change since the last exchange (a lossy dtype, on every link);
  // kAuto: always whole.
  WireDtype change_dtype = WireDtype::kAuto;
  // Every GRAD_PUSH's (transport.exchange_dtype); kAuto: its link's.
  WireDtype push_dtype = WireDtype::kAuto;
  // Every boundary GRADIENT's (transport.gradient_dtype); kAuto: its link's.
  WireDtype gradient_dtype = WireDtype::kAuto;
  std::map<std::pair<int, int>, WireDtype> links;  // (from, to) whose dtype differs from the default
  // Where the plan fixes streams (group_micro_batches > 0): (kind, stage, job replica, shard) of
  // those whose dtype differs from the default; the plan's replica r runs job replicas
  // r × groups … (r + 1) × groups − 1, group_micro_batches micro-batches each.
  std::map<std::tuple<int, int, int, int>, WireDtype> streams;
  int group_micro_batches = 0;
  int groups = 1;

  // By the link from worker `from` to `to` (PARAMS, NORM and EVAL_ACTIVATION by kind alone).
  WireDtype Of(int from, int to, int kind) const;
  // A tensor of `kind` that (stage, replica) of the plan, worker `from`, sends to worker `to`, of
  // micro-batch `micro` (a push: of group `micro`) and push shard `shard`: its stream's dtype
  // where the plan fixes streams, else its link's.
  WireDtype Of(int from, int to, int kind, int stage, int replica, int micro, int shard) const;
  // The config key that sets the dtype of a tensor of `kind`, for people told of a wrong one.
  const char* KeyOf(int kind) const;
};

// The (from, to) pairs that carry tensors where at[stage][replica] runs each slot (a worker, or its
// host): neighbouring stages of a replica both ways (activations, gradients), and every two
// replicas of a stage (pushes, parameters).
std::vector<std::pair<int, int>> TensorPairs(const std::vector<std::vector<int>>& at);

// `configured` (transport.wire_dtype) resolved over the pairs (from, to) that carry tensors, with
// `rate(from, to)` in bytes/s (infinity where unknown or within a host); `fast` is the dtype of an
// "auto" job's fast links.
// With `local_updates`, a lossy dtype on any link sends the parameters as their change.
// `exchange` (transport.exchange_dtype), unless kAuto, is every push's dtype and decides the
// parameters' alone: their change in it where lossy with local updates, else whole in
// WireDtypeFor(exchange). `gradient` (transport.gradient_dtype), unless kAuto, is every boundary
// gradient's.
WirePlan ResolveWires(WireDtype configured, WireDtype fast, const std::vector<std::pair<int, int>>& pairs,
                      const std::function<double(int, int)>& rate, bool local_updates = false,
                      WireDtype exchange = WireDtype::kAuto, WireDtype gradient = WireDtype::kAuto);

// Whether ResolveWires may make some pipeline boundary lossy, before the links are known: a lossy
// `configured` (transport.wire_dtype), or "auto", lossy on any slow link; or a lossy `gradient`
// (transport.gradient_dtype).
bool BoundaryMayBeLossy(WireDtype configured, WireDtype gradient = WireDtype::kAuto);
// The same for some push: `exchange` decides where it names a dtype; else as a boundary.
bool ExchangeMayBeLossy(WireDtype configured, WireDtype exchange);

// Whether the parameters of iteration `it`'s exchange travel whole: always where the plan sends no
// changes; else only in the broadcast that starts a run (iteration start - 1).
bool ParamsTravelWhole(const WirePlan& wires, int64_t it, int64_t start);

// One line for people: the default dtype, the slow links' (how many), the parameters', the
// exchange's and the boundary gradients' where they have their own, and the parameters' change
// where they travel so.
std::string DescribeWires(const WirePlan& wires);

// In a plan, pairs by worker id.
void SetWires(const WirePlan& wires, proto::Plan& plan);
WirePlan WiresOf(const proto::Plan& plan);
// Fixes every stream of `plan` (the job's first layout, at[stage][replica] its workers, its links'
// dtypes and shards set) at its link's dtype; `micro_batches` is train.micro_batches.
void FixStreamWires(const std::vector<std::vector<int>>& at, int micro_batches, proto::Plan& plan);
// (stage, job replica) of every push stream of `plan` that carries error feedback: the replica's
// worker pushes a shard of its stage in a lossy dtype (IsLossy). Their residuals are part of a
// checkpoint.
std::set<std::pair<int, int>> FeedbackStreams(const proto::Plan& plan, const JobConfig& cfg);

}  // namespace longhaul
