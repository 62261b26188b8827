#include "plan/convergence_penalty.h"

#include <algorithm>
#include <sstream>

#include <toml++/toml.h>

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

}  // namespace

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
    const double target = exact[s].back().loss;
    p.final_loss.push_back(runs[s].back().loss);
    p.tokens_to_target.push_back(TokensToReach(runs[s], target));
    if (p.tokens_to_target.back()) penalties.push_back(*p.tokens_to_target.back() / tokens - 1);
    gap += runs[s].back().loss - target;
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

}  // namespace longhaul
