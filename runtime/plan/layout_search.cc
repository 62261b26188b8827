#include "plan/layout_search.h"

#include <algorithm>
#include <future>
#include <numeric>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "metrics/flops.h"
#include "model/param_layout.h"

namespace longhaul {

std::vector<int> ReplicaShares(int micro_batches, int replicas) {
  std::vector<int> shares(replicas, micro_batches / replicas);
  for (int r = 0; r < micro_batches % replicas; ++r) ++shares[r];
  return shares;
}

namespace {

// The layout's memory stage by stage and its compute bound; errors are the cost model's (a profile
// that times no block of this precision).
absl::StatusOr<RankedLayout> Candidate(const LayoutSearchRequest& r, int stages, int replicas, int micro_batch,
                                       ScheduleKind schedule, bool recompute, bool central_ps) {
  RankedLayout c;
  c.central_ps = central_ps;
  Layout& L = c.layout;
  L.stages = stages, L.replicas = replicas, L.schedule = schedule;
  const std::vector<int> shares = ReplicaShares(r.global_batch / micro_batch, replicas);
  L.micro_batches = shares.front();
  if (shares.front() != shares.back()) L.replica_micro_batches = shares;
  L.work = {r.model, r.seq_len, micro_batch, r.precision, recompute};
  L.wire = r.wire, L.fast_wire = r.fast_wire, L.exchange = r.exchange, L.gradient = r.gradient;
  L.boundary_rank_divisor = r.boundary_rank_divisor, L.gradient_rank_divisor = r.gradient_rank_divisor;
  L.shared_directions = r.shared_directions;
  L.local_steps = r.local_steps, L.overlap_outer = r.overlap_outer, L.overlap_steps = r.overlap_steps;
  L.overlap = r.overlap;
  int over = 0;
  for (int s = 0; s < stages; ++s) {
    const StageSpec spec = L.Spec(s);
    MemoryEstimate m = r.device.StageMemory(L.work, spec, ActivationSlots(schedule, stages, s, L.micro_batches));
    // The shards a stage's worker hosts live beside it: the whole stage's on replica 0 (central)
    // or a replica's cut of its tensors; the largest cut is the stage's peak.
    size_t hosted = 0;
    for (const ParamLayout::PsShardCut& cut : ParamLayout(r.model, spec).PsShards(replicas, central_ps)) {
      hosted = std::max(hosted, cut.floats);
    }
    m.Add("parameter-server shards", kPsShardBytesPerParam * static_cast<double>(hosted));
    if (r.device.memory_bytes() > 0 && m.total() > r.device.memory_bytes()) ++over;
    if (s == 0 || m.total() > c.peak_memory.total()) c.peak_stage = s, c.peak_memory = std::move(m);
    auto t = r.device.Stage(L.work, spec);
    if (!t.ok()) return t.status();
    c.lower_bound_s = std::max(c.lower_bound_s, L.micro_batches * (t->forward_s + t->backward_s));
  }
  c.fits = over == 0;
  if (!c.fits) {
    c.why_not = absl::StrFormat("stage %d needs %s, %s over the device's %s", c.peak_stage,
                                c.peak_memory.ToString(), FormatBytes(c.peak_memory.total() - r.device.memory_bytes()),
                                FormatBytes(r.device.memory_bytes()));
    if (over > 1) absl::StrAppend(&c.why_not, absl::StrFormat("; %d of %d stages do not fit", over, stages));
  }
  return c;
}

// The iteration time of `c` on registration order (DefaultPlacement), or with r.place on the
// placement the coordinator would choose for its workers, worker w on host w.
absl::StatusOr<double> IterationSeconds(const LayoutSearchRequest& r, RankedLayout& c) {
  if (r.place) {
    PlacementProblem problem;
    problem.layout = c.layout;
    // The cut registration order keeps: the layout's own, even one.
    for (int s = 0; s < c.layout.stages; ++s) {
      const StageSpec spec = c.layout.Spec(s);
      problem.layout.blocks_per_stage.push_back(spec.end_block - spec.first_block);
    }
    problem.host.resize(static_cast<size_t>(c.devices()));
    std::iota(problem.host.begin(), problem.host.end(), 0);
    problem.devices = {r.device};
    problem.network = r.network;
    problem.central_ps = c.central_ps;
    problem.clip_norm = r.clip_norm;
    auto chosen = ChoosePlacement(std::move(problem));
    if (!chosen.ok()) return chosen.status();
    c.placement = *std::move(chosen);
    return c.placement->plan.iteration_s;
  }
  Simulation sim;
  sim.layout = c.layout;
  sim.placement = DefaultPlacement(c.layout, c.central_ps);
  sim.placement.clip_norm = r.clip_norm;
  sim.devices = {r.device};
  sim.network = r.network;
  auto report = Simulate(sim);
  if (!report.ok()) return report.status();
  return report->iteration_s;
}

absl::Status SimulateInto(const LayoutSearchRequest& r, RankedLayout& c) {
  auto seconds = IterationSeconds(r, c);
  if (!seconds.ok()) return seconds.status();
  const double t = *seconds, devices = c.devices();
  const WorkShape& w = c.layout.work;
  c.iteration_s = t;
  c.tokens_per_s = static_cast<double>(r.global_batch) * r.seq_len / t;
  c.tflops_per_device = ModelFlopsPerIteration(w.model, r.global_batch, r.seq_len, w.recompute) / (t * devices) / 1e12;
  const double peak = r.device.peak_flops_per_second();
  c.mfu = peak > 0 ? ModelFlopsPerIteration(w.model, r.global_batch, r.seq_len, false) / (t * devices * peak) : 0;
  c.days_per_100b_tokens = DaysFor100BTokens(c.tokens_per_s);
  return absl::OkStatus();
}

// Faster first; at equal time, the layout on fewer devices.
bool Better(const RankedLayout& a, const RankedLayout& b) {
  return a.iteration_s != b.iteration_s ? a.iteration_s < b.iteration_s : a.devices() < b.devices();
}

// The `keep` fastest of `candidates` (all of them, when exhaustive), simulating in order of the
// lower bound until the bound reaches the keep-th best time. Placed candidates (r.place) are
// searched a batch at a time, one per core: a batch may search a few that a one-by-one pass would
// have skipped, never miss one, and the ranking is the same (each search is a pure function).
absl::StatusOr<std::vector<RankedLayout>> Rank(const LayoutSearchRequest& r, std::vector<RankedLayout> candidates,
                                               int keep, int& simulated, int& placed) {
  std::vector<RankedLayout> best;
  if (keep <= 0 && !r.exhaustive) return best;
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const RankedLayout& a, const RankedLayout& b) { return a.lower_bound_s < b.lower_bound_s; });
  const size_t batch = r.place ? std::max(1u, std::thread::hardware_concurrency()) : 1;
  auto pruned = [&](const RankedLayout& c) {
    return !r.exhaustive && static_cast<int>(best.size()) >= keep && c.lower_bound_s >= best[keep - 1].iteration_s;
  };
  for (size_t next = 0; next < candidates.size() && !pruned(candidates[next]);) {
    const size_t end = std::min(candidates.size(), next + batch);
    std::vector<std::future<absl::Status>> runs;
    for (size_t i = next; i < end && !pruned(candidates[i]); ++i) {
      runs.push_back(std::async(batch > 1 ? std::launch::async : std::launch::deferred,
                                [&r, &c = candidates[i]] { return SimulateInto(r, c); }));
    }
    for (size_t k = 0; k < runs.size(); ++k) {
      if (absl::Status s = runs[k].get(); !s.ok()) return s;
      RankedLayout& c = candidates[next + k];
      ++simulated;
      if (c.placement) ++placed;
      best.insert(std::upper_bound(best.begin(), best.end(), c, Better), std::move(c));
      if (!r.exhaustive && static_cast<int>(best.size()) > keep) best.pop_back();
    }
    next += runs.size();
  }
  return best;
}

}  // namespace

absl::StatusOr<LayoutSearchResult> SearchLayouts(const LayoutSearchRequest& r) {
  if (r.workers < 1) return absl::InvalidArgumentError(absl::StrCat("workers = ", r.workers, ": give at least 1"));
  if (r.global_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("global batch = ", r.global_batch, ": give at least 1 sequence"));
  }
  if (r.seq_len < 1) return absl::InvalidArgumentError(absl::StrCat("sequence length = ", r.seq_len, ": must be >= 1"));
  if (absl::Status s = r.model.Validate(); !s.ok()) return s;

  LayoutSearchResult result;
  std::vector<RankedLayout> fitting, unfit;
  auto add = [&](RankedLayout c) {
    ++result.candidates;
    (c.fits ? fitting : unfit).push_back(std::move(c));
  };
  for (int P = 1; P <= std::min(r.workers, r.model.n_layer); ++P) {
    if (r.only_stages > 0 && P != r.only_stages) continue;
    for (int D = 1; P * D <= r.workers; ++D) {
      if (D > r.global_batch || (r.only_replicas > 0 && D != r.only_replicas)) continue;
      for (int mbs = 1; mbs * D <= r.global_batch; ++mbs) {
        if (r.global_batch % mbs != 0) continue;
        std::vector<RankedLayout> variants;
        for (ScheduleKind schedule : {ScheduleKind::kGpipe, ScheduleKind::k1F1B}) {
          // One replica: one shard per stage either way.
          for (bool central : D > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
            auto plain = Candidate(r, P, D, mbs, schedule, false, central);
            if (!plain.ok()) return plain.status();
            variants.push_back(*plain);
            if (!plain->fits) {
              auto recomputed = Candidate(r, P, D, mbs, schedule, true, central);
              if (!recomputed.ok()) return recomputed.status();
              variants.push_back(*recomputed);
            }
          }
        }
        const bool any_fits =
            std::any_of(variants.begin(), variants.end(), [](const RankedLayout& v) { return v.fits; });
        if (!any_fits) {
          // Memory rules out this split and micro-batch size whatever the schedule and recompute:
          // the variant that comes closest stands for them.
          add(*std::min_element(variants.begin(), variants.end(), [](const RankedLayout& a, const RankedLayout& b) {
            return a.peak_memory.total() < b.peak_memory.total();
          }));
          continue;
        }
        for (RankedLayout& v : variants)
          if (v.fits) add(std::move(v));
      }
    }
  }
  auto best = Rank(r, std::move(fitting), r.top, result.simulated, result.placed);
  if (!best.ok()) return best.status();
  result.fitting = std::move(*best);
  // Layouts that do not fit are ranked on registration order: no coordinator runs them.
  LayoutSearchRequest unplaced = r;
  unplaced.place = false;
  auto best_unfit = Rank(unplaced, std::move(unfit), r.top_unfit, result.simulated, result.placed);
  if (!best_unfit.ok()) return best_unfit.status();
  result.unfit = std::move(*best_unfit);
  return result;
}

}  // namespace longhaul
