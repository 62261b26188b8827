#include "plan/convergence_penalty.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include <toml++/toml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "format/wire_dtype.h"
#include "transport/wire_plan.h"
#include "util/atomic_file.h"

namespace longhaul {
namespace {

double Spread(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

template <typename T>
toml::array Array(const std::vector<T>& v) {
  toml::array a;
  for (const T& x : v) a.push_back(x);
  return a;
}

bool SameCurve(const std::vector<LossPoint>& a, const std::vector<LossPoint>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const LossPoint& x, const LossPoint& y) { return x.step == y.step && x.loss == y.loss; });
}

}  // namespace

std::vector<std::string> ScheduleDividedOverrides(const JobConfig& cfg, int k) {
  const TrainConfig& t = cfg.train;
  auto up = [k](int64_t n) { return (n + k - 1) / k; };
  return {absl::StrCat("train.steps=", up(t.steps)), absl::StrCat("train.warmup_steps=", up(t.warmup_steps)),
          absl::StrCat("train.eval_every=", up(t.eval_every))};
}

std::vector<std::string> BatchScaleOverrides(const JobConfig& cfg, int k) {
  const TrainConfig& t = cfg.train;
  const double root = std::sqrt(static_cast<double>(k));
  std::vector<std::string> out = ScheduleDividedOverrides(cfg, k);
  out.insert(out.end(), {absl::StrCat("train.micro_batches=", t.micro_batches * k),
                         absl::StrFormat("train.lr=%g", t.lr * root),
                         absl::StrFormat("train.min_lr=%g", t.min_lr * root)});
  if (!cfg.cluster.replica_micro_batches.empty()) {
    std::vector<int> shares = cfg.cluster.replica_micro_batches;
    for (int& m : shares) m *= k;
    out.push_back(absl::StrCat("cluster.replica_micro_batches=[", absl::StrJoin(shares, ", "), "]"));
  }
  return out;
}

namespace {

std::string KeyOf(const std::string& override) { return override.substr(0, override.find('=')); }

// A setting's pipeline stages (SettingPenalty::stages) and how its replicas shared the batch say
// where the bench measured it, not what it changes: the job's layout is the planner's to choose.
bool MeasuredLayoutKey(const std::string& key) {
  return key == "cluster.stages" || key == "cluster.replica_micro_batches" || key == "train.micro_batches" ||
         key == "train.micro_batch_size";
}

}  // namespace

std::vector<std::string> SettingOverrides(const JobConfig& job, const SettingPenalty& p) {
  const nlohmann::json defaults = EffectiveConfigJson(JobConfig{});
  std::vector<std::string> out;
  for (const ConfigKey& k : CommunicationKeys()) {
    const std::string key = k.name();
    const bool own = std::any_of(p.overrides.begin(), p.overrides.end(),
                                 [&key](const std::string& o) { return KeyOf(o) == key; });
    if (own) continue;
    const nlohmann::json& v = defaults.at(k.section).at(k.key);
    out.push_back(key == "transport.wire_dtype"
                      ? absl::StrCat(key, "=\"", WireDtypeName(job.FastWire()), "\"")
                      : absl::StrCat(key, "=", v.is_number_float() ? absl::StrFormat("%g", v.get<double>()) : v.dump()));
  }
  for (const std::string& o : p.overrides)
    if (!MeasuredLayoutKey(KeyOf(o))) out.push_back(o);
  if (p.batch_scale > 1) {
    const std::vector<std::string> batch = BatchScaleOverrides(job, p.batch_scale);
    out.insert(out.end(), batch.begin(), batch.end());
  }
  return out;
}

bool BoundaryUnmeasured(const SettingPenalty& p, const TransportConfig& transport) {
  return p.stages < 2 && (BoundaryMayBeLossy(transport.wire_dtype, transport.gradient_dtype) ||
                          transport.boundary_rank_divisor > 1 || transport.gradient_rank_divisor > 1);
}

std::vector<std::string> KeysBeyondCommunication(const SettingPenalty& p) {
  // The setting's own keys but the layout it was measured on, and what its larger batch changes.
  std::vector<std::string> set;
  for (const std::string& o : p.overrides)
    if (!MeasuredLayoutKey(KeyOf(o))) set.push_back(o);
  if (p.batch_scale > 1) {
    const std::vector<std::string> batch = BatchScaleOverrides(JobConfig{}, p.batch_scale);
    set.insert(set.end(), batch.begin(), batch.end());
  }
  std::vector<std::string> beyond;
  for (const std::string& o : set) {
    const std::string key = KeyOf(o);
    const std::vector<ConfigKey>& ours = CommunicationKeys();
    const bool communication =
        std::any_of(ours.begin(), ours.end(), [&key](const ConfigKey& k) { return k.name() == key; });
    if (!communication && std::find(beyond.begin(), beyond.end(), key) == beyond.end()) beyond.push_back(key);
  }
  return beyond;
}

std::optional<std::string> ShippedPenaltiesPath() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::canonical("/proc/self/exe", ec);
  for (const std::filesystem::path& p : {exe.parent_path().parent_path() / kShippedPenalties,
                                         std::filesystem::path(kShippedPenalties)}) {
    if (!ec && std::filesystem::exists(p, ec)) return p.string();
  }
  return std::nullopt;
}

std::optional<double> TokensToReach(const std::vector<LossPoint>& curve, double target) {
  for (size_t i = 0; i < curve.size(); ++i) {
    if (curve[i].loss > target) continue;
    if (i == 0) return curve[0].step;
    const LossPoint &a = curve[i - 1], &b = curve[i];
    return a.step + (b.step - a.step) * (a.loss - target) / (a.loss - b.loss);
  }
  return std::nullopt;
}

SettingPenalty MeasurePenalty(const std::vector<std::vector<LossPoint>>& runs,
                              const std::vector<std::vector<LossPoint>>& exact, double tokens) {
  SettingPenalty p;
  std::vector<double> penalties;
  double gap = 0;
  for (size_t s = 0; s < runs.size() && s < exact.size(); ++s) {
    if (runs[s].empty() || exact[s].empty()) continue;
    const double target = exact[s].back().loss, final = runs[s].back().loss;
    p.final_loss.push_back(final);
    p.tokens_to_target.push_back(TokensToReach(runs[s], target));
    if (SameCurve(runs[s], exact[s])) {
      penalties.push_back(0);  // the exact path against itself
    } else if (p.tokens_to_target.back()) {
      penalties.push_back(*p.tokens_to_target.back() / tokens - 1);
    } else if (final <= exact[s].front().loss) {
      // Short of the target: the exact path's tokens to this setting's final loss.
      penalties.push_back(tokens / *TokensToReach(exact[s], final) - 1);
    }
    gap += final - target;
  }
  if (p.final_loss.empty()) return p;
  p.final_gap = gap / static_cast<double>(p.final_loss.size());
  p.final_spread = Spread(p.final_loss);
  p.choosable = penalties.size() == p.final_loss.size();
  if (p.choosable) {
    for (double x : penalties) p.penalty += x / static_cast<double>(penalties.size());
    const auto [lo, hi] = std::minmax_element(penalties.begin(), penalties.end());
    p.penalty_min = *lo, p.penalty_max = *hi;
  }
  return p;
}

double PenaltyTable::ExactSpread() const { return Spread(exact_final_loss); }

absl::Status WritePenaltyTable(const std::string& path, const PenaltyTable& t) {
  toml::table root{{"model", t.model},
                   {"corpus", t.corpus},
                   {"measured_on", t.measured_on},
                   {"command", t.command},
                   {"tokens", t.tokens},
                   {"exact_final_loss", Array(t.exact_final_loss)},
                   {"exact_spread", t.ExactSpread()}};
  toml::array seeds;
  for (uint64_t s : t.seeds) seeds.push_back(static_cast<int64_t>(s));
  root.insert("seeds", seeds);
  toml::array settings;
  for (const SettingPenalty& p : t.settings) {
    toml::table s{{"name", p.name},
                  {"set", Array(p.overrides)},
                  {"batch_scale", p.batch_scale},
                  {"stages", p.stages},
                  {"choosable", p.choosable},
                  {"final_gap", p.final_gap},
                  {"final_loss", Array(p.final_loss)},
                  {"final_spread", p.final_spread},
                  {"iteration_s", p.iteration_s}};
    if (p.choosable) s.insert_or_assign("penalty", p.penalty), s.insert_or_assign("penalty_min", p.penalty_min),
        s.insert_or_assign("penalty_max", p.penalty_max);
    settings.push_back(std::move(s));
  }
  root.insert("setting", settings);
  std::ostringstream text;
  text << "# Convergence penalties measured by `longhaul convergence` (runtime/plan/convergence_penalty.h says how\n"
          "# they are computed and read).\n"
       << toml::toml_formatter(root, toml::toml_formatter::default_flags |
                                           toml::format_flags::relaxed_float_precision)  // 6 digits
       << "\n";
  return WriteFileAtomically(path, text.str());
}

absl::StatusOr<PenaltyTable> LoadPenaltyTable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, " is not there: give a penalties file `longhaul convergence` "
                                            "wrote (bash bench/convergence.sh), or none"));
  }
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::string(e.description()), " (line ",
                                                   static_cast<int64_t>(e.source().begin.line),
                                                   "): write it with `longhaul convergence`"));
  }
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", what, ": not a penalties file of `longhaul convergence` (run it again to write one)"));
  };
  PenaltyTable t;
  t.model = root["model"].value_or(std::string());
  t.corpus = root["corpus"].value_or(std::string());
  t.measured_on = root["measured_on"].value_or(std::string());
  t.command = root["command"].value_or(std::string());
  t.tokens = root["tokens"].value_or(0.0);
  if (!(t.tokens > 0)) return bad("no tokens per run");
  if (const toml::array* a = root["exact_final_loss"].as_array()) {
    for (const toml::node& x : *a) t.exact_final_loss.push_back(x.value_or(0.0));
  }
  if (const toml::array* a = root["seeds"].as_array()) {
    for (const toml::node& x : *a) t.seeds.push_back(static_cast<uint64_t>(x.value_or(int64_t{0})));
  }
  const toml::array* settings = root["setting"].as_array();
  if (settings == nullptr || settings->empty()) return bad("no [[setting]]");
  for (const toml::node& node : *settings) {
    const toml::table* s = node.as_table();
    if (s == nullptr) return bad("a [[setting]] that is not a table");
    SettingPenalty p;
    p.name = (*s)["name"].value_or(std::string());
    if (p.name.empty()) return bad("a setting without a name");
    if (const toml::array* set = (*s)["set"].as_array()) {
      for (const toml::node& x : *set) {
        if (!x.is_string()) return bad(absl::StrCat("setting '", p.name, "': a `set` entry that is not a string"));
        p.overrides.push_back(x.value_or(std::string()));
      }
    }
    p.batch_scale = static_cast<int>((*s)["batch_scale"].value_or(int64_t{1}));
    if (p.batch_scale < 1) return bad(absl::StrCat("setting '", p.name, "': batch_scale below 1"));
    p.stages = static_cast<int>((*s)["stages"].value_or(int64_t{1}));
    if (p.stages < 1) return bad(absl::StrCat("setting '", p.name, "': stages below 1"));
    p.choosable = (*s)["choosable"].value_or(false);
    p.final_gap = (*s)["final_gap"].value_or(0.0);
    p.final_spread = (*s)["final_spread"].value_or(0.0);
    p.iteration_s = (*s)["iteration_s"].value_or(0.0);
    if (const toml::array* a = (*s)["final_loss"].as_array()) {
      for (const toml::node& x : *a) p.final_loss.push_back(x.value_or(0.0));
    }
    if (p.choosable) {
      const std::optional<double> penalty = (*s)["penalty"].value<double>();
      if (!penalty) return bad(absl::StrCat("setting '", p.name, "' is choosable but has no penalty"));
      p.penalty = *penalty;
      p.penalty_min = (*s)["penalty_min"].value_or(p.penalty);
      p.penalty_max = (*s)["penalty_max"].value_or(p.penalty);
    }
    t.settings.push_back(std::move(p));
  }
  if (!t.settings.front().overrides.empty() || t.settings.front().batch_scale != 1) {
    return bad("its first setting is not the exact path (no keys set, batch_scale 1)");
  }
  return t;
}

}  // namespace longhaul
