#include "model/param_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "util/hash.h"

namespace longhaul {

ParamLayout::ParamLayout(const ModelConfig& cfg, const StageSpec& spec)
    : first_block_(spec.first_block),
      d_model_(static_cast<size_t>(cfg.d_model)),
      kept_(static_cast<size_t>(cfg.residual_width())) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size;
  if (spec.has_embedding) {
    const int64_t fixed_from = cfg.residual_width() < C ? cfg.residual_width() : -1;
    wte_ = Add("wte.weight", {V, C}, true, fixed_from);
    wpe_ = Add("wpe.weight", {cfg.max_seq_len, C}, true, fixed_from);
  }
  for (int b = spec.first_block; b < spec.end_block; ++b) {
    const std::string p = absl::StrCat("h.", b, ".");
    BlockTensors t;
    t.ln1_w = Add(p + "ln_1.weight", {C}, false);
    t.ln1_b = Add(p + "ln_1.bias", {C}, false);
    t.qkv_w = Add(p + "attn.c_attn.weight", {3 * C, C}, true);
    t.qkv_b = Add(p + "attn.c_attn.bias", {3 * C}, false);
    t.attn_proj_w = Add(p + "attn.c_proj.weight", {C, C}, true);
    t.attn_proj_b = Add(p + "attn.c_proj.bias", {C}, false);
    t.ln2_w = Add(p + "ln_2.weight", {C}, false);
    t.ln2_b = Add(p + "ln_2.bias", {C}, false);
    t.fc_w = Add(p + "mlp.c_fc.weight", {4 * C, C}, true);
    t.fc_b = Add(p + "mlp.c_fc.bias", {4 * C}, false);
    t.fc_proj_w = Add(p + "mlp.c_proj.weight", {C, 4 * C}, true);
    t.fc_proj_b = Add(p + "mlp.c_proj.bias", {C}, false);
    blocks_.push_back(t);
  }
  if (spec.has_head) {
    lnf_w_ = Add("ln_f.weight", {C}, false);
    lnf_b_ = Add("ln_f.bias", {C}, false);
    if (!cfg.tied_head) lm_head_ = Add("lm_head.weight", {V, C}, true);
  }
}

int ParamLayout::Add(std::string name, std::vector<int64_t> shape, bool decay, int64_t fixed_from) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  tensors_.push_back({std::move(name), std::move(shape), total_, n, decay, fixed_from});
  total_ += n;
  return static_cast<int>(tensors_.size()) - 1;
}

std::pair<size_t, size_t> ParamLayout::Range(int first, int end) const {
  if (first >= end) return {0, 0};
  return {tensors_[first].offset, tensors_[end - 1].offset + tensors_[end - 1].size};
}

std::vector<uint8_t> ParamLayout::DecayFlags(size_t begin, size_t end) const {
  std::vector<uint8_t> decay(end - begin, 0);
  for (const ParamTensor& t : tensors_) {
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.size);
    if (!t.decay || lo >= hi) continue;
    std::fill(decay.begin() + (lo - begin), decay.begin() + (hi - begin), 1);
    if (t.fixed_from < 0) continue;
    const size_t C = static_cast<size_t>(t.shape.back()), from = static_cast<size_t>(t.fixed_from);
    for (size_t i = lo; i < hi; ++i)
      if ((i - t.offset) % C >= from) decay[i - begin] = 0;
  }
  return decay;
}

ParamLayout ParamLayout::Slice(int first, int end) const {
  ParamLayout l;
  l.d_model_ = d_model_, l.kept_ = kept_;
  for (int i = first; i < end; ++i) l.Add(tensors_[i].name, tensors_[i].shape, tensors_[i].decay, tensors_[i].fixed_from);
  return l;
}

std::vector<std::pair<int, int>> ParamLayout::SplitIntoShards(int shards) const {
  std::vector<std::pair<int, int>> out;
  int t = 0;
  const int n = static_cast<int>(tensors_.size());
  for (int k = 0; k < shards; ++k) {
    const int first = t;
    // Take tensors while the shard's end stays at or below its share of the total, at least one.
    const double target = static_cast<double>(total_) * (k + 1) / shards;
    while (t < n && (t == first || static_cast<double>(tensors_[t].offset + tensors_[t].size) <= target)) ++t;
    if (k == shards - 1) t = n;
    out.emplace_back(first, t);
  }
  return out;
}

std::vector<ParamLayout::PsShardCut> ParamLayout::PsShards(int replicas, bool central) const {
  const auto cuts = central ? std::vector<std::pair<int, int>>{{0, static_cast<int>(tensors_.size())}}
                            : SplitIntoShards(replicas);
  std::vector<PsShardCut> out;
  for (size_t k = 0; k < cuts.size(); ++k) {
    if (cuts[k].first == cuts[k].second) continue;
    const auto [begin, end] = Range(cuts[k].first, cuts[k].second);
    out.push_back({static_cast<int>(k), cuts[k].first, cuts[k].second, end - begin});
  }
  return out;
}

double ParamLayout::HostedShardFloats(int replicas, bool central, int replica,
                                      const std::function<int(int)>& owner) const {
  double floats = 0;
  for (const PsShardCut& cut : PsShards(replicas, central))
    if (owner(cut.owner_replica) == replica) floats += static_cast<double>(cut.floats);
  return floats;
}

int ParamLayout::Find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

namespace {

// The stream a tensor's initial values are drawn from, and its element i: independent elements,
// so threads share the work and the result does not depend on their number.
uint64_t InitStream(uint64_t seed, const std::string& name) { return HashCoords({seed, std::hash<std::string>{}(name)}); }
float InitialValue(uint64_t stream, size_t i, float stdev) {
  return static_cast<float>(Rng(stream + 2 * static_cast<uint64_t>(i)).Normal()) * stdev;
}
constexpr float kInitStd = 0.02f;

}  // namespace

void InitGpt2Params(const ModelConfig& cfg, const ParamLayout& layout, uint64_t seed, float* params) {
  const float residual_std = kInitStd / std::sqrt(2.0f * cfg.n_layer);
  for (const ParamTensor& t : layout.tensors()) {
    float* p = params + t.offset;
    const std::string& n = t.name;
    auto ends_with = [&](const char* suffix) {
      const size_t k = std::strlen(suffix);
      return n.size() >= k && n.compare(n.size() - k, k, suffix) == 0;
    };
    if (ends_with(".bias")) {
      std::fill(p, p + t.size, 0.0f);
    } else if (t.shape.size() == 1) {  // LayerNorm gain
      std::fill(p, p + t.size, 1.0f);
    } else {
      // Element i is the tensor stream's i-th normal (a 1.3B model's host start-up was a minute on
      // one core before threads shared it).
      const float stdev = ends_with("c_proj.weight") ? residual_std : kInitStd;
      const uint64_t stream = InitStream(seed, n);
      const long size = static_cast<long>(t.size);
#pragma omp parallel for schedule(static)
      for (long i = 0; i < size; ++i) p[i] = InitialValue(stream, static_cast<size_t>(i), stdev);
    }
  }
  ZeroRuns(layout.SubspaceZeroRuns(), params);
}

FixedEmbedding::FixedEmbedding(const ModelConfig& cfg, uint64_t seed) {
  const size_t C = static_cast<size_t>(cfg.d_model), k = static_cast<size_t>(cfg.residual_width());
  if (k == C) return;
  from_ = static_cast<int>(k), width_ = static_cast<int>(C - k);
  auto draw = [&](const char* name, size_t rows, std::vector<float>& out) {
    const uint64_t stream = InitStream(seed, name);
    out.resize(rows * (C - k));
    // Every stage draws these as it starts (a vocabulary's rows): threads share them as
    // InitGpt2Params' do, the values independent of their number.
#pragma omp parallel for schedule(static)
    for (long r = 0; r < static_cast<long>(rows); ++r)
      for (size_t c = k; c < C; ++c) out[r * (C - k) + c - k] = InitialValue(stream, r * C + c, kInitStd);
  };
  draw("wte.weight", static_cast<size_t>(cfg.vocab_size), wte_);
  draw("wpe.weight", static_cast<size_t>(cfg.max_seq_len), wpe_);
}

std::vector<FixedEmbedding::Copy> FixedEmbedding::Copies(const ParamLayout& layout, size_t begin, size_t end) const {
  std::vector<Copy> out;
  if (empty()) return out;
  const size_t C = static_cast<size_t>(from_ + width_), W = static_cast<size_t>(width_);
  const std::vector<StridedRun> fixed = layout.SubspaceFixedRuns();  // wte's columns, then wpe's
  for (size_t i = 0; i < fixed.size(); ++i) {
    const size_t start = fixed[i].offset - from_;  // the tensor's first float
    for (const StridedRun& r : ClipRuns({fixed[i]}, begin, end)) {
      const size_t rel = r.offset - start;  // row rel / C, fixed column rel % C - k
      out.push_back({r, i == 1, rel / C * W + rel % C - from_, W});
    }
  }
  return out;
}

void FixedEmbedding::WriteInto(const ParamLayout& layout, float* params, size_t begin, size_t end) const {
  for (const Copy& c : Copies(layout, begin, end)) {
    const float* src = (c.position ? wpe_ : wte_).data() + c.from;
    for (size_t i = 0; i < c.to.rows; ++i)
      std::copy_n(src + i * c.from_stride, c.to.length, params + c.to.offset + i * c.to.stride);
  }
}

std::vector<StridedRun> ParamLayout::SubspaceFixedRuns() const {
  const size_t C = d_model_, k = kept_;
  if (k == C || wte_ < 0) return {};
  std::vector<StridedRun> runs;
  // Embedding rows (one per token or position) from column k on.
  for (int t : {wte_, wpe_}) runs.push_back({tensors_[t].offset + k, tensors_[t].size / C, C, C - k});
  return runs;
}

std::vector<StridedRun> ParamLayout::SubspaceZeroRuns() const {
  const size_t C = d_model_, k = kept_;
  if (k == C) return {};
  std::vector<StridedRun> runs;
  // A projection's rows (one per output coordinate, PyTorch's (out, in)) and its bias from k on.
  for (const BlockTensors& b : blocks_) {
    for (int t : {b.attn_proj_w, b.attn_proj_b, b.fc_proj_w, b.fc_proj_b}) {
      const size_t row = tensors_[t].size / C;
      runs.push_back({tensors_[t].offset + k * row, 1, 0, (C - k) * row});
    }
  }
  return runs;
}

std::vector<StridedRun> ParamLayout::SubspaceRuns() const {
  std::vector<StridedRun> runs = SubspaceFixedRuns();  // the embedding comes first
  for (const StridedRun& r : SubspaceZeroRuns()) runs.push_back(r);
  return runs;
}

std::vector<StridedRun> ClipRuns(const std::vector<StridedRun>& runs, size_t begin, size_t end) {
  std::vector<StridedRun> out;
  for (const StridedRun& r : runs) {
    // Row i covers [r.offset + i·stride, + length): rows [first, last) meet [begin, end).
    size_t first = 0, last = r.rows;
    while (first < last && r.offset + first * r.stride + r.length <= begin) ++first;
    while (last > first && r.offset + (last - 1) * r.stride >= end) --last;
    for (size_t i = first; i < last;) {
      const size_t lo = r.offset + i * r.stride, hi = lo + r.length;
      if (lo >= begin && hi <= end) {  // whole rows from i on, as far as they stay inside
        size_t j = i + 1;
        while (j < last && r.offset + j * r.stride + r.length <= end) ++j;
        out.push_back({lo, j - i, r.stride, r.length});
        i = j;
      } else {
        const size_t a = std::max(lo, begin), b = std::min(hi, end);
        out.push_back({a, 1, 0, b - a});
        ++i;
      }
    }
  }
  return out;
}

void ZeroRuns(const std::vector<StridedRun>& runs, float* buffer) {
  for (const StridedRun& r : runs)
    for (size_t i = 0; i < r.rows; ++i) std::fill_n(buffer + r.offset + i * r.stride, r.length, 0.0f);
}

}  // namespace longhaul
