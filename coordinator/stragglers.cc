#include "coordinator/stragglers.h"

#include <algorithm>

#include "util/median.h"

namespace longhaul {

double StragglerWatch::Pace(const Worker& w) {
  return static_cast<int>(w.recent.size()) < kWindow ? 0 : Median(w.recent);
}

Slowdown StragglerWatch::Of(int id) const {
  const Worker& w = workers_.at(id);
  Slowdown s;
  const double pace = Pace(w);
  if (pace <= 0) return s;
  if (static_cast<int>(w.start.size()) == kWindow && Median(w.start) > 0) s.vs_start = pace / Median(w.start);
  std::vector<double> peers;
  for (const auto& [other, p] : workers_)
    if (other != id && p.stage == w.stage && Pace(p) > 0) peers.push_back(Pace(p));
  if (!peers.empty() && Median(peers) > 0) s.vs_peers = pace / Median(peers);
  return s;
}

std::vector<std::pair<int, Slowdown>> StragglerWatch::Add(const std::map<int, proto::IterationReport>& reports) {
  // The first iteration opens connections and warms caches: no pace of anyone's.
  if (seen_++ == 0) return {};
  for (const auto& [id, r] : reports) {
    Worker& w = workers_[id];
    w.stage = r.stage();
    if (static_cast<int>(w.start.size()) < kWindow) w.start.push_back(r.compute_seconds());
    w.recent.push_back(r.compute_seconds());
    if (static_cast<int>(w.recent.size()) > kWindow) w.recent.erase(w.recent.begin());
  }
  std::vector<std::pair<int, Slowdown>> became;
  for (auto& [id, w] : workers_) {
    const Slowdown s = Of(id);
    w.slow_for = s.worst() > kThreshold ? w.slow_for + 1 : 0;
    const bool straggling = w.slow_for >= kWindow;
    if (straggling) {
      Slowdown& worst = worst_[id];
      worst.vs_start = std::max(worst.vs_start, s.vs_start);
      worst.vs_peers = std::max(worst.vs_peers, s.vs_peers);
    }
    if (straggling && !w.straggling) became.emplace_back(id, s);
    if (straggling || w.slow_for == 0) w.straggling = straggling;
  }
  return became;
}

std::map<int, Slowdown> StragglerWatch::Current() const {
  std::map<int, Slowdown> out;
  for (const auto& [id, w] : workers_)
    if (Pace(w) > 0) out[id] = Of(id);
  return out;
}

}  // namespace longhaul
