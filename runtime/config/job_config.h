#pragma once
// A training job's configuration, read from TOML. Every key is optional (defaults below); unknown
// keys, wrong types and values out of range are errors that name the key and the fix.
//
// One table in job_config.cc lists every key: how it is read into JobConfig, its valid range, and
// what changing it means for a resume. The accepted keys, the effective configuration recorded in
// checkpoints and the resume comparison all derive from it, so a new key cannot be left out of any.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/markov_source.h"
#include "format/wire_dtype.h"
#include "model/model_config.h"
#include "optim/adamw.h"
#include "schedule/schedule.h"

namespace longhaul {

enum class DataSource { kBuiltin, kBytes, kLlmc };

struct DataConfig {
  DataSource source = DataSource::kBuiltin;
  std::string path, val_path;  // globs, for bytes and llmc
  double val_fraction = 0.05;  // held out of `path` when val_path is empty
  MarkovSpec markov;           // built-in corpus shape (markov.seed = data.seed)
  int64_t train_tokens = 2'000'000;
  int64_t val_tokens = 100'000;
};

struct TrainConfig {
  int64_t steps = 200;
  int seq_len = 64;
  int micro_batch_size = 8;  // sequences per micro-batch
  // Gradient accumulation: micro-batches per replica per optimizer step (the most any replica runs
  // where cluster.replica_micro_batches shares the batch unevenly).
  int micro_batches = 1;
  float lr = 1e-3f, min_lr = 1e-4f;
  int64_t warmup_steps = 20;
  AdamWConfig adamw;
  float grad_clip = 1.0f;  // global norm; 0 disables
  uint64_t seed = 1;
  int threads = 0;  // 0: all cores
  bool recompute = false;
  int log_every = 10;
  int eval_every = 50;  // 0 disables
  int eval_batches = 4;
  int checkpoint_every = 0;  // 0: only at the end
  int keep_checkpoints = 0;  // the newest complete checkpoints kept; 0: all
  std::string out_dir = "runs/latest";
  bool resume = false;  // continue from out_dir/checkpoints/latest
  // A Hugging Face GPT-2 checkpoint directory (model.safetensors, config.json) every stage starts
  // from instead of the seed's initialisation; empty: none.
  std::string init_from;
  int backend_device = -1;  // train.backend: -1 = "cpu", N = "cuda:N"
  Precision precision = Precision::kFp32;
  // Local updates (DiLoCo): each worker steps its own stage with AdamW for local_steps iterations,
  // then the parameter servers average the replicas' change since the last exchange and take an
  // outer Nesterov step with it. 1: synchronous data parallelism (every iteration exchanges).
  int local_steps = 1;
  float outer_lr = 0.7f, outer_momentum = 0.5f;
  // Overlapped outer steps (Streaming DiLoCo's overlap): a round's exchange travels while the
  // workers go on stepping: pushed after its last iteration, stepped by the hosts half-way
  // (OuterStepDelay: after the next where overlap_steps is 2) and landed overlap_steps iterations
  // after the push, when each worker takes the new parameters
  // plus what it stepped meanwhile. Needs local_steps > overlap_steps >= 2 (OverlapsAfter says
  // which rounds): a slow link gets as many iterations of compute to hide the exchange under as
  // the round allows, for a staler outer step.
  bool overlap_outer = false;
  int overlap_steps = 2;
  // How an overlapped exchange lands. 0: each worker takes the new parameters plus what it stepped
  // since its push. A fraction a in (0, 1): a x its own parameters + (1 - a) x the new ones
  // (Streaming DiLoCo's merge), which keeps less of the steps taken on parameters the other
  // replicas never saw: the convergence bench says which pays at which overlap_steps.
  float overlap_mix = 0;
  // Whether iteration `it` of a run that ends before iteration `end` exchanges with the parameter
  // servers: every one when synchronous, else every local_steps-th and the run's last, so a run
  // never ends (or checkpoints) with the replicas apart.
  bool ExchangesAfter(int64_t it, int64_t end) const {
    return local_steps <= 1 || (it + 1) % local_steps == 0 || it + 1 == end;
  }
  // Whether a checkpoint follows iteration `it` of a run that ends before iteration `end`: every
  // checkpoint_every-th step and the run's last, where the replicas exchanged. The worker writes
  // one there, and the coordinator takes reports of no other step.
  bool CheckpointsAfter(int64_t it, int64_t end) const {
    const int64_t step = it + 1;
    return ((checkpoint_every > 0 && step % checkpoint_every == 0) || step == end) && ExchangesAfter(it, end);
  }
  // Whether step `step` of a run ending before `end` is evaluated on the validation data:
  // `longhaul train`'s steps; a cluster evaluates iteration `it`'s step where it is one of those
  // and the replicas exchanged (with local updates each holds its own parameters in between).
  bool EvalDue(int64_t step, int64_t end) const { return eval_every > 0 && (step % eval_every == 0 || step == end); }
  bool EvaluatesAfter(int64_t it, int64_t end) const { return EvalDue(it + 1, end) && ExchangesAfter(it, end); }
  // Whether the exchange after iteration `it` is overlapped (overlap_outer): every round's except
  // those a checkpoint follows and those too near the run's end to land before its last exchange,
  // so a checkpoint and the run's end still find the replicas together.
  bool OverlapsAfter(int64_t it, int64_t end) const {
    return overlap_outer && local_steps > overlap_steps && ExchangesAfter(it, end) && it + overlap_steps + 1 < end &&
           !CheckpointsAfter(it, end);
  }
  // The iteration whose overlapped exchange is under way in iteration `it` (pushed before it and
  // landing in it or later), if any: at most one, rounds being longer than overlap_steps.
  std::optional<int64_t> OverlappedUnder(int64_t it, int64_t end) const {
    for (int64_t k = 1; overlap_outer && k <= overlap_steps && k <= it; ++k)
      if (OverlapsAfter(it - k, end)) return it - k;
    return std::nullopt;
  }
  // Whether iteration `it` reports a validation loss: after an exchange EvaluatesAfter names, once
  // the replicas hold its parameters: at once, or where an overlapped exchange lands (evaluated
  // on the parameters it brought, before what the worker stepped since).
  bool EvaluatesIn(int64_t it, int64_t end) const {
    if (it >= overlap_steps && OverlapsAfter(it - overlap_steps, end)) return EvaluatesAfter(it - overlap_steps, end);
    return EvaluatesAfter(it, end) && !OverlapsAfter(it, end);
  }
  // The validation micro-batches i < eval_batches with i % replicas == replica are replica
  // `replica`'s to run: the micro-batches `longhaul train` evaluates, shared out, so that every
  // layout reports the same validation loss for the same parameters.
  int EvalShare(int replicas, int replica) const {
    return eval_every > 0 ? eval_batches / replicas + (replica < eval_batches % replicas ? 1 : 0) : 0;
  }
};

// The longest period or duration of a job, in seconds (about 116 days): a heartbeat, a silence, an
// iteration. Deadlines made of more overflow.
inline constexpr double kLongestSeconds = 1e7;

// The longest job id: the tensor port's hello carries it, and a receiver reads at most this many
// bytes of it (transport/tensor_transport.h).
inline constexpr size_t kMaxJobIdBytes = 256;

struct ClusterConfig {
  std::string job_id = "longhaul";  // every process of a job must agree; strangers are refused
  int stages = 1;                   // pipeline stages
  int replicas = 1;                 // data-parallel replicas of the pipeline
  ScheduleKind schedule = ScheduleKind::kGpipe;
  bool central_ps = false;          // one parameter server per stage instead of sharding it over replicas
  // "search": the coordinator places workers by the simulator where it knows the links (else and
  // with "registration": worker k runs slot k = replica·stages + stage).
  bool search_placement = true;
  // Whether workers measure their links to each other at join (round trip and bandwidth through
  // the tensor transport) for the coordinator to plan with: "auto" where it has no scenario's
  // links, "on" always (measured links replace a scenario's), "off" never.
  enum class LinkProbe { kAuto, kOn, kOff } link_probe = LinkProbe::kAuto;
  // Whether the data-parallel exchange overlaps compute where a stage's backend allows it
  // (model/exchange_hooks.h: pushes during the last backward, pulls during the next first forward).
  bool overlap_exchange = true;
  // "auto": the coordinator chooses the communication keys (CommunicationKeys(): local steps, the
  // wire and exchange dtypes, the outer step) among the settings of a penalties file by time to
  // the same loss, priced on the links it knows (coordinator/communication.h); "fixed" (default):
  // the config's own. A resumed job keeps its checkpoint's.
  bool choose_communication = false;
  // The convergence penalties "auto" charges (runtime/plan/convergence_penalty.h); "": the file
  // shipped with the source tree (beside the binary's build directory, or under the working one).
  std::string penalties;
  std::vector<int> stage_layers;    // blocks per stage; empty splits evenly
  // Micro-batches per replica, where they differ (empty: train.micro_batches each): 64 over 12
  // replicas as 6 × 4 and 5 × 8, or fewer on a slower GPU. Every micro-batch weighs the same in the
  // job's gradient, whatever replica ran it (JobConfig::MicroBatchWeight).
  std::vector<int> replica_micro_batches;
  std::vector<int> stage_backends;  // device per stage (-1 = "cpu", N = "cuda:N"); empty: train.backend
  double heartbeat_s = 1.0;
  double dead_after_s = 20.0;       // a worker silent this long is declared dead
  // A worker whose lifeline to the coordinator closed (its process ended: the kernel closed its
  // sockets) is lost unless it holds the lifeline again, or heartbeats, within this: a live
  // worker's channel reconnects within a round trip or two.
  double lifeline_grace_s = 0.25;
  // Workers beyond stages x replicas that the coordinator keeps waiting to take a lost worker's
  // place (worker/worker.cc runs each plan version); more are refused.
  int spares = 4;
  // How long the coordinator waits for a spare to join once a worker is lost and none waits; past
  // it (0: at once) the layout shrinks (fewer replicas, or the pipeline cut anew), and where no
  // smaller layout can run the job stops, naming the lost worker.
  double spare_wait_s = 60.0;
  // A straggler (coordinator/stragglers.h) gives its place to a waiting spare at the next plan
  // version and waits as a spare itself; with no spare, the model is cut anew with fewer blocks on
  // its stage (RebalancePlan), and back once it is fast again; false: it keeps its place and its
  // blocks.
  bool replace_stragglers = true;
};

struct TransportConfig {
  WireDtype wire_dtype = WireDtype::kAuto;  // resolved per link in the plan (transport/wire_plan.h)
  // The data-parallel exchange's dtype (every push; with local updates, the parameters' change
  // too); kAuto: as the wire of each push's link.
  WireDtype exchange_dtype = WireDtype::kAuto;
  // The pipeline boundaries' gradients' own dtype (every GRADIENT, whatever its link; int4, int3
  // and int2 round them stochastically); kAuto: as the activations of each link (wire_dtype).
  WireDtype gradient_dtype = WireDtype::kAuto;
  // > 1: a pipeline boundary's activations travel as a rank-r product (cpu/low_rank.h), r = the
  // width a link carries / boundary_rank_divisor; 1 sends them whole. gradient_rank_divisor is their
  // gradients' own, 0: as the activations'.
  int boundary_rank_divisor = 1;
  int gradient_rank_divisor = 0;
  // With boundary_rank_divisor > 1: the activations travel as their coordinates in directions an
  // iteration's micro-batches share (the first one's range finder), and their gradients in the
  // same directions (model/model_config.h's BoundaryShape::shared), instead of each as a product
  // of its own; gradient_rank_divisor then stays 0.
  bool shared_directions = false;
  int chunk_mib = 2;
  // TCP connections per peer pair; 0: per link from its rate × round trip where the coordinator
  // knows the links (transport/link_connections.h), else 1.
  int connections = 0;
  double timeout_s = 120.0;  // longest wait for a peer's tensor or acknowledgement
  // Of the tensor connections' sending side; "" keeps the system's default. Cubic, since BBR paces
  // the bursts of a pipeline (a few hundred KiB, then idle) at a fraction of the link on long
  // links (README, "The data plane").
  std::string congestion_control = "cubic";
};

struct JobConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  ClusterConfig cluster;
  TransportConfig transport;
  std::string toml_text;  // the configuration with overrides applied, as workers receive it
  std::string source_path;  // where it was read from, for messages
  nlohmann::json as_json;   // EffectiveConfigJson(*this) when parsed: what checkpoints record

  // Tokens of one optimizer step over every replica.
  int64_t tokens_per_step() const {
    return static_cast<int64_t>(train.micro_batch_size) * train.seq_len * GlobalMicroBatches();
  }
  // Micro-batches of job replica `replica` (cluster.replica_micro_batches, else train.micro_batches),
  // the global index of its first (its micro-batch m is global micro-batch first + m), and every
  // replica's together.
  int MicroBatchesOf(int replica) const {
    return cluster.replica_micro_batches.empty() ? train.micro_batches : cluster.replica_micro_batches[replica];
  }
  int64_t FirstMicroBatchOf(int replica) const;
  int64_t GlobalMicroBatches() const { return FirstMicroBatchOf(cluster.replicas); }
  // What a micro-batch's gradient is scaled by so that the shards' mean over the job's replicas is
  // the mean over every micro-batch: replicas / global micro-batches (1 / train.micro_batches, to
  // the bit, where every replica runs that many).
  float MicroBatchWeight() const {
    return static_cast<float>(cluster.replicas) / static_cast<float>(GlobalMicroBatches());
  }
  // One micro-batch's tensor between stages, its activations or (`gradient`) their gradients, and
  // the floats of it a link carries.
  BoundaryShape boundary(bool gradient) const;
  size_t boundary_floats(bool gradient) const { return boundary(gradient).sent(); }
  // Blocks of pipeline stage `stage` (cluster.stage_layers, or an even split).
  StageSpec Stage(int stage) const;
  // Blocks of every stage: cluster.stage_layers, or the even split it defaults to.
  std::vector<int> Cut() const;
  // This config with cluster.stage_layers = `cut` and cluster.stages its length, its text (what
  // workers receive) included.
  absl::StatusOr<JobConfig> WithCut(const std::vector<int>& cut) const;
  // train.backend or a cluster.stage_backends entry names a GPU.
  // What an "auto" wire carries on fast links: what the compute keeps (a GPU computes a stage in a
  // fraction of the time its fp32 boundary tensors take on any real link).
  WireDtype FastWire() const { return UsesGpu() ? WireDtype::kBf16 : WireDtype::kF32; }
  bool UsesGpu() const {
    return train.backend_device >= 0 ||
           std::any_of(cluster.stage_backends.begin(), cluster.stage_backends.end(), [](int d) { return d >= 0; });
  }
  // The device stage `stage`'s workers compute on (cluster.stage_backends, or train.backend).
  int DeviceOf(int stage) const { return cluster.stage_backends.empty() ? train.backend_device : cluster.stage_backends[stage]; }
};

// What changing a key between a run and its resume means.
enum class ResumeRule {
  kMustMatch,  // it changes the math or the samples: the checkpoint cannot continue under another value
  kLayout,     // it changes how the model is split over workers: must match too, reported as a layout change
  kFree,       // logging, timeouts, threads, where files go, ...: may change
};
const char* ResumeRuleName(ResumeRule r);  // "must match", "layout", "free"

struct ConfigKey {
  std::string section, key;
  ResumeRule resume;
  std::string name() const { return section + "." + key; }
};
// Every key the config accepts, in table order.
const std::vector<ConfigKey>& ConfigKeys();

// Every key of ConfigKeys() with its effective value (defaults resolved, e.g. the blocks of each
// stage for an empty cluster.stage_layers), by section: {"model": {"d_model": 256, ...}, ...}.
nlohmann::json EffectiveConfigJson(const JobConfig& cfg);

// The keys cluster.communication = "auto" chooses, which a convergence setting may set on top of
// the exact path (section.key): local steps and the outer step, the wire and exchange dtypes.
const std::vector<ConfigKey>& CommunicationKeys();

// --stop-at N must name a step of the run: 1 <= N <= train.steps.
absl::Status CheckStopAt(int64_t stop_at, const JobConfig& cfg);

// Parses TOML text; `overrides` are "section.key=value" (value in TOML syntax, bare strings
// allowed) applied on top. Validation covers everything that can be checked without the data.
absl::StatusOr<JobConfig> ParseJobConfig(const std::string& toml_text, const std::string& source_path,
                                         const std::vector<std::string>& overrides = {});
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides = {});

// bf16 and fp16 compute need a GPU in the job: InvalidArgument naming train.backend otherwise.
absl::Status CheckPrecisionHasAGpu(const JobConfig& c);

// "cpu" (-1) or "cuda:N" (N); `what` names the setting in the error.
absl::StatusOr<int> ParseBackend(const std::string& name, const std::string& what);
std::string BackendName(int device);

}  // namespace longhaul
