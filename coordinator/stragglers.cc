#include "coordinator/stragglers.h"

#include <algorithm>

#include "util/median.h"

namespace longhaul {

double StragglerWatch::Pace(const Worker& w) {
  return static_cast<int>(w.recent.size()) < kWindow ? 0 : Median(w.recent);
}

std::map<int, double> StragglerWatch::Paces() const {
  std::map<int, double> paces;
  for (const auto& [id, w] : workers_)
    if (const double pace = Pace(w); pace > 0) paces[id] = pace;
  return paces;
}

std::vector<std::pair<int, Slowdown>> StragglerWatch::Add(const std::map<int, proto::IterationReport>& reports) {
  // The first iteration opens connections and warms caches: no pace of anyone's.
  if (seen_++ == 0) return {};
  // Workers of an earlier plan (lost, or waiting as spares) are no one's peers now.
  for (auto it = workers_.begin(); it != workers_.end();) it = reports.count(it->first) ? std::next(it) : workers_.erase(it);
  for (const auto& [id, r] : reports) {
    Worker& w = workers_[id];
    // A worker moved to another stage does other work: its pace starts again.
    if (w.stage != r.stage()) {
      w = Worker{};
      w.stage = r.stage();
    }
    // Per micro-batch: a plan with fewer replicas gives each more of them (ShrinkPlan).
    const double compute = r.compute_seconds() / std::max(1, r.micro_batches_size());
    if (static_cast<int>(w.start.size()) < kWindow) w.start.push_back(compute);
    w.recent.push_back(compute);
    if (static_cast<int>(w.recent.size()) > kWindow) w.recent.erase(w.recent.begin());
  }
  // Each pace once (a median of the window), then each worker against its start and its peers'.
  const std::map<int, double> paces = Paces();
  std::map<int, double> drift;  // pace now / pace at the start
  for (const auto& [id, pace] : paces) {
    const Worker& w = workers_.at(id);
    if (static_cast<int>(w.start.size()) == kWindow && Median(w.start) > 0) drift[id] = pace / Median(w.start);
  }
  current_.clear();
  for (const auto& [id, pace] : paces) {
    Worker& w = workers_.at(id);
    Slowdown& s = current_[id];
    w.drift = 1;
    if (const auto own = drift.find(id); own != drift.end()) {
      std::vector<double> others;
      for (const auto& [other, d] : drift)
        if (other != id) others.push_back(d);
      const double theirs = others.empty() ? 1.0 : Median(others);
      s.vs_start = own->second / std::max(1.0, theirs);
      w.drift = own->second / theirs;
    }
    std::vector<double> peers;
    for (const auto& [other, other_pace] : paces)
      if (other != id && workers_.at(other).stage == w.stage) peers.push_back(other_pace);
    if (!peers.empty()) s.vs_peers = pace / Median(peers);
  }
  std::vector<std::pair<int, Slowdown>> became;
  for (auto& [id, w] : workers_) {
    const auto now = current_.find(id);
    const Slowdown s = now == current_.end() ? Slowdown{} : now->second;
    w.slow_for = s.worst() > kThreshold ? w.slow_for + 1 : 0;
    w.fast_for = w.drift < 1 / kThreshold ? w.fast_for + 1 : 0;
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

}  // namespace longhaul
