#include "plan/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace longhaul {
namespace {

constexpr double kFp32 = 4;
constexpr double kInf = std::numeric_limits<double>::infinity();

// std::uniform_int_distribution and std::shuffle differ between standard libraries; a plan must
// not, so draws are mt19937_64's own (which the standard fixes) reduced by modulo.
int Below(std::mt19937_64& rng, int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); }
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

void Shuffle(std::vector<int>& v, std::mt19937_64& rng) {
  for (int i = static_cast<int>(v.size()) - 1; i > 0; --i) std::swap(v[i], v[Below(rng, i + 1)]);
}

bool Better(const PlacementResult& a, const PlacementResult& b) {
  if (a.fits != b.fits) return a.fits;
  return a.iteration_s < b.iteration_s * (1 - 1e-9);
}

bool SameLink(const LinkCost& a, const LinkCost& b) {
  return a.latency_s == b.latency_s && a.bandwidth == b.bandwidth && a.window_bytes == b.window_bytes;
}

// Simulates plans for one problem: a worker order (PlaceInOrder's) and a cut. Holds one
// Simulation so that each candidate copies neither the devices nor the network.
class Scorer {
 public:
  explicit Scorer(const PlacementProblem& p) : p_(p) {
    sim_.layout = p.layout;
    sim_.devices = p.devices;
    sim_.network = p.network;
    sim_.iterations = p.iterations;
  }

  absl::Status Validate() const {
    auto bad = [](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("placement: ", why)); };
    const Layout& L = p_.layout;
    if (L.stages < 1 || L.replicas < 1) return bad("stages and replicas must be >= 1");
    if (L.stages > L.work.model.n_layer) {
      return bad(absl::StrFormat("%d stages for %d layers", L.stages, L.work.model.n_layer));
    }
    if (workers() < slots()) {
      return bad(absl::StrFormat("%d stages x %d replicas need %d workers, %d given", L.stages, L.replicas, slots(),
                                 workers()));
    }
    if (p_.devices.empty()) return bad("no devices");
    if (!p_.device.empty() && static_cast<int>(p_.device.size()) != workers()) {
      return bad("device needs one entry per worker");
    }
    for (int w = 0; w < workers(); ++w) {
      if (p_.host[w] < 0) return bad("hosts are numbered from 0");
      if (Device(w) < 0 || Device(w) >= static_cast<int>(p_.devices.size())) {
        return bad(absl::StrFormat("worker %d names device %d of %d", w, Device(w), p_.devices.size()));
      }
    }
    return absl::OkStatus();
  }

  int slots() const { return p_.layout.stages * p_.layout.replicas; }
  int workers() const { return static_cast<int>(p_.host.size()); }
  int Device(int w) const { return p_.device.empty() ? 0 : p_.device[w]; }
  int simulations() const { return simulations_; }

  // The identity: shard k of every stage on replica k.
  std::vector<std::vector<int>> DefaultOwners() const {
    std::vector<int> replicas(p_.layout.replicas);
    std::iota(replicas.begin(), replicas.end(), 0);
    return std::vector<std::vector<int>>(p_.layout.stages, replicas);
  }

  // [stage][k]: the floats of the shard PsShards gives replica k under `cut` (0 where none).
  std::vector<std::vector<double>> ShardFloats(const std::vector<int>& cut) {
    sim_.layout.blocks_per_stage = cut;
    std::vector<std::vector<double>> floats(p_.layout.stages, std::vector<double>(p_.layout.replicas, 0));
    for (const ShardPlacement& sh : DefaultPlacement(sim_.layout, p_.central_ps).shards) {
      floats[sh.stage][sh.worker / p_.layout.stages] = sh.params;
    }
    return floats;
  }

  absl::StatusOr<PlacementResult> Score(const std::vector<int>& order, const std::vector<int>& cut,
                                        const std::vector<std::vector<int>>& owners) {
    sim_.layout.blocks_per_stage = cut;
    const Placement base = DefaultPlacement(sim_.layout, p_.central_ps);
    Placement& out = sim_.placement;
    out.worker = base.worker;
    for (auto& row : out.worker)
      for (int& w : row) w = order[w];
    out.host = p_.host;
    out.device = p_.device;
    out.shards = base.shards;
    const int P = p_.layout.stages;
    for (ShardPlacement& sh : out.shards) {
      // DefaultPlacement numbers the worker of (stage s, replica r) r·P + s.
      sh.worker = order[owners[sh.stage][sh.worker / P] * P + sh.stage];
    }
    out.clip_norm = p_.clip_norm;
    ++simulations_;
    auto report = Simulate(sim_);
    if (!report.ok()) return report.status();
    PlacementResult r;
    r.placement = out;
    r.blocks_per_stage = cut;
    r.shard_owner = owners;
    r.iteration_s = report->iteration_s;
    double worst_over = 0;
    for (size_t w = 0; w < report->workers.size(); ++w) {
      const WorkerReport& k = report->workers[w];
      if (k.fits) continue;
      r.fits = false;
      const double need = k.memory.total() + k.ps_bytes, have = p_.devices[Device(static_cast<int>(w))].memory_bytes();
      if (need - have <= worst_over) continue;
      worst_over = need - have;
      r.why_not = absl::StrFormat("worker %d (stage %d) needs %s and %s of parameter-server shards, %s over its %s", w,
                                  k.stage, k.memory.ToString(), FormatBytes(k.ps_bytes), FormatBytes(worst_over),
                                  FormatBytes(have));
    }
    r.simulations = simulations_;
    return r;
  }

 private:
  const PlacementProblem& p_;
  Simulation sim_;
  int simulations_ = 0;
};

// `what` names the n things (workers, a stage's replicas) that `order` must be a permutation of.
absl::Status CheckOrder(const std::vector<int>& order, int n, const std::string& what) {
  std::vector<bool> seen(n, false);
  if (static_cast<int>(order.size()) != n) {
    return absl::InvalidArgumentError(absl::StrFormat("placement: %d entries for %d %s", order.size(), n, what));
  }
  for (int w : order) {
    if (w < 0 || w >= n || seen[w]) {
      return absl::InvalidArgumentError(absl::StrCat("placement: not a permutation of the ", what));
    }
    seen[w] = true;
  }
  return absl::OkStatus();
}

using Matrix = std::vector<std::vector<double>>;

// The constructive part of the search (steps 1 to 3 of placement.h) and the local search.
class Search {
 public:
  Search(const PlacementProblem& p, Scorer& scorer) : p_(p), scorer_(scorer) {}

  absl::StatusOr<PlacementResult> Run(const SearchOptions& options) {
    const int W = scorer_.workers();
    Distances();
    Classes();
    // Starts: registration order with the layout's own cut and with the balanced one (so that no
    // baseline's plan is better than the start, and where nothing is better registration order
    // stands: only a strict improvement replaces a start), then the constructed plans.
    struct Start {
      std::vector<int> order, cut;
      int family;  // 0: registration order, and stages grouped by fast exchange links; 1: pipelines grouped
    };
    std::vector<Start> starts;
    std::vector<int> registration(W);
    std::iota(registration.begin(), registration.end(), 0);
    starts.push_back({registration, LayoutCut(), 0});
    auto cut = Balanced(registration);
    if (!cut.ok()) return cut.status();
    starts.push_back({registration, *cut, 0});
    for (bool hardest_first : {false, true}) {
      groups_ = Groups(p_.layout.stages, p_.layout.replicas, dp_, hardest_first);
      const std::vector<int> path = GroupPath();
      const std::vector<int> pipeline = FirstPipeline(hardest_first);
      const std::vector<std::vector<int>> orders = {Chain(path), Chain({path.rbegin(), path.rend()}),
                                                    AlignReplicas(pipeline),
                                                    AlignReplicas({pipeline.rbegin(), pipeline.rend()})};
      for (size_t k = 0; k < orders.size(); ++k) {
        auto balanced = Balanced(orders[k]);
        if (!balanced.ok()) return balanced.status();
        starts.push_back({orders[k], *balanced, k < 2 ? 0 : 1});
      }
    }
    std::vector<PlacementResult> best(2);
    std::vector<std::vector<int>> order(2);
    for (const Start& start : starts) {
      auto r = scorer_.Score(start.order, start.cut, scorer_.DefaultOwners());
      if (!r.ok()) return r.status();
      const int f = start.family;
      if (order[f].empty() || Better(*r, best[f])) best[f] = *r, order[f] = start.order;
    }
    // The families' optima lie in different basins (a stage's replicas on one site against a
    // pipeline on one site) that the descent's single moves do not cross: each family descends
    // from its best start with half of what the budget has left, the better start first.
    const int first = Better(best[1], best[0]) ? 1 : 0;
    const int half = scorer_.simulations() + (options.max_simulations - scorer_.simulations()) / 2;
    auto a = LocalSearch(std::move(best[first]), std::move(order[first]), options.seed, half);
    if (!a.ok()) return a.status();
    auto b = LocalSearch(std::move(best[1 - first]), std::move(order[1 - first]), options.seed + 1,
                         options.max_simulations);
    if (!b.ok()) return b.status();
    return Done(Better(*b, *a) ? *b : *a);
  }

 private:
  // Seconds to move `bytes` from worker a to worker b, one message.
  double Transfer(int a, int b, double bytes) const {
    if (p_.host[a] == p_.host[b]) return 0;
    const LinkCost l = p_.network.Between(p_.host[a], p_.host[b]);
    return l.SerializeSeconds(bytes) + l.latency_s;
  }

  // dp_[a][b]: the slower direction of one worker's share of a stage's exchange; pp_[a][b]: of one
  // iteration's activations (or gradients) over one pipeline boundary.
  void Distances() {
    const Layout& L = p_.layout;
    const int W = scorer_.workers();
    double params = 0;
    for (int s = 0; s < L.stages; ++s) params += StageParamCount(L.work.model, L.Spec(s));
    const double dp_bytes = kFp32 * params / L.stages / (p_.central_ps ? 1 : L.replicas);
    const double pp_bytes = L.micro_batches * L.BoundaryBytes();
    dp_.assign(W, std::vector<double>(W, 0));
    pp_ = dp_;
    for (int a = 0; a < W; ++a)
      for (int b = 0; b < W; ++b) {
        dp_[a][b] = std::max(Transfer(a, b, dp_bytes), Transfer(b, a, dp_bytes));
        pp_[a][b] = std::max(Transfer(a, b, pp_bytes), Transfer(b, a, pp_bytes));
      }
  }

  // class_[w]: workers the cost model cannot tell apart (one device, the same card, the same links
  // to every other host) share a class; swapping two of them changes nothing.
  void Classes() {
    const int W = scorer_.workers();
    std::vector<int> hosts = p_.host;
    auto same = [&](int a, int b) {
      if (scorer_.Device(a) != scorer_.Device(b)) return false;
      const int ha = p_.host[a], hb = p_.host[b];
      if (ha == hb) return true;
      if (p_.network.EgressRate(ha) != p_.network.EgressRate(hb) ||
          p_.network.IngressRate(ha) != p_.network.IngressRate(hb)) {
        return false;
      }
      if (!SameLink(p_.network.Between(ha, hb), p_.network.Between(hb, ha))) return false;
      for (int h : hosts) {
        if (h == ha || h == hb) continue;
        if (!SameLink(p_.network.Between(ha, h), p_.network.Between(hb, h)) ||
            !SameLink(p_.network.Between(h, ha), p_.network.Between(h, hb))) {
          return false;
        }
      }
      return true;
    };
    class_.assign(W, -1);
    std::vector<int> representative;
    for (int w = 0; w < W; ++w) {
      for (size_t c = 0; c < representative.size() && class_[w] < 0; ++c)
        if (same(w, representative[c])) class_[w] = static_cast<int>(c);
      if (class_[w] < 0) {
        class_[w] = static_cast<int>(representative.size());
        representative.push_back(w);
      }
    }
  }

  // Step 1: `count` groups of `size` workers, each a seed worker and its nearest free workers by
  // `dist`. Either the tightest group left goes first (the seed whose farthest member is nearest
  // wins), or the hardest: the seed whose best group is worst, so that workers far from everyone
  // take the best of what is left before the others use it up (with two workers in each of eight
  // regions, tightest-first leaves the two worst-connected regions to share a group).
  std::vector<std::vector<int>> Groups(int count, int size, const Matrix& dist, bool hardest_first) const {
    const int W = scorer_.workers();
    std::vector<bool> taken(W, false);
    std::vector<std::vector<int>> groups;
    for (int g = 0; g < count; ++g) {
      std::vector<int> best;
      double best_far = kInf, best_sum = kInf;
      for (int seed = 0; seed < W; ++seed) {
        if (taken[seed]) continue;
        std::vector<int> free;
        for (int w = 0; w < W; ++w)
          if (!taken[w] && w != seed) free.push_back(w);
        std::stable_sort(free.begin(), free.end(), [&](int a, int b) { return dist[seed][a] < dist[seed][b]; });
        std::vector<int> group = {seed};
        group.insert(group.end(), free.begin(), free.begin() + (size - 1));
        double far = 0, sum = 0;
        for (int w : group) far = std::max(far, dist[seed][w]), sum += dist[seed][w];
        const bool better = best.empty() || (hardest_first ? far > best_far || (far == best_far && sum > best_sum)
                                                           : far < best_far || (far == best_far && sum < best_sum));
        if (better) best = group, best_far = far, best_sum = sum;
      }
      for (int w : best) taken[w] = true;
      groups.push_back(best);
    }
    return groups;
  }

  // b's members reordered so that b[i] pairs with a[i] (follows it in a pipeline, or shares its
  // stage), pairs by `dist` fastest first. Returns the slowest pair's time.
  double Match(const std::vector<int>& a, std::vector<int>& b, const Matrix& dist) const {
    const int D = static_cast<int>(a.size());
    std::vector<std::pair<int, int>> pairs;
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < D; ++j) pairs.push_back({i, j});
    std::stable_sort(pairs.begin(), pairs.end(),
                     [&](auto x, auto y) { return dist[a[x.first]][b[x.second]] < dist[a[y.first]][b[y.second]]; });
    std::vector<int> matched(D, -1);
    std::vector<bool> used(D, false);
    double slowest = 0;
    for (auto [i, j] : pairs) {
      if (matched[i] >= 0 || used[j]) continue;
      matched[i] = j, used[j] = true;
      slowest = std::max(slowest, dist[a[i]][b[j]]);
    }
    std::vector<int> out(D);
    for (int i = 0; i < D; ++i) out[i] = b[matched[i]];
    b = out;
    return slowest;
  }

  // Step 2: the groups in stage order, as an open path minimizing the crossings' total time.
  std::vector<int> GroupPath() const {
    const int P = static_cast<int>(groups_.size());
    std::vector<std::vector<double>> cost(P, std::vector<double>(P, 0));
    for (int g = 0; g < P; ++g)
      for (int h = 0; h < P; ++h) {
        std::vector<int> b = groups_[h];
        if (g != h) cost[g][h] = Match(groups_[g], b, pp_);
      }
    auto length = [&](const std::vector<int>& path) {
      double sum = 0;
      for (int i = 0; i + 1 < P; ++i) sum += cost[path[i]][path[i + 1]];
      return sum;
    };
    std::vector<int> best;
    double best_length = kInf;
    for (int start = 0; start < P; ++start) {
      std::vector<int> path = {start};
      std::vector<bool> on(P, false);
      on[start] = true;
      while (static_cast<int>(path.size()) < P) {
        int next = -1;
        for (int h = 0; h < P; ++h)
          if (!on[h] && (next < 0 || cost[path.back()][h] < cost[path.back()][next])) next = h;
        path.push_back(next);
        on[next] = true;
      }
      for (bool improved = true; improved;) {  // 2-opt: reverse a stretch while that shortens the path
        improved = false;
        for (int i = 0; i + 1 < P; ++i)
          for (int j = i + 1; j < P; ++j) {
            std::vector<int> trial = path;
            std::reverse(trial.begin() + i, trial.begin() + j + 1);
            if (length(trial) < length(path) - 1e-12) path = trial, improved = true;
          }
      }
      if (length(path) < best_length) best = path, best_length = length(path);
    }
    return best;
  }

  // The worker order (PlaceInOrder's) with group path[s] as stage s, each replica chained through
  // fast pairs; workers in no group follow the slots.
  std::vector<int> Chain(const std::vector<int>& path) const {
    const int P = p_.layout.stages, D = p_.layout.replicas;
    std::vector<int> order(P * D);
    std::vector<int> previous = groups_[path[0]];
    for (int s = 0; s < P; ++s) {
      std::vector<int> members = groups_[path[s]];
      if (s > 0) Match(previous, members, pp_);
      for (int r = 0; r < D; ++r) order[r * P + s] = members[r];
      previous = members;
    }
    return WithIdle(order);
  }

  // The other way round, for layouts whose boundaries carry more than the exchange: `replicas`
  // pipelines grouped by fast boundary links. Returns the first pipeline's workers in stage order
  // (a path over its workers, as GroupPath orders groups); AlignReplicas places the rest.
  std::vector<int> FirstPipeline(bool hardest_first) {
    pipelines_ = Groups(p_.layout.replicas, p_.layout.stages, pp_, hardest_first);
    const std::vector<std::vector<int>> stage_groups = std::move(groups_);
    groups_.clear();
    for (int w : pipelines_[0]) groups_.push_back({w});
    std::vector<int> first;
    for (int g : GroupPath()) first.push_back(pipelines_[0][g]);
    groups_ = stage_groups;
    return first;
  }

  // Replica 0 is `first`; each other pipeline's workers take the stages of the first's workers
  // they exchange with fastest.
  std::vector<int> AlignReplicas(const std::vector<int>& first) const {
    const int P = p_.layout.stages, D = p_.layout.replicas;
    std::vector<int> order(P * D);
    for (int r = 0; r < D; ++r) {
      std::vector<int> members = r == 0 ? first : pipelines_[r];
      if (r > 0) Match(first, members, dp_);
      for (int s = 0; s < P; ++s) order[r * P + s] = members[s];
    }
    return WithIdle(order);
  }

  std::vector<int> LayoutCut() const {
    std::vector<int> cut;
    for (int s = 0; s < p_.layout.stages; ++s) {
      const StageSpec spec = p_.layout.Spec(s);
      cut.push_back(spec.end_block - spec.first_block);
    }
    return cut;
  }

  // `order` with the workers it leaves out appended: they are idle.
  std::vector<int> WithIdle(std::vector<int> order) const {
    std::vector<bool> placed(scorer_.workers(), false);
    for (int w : order) placed[w] = true;
    for (int w = 0; w < scorer_.workers(); ++w)
      if (!placed[w]) order.push_back(w);
    return order;
  }

  // Step 3: the cut balanced on each stage's slowest device (the layout's own under keep_cut).
  absl::StatusOr<std::vector<int>> Balanced(const std::vector<int>& order) const {
    const Layout& L = p_.layout;
    if (p_.keep_cut) return LayoutCut();
    std::vector<double> block(L.stages, 0);
    double head = 0;
    for (int s = 0; s < L.stages; ++s)
      for (int r = 0; r < L.replicas; ++r) {
        const DeviceCost& d = p_.devices[scorer_.Device(order[r * L.stages + s])];
        auto b = d.Block(L.work);
        if (!b.ok()) return b.status();
        block[s] = std::max(block[s], b->forward_s + b->backward_s);
        if (s == L.stages - 1) {
          auto h = d.Head(L.work);
          if (!h.ok()) return h.status();
          head = std::max(head, h->forward_s + h->backward_s);
        }
      }
    return BalancedCut(L.work.model.n_layer, block, head);
  }

  // The workers of class class_[order[a]] in a's stage trade places, replica by replica, with as
  // many workers of class_[order[b]] in b's stage: with several workers per site, moving one alone
  // splits a stage over one more site and looks worse, where moving the site's whole share may
  // not. False where that is not a move: a and b in one stage, unequal shares, a share of one
  // worker (a plain swap), or a and b not the first of their shares (the same move counted once).
  bool GroupSwap(std::vector<int>& order, int a, int b) const {
    const int P = p_.layout.stages, slots = scorer_.slots();
    if (a >= slots || b >= slots || a % P == b % P) return false;
    auto share = [&](int at) {
      std::vector<int> out;
      for (int k = at % P; k < slots; k += P)
        if (class_[order[k]] == class_[order[at]]) out.push_back(k);
      return out;
    };
    const std::vector<int> A = share(a), B = share(b);
    if (A.size() != B.size() || A.size() < 2 || A[0] != a || B[0] != b) return false;
    for (size_t i = 0; i < A.size(); ++i) std::swap(order[A[i]], order[B[i]]);
    return true;
  }

  // Step 4: first-improvement descent from (best, order) until a pass improves nothing or the
  // budget is spent; best and order end as the local optimum.
  absl::Status Descend(PlacementResult& best, std::vector<int>& order, int budget, std::mt19937_64& rng) {
    const int P = p_.layout.stages, W = scorer_.workers(), slots = scorer_.slots();
    const int D = p_.layout.replicas;
    enum class Kind { kBlock, kOwnerSwap, kGroupSwap, kSwap };
    struct Move {
      Kind kind;
      // Swaps: positions in the order. A block: stage a gives one to stage b (blocks cost the same
      // wherever they are, so the stages between keep their counts and shift by one). An owner
      // swap: the shards PsShards gives replicas a and b of stage `stage` trade hosts.
      int a, b, stage = 0;
    };
    // Each pass tries the block moves first (few, and a swap is judged on the cut they leave),
    // then the owner swaps (shards of unequal size on workers the cost model tells apart), then
    // the group swaps (few that apply, and they reach what single swaps cannot), then swaps.
    std::vector<std::vector<Move>> kinds(4);
    for (int from = 0; from < P; ++from)
      for (int to = 0; to < P; ++to)
        if (from != to) kinds[0].push_back({Kind::kBlock, from, to});
    for (int st = 0; st < P; ++st)
      for (int i = 0; i < D; ++i)
        for (int j = i + 1; j < D; ++j) kinds[1].push_back({Kind::kOwnerSwap, i, j, st});
    for (int i = 0; i < slots; ++i)
      for (int j = i + 1; j < W; ++j) {
        kinds[2].push_back({Kind::kGroupSwap, i, j});
        kinds[3].push_back({Kind::kSwap, i, j});
      }
    for (bool improved = true; improved;) {
      improved = false;
      // Shards of (nearly) one size cost the same wherever they live: their swaps are skipped.
      const std::vector<std::vector<double>> floats = scorer_.ShardFloats(best.blocks_per_stage);
      std::vector<Move> pass;
      for (std::vector<Move>& moves : kinds) {
        std::vector<int> index(moves.size());
        std::iota(index.begin(), index.end(), 0);
        Shuffle(index, rng);
        for (int m : index) pass.push_back(moves[m]);
      }
      for (const Move& mv : pass) {
        if (scorer_.simulations() >= budget) return absl::OkStatus();
        std::vector<int> trial = order, cut = best.blocks_per_stage;
        std::vector<std::vector<int>> owners = best.shard_owner;
        if (mv.kind == Kind::kBlock) {
          if (cut[mv.a] <= 1 || p_.keep_cut) continue;
          --cut[mv.a], ++cut[mv.b];
        } else if (mv.kind == Kind::kOwnerSwap) {
          const double x = floats[mv.stage][mv.a], y = floats[mv.stage][mv.b];
          // Workers the cost model cannot tell apart host either shard at the same cost.
          const int host_a = order[owners[mv.stage][mv.a] * P + mv.stage],
                    host_b = order[owners[mv.stage][mv.b] * P + mv.stage];
          if (std::abs(x - y) <= 0.01 * std::max(x, y) || class_[host_a] == class_[host_b]) continue;
          std::swap(owners[mv.stage][mv.a], owners[mv.stage][mv.b]);
        } else {
          if (class_[order[mv.a]] == class_[order[mv.b]]) continue;
          if (mv.kind == Kind::kSwap) {
            std::swap(trial[mv.a], trial[mv.b]);
          } else if (!GroupSwap(trial, mv.a, mv.b)) {
            continue;
          }
          // A faster device only pays off with more blocks: re-cut when the devices differ.
          if (scorer_.Device(order[mv.a]) != scorer_.Device(order[mv.b])) {
            auto balanced = Balanced(trial);
            if (!balanced.ok()) return balanced.status();
            cut = *balanced;
          }
        }
        auto r = scorer_.Score(trial, cut, owners);
        if (!r.ok()) return r.status();
        if (Better(*r, best)) best = *r, order = trial, improved = true;
      }
    }
    return absl::OkStatus();
  }

  // Then, while budget is left, iterated local search: kick the best plan with two random swaps
  // (group swaps where they apply) and descend again, keeping what improves. The descent's moves
  // change one thing at a time; the optimum can need two (two stages trading halves of their
  // sites at once).
  absl::StatusOr<PlacementResult> LocalSearch(PlacementResult best, std::vector<int> order, uint64_t seed,
                                              int budget) {
    std::mt19937_64 rng(seed);
    if (auto st = Descend(best, order, budget, rng); !st.ok()) return st;
    const int slots = scorer_.slots(), W = scorer_.workers();
    while (scorer_.simulations() < budget) {
      std::vector<int> trial = order;
      int kicks = 0;
      for (int tries = 0; kicks < 2 && tries < 100; ++tries) {
        const int a = Below(rng, slots), b = Below(rng, W);
        if (class_[trial[a]] == class_[trial[b]]) continue;
        if (!GroupSwap(trial, a, b)) std::swap(trial[a], trial[b]);
        ++kicks;
      }
      if (kicks == 0) break;  // every worker alike: no placement differs from this one
      auto cut = Balanced(trial);
      if (!cut.ok()) return cut.status();
      auto kicked = scorer_.Score(trial, *cut, best.shard_owner);
      if (!kicked.ok()) return kicked.status();
      PlacementResult local = *kicked;
      if (auto st = Descend(local, trial, budget, rng); !st.ok()) return st;
      if (Better(local, best)) best = local, order = trial;
    }
    return best;
  }

  PlacementResult Done(PlacementResult best) const {
    best.simulations = scorer_.simulations();
    return best;
  }

  const PlacementProblem& p_;
  Scorer& scorer_;
  Matrix dp_, pp_;
  std::vector<int> class_;
  std::vector<std::vector<int>> groups_, pipelines_;
};

// Order crossover: the child keeps a stretch of `a` in place and fills the rest with the other
// workers in the order `b` has them, starting after the stretch.
std::vector<int> OrderCrossover(const std::vector<int>& a, const std::vector<int>& b, std::mt19937_64& rng) {
  const int n = static_cast<int>(a.size());
  int lo = Below(rng, n), hi = Below(rng, n);
  if (lo > hi) std::swap(lo, hi);
  std::vector<int> child(n, -1);
  std::vector<bool> in(n, false);
  for (int i = lo; i <= hi; ++i) child[i] = a[i], in[a[i]] = true;
  int at = (hi + 1) % n;
  for (int k = 0; k < n; ++k) {
    const int w = b[(hi + 1 + k) % n];
    if (in[w]) continue;
    child[at] = w;
    at = (at + 1) % n;
  }
  return child;
}

}  // namespace

std::vector<int> BalancedCut(int blocks, const std::vector<double>& block_s, double head_s,
                             const std::vector<int>& max_blocks) {
  const int P = static_cast<int>(block_s.size());
  if (P < 1 || blocks < P) return {};
  auto most = [&](int s) { return max_blocks.empty() ? blocks : std::min(blocks, max_blocks[s]); };
  int room = 0;
  for (int s = 0; s < P; ++s) {
    if (most(s) < 1) return {};
    room += most(s);
  }
  if (room < blocks) return {};
  auto extra = [&](int s) { return s == P - 1 ? head_s : 0.0; };
  auto time = [&](int s, int n) { return n * block_s[s] + extra(s); };
  // The bottleneck is some stage's time for some block count: the least such time at which every
  // stage together can hold all the blocks.
  std::vector<double> candidates;
  for (int s = 0; s < P; ++s)
    for (int n = 1; n <= blocks - (P - 1); ++n) candidates.push_back(time(s, n));
  std::sort(candidates.begin(), candidates.end());
  std::vector<int> cut(P, 1);
  for (double limit : candidates) {
    int sum = 0;
    for (int s = 0; s < P; ++s) {
      cut[s] = 1;
      while (cut[s] + 1 <= most(s) && time(s, cut[s] + 1) <= limit * (1 + 1e-12)) ++cut[s];
      sum += cut[s];
    }
    if (sum >= blocks) break;
  }
  for (int sum = std::accumulate(cut.begin(), cut.end(), 0); sum > blocks; --sum) {
    int slowest = -1;
    for (int s = 0; s < P; ++s)
      if (cut[s] > 1 && (slowest < 0 || time(s, cut[s]) > time(slowest, cut[slowest]))) slowest = s;
    --cut[slowest];
  }
  return cut;
}

absl::StatusOr<PlacementResult> PlaceInOrder(const PlacementProblem& problem, const std::vector<int>& order,
                                             const std::vector<std::vector<int>>& shard_owner) {
  Scorer scorer(problem);
  if (auto st = scorer.Validate(); !st.ok()) return st;
  if (auto st = CheckOrder(order, scorer.workers(), "workers"); !st.ok()) return st;
  if (shard_owner.empty()) return scorer.Score(order, problem.layout.blocks_per_stage, scorer.DefaultOwners());
  if (static_cast<int>(shard_owner.size()) != problem.layout.stages) {
    return absl::InvalidArgumentError(absl::StrFormat("placement: shard owners for %d stages, the layout has %d",
                                                      shard_owner.size(), problem.layout.stages));
  }
  for (const std::vector<int>& owners : shard_owner) {
    if (auto st = CheckOrder(owners, problem.layout.replicas, "replicas of a stage (shard owners)"); !st.ok()) return st;
  }
  return scorer.Score(order, problem.layout.blocks_per_stage, shard_owner);
}

absl::StatusOr<PlacementResult> RegistrationOrder(const PlacementProblem& problem) {
  std::vector<int> order(problem.host.size());
  std::iota(order.begin(), order.end(), 0);
  return PlaceInOrder(problem, order);
}

absl::StatusOr<PlacementResult> RandomPlacement(const PlacementProblem& problem, uint64_t seed) {
  std::vector<int> order(problem.host.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  Shuffle(order, rng);
  return PlaceInOrder(problem, order);
}

absl::StatusOr<PlacementResult> SearchPlacement(const PlacementProblem& problem, const SearchOptions& options) {
  Scorer scorer(problem);
  if (auto st = scorer.Validate(); !st.ok()) return st;
  Search search(problem, scorer);
  return search.Run(options);
}

absl::StatusOr<PlacementResult> GeneticPlacement(const PlacementProblem& problem, const GeneticOptions& options) {
  Scorer scorer(problem);
  if (auto st = scorer.Validate(); !st.ok()) return st;
  if (options.population < 2 || options.generations < 1 || options.elite < 0 || options.elite >= options.population ||
      options.tournament < 1) {
    return absl::InvalidArgumentError("genetic placement: needs population >= 2, generations >= 1, "
                                      "0 <= elite < population, tournament >= 1");
  }
  const int W = scorer.workers();
  std::mt19937_64 rng(options.seed);
  struct Individual {
    std::vector<int> order;
    PlacementResult result;
  };
  auto score = [&](std::vector<int> order) -> absl::StatusOr<Individual> {
    auto r = scorer.Score(order, problem.layout.blocks_per_stage, scorer.DefaultOwners());
    if (!r.ok()) return r.status();
    return Individual{std::move(order), *std::move(r)};
  };
  auto ranked = [](const Individual& a, const Individual& b) { return Better(a.result, b.result); };
  std::vector<Individual> population;
  for (int i = 0; i < options.population; ++i) {
    std::vector<int> order(W);
    std::iota(order.begin(), order.end(), 0);
    if (i > 0) Shuffle(order, rng);
    auto ind = score(std::move(order));
    if (!ind.ok()) return ind.status();
    population.push_back(*std::move(ind));
  }
  std::stable_sort(population.begin(), population.end(), ranked);
  auto pick = [&]() -> const Individual& {
    int best = Below(rng, options.population);
    for (int k = 1; k < options.tournament; ++k) best = std::min(best, Below(rng, options.population));
    return population[best];  // ranked: a lower index is fitter
  };
  for (int g = 1; g < options.generations; ++g) {
    std::vector<Individual> next(population.begin(), population.begin() + options.elite);
    while (static_cast<int>(next.size()) < options.population) {
      const Individual& mother = pick();  // drawn one after the other: the draws' order is fixed
      const Individual& father = pick();
      std::vector<int> child = OrderCrossover(mother.order, father.order, rng);
      while (Uniform(rng) < options.mutation_rate) {
        std::swap(child[Below(rng, W)], child[Below(rng, W)]);
      }
      auto ind = score(std::move(child));
      if (!ind.ok()) return ind.status();
      next.push_back(*std::move(ind));
    }
    population = std::move(next);
    std::stable_sort(population.begin(), population.end(), ranked);
  }
  PlacementResult best = population.front().result;
  best.simulations = scorer.simulations();
  return best;
}

absl::StatusOr<ChosenPlacement> ChoosePlacement(PlacementProblem problem) {
  LH_ASSIGN_OR_RETURN(PlacementResult found, SearchPlacement(problem));
  problem.keep_cut = true;  // registration order as the layout has it
  LH_ASSIGN_OR_RETURN(PlacementResult registration, RegistrationOrder(problem));
  // A plan that fits beats one that does not, however fast (the search ranks them so too).
  const bool better = (found.fits && !registration.fits) ||
                      (found.fits == registration.fits &&
                       found.iteration_s < (1 - kPlacementMinGain) * registration.iteration_s);
  ChosenPlacement out;
  out.searched = better;
  out.registration_order_s = registration.iteration_s;
  out.simulations = found.simulations;
  out.plan = better ? std::move(found) : std::move(registration);
  return out;
}

}  // namespace longhaul
