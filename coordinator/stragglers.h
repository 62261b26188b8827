#pragma once
// Which workers compute slower than they should, measured as the run goes. A worker's pace is
// the median compute time per micro-batch of its last kWindow iterations; it is compared with its own at the start
// of the run (the median of its first kWindow iterations after the first: a machine that slowed
// down, a noisy neighbour), beyond the drift of the other workers (the median of theirs, where it
// is a slowdown: when every worker of an emulated cluster sharing one machine's cores computes
// twice as slowly as at the start, no machine is to blame, and a demo at d_model 512 had every
// stage-1 worker replaced in turn), and with the median pace of its stage's other replicas, which
// do the same work (a machine slower than its peers). Over kThreshold by either measure for kWindow
// iterations in a row, it straggles: processes sharing a machine's cores drift by a third and more
// for a while (the README's demo, 4 workers on 2 cores, did), a straggler stays slow. A straggler
// is slow, not dead: it keeps its place and is reported (a console line, the metrics endpoint,
// summary.json) so that a person or a later plan can move blocks off it.
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "longhaul.pb.h"

namespace longhaul {

struct Slowdown {
  double vs_start = 1;  // pace now / its pace at the start, over the other workers' (where > 1)
  double vs_peers = 1;  // pace now / its stage's other replicas' median pace (1 without peers)
  double worst() const { return vs_start > vs_peers ? vs_start : vs_peers; }
};

class StragglerWatch {
 public:
  static constexpr int kWindow = 20;
  static constexpr double kThreshold = 1.5;

  // Every iteration's reports, by worker id (each names its stage and replica). Returns the
  // workers that became stragglers with this iteration: each once, until it is back under the
  // threshold.
  std::vector<std::pair<int, Slowdown>> Add(const std::map<int, proto::IterationReport>& reports);
  // A plan that cut the model anew gives every worker other blocks: every pace starts again, from
  // the next Add but one (its first iteration opens connections again).
  void Restart() {
    workers_.clear();
    current_.clear();
    seen_ = 0;
  }
  // Each worker's slowdown as of the last Add, once it has a pace.
  const std::map<int, Slowdown>& Current() const { return current_; }
  // Whether worker `id` has computed in under 1/kThreshold of its time at the start, against the
  // other workers' drift either way (a job-wide speed-up quickens no one), for kWindow iterations
  // in a row: a straggler whose blocks moved (its start is its slow pace under the new cut) that
  // is fast again.
  bool Quick(int id) const {
    auto it = workers_.find(id);
    return it != workers_.end() && it->second.fast_for >= kWindow;
  }
  // Worker `id`'s pace now over its pace at the start, over the other workers' median of the same
  // (1 until it has both).
  double Drift(int id) const {
    auto it = workers_.find(id);
    return it == workers_.end() ? 1 : it->second.drift;
  }
  // Each worker's pace as of the last Add (the median compute per micro-batch of its last kWindow
  // iterations), once it has one.
  std::map<int, double> Paces() const;
  // Each worker that was ever a straggler, with its worst slowdown.
  const std::map<int, Slowdown>& worst() const { return worst_; }

 private:
  struct Worker {
    int stage = -1;
    std::vector<double> start;   // compute seconds of its first kWindow timed iterations
    std::vector<double> recent;  // of its last kWindow, oldest first
    int slow_for = 0;  // iterations in a row over the threshold
    int fast_for = 0;  // and with its drift under its inverse
    double drift = 1;
    bool straggling = false;
  };
  // Median of the recent window; 0 until it is full.
  static double Pace(const Worker& w);

  std::map<int, Worker> workers_;
  std::map<int, Slowdown> current_, worst_;
  int64_t seen_ = 0;  // iterations added
};

}  // namespace longhaul
