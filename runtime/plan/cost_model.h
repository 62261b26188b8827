#pragma once
// The planner's cost model: how long a device takes for one micro-batch through a GPT block (and
// the first and last stages' extras), what a stage holds in memory, and how long a message takes
// between two hosts. The simulator (simulator.h) runs the schedules against it.
//
// A device's speed comes from one of two sources:
//  - a named device's dense peak × an efficiency: every block costs its FLOPs (metrics/flops.h) at
//    that rate, so one efficiency calibrated on one run carries to other shapes;
//  - a profile file of measured per-block times (below), for what a benchmark on the device saw.
//
// Profile file (TOML); times are for one micro-batch of `micro_batch` sequences:
//   device = "v100-16gb"          # free text, shown in plans
//   backend = "cuda"              # "cuda" or "cpu": which memory estimate applies
//   memory_gib = 16               # optional: memory the stage must fit in (0 or absent: unchecked)
//   memory_bandwidth_gbs = 900    # what the parameter-server step streams at
//   [[block]]                     # one GPT block (attention + MLP), as many shapes as measured
//   d_model = 2048
//   n_head = 16
//   seq_len = 2048
//   micro_batch = 1
//   precision = "fp32"            # fp32, bf16 or fp16
//   recompute = false             # optional: backward reruns the forward
//   forward_ms = 22.1
//   backward_ms = 44.6            # with recompute, including the rerun forward
//   [[head]]                      # optional: final LayerNorm, LM head and loss of the last stage
//   d_model = 2048
//   vocab_size = 50257
//   seq_len = 2048
//   micro_batch = 1
//   precision = "fp32"
//   forward_ms = 11.0
//   backward_ms = 22.0
// A shape the profile lacks is priced at the FLOP rate the profile measured for the nearest block
// of the same precision and recompute setting (nearest in FLOPs), so a planner may try
// micro-batch sizes nobody timed; a head the profile lacks, at its own shape's block rate. A
// profile that times no block with recompute in a precision prices recompute from its blocks
// without: the backward reruns the forward, so it takes forward + backward (PricesRecompute says
// where it does).
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/wire_dtype.h"
#include "model/memory_estimate.h"
#include "model/model_config.h"
#include "scenario/scenario.h"

namespace longhaul {

// What one compute instruction works on: one micro-batch of `micro_batch` sequences of `seq_len`
// tokens through a block of `model` (d_model, n_head; vocab_size for the head).
struct WorkShape {
  ModelConfig model;
  int seq_len = 1;
  int micro_batch = 1;
  Precision precision = Precision::kFp32;
  bool recompute = false;
};

struct ComputeTimes {
  double forward_s = 0, backward_s = 0;
};

// What a stage of `spec` holds on `backend` (model/memory_estimate.h), `activation_slots`
// micro-batches' activations at once: the memory the planner checks a placement against.
MemoryEstimate StageMemoryOn(Backend backend, const WorkShape& w, const StageSpec& spec, int activation_slots);

class DeviceCost {
 public:
  // "v100" (16 GB), "v100-32gb", "a100" (80 GB), "h100" (SXM, 80 GB): dense peaks for the
  // precision (V100: 15.7 TFLOP/s fp32, 125 fp16 on tensor cores, no bf16; A100: 19.5 / 312;
  // H100: 67 / 989), memory size and bandwidth from the data sheets. "cpu:<GFLOP/s>" for a CPU at
  // the peak given (memory bandwidth 20 GB/s, memory unchecked).
  static absl::StatusOr<DeviceCost> Named(const std::string& name, Precision precision, double efficiency);
  static absl::StatusOr<DeviceCost> ParseProfile(const std::string& toml_text, const std::string& name);
  static absl::StatusOr<DeviceCost> LoadProfile(const std::string& path);
  // The measured times as a profile file ParseProfile reads back (header comment `comment`);
  // a named device, priced from its peak, has none to write: an error.
  absl::StatusOr<std::string> ProfileToml(const std::string& comment) const;
  // A device timed on one shape, as a run of the job measured it: one block and the head (each
  // time > 0), the parameter-server step streaming at `memory_bandwidth` bytes/s, `memory_bytes`
  // to hold a stage (0: unchecked).
  static absl::StatusOr<DeviceCost> Timed(const std::string& name, Backend backend, double memory_bandwidth,
                                          const WorkShape& shape, ComputeTimes block, ComputeTimes head,
                                          double memory_bytes = 0);

  const std::string& name() const { return name_; }
  Backend backend() const { return backend_; }
  double memory_bytes() const { return memory_bytes_; }  // 0: unchecked
  // FLOP/s a block runs at when priced from a peak (peak × efficiency); 0 for a profile.
  double flops_per_second() const { return flops_per_second_; }
  // The named device's dense peak for the precision, what MFU is measured against; 0 for a profile.
  double peak_flops_per_second() const { return peak_flops_per_second_; }

  absl::StatusOr<ComputeTimes> Block(const WorkShape& w) const;
  // Whether a measured profile prices recompute in `precision` from its blocks without (above).
  bool PricesRecompute(Precision precision) const;
  absl::StatusOr<ComputeTimes> Head(const WorkShape& w) const;
  // The stage's blocks, plus the head when it has one. The embedding's lookup and scatter-add are
  // priced at zero: they touch B·s·h numbers, less than a block's LayerNorm.
  absl::StatusOr<ComputeTimes> Stage(const WorkShape& w, const StageSpec& spec) const;
  // A parameter-server shard's step: sum `replicas` gradients, then AdamW (read parameter,
  // gradient and both moments, write parameter and moments), all streaming fp32 at memory
  // bandwidth.
  double StepSeconds(double param_count, int replicas) const;
  // The bytes that step streams.
  static double StepBytes(double param_count, int replicas);
  // What the stage holds on this device (StageMemoryOn this device's backend).
  MemoryEstimate StageMemory(const WorkShape& w, const StageSpec& spec, int activation_slots) const;

 private:
  struct Measured {
    WorkShape shape;
    ComputeTimes times;
  };
  std::string name_;
  Backend backend_ = Backend::kCuda;
  double flops_per_second_ = 0;
  double peak_flops_per_second_ = 0;
  double memory_bandwidth_ = 0;  // bytes/s
  double memory_bytes_ = 0;
  std::vector<Measured> blocks_, heads_;
};

// One direction of the link between two hosts. A message occupies it for size / Rate() (one
// message at a time per direction) and arrives latency_s after its last byte left.
struct LinkCost {
  double latency_s = 0;     // one-way
  double bandwidth = 0;     // bytes/s; 0: unlimited
  double window_bytes = 0;  // TCP window of the connection; 0: not limiting
  // min(bandwidth, window / round trip); infinity when neither limits.
  double Rate() const;
  double SerializeSeconds(double bytes) const;
};

// What a parameter-server shard holds per parameter: fp32 parameters, the gradient sum and
// AdamW's two moments.
inline constexpr double kPsShardBytesPerParam = 16;

// A link as a probe measured it (worker/link_probe.h): one-way delay half the round trip.
LinkCost MeasuredLink(double round_trip_s, double bytes_per_s);

// A boundary tensor's encoding on the sender's host core and decoding on the receiver's, where the
// transport does them: part by part, by the thread of the connection that writes (and reads) it
// (transport/tensor_transport.h). `stochastic`: a gradient in a FewLevels dtype, rounded so. fp32
// is read in place: nothing. A GPU worker's boundaries are encoded on its host too. The rates are
// one core of the 2-core VM, as bench/wire_codec_bench's host columns print them.
struct CodecSeconds {
  double encode_s = 0, decode_s = 0;
};
CodecSeconds HostCodecSeconds(double elements, WireDtype d, bool stochastic);
// A GPU worker puts its boundaries in low rank on the device (cuda/low_rank.cuh): the products on
// its fp32 CUDA cores, at this share of the rate its blocks run at (tensor cores in a 16-bit
// precision; the data sheets: H100 67 of 989 TFLOP/s, A100 19.5 of 312; a stage in fp32 runs its
// blocks at that rate already), and an encoding's Cholesky factorisations, one pivot after
// another (BoundaryShape::LowRankPivots), at about kDevicePivotSeconds a pivot (a thread block's
// three synchronisations and a square root, and a panel's launches of a triangular solve and a
// product shared by its 64 pivots: an estimate until deploy/gpu_check.sh's wire_codec_bench
// measures it).
inline constexpr double kDeviceLowRankShare = 67.0 / 989.0;
inline constexpr double kDevicePivotSeconds = 1e-6;
// FLOP/s of the host's BLAS (cpu/low_rank.h), where a GPU worker puts a subspace model's narrowed
// boundaries in low rank: the 2-core VM with both cores, as bench/wire_codec_bench's low-rank rows
// print it for a GPT-3 XL boundary.
inline constexpr double kHostLowRankFlops = 80e9;

// Links between every pair of hosts. Two workers on one host talk for free, and so does anyone
// with host -1, which sits beside every host (the coordinator of an emulation, on its router).
class NetworkCost {
 public:
  // The scenario's one-way delay and rate between the hosts' sites (jitter and loss are not
  // modelled), with every connection's window capped at `window_bytes` (0: not limiting).
  static NetworkCost FromScenario(netem::Scenario scenario, double window_bytes = 0);
  static NetworkCost Uniform(LinkCost link);
  // Measured links: links[a][b] from host a to host b (a pair outside the matrix is free).
  static NetworkCost FromMatrix(std::vector<std::vector<LinkCost>> links);
  // The links a run's workers measured at join, from its cluster.json ("links": from, to,
  // round_trip_ms, mbit_per_s; worker w is host w; "cards": worker, egress_mbit_per_s, where the
  // probes saw one); `*hosts` gets the matrix's size.
  static absl::StatusOr<NetworkCost> LoadMeasured(const std::string& cluster_json_path, int* hosts);
  LinkCost Between(int from_host, int to_host) const;
  // Host `host`'s network card in bytes/s, shared by all it sends (egress) or receives (ingress)
  // at once; 0: unlimited (no card). From the scenario's nic_gbps, or set from measurements.
  double EgressRate(int host) const;
  double IngressRate(int host) const;
  bool HasCards() const;
  // Measured cards: [host] bytes/s each way, 0 where unknown.
  void SetCards(std::vector<double> egress, std::vector<double> ingress);
  // The same links with no card anywhere: the model that prices every pair as if it had a card of
  // its own, for comparison.
  NetworkCost WithoutCards() const;

 private:
  std::optional<netem::Scenario> scenario_;
  std::vector<double> egress_, ingress_;  // [host]: measured cards
  std::vector<std::vector<LinkCost>> matrix_;
  LinkCost uniform_;
  double window_bytes_ = 0;
};

}  // namespace longhaul
