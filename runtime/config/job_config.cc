#include "config/job_config.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

// The keys each section accepts; anything else is a typo worth reporting.
const std::map<std::string, std::set<std::string>>& KnownKeys() {
  static const auto* keys = new std::map<std::string, std::set<std::string>>{
      {"model", {"vocab_size", "max_seq_len", "n_layer", "n_head", "d_model", "tied_head", "attention"}},
      {"data",
       {"source", "path", "val_path", "val_fraction", "seed", "alphabet", "order", "branching", "train_tokens",
        "val_tokens"}},
      {"train",
       {"steps", "seq_len", "micro_batch_size", "micro_batches", "lr", "min_lr", "warmup_steps", "weight_decay", "beta1",
        "beta2", "eps", "grad_clip", "seed", "threads", "recompute", "log_every", "eval_every", "eval_batches",
        "checkpoint_every", "out_dir", "resume", "backend", "precision"}},
      {"cluster",
       {"job_id", "stages", "replicas", "schedule", "ps", "stage_layers", "heartbeat_s", "dead_after_s"}},
      {"transport", {"wire_dtype", "chunk_mib", "connections", "timeout_s"}},
  };
  return *keys;
}

class Reader {
 public:
  Reader(const toml::table& root, std::string file) : root_(root), file_(std::move(file)) {}

  absl::Status CheckKeys() const {
    for (auto&& [section, node] : root_) {
      const std::string s(section.str());
      auto it = KnownKeys().find(s);
      if (it == KnownKeys().end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file_, ": unknown section [", s, "] (known: [model], [data], [train], [cluster], [transport])"));
      }
      if (!node.is_table()) return absl::InvalidArgumentError(absl::StrCat(file_, ": ", s, " must be a table [", s, "]"));
      for (auto&& [key, _] : *node.as_table()) {
        if (!it->second.count(std::string(key.str()))) {
          return absl::InvalidArgumentError(absl::StrCat(file_, ": unknown key ", s, ".", std::string(key.str()), " (known keys of [",
                                                         s, "]: ", absl::StrJoin(it->second, ", "), ")"));
        }
      }
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Get(const char* section, const char* key, T& out) const {
    auto node = root_[section][key];
    if (!node) return absl::OkStatus();
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = node.template value<bool>(); v && node.is_boolean()) return out = *v, absl::OkStatus();
      return TypeError(section, key, "true or false");
    } else if constexpr (std::is_integral_v<T>) {
      if (auto v = node.template value<int64_t>(); v && node.is_integer()) return out = static_cast<T>(*v), absl::OkStatus();
      return TypeError(section, key, "an integer");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (auto v = node.template value<double>(); v && (node.is_floating_point() || node.is_integer()))
        return out = static_cast<T>(*v), absl::OkStatus();
      return TypeError(section, key, "a number");
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      const toml::array* arr = node.as_array();
      if (arr == nullptr) return TypeError(section, key, "an array of integers");
      out.clear();
      for (const toml::node& e : *arr) {
        if (!e.is_integer()) return TypeError(section, key, "an array of integers");
        out.push_back(static_cast<int>(*e.value<int64_t>()));
      }
      return absl::OkStatus();
    } else {
      if (auto v = node.template value<std::string>(); v && node.is_string()) return out = *v, absl::OkStatus();
      return TypeError(section, key, "a string");
    }
  }

 private:
  absl::Status TypeError(const char* section, const char* key, const char* want) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", section, ".", key, " must be ", want));
  }
  const toml::table& root_;
  std::string file_;
};

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

absl::Status Validate(const JobConfig& c, const std::string& file) {
  auto bad = [&](const std::string& msg) { return absl::InvalidArgumentError(absl::StrCat(file, ": ", msg)); };
  if (auto s = c.model.Validate(); !s.ok()) return bad(std::string(s.message()));
  const TrainConfig& t = c.train;
  if (t.seq_len <= 0) return bad(absl::StrFormat("train.seq_len = %d: must be positive", t.seq_len));
  if (t.seq_len > c.model.max_seq_len) {
    return bad(absl::StrFormat(
        "train.seq_len = %d is longer than the position table (model.max_seq_len = %d): raise model.max_seq_len or "
        "lower train.seq_len",
        t.seq_len, c.model.max_seq_len));
  }
  if (t.steps <= 0) return bad("train.steps must be positive");
  if (t.micro_batch_size <= 0) return bad("train.micro_batch_size must be positive");
  if (t.micro_batches <= 0) return bad("train.micro_batches must be positive");
  if (!(t.lr > 0) || t.min_lr < 0 || t.min_lr > t.lr) return bad("need 0 <= train.min_lr <= train.lr and train.lr > 0");
  if (t.warmup_steps < 0) return bad("train.warmup_steps must be >= 0");
  if (t.threads < 0) return bad("train.threads must be >= 0 (0 uses every core)");
  if (t.log_every <= 0) return bad("train.log_every must be positive");
  if (t.eval_every < 0 || t.eval_batches <= 0) return bad("train.eval_every must be >= 0 and train.eval_batches > 0");
  if (t.checkpoint_every < 0) return bad("train.checkpoint_every must be >= 0 (0: only at the end)");
  if (!(t.adamw.beta1 >= 0 && t.adamw.beta1 < 1 && t.adamw.beta2 >= 0 && t.adamw.beta2 < 1)) {
    return bad("train.beta1 and train.beta2 must be in [0, 1)");
  }
  if (c.data.source != DataSource::kBuiltin && c.data.path.empty()) {
    return bad("data.path is required when data.source is \"bytes\" or \"llmc\"");
  }
  if (c.data.val_fraction < 0 || c.data.val_fraction >= 1) return bad("data.val_fraction must be in [0, 1)");
  const ClusterConfig& k = c.cluster;
  if (k.stages <= 0 || k.replicas <= 0) return bad("cluster.stages and cluster.replicas must be positive");
  if (k.job_id.empty()) return bad("cluster.job_id must not be empty");
  if (!k.stage_layers.empty()) {
    if (static_cast<int>(k.stage_layers.size()) != k.stages) {
      return bad(absl::StrFormat("cluster.stage_layers has %d entries for cluster.stages = %d", k.stage_layers.size(),
                                 k.stages));
    }
    int sum = 0;
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
  if (k.heartbeat_s <= 0 || k.dead_after_s <= k.heartbeat_s) {
    return bad("need cluster.heartbeat_s > 0 and cluster.dead_after_s > cluster.heartbeat_s");
  }
  if (c.transport.chunk_mib < 1 || c.transport.chunk_mib > 16) return bad("transport.chunk_mib must be in [1, 16]");
  if (c.transport.connections < 1 || c.transport.connections > 64) return bad("transport.connections must be in [1, 64]");
  if (c.transport.timeout_s <= 0) return bad("transport.timeout_s must be positive");
  if (c.data.source != DataSource::kLlmc && c.model.vocab_size < 256) {
    return bad(absl::StrFormat("model.vocab_size = %d: byte-level data needs at least 256", c.model.vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace

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
  Reader r(root, source_path);
  LH_RETURN_IF_ERROR(r.CheckKeys());

  JobConfig c;
  c.source_path = source_path;
  std::string attention = "causal", source = "builtin";
  LH_RETURN_IF_ERROR(r.Get("model", "vocab_size", c.model.vocab_size));
  LH_RETURN_IF_ERROR(r.Get("model", "max_seq_len", c.model.max_seq_len));
  LH_RETURN_IF_ERROR(r.Get("model", "n_layer", c.model.n_layer));
  LH_RETURN_IF_ERROR(r.Get("model", "n_head", c.model.n_head));
  LH_RETURN_IF_ERROR(r.Get("model", "d_model", c.model.d_model));
  LH_RETURN_IF_ERROR(r.Get("model", "tied_head", c.model.tied_head));
  LH_RETURN_IF_ERROR(r.Get("model", "attention", attention));
  if (attention == "causal") {
    c.model.attention = AttentionMask::kCausal;
  } else if (attention == "prefix_lm") {
    c.model.attention = AttentionMask::kPrefixLm;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source_path, ": model.attention = \"", attention, "\": use \"causal\" or \"prefix_lm\""));
  }

  LH_RETURN_IF_ERROR(r.Get("data", "source", source));
  if (source == "builtin") {
    c.data.source = DataSource::kBuiltin;
  } else if (source == "bytes") {
    c.data.source = DataSource::kBytes;
  } else if (source == "llmc") {
    c.data.source = DataSource::kLlmc;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source_path, ": data.source = \"", source, "\": use \"builtin\", \"bytes\" or \"llmc\""));
  }
  LH_RETURN_IF_ERROR(r.Get("data", "path", c.data.path));
  LH_RETURN_IF_ERROR(r.Get("data", "val_path", c.data.val_path));
  LH_RETURN_IF_ERROR(r.Get("data", "val_fraction", c.data.val_fraction));
  LH_RETURN_IF_ERROR(r.Get("data", "seed", c.data.markov.seed));
  LH_RETURN_IF_ERROR(r.Get("data", "alphabet", c.data.markov.alphabet));
  LH_RETURN_IF_ERROR(r.Get("data", "order", c.data.markov.order));
  LH_RETURN_IF_ERROR(r.Get("data", "branching", c.data.markov.branching));
  LH_RETURN_IF_ERROR(r.Get("data", "train_tokens", c.data.train_tokens));
  LH_RETURN_IF_ERROR(r.Get("data", "val_tokens", c.data.val_tokens));

  auto with_file = [&](absl::Status s) {
    return absl::InvalidArgumentError(absl::StrCat(source_path, ": ", s.message()));
  };
  TrainConfig& t = c.train;
  LH_RETURN_IF_ERROR(r.Get("train", "steps", t.steps));
  LH_RETURN_IF_ERROR(r.Get("train", "seq_len", t.seq_len));
  LH_RETURN_IF_ERROR(r.Get("train", "micro_batch_size", t.micro_batch_size));
  LH_RETURN_IF_ERROR(r.Get("train", "micro_batches", t.micro_batches));
  LH_RETURN_IF_ERROR(r.Get("train", "lr", t.lr));
  LH_RETURN_IF_ERROR(r.Get("train", "min_lr", t.min_lr));
  LH_RETURN_IF_ERROR(r.Get("train", "warmup_steps", t.warmup_steps));
  LH_RETURN_IF_ERROR(r.Get("train", "weight_decay", t.adamw.weight_decay));
  LH_RETURN_IF_ERROR(r.Get("train", "beta1", t.adamw.beta1));
  LH_RETURN_IF_ERROR(r.Get("train", "beta2", t.adamw.beta2));
  LH_RETURN_IF_ERROR(r.Get("train", "eps", t.adamw.eps));
  LH_RETURN_IF_ERROR(r.Get("train", "grad_clip", t.grad_clip));
  LH_RETURN_IF_ERROR(r.Get("train", "seed", t.seed));
  LH_RETURN_IF_ERROR(r.Get("train", "threads", t.threads));
  LH_RETURN_IF_ERROR(r.Get("train", "recompute", t.recompute));
  LH_RETURN_IF_ERROR(r.Get("train", "log_every", t.log_every));
  LH_RETURN_IF_ERROR(r.Get("train", "eval_every", t.eval_every));
  LH_RETURN_IF_ERROR(r.Get("train", "eval_batches", t.eval_batches));
  LH_RETURN_IF_ERROR(r.Get("train", "checkpoint_every", t.checkpoint_every));
  LH_RETURN_IF_ERROR(r.Get("train", "out_dir", t.out_dir));
  LH_RETURN_IF_ERROR(r.Get("train", "resume", t.resume));
  std::string backend = "cpu", precision = "fp32";
  LH_RETURN_IF_ERROR(r.Get("train", "backend", backend));
  LH_RETURN_IF_ERROR(r.Get("train", "precision", precision));
  if (backend.rfind("cuda:", 0) == 0 && backend.size() > 5 && backend.find_first_not_of("0123456789", 5) == std::string::npos) {
    t.backend_device = std::stoi(backend.substr(5));
  } else if (backend != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat(source_path, ": train.backend = \"", backend, "\": use \"cpu\" or \"cuda:N\" (N = device index)"));
  }
  if (auto p = ParsePrecision(precision); p.ok()) t.precision = *p; else return with_file(p.status());
  if (t.backend_device < 0 && t.precision != Precision::kFp32) {
    return absl::InvalidArgumentError(absl::StrCat(source_path, ": train.precision = \"", precision,
                                                   "\" needs train.backend = \"cuda:N\" (the CPU backend computes in "
                                                   "fp32)"));
  }
  std::string schedule = "gpipe", ps = "sharded", wire = "fp32";
  LH_RETURN_IF_ERROR(r.Get("cluster", "job_id", c.cluster.job_id));
  LH_RETURN_IF_ERROR(r.Get("cluster", "stages", c.cluster.stages));
  LH_RETURN_IF_ERROR(r.Get("cluster", "replicas", c.cluster.replicas));
  LH_RETURN_IF_ERROR(r.Get("cluster", "schedule", schedule));
  LH_RETURN_IF_ERROR(r.Get("cluster", "ps", ps));
  LH_RETURN_IF_ERROR(r.Get("cluster", "stage_layers", c.cluster.stage_layers));
  LH_RETURN_IF_ERROR(r.Get("cluster", "heartbeat_s", c.cluster.heartbeat_s));
  LH_RETURN_IF_ERROR(r.Get("cluster", "dead_after_s", c.cluster.dead_after_s));
  LH_RETURN_IF_ERROR(r.Get("transport", "wire_dtype", wire));
  LH_RETURN_IF_ERROR(r.Get("transport", "chunk_mib", c.transport.chunk_mib));
  LH_RETURN_IF_ERROR(r.Get("transport", "connections", c.transport.connections));
  LH_RETURN_IF_ERROR(r.Get("transport", "timeout_s", c.transport.timeout_s));
  if (auto k = ParseSchedule(schedule); k.ok()) c.cluster.schedule = *k; else return with_file(k.status());
  if (auto d = ParseWireDtype(wire); d.ok()) c.transport.wire_dtype = *d; else return with_file(d.status());
  if (ps != "sharded" && ps != "central") {
    return absl::InvalidArgumentError(absl::StrCat(source_path, ": cluster.ps = \"", ps, "\": use \"sharded\" or \"central\""));
  }
  c.cluster.central_ps = ps == "central";
  if (c.data.source == DataSource::kLlmc && !root["model"]["vocab_size"]) c.model.vocab_size = 50257;
  LH_RETURN_IF_ERROR(Validate(c, source_path));

  // The effective configuration, with defaults filled in, is what checkpoints record.
  c.as_json = {{"model",
                {{"vocab_size", c.model.vocab_size}, {"max_seq_len", c.model.max_seq_len}, {"n_layer", c.model.n_layer},
                 {"n_head", c.model.n_head}, {"d_model", c.model.d_model}, {"tied_head", c.model.tied_head},
                 {"attention", attention}}},
               {"data", {{"source", source}, {"path", c.data.path}, {"seed", c.data.markov.seed}}},
               {"train",
                {{"seq_len", t.seq_len}, {"micro_batch_size", t.micro_batch_size}, {"micro_batches", t.micro_batches},
                 {"seed", t.seed}, {"steps", t.steps}}},
               {"cluster", {{"stages", c.cluster.stages}, {"replicas", c.cluster.replicas}, {"ps", ps}}}};
  std::ostringstream text;
  text << root;
  c.toml_text = text.str();
  return c;
}

StageSpec JobConfig::Stage(int stage) const {
  if (cluster.stage_layers.empty()) return StageSpec::Even(model, stage, cluster.stages);
  int first = 0;
  for (int s = 0; s < stage; ++s) first += cluster.stage_layers[s];
  return {first, first + cluster.stage_layers[stage], stage == 0, stage == cluster.stages - 1};
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open config file ", path, " (check the path)"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseJobConfig(ss.str(), path, overrides);
}

}  // namespace longhaul
