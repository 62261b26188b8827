#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <toml++/toml.h>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "metrics/flops.h"

namespace longhaul {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// Forward's share of a block's (or the head's) FLOPs: the backward does twice the forward's
// matmuls, and reruns the forward first under recompute.
double ForwardShare(bool recompute) { return recompute ? 0.25 : 1.0 / 3.0; }

ComputeTimes AtRate(double flops, double rate, bool recompute) {
  const double total = flops / rate, f = ForwardShare(recompute);
  return {total * f, total * (1 - f)};
}

double BlockFlopsOf(const WorkShape& w) { return BlockFlops(w.model, w.micro_batch, w.seq_len, w.recompute); }

bool SameBlock(const WorkShape& a, const WorkShape& b) {
  return a.model.d_model == b.model.d_model && a.model.n_head == b.model.n_head && a.seq_len == b.seq_len &&
         a.micro_batch == b.micro_batch && a.precision == b.precision && a.recompute == b.recompute;
}

bool SameHead(const WorkShape& a, const WorkShape& b) {
  return a.model.d_model == b.model.d_model && a.model.vocab_size == b.model.vocab_size && a.seq_len == b.seq_len &&
         a.micro_batch == b.micro_batch && a.precision == b.precision;
}

}  // namespace

absl::StatusOr<DeviceCost> DeviceCost::Named(const std::string& name, Precision precision, double efficiency) {
  if (!(efficiency > 0 && efficiency <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("device ", name, ": efficiency ", efficiency, " is not in (0, 1]"));
  }
  DeviceCost d;
  d.name_ = name;
  const bool half = precision != Precision::kFp32;
  double peak = 0;
  if (absl::StartsWith(name, "cpu:")) {
    double gflops = 0;
    if (!absl::SimpleAtod(name.substr(4), &gflops) || gflops <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("device ", name, ": write a CPU as cpu:<GFLOP/s>, e.g. cpu:200"));
    }
    if (half) return absl::InvalidArgumentError(absl::StrCat("device ", name, ": the CPU backend computes in fp32 only"));
    d.backend_ = Backend::kCpu;
    peak = gflops * 1e9;
    d.memory_bandwidth_ = 20e9;
  } else if (name == "v100" || name == "v100-32gb") {
    if (precision == Precision::kBf16) {
      return absl::InvalidArgumentError(absl::StrCat("device ", name, ": V100 has no bf16; use fp16 or fp32"));
    }
    peak = half ? 125e12 : 15.7e12;
    d.memory_bandwidth_ = 900e9;
    d.memory_bytes_ = (name == "v100" ? 16 : 32) * kGiB;
  } else if (name == "a100") {
    peak = half ? 312e12 : 19.5e12;
    d.memory_bandwidth_ = 2039e9;
    d.memory_bytes_ = 80 * kGiB;
  } else if (name == "h100") {
    peak = half ? 989e12 : 67e12;
    d.memory_bandwidth_ = 3350e9;
    d.memory_bytes_ = 80 * kGiB;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device \"", name, "\": use v100, v100-32gb, a100, h100, cpu:<GFLOP/s>, or a profile file"));
  }
  d.peak_flops_per_second_ = peak;
  d.flops_per_second_ = peak * efficiency;
  return d;
}

absl::StatusOr<DeviceCost> DeviceCost::ParseProfile(const std::string& toml_text, const std::string& name) {
  toml::table t;
  try {
    t = toml::parse(toml_text, name);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("profile ", name, ": ", std::string(e.description())));
  }
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("profile ", name, ": ", why)); };
  DeviceCost d;
  d.name_ = t["device"].value_or(name);
  const std::string backend = t["backend"].value_or(std::string("cuda"));
  if (backend != "cuda" && backend != "cpu") return bad("backend must be \"cuda\" or \"cpu\"");
  d.backend_ = backend == "cpu" ? Backend::kCpu : Backend::kCuda;
  d.memory_bytes_ = t["memory_gib"].value_or(0.0) * kGiB;
  d.memory_bandwidth_ = t["memory_bandwidth_gbs"].value_or(0.0) * 1e9;
  if (!(d.memory_bandwidth_ > 0)) return bad("memory_bandwidth_gbs (> 0) is required: the parameter-server step needs it");
  auto entries = [&](const char* key, bool head, std::vector<Measured>& out) -> absl::Status {
    const toml::array* list = t[key].as_array();
    if (list == nullptr) return absl::OkStatus();
    for (size_t i = 0; i < list->size(); ++i) {
      const toml::table* e = (*list)[i].as_table();
      const std::string where = absl::StrCat(key, "[", i, "]");
      if (e == nullptr) return bad(absl::StrCat(where, " must be a table ([[", key, "]])"));
      Measured m;
      m.shape.model.d_model = (*e)["d_model"].value_or(0);
      m.shape.model.n_head = (*e)["n_head"].value_or(head ? 1 : 0);
      m.shape.model.vocab_size = (*e)["vocab_size"].value_or(head ? 0 : 1);
      m.shape.seq_len = (*e)["seq_len"].value_or(0);
      m.shape.micro_batch = (*e)["micro_batch"].value_or(0);
      m.shape.recompute = (*e)["recompute"].value_or(false);
      auto precision = ParsePrecision((*e)["precision"].value_or(std::string("fp32")));
      if (!precision.ok()) return bad(absl::StrCat(where, ": ", precision.status().message()));
      m.shape.precision = *precision;
      m.times = {(*e)["forward_ms"].value_or(0.0) / 1e3, (*e)["backward_ms"].value_or(0.0) / 1e3};
      if (m.shape.model.d_model <= 0 || m.shape.model.n_head <= 0 || m.shape.model.vocab_size <= 0 ||
          m.shape.seq_len <= 0 || m.shape.micro_batch <= 0) {
        return bad(absl::StrCat(where, ": d_model, ", head ? "vocab_size" : "n_head",
                                ", seq_len and micro_batch must all be given, > 0"));
      }
      if (!(m.times.forward_s > 0 && m.times.backward_s > 0)) {
        return bad(absl::StrCat(where, ": forward_ms and backward_ms must be > 0"));
      }
      out.push_back(m);
    }
    return absl::OkStatus();
  };
  if (auto st = entries("block", false, d.blocks_); !st.ok()) return st;
  if (auto st = entries("head", true, d.heads_); !st.ok()) return st;
  if (d.blocks_.empty()) return bad("no [[block]] entries: a profile must time at least one block");
  return d;
}

absl::StatusOr<DeviceCost> DeviceCost::Timed(const std::string& name, Backend backend, double memory_bandwidth,
                                             const WorkShape& shape, ComputeTimes block, ComputeTimes head,
                                             double memory_bytes) {
  for (const ComputeTimes& t : {block, head}) {
    if (!(t.forward_s > 0 && t.backward_s > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("device ", name, ": forward and backward times must be > 0"));
    }
  }
  DeviceCost d;
  d.name_ = name;
  d.backend_ = backend;
  d.memory_bandwidth_ = memory_bandwidth;
  d.memory_bytes_ = memory_bytes;
  d.blocks_.push_back({shape, block});
  d.heads_.push_back({shape, head});
  return d;
}

absl::StatusOr<std::string> DeviceCost::ProfileToml(const std::string& comment) const {
  if (blocks_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("device ", name_, " is priced from its peak: no times to write"));
  }
  // A name from a worker's registration may hold anything: only what a TOML basic string takes as is.
  std::string name;
  for (char c : name_) name += (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) ? '_' : c;
  std::string out = absl::StrFormat("# %s\ndevice = \"%s\"\nbackend = \"%s\"\nmemory_gib = %.6g\n"
                                    "memory_bandwidth_gbs = %.6g\n",
                                    comment, name, backend_ == Backend::kCpu ? "cpu" : "cuda", memory_bytes_ / kGiB,
                                    memory_bandwidth_ / 1e9);
  for (const Measured& m : blocks_) {
    absl::StrAppendFormat(&out,
                          "\n[[block]]\nd_model = %d\nn_head = %d\nseq_len = %d\nmicro_batch = %d\nprecision = "
                          "\"%s\"\nrecompute = %s\nforward_ms = %.6g\nbackward_ms = %.6g\n",
                          m.shape.model.d_model, m.shape.model.n_head, m.shape.seq_len, m.shape.micro_batch,
                          PrecisionName(m.shape.precision), m.shape.recompute ? "true" : "false",
                          m.times.forward_s * 1e3, m.times.backward_s * 1e3);
  }
  for (const Measured& m : heads_) {
    absl::StrAppendFormat(&out,
                          "\n[[head]]\nd_model = %d\nvocab_size = %d\nseq_len = %d\nmicro_batch = %d\nprecision = "
                          "\"%s\"\nforward_ms = %.6g\nbackward_ms = %.6g\n",
                          m.shape.model.d_model, m.shape.model.vocab_size, m.shape.seq_len, m.shape.micro_batch,
                          PrecisionName(m.shape.precision), m.times.forward_s * 1e3, m.times.backward_s * 1e3);
  }
  return out;
}

absl::StatusOr<DeviceCost> DeviceCost::LoadProfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open device profile ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseProfile(ss.str(), std::filesystem::path(path).stem().string());
}

absl::StatusOr<ComputeTimes> DeviceCost::Block(const WorkShape& w) const {
  if (flops_per_second_ > 0) return AtRate(BlockFlopsOf(w), flops_per_second_, w.recompute);
  const Measured* nearest = nullptr;
  for (const Measured& m : blocks_) {
    if (SameBlock(m.shape, w)) return m.times;
    if (m.shape.precision != w.precision || m.shape.recompute != w.recompute) continue;
    if (nearest == nullptr || std::abs(std::log(BlockFlopsOf(m.shape) / BlockFlopsOf(w))) <
                                  std::abs(std::log(BlockFlopsOf(nearest->shape) / BlockFlopsOf(w)))) {
      nearest = &m;
    }
  }
  if (nearest == nullptr && w.recompute) {
    WorkShape plain = w;
    plain.recompute = false;
    auto t = Block(plain);
    if (!t.ok()) return t.status();
    return ComputeTimes{t->forward_s, t->backward_s + t->forward_s};
  }
  if (nearest == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("profile ", name_, " times no block in ", PrecisionName(w.precision), ": add one"));
  }
  const double scale = BlockFlopsOf(w) / BlockFlopsOf(nearest->shape);
  return ComputeTimes{nearest->times.forward_s * scale, nearest->times.backward_s * scale};
}

bool DeviceCost::PricesRecompute(Precision precision) const {
  if (flops_per_second_ > 0) return false;
  for (const Measured& m : blocks_)
    if (m.shape.precision == precision && m.shape.recompute) return false;
  return true;
}

absl::StatusOr<ComputeTimes> DeviceCost::Head(const WorkShape& w) const {
  const double flops = HeadFlops(w.model, w.micro_batch, w.seq_len);
  // The head is never recomputed: its backward is twice its forward either way.
  if (flops_per_second_ > 0) return AtRate(flops, flops_per_second_, false);
  for (const Measured& m : heads_)
    if (SameHead(m.shape, w)) return m.times;
  auto block = Block(w);
  if (!block.ok()) return block.status();
  return AtRate(flops, BlockFlopsOf(w) / (block->forward_s + block->backward_s), false);
}

absl::StatusOr<ComputeTimes> DeviceCost::Stage(const WorkShape& w, const StageSpec& spec) const {
  ComputeTimes t;
  if (spec.end_block > spec.first_block) {
    auto block = Block(w);
    if (!block.ok()) return block.status();
    const int n = spec.end_block - spec.first_block;
    t = {n * block->forward_s, n * block->backward_s};
  }
  if (spec.has_head) {
    auto head = Head(w);
    if (!head.ok()) return head.status();
    t.forward_s += head->forward_s;
    t.backward_s += head->backward_s;
  }
  return t;
}

double DeviceCost::StepSeconds(double param_count, int replicas) const {
  return StepBytes(param_count, replicas) / memory_bandwidth_;
}

double DeviceCost::StepBytes(double param_count, int replicas) {
  // Sum: read `replicas` gradients, write one. AdamW: read parameter, gradient, m, v; write
  // parameter, m, v. Four bytes each.
  const double passes = (replicas + 1) + 7;
  return passes * 4 * param_count;
}

MemoryEstimate DeviceCost::StageMemory(const WorkShape& w, const StageSpec& spec, int activation_slots) const {
  return StageMemoryOn(backend_, w, spec, activation_slots);
}

MemoryEstimate StageMemoryOn(Backend backend, const WorkShape& w, const StageSpec& spec, int activation_slots) {
  StageMemoryRequest r;
  r.model = w.model;
  r.spec = spec;
  r.B = w.micro_batch;
  r.T = w.seq_len;
  r.recompute = w.recompute;
  r.activation_slots = activation_slots;
  r.backend = backend;
  r.precision = w.precision;
  return EstimateStage(r);
}

double LinkCost::Rate() const {
  double rate = bandwidth > 0 ? bandwidth : std::numeric_limits<double>::infinity();
  if (window_bytes > 0 && latency_s > 0) rate = std::min(rate, window_bytes / (2 * latency_s));
  return rate;
}

double LinkCost::SerializeSeconds(double bytes) const { return bytes / Rate(); }

NetworkCost NetworkCost::FromScenario(netem::Scenario scenario, double window_bytes) {
  NetworkCost n;
  n.scenario_ = std::move(scenario);
  n.window_bytes_ = window_bytes;
  return n;
}

NetworkCost NetworkCost::Uniform(LinkCost link) {
  NetworkCost n;
  n.uniform_ = link;
  return n;
}

LinkCost MeasuredLink(double round_trip_s, double bytes_per_s) { return {round_trip_s / 2, bytes_per_s, 0}; }

CodecSeconds HostCodecSeconds(double elements, WireDtype d, bool stochastic) {
  // Nanoseconds a value: encode to nearest, encode stochastically, decode.
  struct Rate {
    double encode, stochastic, decode;
  };
  Rate r{0, 0, 0};
  switch (d) {
    case WireDtype::kAuto:
    case WireDtype::kF32:
    case WireDtype::kTopK:
    case WireDtype::kInt1H: break;  // the exchange's alone (ExchangeOnly): never across a boundary
    case WireDtype::kF16: r = {0.25, 0.25, 0.25}; break;
    case WireDtype::kBf16: r = {0.18, 0.18, 0.16}; break;
    case WireDtype::kInt8: r = {0.65, 0.98, 0.51}; break;
    case WireDtype::kInt4: r = {0.91, 1.25, 0.67}; break;
    case WireDtype::kInt3: r = {0.89, 1.21, 0.74}; break;
    case WireDtype::kInt2: r = {0.83, 1.06, 0.53}; break;
    case WireDtype::kInt3H: r = {1.23, 1.57, 1.19}; break;
    case WireDtype::kInt2H: r = {1.29, 1.53, 1.07}; break;
  }
  return {elements * (stochastic ? r.stochastic : r.encode) * 1e-9, elements * r.decode * 1e-9};
}

absl::StatusOr<NetworkCost> NetworkCost::LoadMeasured(const std::string& path, int* hosts) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path, " (give a run's cluster.json)"));
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("links") || !j["links"].is_array() || j["links"].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds no measured links: a run records them in its cluster.json when its workers probe their links "
              "(cluster.link_probe = \"on\", or \"auto\" without --scenario)"));
  }
  constexpr int64_t kMaxHosts = 1024;  // the matrix stays in megabytes whatever the file says
  std::vector<std::tuple<int, int, double, double>> links;
  std::set<std::pair<int, int>> seen;
  int n = 0;
  for (const nlohmann::json& l : j["links"]) {
    const bool shaped = l.is_object() && l.contains("from") && l["from"].is_number_integer() && l.contains("to") &&
                        l["to"].is_number_integer() && l.contains("round_trip_ms") && l["round_trip_ms"].is_number() &&
                        l.contains("mbit_per_s") && l["mbit_per_s"].is_number();
    const int64_t a = shaped ? l["from"].get<int64_t>() : -1, b = shaped ? l["to"].get<int64_t>() : -1;
    const double rtt_ms = shaped ? l["round_trip_ms"].get<double>() : -1, mbit = shaped ? l["mbit_per_s"].get<double>() : -1;
    if (!shaped || a < 0 || b < 0 || a >= kMaxHosts || b >= kMaxHosts || a == b || !(rtt_ms > 0 && rtt_ms < 3.6e6) ||
        !(mbit > 0 && mbit < 1e8)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a link entry ", l.dump(),
                                                     " is not {from, to, round_trip_ms > 0, mbit_per_s > 0} of workers "
                                                     "0 to ",
                                                     kMaxHosts - 1));
    }
    if (!seen.emplace(a, b).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the link from worker ", a, " to ", b, " appears twice"));
    }
    links.emplace_back(static_cast<int>(a), static_cast<int>(b), rtt_ms / 1e3, mbit * 1e6 / 8);
    n = std::max({n, static_cast<int>(a) + 1, static_cast<int>(b) + 1});
  }
  std::vector<std::vector<LinkCost>> matrix(n, std::vector<LinkCost>(n));
  for (const auto& [a, b, rtt, rate] : links) matrix[a][b] = MeasuredLink(rtt, rate);
  // Cards the probes saw: {worker, egress_mbit_per_s} of workers among the links'.
  std::vector<double> egress(n);
  if (j.contains("cards")) {
    if (!j["cards"].is_array()) return absl::InvalidArgumentError(absl::StrCat(path, ": \"cards\" is not a list"));
    for (const nlohmann::json& c : j["cards"]) {
      const bool shaped = c.is_object() && c.contains("worker") && c["worker"].is_number_integer() &&
                          c.contains("egress_mbit_per_s") && c["egress_mbit_per_s"].is_number();
      const int64_t w = shaped ? c["worker"].get<int64_t>() : -1;
      const double mbit = shaped ? c["egress_mbit_per_s"].get<double>() : -1;
      if (!shaped || w < 0 || w >= n || !(mbit > 0 && mbit < 1e8)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": a card entry ", c.dump(),
                                                       " is not {worker of the links, egress_mbit_per_s > 0}"));
      }
      egress[w] = mbit * 1e6 / 8;
    }
  }
  *hosts = n;
  NetworkCost network = FromMatrix(std::move(matrix));
  network.SetCards(std::move(egress), {});
  return network;
}

NetworkCost NetworkCost::FromMatrix(std::vector<std::vector<LinkCost>> links) {
  NetworkCost n;
  n.matrix_ = std::move(links);
  return n;
}

LinkCost NetworkCost::Between(int from_host, int to_host) const {
  if (from_host == to_host || from_host < 0 || to_host < 0) return {};
  if (!matrix_.empty()) {
    const size_t a = static_cast<size_t>(from_host), b = static_cast<size_t>(to_host);
    return a < matrix_.size() && b < matrix_[a].size() ? matrix_[a][b] : LinkCost{};
  }
  if (!scenario_) return uniform_;
  const netem::Link l = scenario_->Between(from_host, to_host);
  return {l.delay_ms / 1e3, l.rate_mbit * 1e6 / 8, window_bytes_};
}

double NetworkCost::EgressRate(int host) const {
  if (host < 0) return 0;
  if (static_cast<size_t>(host) < egress_.size()) return egress_[host];
  return scenario_ ? scenario_->EgressMbit(host) * 1e6 / 8 : 0;
}

double NetworkCost::IngressRate(int host) const {
  if (host < 0) return 0;
  if (static_cast<size_t>(host) < ingress_.size()) return ingress_[host];
  return scenario_ ? scenario_->IngressMbit(host) * 1e6 / 8 : 0;
}

bool NetworkCost::HasCards() const {
  auto any = [](const std::vector<double>& v) { return std::any_of(v.begin(), v.end(), [](double r) { return r > 0; }); };
  return any(egress_) || any(ingress_) || (scenario_ && scenario_->HasCards());
}

void NetworkCost::SetCards(std::vector<double> egress, std::vector<double> ingress) {
  egress_ = std::move(egress);
  ingress_ = std::move(ingress);
}

NetworkCost NetworkCost::WithoutCards() const {
  NetworkCost n = *this;
  n.egress_.clear();
  n.ingress_.clear();
  if (n.scenario_) n.scenario_->egress_mbit.clear(), n.scenario_->ingress_mbit.clear();
  return n;
}

}  // namespace longhaul
