#include "config/job_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The valid range of a numeric key, and what its edge means.
struct Range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  const char* note = "";
};
Range AtLeast(double lo, const char* note = "") { return {lo, kInf, false, false, note}; }
Range Above(double lo, const char* note = "") { return {lo, kInf, true, false, note}; }
Range Within(double lo, double hi, const char* note = "") { return {lo, hi, false, false, note}; }
Range AboveUpTo(double lo, double hi) { return {lo, hi, true, false, ""}; }  // (lo, hi]
Range Fraction() { return {0, 1, false, true, ""}; }  // [0, 1)

// A pipeline boundary's dtype (transport.wire_dtype, transport.gradient_dtype): any but the
// exchange's own (topk, int1h).
absl::StatusOr<WireDtype> ParseBoundaryDtype(const std::string& name, const std::string& key) {
  LH_ASSIGN_OR_RETURN(const WireDtype d, ParseWireDtype(name, key));
  if (ExchangeOnly(d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, " = \"", name, "\": ",
        d == WireDtype::kTopK ? "top-k sends one value in 32" : "int1h sends one bit, a sign, of each value",
        ", which a pipeline boundary cannot lose; it is for the data-parallel exchange, whose error feedback sends "
        "what a round loses in the next: transport.exchange_dtype = \"",
        name, "\""));
  }
  return d;
}

std::string Requirement(const Range& r) {
  std::string req = r.hi == kInf ? absl::StrCat(r.lo_open ? "> " : ">= ", r.lo)
                                 : absl::StrCat("in ", r.lo_open ? "(" : "[", r.lo, ", ", r.hi, r.hi_open ? ")" : "]");
  return absl::StrCat("must be ", req, *r.note ? absl::StrCat(" (", r.note, ")") : "");
}

class Reader {
 public:
  Reader(const toml::table& root, std::string file) : root_(root), file_(std::move(file)) {}

  // Reads section.key into out when present (out keeps its default otherwise). Integers must fit
  // the field, numbers must be finite.
  template <typename T>
  absl::Status Get(const char* section, const char* key, T& out) const {
    auto node = root_[section][key];
    if (!node) return absl::OkStatus();
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node.template value<bool>(); v && node.is_boolean()) return out = *v, absl::OkStatus();
      return TypeError(section, key, "true or false");
    } else if constexpr (std::is_integral_v<T>) {
      auto v = node.template value<int64_t>();
      if (!v || !node.is_integer()) return TypeError(section, key, "an integer");
      LH_RETURN_IF_ERROR(FitsIn<T>(section, key, *v));
      return out = static_cast<T>(*v), absl::OkStatus();
    } else if constexpr (std::is_floating_point_v<T>) {
      auto v = node.template value<double>();
      if (!v || !(node.is_floating_point() || node.is_integer())) return TypeError(section, key, "a number");
      if (!std::isfinite(*v)) return Bad(section, key, absl::StrCat(*v), "must be a finite number");
      return out = static_cast<T>(*v), absl::OkStatus();
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      const toml::array* arr = node.as_array();
      if (arr == nullptr) return TypeError(section, key, "an array of strings");
      out.clear();
      for (const toml::node& e : *arr) {
        if (!e.is_string()) return TypeError(section, key, "an array of strings");
        out.push_back(*e.value<std::string>());
      }
      return absl::OkStatus();
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      const toml::array* arr = node.as_array();
      if (arr == nullptr) return TypeError(section, key, "an array of integers");
      out.clear();
      for (const toml::node& e : *arr) {
        if (!e.is_integer()) return TypeError(section, key, "an array of integers");
        LH_RETURN_IF_ERROR(FitsIn<int>(section, key, *e.value<int64_t>()));
        out.push_back(static_cast<int>(*e.value<int64_t>()));
      }
      return absl::OkStatus();
    } else {
      if (auto v = node.template value<std::string>(); v && node.is_string()) return out = *v, absl::OkStatus();
      return TypeError(section, key, "a string");
    }
  }

  absl::Status CheckRange(const char* section, const char* key, double v, const Range& r) const {
    const bool ok = (r.lo_open ? v > r.lo : v >= r.lo) && (r.hi_open ? v < r.hi : v <= r.hi);
    return ok ? absl::OkStatus() : Bad(section, key, absl::StrCat(v), Requirement(r));
  }

  // A parse function's own message (which names the key), prefixed with the file.
  absl::Status InFile(const absl::Status& s) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", s.message()));
  }

  // "file: section.key = value: why".
  absl::Status Bad(const char* section, const char* key, const std::string& value, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", section, ".", key, " = ", value, ": ", why));
  }

 private:
  template <typename T>
  absl::Status FitsIn(const char* section, const char* key, int64_t v) const {
    if constexpr (std::is_unsigned_v<T>) {
      if (v < 0) return Bad(section, key, absl::StrCat(v), "must be >= 0");
    } else if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      return Bad(section, key, absl::StrCat(v),
                 absl::StrCat("must be in [", std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(), "]"));
    }
    return absl::OkStatus();
  }
  absl::Status TypeError(const char* section, const char* key, const char* want) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", section, ".", key, " must be ", want));
  }
  const toml::table& root_;
  std::string file_;
};

// A float field as JSON: the double nearest its shortest decimal form (0.9f is recorded as 0.9, not
// 0.8999999761581421), which reads back as the same float.
template <typename T>
nlohmann::json AsJson(const T& v) {
  if constexpr (std::is_same_v<T, float>) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
    return std::strtod(std::string(buf, end).c_str(), nullptr);
  } else {
    return nlohmann::json(v);
  }
}

// One row of the key table.
struct KeyDef {
  ConfigKey info;
  std::function<absl::Status(const Reader&, JobConfig&)> read;  // leaves the default when the key is absent
  std::function<nlohmann::json(const JobConfig&)> value;        // the effective value
};

// A key read straight into a JobConfig field. `field` is a generic lambda returning the field of
// a (const or not) JobConfig; numeric keys with a range are checked against it.
template <typename Field>
KeyDef Value(const char* section, const char* key, ResumeRule rule, Field field,
             std::optional<Range> range = std::nullopt) {
  return {{section, key, rule},
          [=](const Reader& r, JobConfig& c) -> absl::Status {
            auto& f = field(c);
            LH_RETURN_IF_ERROR(r.Get(section, key, f));
            if constexpr (std::is_arithmetic_v<std::remove_reference_t<decltype(f)>>) {
              if (range) return r.CheckRange(section, key, static_cast<double>(f), *range);
            }
            return absl::OkStatus();
          },
          [=](const JobConfig& c) { return AsJson(field(c)); }};
}

// A key naming one of a few choices: parse turns the name into the field's value (its error names
// the key and the choices), name turns it back.
template <typename Field, typename Parse, typename Name>
KeyDef Choice(const char* section, const char* key, ResumeRule rule, Field field, Parse parse, Name name) {
  return {{section, key, rule},
          [=](const Reader& r, JobConfig& c) -> absl::Status {
            std::string text = name(field(c));
            LH_RETURN_IF_ERROR(r.Get(section, key, text));
            auto v = parse(text);
            if (!v.ok()) return r.InFile(v.status());
            field(c) = *v;
            return absl::OkStatus();
          },
          [=](const JobConfig& c) { return nlohmann::json(name(field(c))); }};
}

const char* DataSourceName(DataSource s) {
  return s == DataSource::kBuiltin ? "builtin" : (s == DataSource::kBytes ? "bytes" : "llmc");
}
absl::StatusOr<DataSource> ParseDataSource(const std::string& name) {
  for (DataSource s : {DataSource::kBuiltin, DataSource::kBytes, DataSource::kLlmc})
    if (name == DataSourceName(s)) return s;
  return absl::InvalidArgumentError(
      absl::StrCat("data.source = \"", name, "\": use \"builtin\", \"bytes\" or \"llmc\""));
}

const char* PsName(bool central) { return central ? "central" : "sharded"; }
absl::StatusOr<bool> ParsePs(const std::string& name) {
  if (name == "sharded" || name == "central") return name == "central";
  return absl::InvalidArgumentError(absl::StrCat("cluster.ps = \"", name, "\": use \"sharded\" or \"central\""));
}

const char* PlacementName(bool search) { return search ? "search" : "registration"; }
using LinkProbe = ClusterConfig::LinkProbe;
const char* LinkProbeName(LinkProbe p) { return p == LinkProbe::kAuto ? "auto" : (p == LinkProbe::kOn ? "on" : "off"); }
absl::StatusOr<LinkProbe> ParseLinkProbe(const std::string& name) {
  for (LinkProbe p : {LinkProbe::kAuto, LinkProbe::kOn, LinkProbe::kOff})
    if (name == LinkProbeName(p)) return p;
  return absl::InvalidArgumentError(absl::StrCat("cluster.link_probe = \"", name, "\": use \"auto\", \"on\" or \"off\""));
}
const char* CommunicationName(bool choose) { return choose ? "auto" : "fixed"; }
absl::StatusOr<bool> ParseCommunication(const std::string& name) {
  if (name == "auto" || name == "fixed") return name == "auto";
  return absl::InvalidArgumentError(absl::StrCat("cluster.communication = \"", name,
                                                 "\": use \"fixed\" (the config's own) or \"auto\" (the "
                                                 "coordinator chooses by the measured penalties)"));
}
absl::StatusOr<bool> ParsePlacement(const std::string& name) {
  if (name == "search" || name == "registration") return name == "search";
  return absl::InvalidArgumentError(
      absl::StrCat("cluster.placement = \"", name, "\": use \"search\" or \"registration\""));
}

#define LH_FIELD(path) [](auto& c) -> auto& { return c.path; }

// Every key. Resume rules: anything that changes the math or the samples must match (the model,
// the data, the optimizer and its schedule — train.steps sets the cosine decay —, the seeds, the
// batch shape, the compute precision and the wire precision); how the model is split over workers
// is a layout; the rest (threads, recompute, the pipeline schedule, logging, evaluation,
// checkpoint frequency, paths, the backend device, timeouts, transport tuning) may change.
const std::vector<KeyDef>& Table() {
  using R = ResumeRule;
  static const auto* table = new std::vector<KeyDef>{
      // Ranges of the model's shape are ModelConfig::Validate's.
      Value("model", "vocab_size", R::kMustMatch, LH_FIELD(model.vocab_size)),
      Value("model", "max_seq_len", R::kMustMatch, LH_FIELD(model.max_seq_len)),
      Value("model", "n_layer", R::kMustMatch, LH_FIELD(model.n_layer)),
      Value("model", "n_head", R::kMustMatch, LH_FIELD(model.n_head)),
      Value("model", "d_model", R::kMustMatch, LH_FIELD(model.d_model)),
      Value("model", "tied_head", R::kMustMatch, LH_FIELD(model.tied_head)),
      Value("model", "subspace_divisor", R::kMustMatch, LH_FIELD(model.subspace_divisor)),
      Choice("model", "attention", R::kMustMatch, LH_FIELD(model.attention), ParseAttentionMask, AttentionMaskName),

      Choice("data", "source", R::kMustMatch, LH_FIELD(data.source), ParseDataSource, DataSourceName),
      Value("data", "path", R::kMustMatch, LH_FIELD(data.path)),
      Value("data", "val_path", R::kMustMatch, LH_FIELD(data.val_path)),
      Value("data", "val_fraction", R::kMustMatch, LH_FIELD(data.val_fraction), Fraction()),
      Value("data", "seed", R::kMustMatch, LH_FIELD(data.markov.seed)),
      // Ranges of the built-in corpus's shape are ValidateMarkovSpec's.
      Value("data", "alphabet", R::kMustMatch, LH_FIELD(data.markov.alphabet)),
      Value("data", "order", R::kMustMatch, LH_FIELD(data.markov.order)),
      Value("data", "branching", R::kMustMatch, LH_FIELD(data.markov.branching)),
      Value("data", "train_tokens", R::kMustMatch, LH_FIELD(data.train_tokens), AtLeast(1)),
      Value("data", "val_tokens", R::kMustMatch, LH_FIELD(data.val_tokens), AtLeast(0)),

      Value("train", "steps", R::kMustMatch, LH_FIELD(train.steps), AtLeast(1)),
      Value("train", "seq_len", R::kMustMatch, LH_FIELD(train.seq_len), AtLeast(1)),
      Value("train", "micro_batch_size", R::kMustMatch, LH_FIELD(train.micro_batch_size), AtLeast(1)),
      Value("train", "micro_batches", R::kMustMatch, LH_FIELD(train.micro_batches), AtLeast(1)),
      Value("train", "lr", R::kMustMatch, LH_FIELD(train.lr), Above(0)),
      Value("train", "min_lr", R::kMustMatch, LH_FIELD(train.min_lr), AtLeast(0)),
      Value("train", "warmup_steps", R::kMustMatch, LH_FIELD(train.warmup_steps), AtLeast(0)),
      Value("train", "weight_decay", R::kMustMatch, LH_FIELD(train.adamw.weight_decay), AtLeast(0, "0 disables decay")),
      Value("train", "beta1", R::kMustMatch, LH_FIELD(train.adamw.beta1), Fraction()),
      Value("train", "beta2", R::kMustMatch, LH_FIELD(train.adamw.beta2), Fraction()),
      Value("train", "eps", R::kMustMatch, LH_FIELD(train.adamw.eps), Above(0, "for example 1e-8")),
      Value("train", "grad_clip", R::kMustMatch, LH_FIELD(train.grad_clip), AtLeast(0, "0 disables clipping")),
      Value("train", "seed", R::kMustMatch, LH_FIELD(train.seed)),
      Value("train", "threads", R::kFree, LH_FIELD(train.threads), Within(0, 1024, "0 uses every core")),
      Value("train", "recompute", R::kFree, LH_FIELD(train.recompute)),
      Value("train", "log_every", R::kFree, LH_FIELD(train.log_every), AtLeast(1)),
      Value("train", "eval_every", R::kFree, LH_FIELD(train.eval_every), AtLeast(0, "0 disables evaluation")),
      Value("train", "eval_batches", R::kFree, LH_FIELD(train.eval_batches), AtLeast(1)),
      Value("train", "checkpoint_every", R::kFree, LH_FIELD(train.checkpoint_every), AtLeast(0, "0: only at the end")),
      Value("train", "keep_checkpoints", R::kFree, LH_FIELD(train.keep_checkpoints), AtLeast(0, "0 keeps all")),
      Value("train", "out_dir", R::kFree, LH_FIELD(train.out_dir)),
      Value("train", "resume", R::kFree, LH_FIELD(train.resume)),
      Value("train", "init_from", R::kFree, LH_FIELD(train.init_from)),
      Choice("train", "backend", R::kFree, LH_FIELD(train.backend_device), [](const std::string& n) { return ParseBackend(n, "train.backend"); }, BackendName),
      Choice("train", "precision", R::kMustMatch, LH_FIELD(train.precision), ParsePrecision, PrecisionName),
      Value("train", "local_steps", R::kMustMatch, LH_FIELD(train.local_steps),
            AtLeast(1, "1 exchanges every iteration")),
      Value("train", "outer_lr", R::kMustMatch, LH_FIELD(train.outer_lr), AboveUpTo(0, 10)),
      Value("train", "outer_momentum", R::kMustMatch, LH_FIELD(train.outer_momentum), Fraction()),
      Value("train", "overlap_outer", R::kMustMatch, LH_FIELD(train.overlap_outer)),
      Value("train", "overlap_steps", R::kMustMatch, LH_FIELD(train.overlap_steps),
            AtLeast(2, "the hosts step in the iteration after the push, and it lands after that")),
      Value("train", "overlap_mix", R::kMustMatch, LH_FIELD(train.overlap_mix), Fraction()),

      Value("cluster", "job_id", R::kFree, LH_FIELD(cluster.job_id)),
      // A stage reads its tensors from a checkpoint by name (CheckpointPieces): the cut may change.
      Value("cluster", "stages", R::kFree, LH_FIELD(cluster.stages), Within(1, 65536)),
      Value("cluster", "replicas", R::kLayout, LH_FIELD(cluster.replicas), Within(1, 65536)),
      Choice("cluster", "schedule", R::kFree, LH_FIELD(cluster.schedule), ParseSchedule, ScheduleName),
      Choice("cluster", "ps", R::kLayout, LH_FIELD(cluster.central_ps), ParsePs, PsName),
      Choice("cluster", "placement", R::kFree, LH_FIELD(cluster.search_placement), ParsePlacement, PlacementName),
      Choice("cluster", "link_probe", R::kFree, LH_FIELD(cluster.link_probe), ParseLinkProbe, LinkProbeName),
      Value("cluster", "overlap_exchange", R::kFree, LH_FIELD(cluster.overlap_exchange)),
      Choice("cluster", "communication", R::kFree, LH_FIELD(cluster.choose_communication), ParseCommunication,
             CommunicationName),
      Value("cluster", "penalties", R::kFree, LH_FIELD(cluster.penalties)),
      {{"cluster", "stage_layers", R::kFree},
       [](const Reader& r, JobConfig& c) { return r.Get("cluster", "stage_layers", c.cluster.stage_layers); },
       [](const JobConfig& c) { return nlohmann::json(c.Cut()); }},
      {{"cluster", "replica_micro_batches", R::kMustMatch},
       [](const Reader& r, JobConfig& c) {
         return r.Get("cluster", "replica_micro_batches", c.cluster.replica_micro_batches);
       },
       [](const JobConfig& c) { return nlohmann::json(c.cluster.replica_micro_batches); }},
      {{"cluster", "stage_backends", R::kFree},
       [](const Reader& r, JobConfig& c) {
         std::vector<std::string> names;
         LH_RETURN_IF_ERROR(r.Get("cluster", "stage_backends", names));
         c.cluster.stage_backends.clear();
         for (const std::string& n : names) {
           const absl::StatusOr<int> device = ParseBackend(n, "an entry");
           if (!device.ok()) {
             return r.Bad("cluster", "stage_backends", absl::StrCat("[..., \"", n, "\", ...]"),
                          std::string(device.status().message()));
           }
           c.cluster.stage_backends.push_back(*device);
         }
         return absl::OkStatus();
       },
       [](const JobConfig& c) {
         nlohmann::json names = nlohmann::json::array();
         for (int d : c.cluster.stage_backends) names.push_back(BackendName(d));
         return names;
       }},
      Value("cluster", "heartbeat_s", R::kFree, LH_FIELD(cluster.heartbeat_s), AboveUpTo(0, kLongestSeconds)),
      Value("cluster", "dead_after_s", R::kFree, LH_FIELD(cluster.dead_after_s), AboveUpTo(0, kLongestSeconds)),
      Value("cluster", "lifeline_grace_s", R::kFree, LH_FIELD(cluster.lifeline_grace_s), Above(0)),
      Value("cluster", "spares", R::kFree, LH_FIELD(cluster.spares), Within(0, 1024)),
      Value("cluster", "spare_wait_s", R::kFree, LH_FIELD(cluster.spare_wait_s), Within(0.0, 86400.0)),
      Value("cluster", "replace_stragglers", R::kFree, LH_FIELD(cluster.replace_stragglers)),

      Choice("transport", "wire_dtype", R::kMustMatch, LH_FIELD(transport.wire_dtype),
             [](const std::string& n) { return ParseBoundaryDtype(n, "transport.wire_dtype"); }, WireDtypeName),
      Choice("transport", "exchange_dtype", R::kMustMatch, LH_FIELD(transport.exchange_dtype),
             [](const std::string& n) { return ParseWireDtype(n, "transport.exchange_dtype"); }, WireDtypeName),
      Choice("transport", "gradient_dtype", R::kMustMatch, LH_FIELD(transport.gradient_dtype),
             [](const std::string& n) { return ParseBoundaryDtype(n, "transport.gradient_dtype"); }, WireDtypeName),
      Value("transport", "boundary_rank_divisor", R::kMustMatch, LH_FIELD(transport.boundary_rank_divisor),
            AtLeast(1, "1: boundaries sent whole")),
      Value("transport", "gradient_rank_divisor", R::kMustMatch, LH_FIELD(transport.gradient_rank_divisor),
            AtLeast(0, "0: as transport.boundary_rank_divisor")),
      Value("transport", "shared_directions", R::kMustMatch, LH_FIELD(transport.shared_directions)),
      Value("transport", "chunk_mib", R::kFree, LH_FIELD(transport.chunk_mib), Within(1, 16)),
      Value("transport", "connections", R::kFree, LH_FIELD(transport.connections),
            Within(0, 64, "0: per link, from its rate x round trip")),
      Value("transport", "timeout_s", R::kFree, LH_FIELD(transport.timeout_s), AboveUpTo(0, 86400)),
      Value("transport", "congestion_control", R::kFree, LH_FIELD(transport.congestion_control)),
  };
  return *table;
}

#undef LH_FIELD

absl::Status CheckKeys(const toml::table& root, const std::string& file) {
  std::map<std::string, std::vector<std::string>> known;  // by section, in table order
  for (const KeyDef& k : Table()) known[k.info.section].push_back(k.info.key);
  for (auto&& [section, node] : root) {
    const std::string s(section.str());
    auto it = known.find(s);
    if (it == known.end()) {
      std::vector<std::string> names;
      for (const char* n : {"model", "data", "train", "cluster", "transport"}) names.push_back(absl::StrCat("[", n, "]"));
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": unknown section [", s, "] (known: ", absl::StrJoin(names, ", "), ")"));
    }
    if (!node.is_table()) return absl::InvalidArgumentError(absl::StrCat(file, ": ", s, " must be a table [", s, "]"));
    for (auto&& [key, _] : *node.as_table()) {
      if (std::find(it->second.begin(), it->second.end(), std::string(key.str())) == it->second.end()) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": unknown key ", s, ".", std::string(key.str()),
                                                       " (known keys of [", s, "]: ", absl::StrJoin(it->second, ", "),
                                                       ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(toml::table& root, const std::string& assignment) {
  const size_t eq = assignment.find('='), dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", assignment, ": expected section.key=value, for example --set train.steps=100"));
  }
  const std::string section = assignment.substr(0, dot), key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);  // a bare word is a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* tbl = root[section].as_table();
  if (tbl == nullptr) return absl::InvalidArgumentError(absl::StrCat("--set ", assignment, ": ", section, " is not a table"));
  tbl->insert_or_assign(key, *parsed.get("v"));
  return absl::OkStatus();
}

// Checks between keys; each key's own range was checked as it was read.
absl::Status Validate(const JobConfig& c, const std::string& file) {
  auto bad = [&](const std::string& msg) { return absl::InvalidArgumentError(absl::StrCat(file, ": ", msg)); };
  if (auto s = c.model.Validate(); !s.ok()) return bad(std::string(s.message()));
  const TrainConfig& t = c.train;
  if (t.seq_len > c.model.max_seq_len) {
    return bad(absl::StrFormat(
        "train.seq_len = %d is longer than the position table (model.max_seq_len = %d): raise model.max_seq_len or "
        "lower train.seq_len",
        t.seq_len, c.model.max_seq_len));
  }
  if (static_cast<int64_t>(t.micro_batch_size) * t.seq_len > std::numeric_limits<int>::max()) {
    return bad(absl::StrFormat("train.micro_batch_size x train.seq_len = %d x %d tokens per micro-batch: at most %d",
                               t.micro_batch_size, t.seq_len, std::numeric_limits<int>::max()));
  }
  if (t.min_lr > t.lr) {
    return bad(absl::StrFormat("train.min_lr = %g is above train.lr = %g: the schedule decays from lr to min_lr, so "
                               "lower train.min_lr",
                               t.min_lr, t.lr));
  }
  if (static_cast<double>(t.lr) * t.adamw.weight_decay >= 1) {
    return bad(absl::StrFormat("train.lr x train.weight_decay = %g x %g >= 1 would flip the sign of every decayed "
                               "weight: lower train.weight_decay",
                               t.lr, t.adamw.weight_decay));
  }
  if (t.out_dir.empty()) return bad("train.out_dir must not be empty (default \"runs/latest\")");
  // A checkpoint between exchanges would hold the outer parameters under a later step's number.
  if (t.local_steps > 1 && t.checkpoint_every % t.local_steps != 0) {
    return bad(absl::StrFormat("train.checkpoint_every = %d is not a multiple of train.local_steps = %d: checkpoints "
                               "are taken where the replicas exchange; set train.checkpoint_every to %d",
                               t.checkpoint_every, t.local_steps,
                               (t.checkpoint_every / t.local_steps + 1) * t.local_steps));
  }
  if (t.overlap_outer && t.local_steps <= t.overlap_steps) {
    return bad(absl::StrFormat("train.overlap_outer = true with train.local_steps = %d: an overlapped exchange lands "
                               "train.overlap_steps = %d iterations after its push, within the next round, which "
                               "needs train.local_steps >= %d",
                               t.local_steps, t.overlap_steps, t.overlap_steps + 1));
  }
  // The keys that say how an overlapped exchange goes, set where none is.
  auto without_overlap = [&](const std::string& setting, const char* says) {
    return bad(absl::StrCat(setting, " with train.overlap_outer = false: it says ", says,
                            "; set train.overlap_outer = true, or leave it out"));
  };
  if (!t.overlap_outer && t.overlap_mix != 0) {
    return without_overlap(absl::StrFormat("train.overlap_mix = %g", t.overlap_mix), "how an overlapped exchange lands");
  }
  if (!t.overlap_outer && t.overlap_steps != 2) {
    return without_overlap(absl::StrFormat("train.overlap_steps = %d", t.overlap_steps),
                           "how long an overlapped exchange travels");
  }
  if (c.transport.shared_directions && c.transport.boundary_rank_divisor <= 1) {
    return bad("transport.shared_directions = true needs boundaries in low rank: set "
               "transport.boundary_rank_divisor > 1 (the directions' count is the width / it), or drop the key");
  }
  if (c.transport.shared_directions && c.transport.gradient_rank_divisor > 0) {
    return bad(absl::StrFormat("transport.gradient_rank_divisor = %d with transport.shared_directions: the gradients "
                               "travel in their activations' directions, at their rank; drop the key",
                               c.transport.gradient_rank_divisor));
  }
  // A low rank must have a direction at all, and send fewer floats than the tensor it stands for.
  for (const bool gradient : {false, true}) {
    const bool own = gradient && c.transport.gradient_rank_divisor > 0;
    const int divisor = RankDivisor(gradient, c.transport.boundary_rank_divisor, c.transport.gradient_rank_divisor);
    const BoundaryShape b = c.boundary(gradient);
    const std::string key = absl::StrFormat("transport.%s_rank_divisor = %d", own ? "gradient" : "boundary", divisor);
    if (divisor > b.kept) {
      return bad(absl::StrFormat("%s leaves no rank of the %d columns a boundary carries: use a divisor of at most "
                                 "%d, or 1 to send boundaries whole",
                                 key, b.kept, b.kept));
    }
    if (divisor > 1 && b.sent() >= b.kept_floats()) {
      return bad(absl::StrFormat("%s: rank %d of a boundary's %d x %d floats sends %d floats, no fewer than the "
                                 "tensor's %d; use a larger divisor, or 1 to send boundaries whole",
                                 key, b.rank, b.rows, b.kept, b.sent(), b.kept_floats()));
    }
  }
  // The tensor port's hello carries it, and a receiver reads at most this many bytes of it.
  if (c.cluster.job_id.empty() || c.cluster.job_id.size() > kMaxJobIdBytes) {
    return bad(absl::StrFormat("cluster.job_id is %d bytes; give it 1 to %d", c.cluster.job_id.size(), kMaxJobIdBytes));
  }
  if (const std::string& cc = c.transport.congestion_control;
      cc.size() > 15 || cc.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos) {
    return bad(absl::StrFormat("transport.congestion_control = \"%s\" is not a kernel congestion control name (as in "
                               "/proc/sys/net/ipv4/tcp_available_congestion_control: \"cubic\", \"reno\", \"bbr\"; "
                               "\"\" keeps the system's)",
                               cc));
  }
  if (absl::Status s = CheckPrecisionHasAGpu(c); !s.ok()) return bad(std::string(s.message()));
  if (c.data.source != DataSource::kBuiltin && c.data.path.empty()) {
    return bad("data.path is required when data.source is \"bytes\" or \"llmc\"");
  }
  if (c.data.source == DataSource::kBuiltin) {
    if (auto s = ValidateMarkovSpec(c.data.markov); !s.ok()) return bad(std::string(s.message()));
  }
  const ClusterConfig& k = c.cluster;
  if (k.job_id.empty()) return bad("cluster.job_id must not be empty");
  if (static_cast<int64_t>(k.stages) * k.replicas > 65536) {
    return bad(absl::StrFormat("cluster.stages x cluster.replicas = %d x %d workers: at most 65536", k.stages,
                               k.replicas));
  }
  if (!k.stage_backends.empty() && static_cast<int>(k.stage_backends.size()) != k.stages) {
    return bad(absl::StrFormat("cluster.stage_backends has %d entries for cluster.stages = %d: give one per stage, or "
                               "none to use train.backend everywhere",
                               k.stage_backends.size(), k.stages));
  }
  if (!k.replica_micro_batches.empty()) {
    if (static_cast<int>(k.replica_micro_batches.size()) != k.replicas) {
      return bad(absl::StrFormat("cluster.replica_micro_batches has %d entries for cluster.replicas = %d: give one per "
                                 "replica, or none to run train.micro_batches on each",
                                 k.replica_micro_batches.size(), k.replicas));
    }
    const auto [least, most] = std::minmax_element(k.replica_micro_batches.begin(), k.replica_micro_batches.end());
    if (*least < 1) return bad("cluster.replica_micro_batches entries must be >= 1");
    if (*most != c.train.micro_batches) {
      return bad(absl::StrFormat("cluster.replica_micro_batches runs at most %d micro-batches on a replica but "
                                 "train.micro_batches = %d: set train.micro_batches = %d, the most any replica runs "
                                 "(what its memory is sized for)",
                                 *most, c.train.micro_batches, *most));
    }
  }
  if (!k.stage_layers.empty()) {
    if (static_cast<int>(k.stage_layers.size()) != k.stages) {
      return bad(absl::StrFormat("cluster.stage_layers has %d entries for cluster.stages = %d", k.stage_layers.size(),
                                 k.stages));
    }
    int64_t sum = 0;
    for (int l : k.stage_layers) {
      if (l < 0) return bad("cluster.stage_layers entries must be >= 0");
      sum += l;
    }
    if (sum != c.model.n_layer) {
      return bad(absl::StrFormat("cluster.stage_layers adds up to %d blocks but model.n_layer = %d", sum,
                                 c.model.n_layer));
    }
  } else if (k.stages > c.model.n_layer) {
    return bad(absl::StrFormat("cluster.stages = %d is more than model.n_layer = %d blocks", k.stages, c.model.n_layer));
  }
  if (c.model.tied_head && k.stages > 1) {
    return bad("model.tied_head = true needs the embedding and the head in one stage: set model.tied_head = false "
               "or cluster.stages = 1");
  }
  if (k.dead_after_s <= k.heartbeat_s) {
    return bad(absl::StrFormat("cluster.dead_after_s = %g must be longer than cluster.heartbeat_s = %g", k.dead_after_s,
                               k.heartbeat_s));
  }
  if (k.lifeline_grace_s > k.dead_after_s) {
    return bad(absl::StrFormat("cluster.lifeline_grace_s = %g is longer than cluster.dead_after_s = %g, which "
                               "loses any silent worker: make it shorter",
                               k.lifeline_grace_s, k.dead_after_s));
  }
  if (c.data.source != DataSource::kLlmc && c.model.vocab_size < 256) {
    return bad(absl::StrFormat("model.vocab_size = %d: byte-level data needs at least 256", c.model.vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPrecisionHasAGpu(const JobConfig& c) {
  if (c.UsesGpu() || c.train.precision == Precision::kFp32) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("train.precision = \"", PrecisionName(c.train.precision),
                                                 "\" needs train.backend = \"cuda:N\" (the CPU backend computes in "
                                                 "fp32)"));
}

std::string BackendName(int device) { return device < 0 ? "cpu" : absl::StrCat("cuda:", device); }
absl::StatusOr<int> ParseBackend(const std::string& name, const std::string& what) {
  int device = -1;
  if (name == "cpu") return -1;
  if (name.rfind("cuda:", 0) == 0 && name.size() <= 9 && name.find_first_not_of("0123456789", 5) == std::string::npos &&
      absl::SimpleAtoi(name.substr(5), &device)) {
    return device;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " = \"", name, "\": use \"cpu\" or \"cuda:N\" (N = device index)"));
}


const char* ResumeRuleName(ResumeRule r) {
  return r == ResumeRule::kMustMatch ? "must match" : (r == ResumeRule::kLayout ? "layout" : "free");
}

const std::vector<ConfigKey>& ConfigKeys() {
  static const auto* keys = [] {
    auto* v = new std::vector<ConfigKey>;
    for (const KeyDef& k : Table()) v->push_back(k.info);
    return v;
  }();
  return *keys;
}

const std::vector<ConfigKey>& CommunicationKeys() {
  static const std::vector<ConfigKey>* keys = [] {
    const std::set<std::string> names = {"train.local_steps",       "train.outer_lr",
                                         "train.outer_momentum",    "train.overlap_outer",
                                         "train.overlap_steps",     "train.overlap_mix",
                                         "transport.wire_dtype",    "transport.exchange_dtype",
                                         "transport.gradient_dtype", "transport.boundary_rank_divisor",
                                         "transport.gradient_rank_divisor", "transport.shared_directions"};
    auto* out = new std::vector<ConfigKey>;
    for (const ConfigKey& k : ConfigKeys())
      if (names.count(k.name()) > 0) out->push_back(k);
    return out;
  }();
  return *keys;
}

nlohmann::json EffectiveConfigJson(const JobConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const KeyDef& k : Table()) j[k.info.section][k.info.key] = k.value(cfg);
  return j;
}

absl::Status CheckStopAt(int64_t stop_at, const JobConfig& cfg) {
  if (stop_at >= 1 && stop_at <= cfg.train.steps) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--stop-at %d: must be a step of the run, between 1 and train.steps = %d", stop_at, cfg.train.steps));
}

absl::StatusOr<JobConfig> ParseJobConfig(const std::string& toml_text, const std::string& source_path,
                                         const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source_path);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return absl::InvalidArgumentError(
        absl::StrCat(source_path, ": TOML syntax error at ", where.str(), ": ", std::string(e.description())));
  }
  for (const std::string& o : overrides) LH_RETURN_IF_ERROR(ApplyOverride(root, o));
  LH_RETURN_IF_ERROR(CheckKeys(root, source_path));

  JobConfig c;
  c.source_path = source_path;
  const Reader r(root, source_path);
  for (const KeyDef& k : Table()) LH_RETURN_IF_ERROR(k.read(r, c));
  if (c.data.source == DataSource::kLlmc && !root["model"]["vocab_size"]) c.model.vocab_size = 50257;
  LH_RETURN_IF_ERROR(Validate(c, source_path));
  c.as_json = EffectiveConfigJson(c);
  std::ostringstream text;
  text << root;
  c.toml_text = text.str();
  return c;
}

BoundaryShape JobConfig::boundary(bool gradient) const {
  return BoundaryOf(model, static_cast<size_t>(train.micro_batch_size) * train.seq_len,
                    RankDivisor(gradient, transport.boundary_rank_divisor, transport.gradient_rank_divisor),
                    transport.shared_directions);
}

int64_t JobConfig::FirstMicroBatchOf(int replica) const {
  if (cluster.replica_micro_batches.empty()) return static_cast<int64_t>(replica) * train.micro_batches;
  return std::accumulate(cluster.replica_micro_batches.begin(), cluster.replica_micro_batches.begin() + replica,
                         int64_t{0});
}

std::vector<int> JobConfig::Cut() const {
  std::vector<int> blocks;
  for (int s = 0; s < cluster.stages; ++s) blocks.push_back(Stage(s).end_block - Stage(s).first_block);
  return blocks;
}

absl::StatusOr<JobConfig> JobConfig::WithCut(const std::vector<int>& cut) const {
  return ParseJobConfig(toml_text, source_path,
                        {absl::StrCat("cluster.stages=", cut.size()),
                         absl::StrCat("cluster.stage_layers=[", absl::StrJoin(cut, ", "), "]")});
}

StageSpec JobConfig::Stage(int stage) const {
  return cluster.stage_layers.empty() ? StageSpec::Even(model, stage, cluster.stages)
                                      : StageSpec::OfCut(cluster.stage_layers, stage);
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open config file ", path, " (check the path)"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseJobConfig(ss.str(), path, overrides);
}

}  // namespace longhaul
