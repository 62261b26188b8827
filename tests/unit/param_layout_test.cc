#include "model/param_layout.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <functional>
#include <vector>

#include "util/hash.h"

namespace longhaul {
namespace {

ModelConfig Cfg(bool tied) {
  ModelConfig c;
  c.vocab_size = 50, c.max_seq_len = 16, c.n_layer = 5, c.n_head = 2, c.d_model = 8, c.tied_head = tied;
  return c;
}

// The floats of `runs` in a buffer of `n`, as 1s.
std::vector<int> Marked(const std::vector<StridedRun>& runs, size_t n) {
  std::vector<int> m(n, 0);
  for (const StridedRun& r : runs)
    for (size_t i = 0; i < r.rows; ++i)
      for (size_t j = 0; j < r.length; ++j) m.at(r.offset + i * r.stride + j) += 1;
  return m;
}

// A subspace model holds the embeddings' columns from k on (at their initial values, which the
// fixed embedding draws alike) and the output projections' rows from k on with their biases (at
// zero), each float once; clipping to any two halves keeps them all.
TEST(ParamLayout, SubspaceRunsAreTheColumnsAndRowsPastTheKeptWidth) {
  ModelConfig c = Cfg(false);
  c.subspace_divisor = 4;  // d_model 8: k = 2
  const ParamLayout whole(c, StageSpec::Whole(c));
  const std::vector<int> marked = Marked(whole.SubspaceRuns(), whole.total());
  const size_t C = 8, k = 2;
  size_t want = (c.vocab_size + c.max_seq_len) * (C - k) + c.n_layer * ((C - k) * C + (C - k) * 4 * C + 2 * (C - k));
  size_t got = 0;
  for (int m : marked) {
    EXPECT_LE(m, 1);
    got += static_cast<size_t>(m);
  }
  EXPECT_EQ(got, want);
  const ParamTensor& wte = whole.tensors()[whole.wte()];
  EXPECT_EQ(marked[wte.offset + 1], 0);
  EXPECT_EQ(marked[wte.offset + 2], 1);
  EXPECT_EQ(marked[wte.offset + C + 1], 0);
  const ParamTensor& proj = whole.tensors()[whole.block(0).fc_proj_w];  // (C, 4C)
  EXPECT_EQ(marked[proj.offset + k * 4 * C - 1], 0);
  EXPECT_EQ(marked[proj.offset + k * 4 * C], 1);
  for (size_t cut : {size_t{0}, size_t{5}, wte.offset + C + 3, proj.offset + 7, whole.total()}) {
    std::vector<StridedRun> halves = ClipRuns(whole.SubspaceRuns(), 0, cut);
    for (const StridedRun& r : ClipRuns(whole.SubspaceRuns(), cut, whole.total())) halves.push_back(r);
    EXPECT_EQ(Marked(halves, whole.total()), marked) << "cut at " << cut;
  }
  std::vector<float> params(whole.total());
  InitGpt2Params(c, whole, 3, params.data());
  const std::vector<int> fixed = Marked(whole.SubspaceFixedRuns(), whole.total());
  for (size_t i = 0; i < params.size(); ++i) {
    if (marked[i] > 0 && fixed[i] == 0) {
      ASSERT_EQ(params[i], 0.0f) << i;
    }
  }
  std::vector<float> rewritten(params.size(), 5.0f);
  const FixedEmbedding embedding(c, 3);
  embedding.WriteInto(whole, rewritten.data(), 0, wte.offset + C + 4);  // a row and a half of wte...
  embedding.WriteInto(whole, rewritten.data(), wte.offset + C + 4, whole.total());  // ...then the rest
  for (size_t i = 0; i < params.size(); ++i) ASSERT_EQ(rewritten[i], fixed[i] ? params[i] : 5.0f) << i;
  // No weight decay moves the fixed embedding, in the stage's layout or a shard's slice of it.
  const std::vector<uint8_t> decay = whole.DecayFlags(), sliced = whole.Slice(0, 2).DecayFlags();
  EXPECT_EQ(decay[wte.offset + 1], 1);
  EXPECT_EQ(decay[wte.offset + 2], 0);
  EXPECT_EQ(sliced, std::vector<uint8_t>(decay.begin(), decay.begin() + static_cast<long>(sliced.size())));
  c.subspace_divisor = 1;
  EXPECT_TRUE(ParamLayout(c, StageSpec::Whole(c)).SubspaceRuns().empty());
  c.subspace_divisor = 3;
  EXPECT_NE(c.Validate().message().find("does not divide model.d_model = 8"), std::string::npos) << c.Validate();
}

// A replica hosts its home shards, and those a plan moved to it; the shards' floats add to the
// stage's whichever replicas host them.
TEST(ParamLayout, HostedShardFloatsFollowTheOwners) {
  const ModelConfig c = Cfg(false);
  const ParamLayout whole(c, StageSpec::Whole(c));
  const std::vector<ParamLayout::PsShardCut> cuts = whole.PsShards(3, false);
  ASSERT_EQ(cuts.size(), 3u);
  auto home = [](int shard) { return shard; };
  double sum = 0;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(whole.HostedShardFloats(3, false, r, home), static_cast<double>(cuts[r].floats)) << r;
    sum += whole.HostedShardFloats(3, false, r, home);
  }
  EXPECT_EQ(sum, static_cast<double>(whole.total()));
  auto moved = [](int shard) { return shard == 2 ? 0 : shard; };  // replica 2's shard on replica 0
  EXPECT_EQ(whole.HostedShardFloats(3, false, 0, moved), static_cast<double>(cuts[0].floats + cuts[2].floats));
  EXPECT_EQ(whole.HostedShardFloats(3, false, 2, moved), 0.0);
  EXPECT_EQ(whole.HostedShardFloats(3, true, 0, home), static_cast<double>(whole.total()));
  EXPECT_EQ(whole.HostedShardFloats(3, true, 1, home), 0.0);
}

TEST(ParamLayout, LayerMajorAndContiguous) {
  const ModelConfig c = Cfg(false);
  ParamLayout whole(c, StageSpec::Whole(c));
  size_t expect = 0;
  for (const ParamTensor& t : whole.tensors()) {
    EXPECT_EQ(t.offset, expect) << t.name;
    expect += t.size;
  }
  EXPECT_EQ(whole.total(), expect);
  EXPECT_EQ(whole.tensors().front().name, "wte.weight");
  EXPECT_EQ(whole.tensors().back().name, "lm_head.weight");
  EXPECT_EQ(whole.tensors()[whole.block(3).qkv_w].name, "h.3.attn.c_attn.weight");
  // Per block: 12·C² + 13·C parameters, as in GPT-2.
  const size_t per_block = 12 * 64 + 13 * 8;
  EXPECT_EQ(whole.total(), 50 * 8 + 16 * 8 + 5 * per_block + 2 * 8 + 50 * 8);
  // A block's tensors are one contiguous range, right after the previous block's.
  EXPECT_EQ(whole.BlockRange(0).first, static_cast<size_t>(50 * 8 + 16 * 8));
  for (int b = 0; b < 5; ++b) EXPECT_EQ(whole.BlockRange(b).second - whole.BlockRange(b).first, per_block);
  EXPECT_EQ(whole.BlockRange(3).first, whole.BlockRange(2).second);
}

TEST(ParamLayout, StagesConcatenateToTheWholeModel) {
  const ModelConfig c = Cfg(false);
  ParamLayout whole(c, StageSpec::Whole(c));
  std::vector<std::string> names;
  size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    StageSpec spec = StageSpec::Even(c, s, 3);
    ParamLayout l(c, spec);
    for (const ParamTensor& t : l.tensors()) names.push_back(t.name);
    total += l.total();
  }
  EXPECT_EQ(total, whole.total());
  ASSERT_EQ(names.size(), whole.tensors().size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(names[i], whole.tensors()[i].name);
  // 5 layers over 3 stages: 2, 2, 1
  EXPECT_EQ(StageSpec::Even(c, 0, 3).end_block, 2);
  EXPECT_EQ(StageSpec::Even(c, 2, 3).first_block, 4);
}

TEST(ParamLayout, TiedHeadHasNoSeparateMatrix) {
  const ModelConfig c = Cfg(true);
  ParamLayout l(c, StageSpec::Whole(c));
  EXPECT_EQ(l.lm_head(), -1);
  EXPECT_EQ(l.Find("lm_head.weight"), -1);
  EXPECT_FALSE(StageSpec::Even(c, 0, 2).Validate(c).ok());  // embedding and head would be apart
}

TEST(ParamLayout, DecayOnlyOnMatricesAndEmbeddings) {
  const ModelConfig c = Cfg(false);
  ParamLayout l(c, StageSpec::Whole(c));
  for (const ParamTensor& t : l.tensors()) EXPECT_EQ(t.decay, t.shape.size() == 2) << t.name;
}

// AdamW's flags per float: each float's tensor's, over the whole buffer or any range of it (a
// shard may cut through a tensor).
TEST(ParamLayout, DecayFlagsAreEachFloatsTensors) {
  const ModelConfig c = Cfg(false);
  ParamLayout l(c, StageSpec::Whole(c));
  const std::vector<uint8_t> whole = l.DecayFlags();
  ASSERT_EQ(whole.size(), l.total());
  for (const ParamTensor& t : l.tensors())
    for (size_t i = t.offset; i < t.offset + t.size; ++i) ASSERT_EQ(whole[i], t.decay ? 1 : 0) << t.name << " " << i;
  const size_t begin = l.tensors()[0].size / 2, end = l.total() - 3;
  EXPECT_EQ(l.DecayFlags(begin, end), std::vector<uint8_t>(whole.begin() + begin, whole.begin() + end));
}

}  // namespace
}  // namespace longhaul

namespace longhaul {
namespace {

TEST(ParamLayout, ShardsCoverEveryTensorOnceAndSliceRebases) {
  const ModelConfig c = Cfg(false);
  ParamLayout l(c, StageSpec::Whole(c));
  for (int shards = 1; shards <= 5; ++shards) {
    auto cuts = l.SplitIntoShards(shards);
    ASSERT_EQ(static_cast<int>(cuts.size()), shards);
    int next = 0;
    size_t biggest = 0;
    for (auto [a, b] : cuts) {
      EXPECT_EQ(a, next);
      next = b;
      biggest = std::max(biggest, l.Slice(a, b).total());
    }
    EXPECT_EQ(next, static_cast<int>(l.tensors().size()));
    EXPECT_LE(biggest, l.total() / shards + 50 * 8) << shards << " shards";  // within one embedding of even
  }
  auto [a, b] = l.SplitIntoShards(3)[1];
  ParamLayout s = l.Slice(a, b);
  EXPECT_EQ(s.tensors().front().offset, 0u);
  EXPECT_EQ(s.tensors().front().name, l.tensors()[a].name);
}

// The initialisation runs on every core; each tensor is still its own sequential normal stream,
// so the values depend on neither the thread count nor the machine.
TEST(ParamLayout, InitialisationIsEachTensorsStreamWhateverTheThreads) {
  const ModelConfig c = Cfg(false);
  ParamLayout whole(c, StageSpec::Whole(c));
  std::vector<float> one(whole.total()), three(whole.total());
  const int was = omp_get_max_threads();
  omp_set_num_threads(1);
  InitGpt2Params(c, whole, 5, one.data());
  omp_set_num_threads(3);
  InitGpt2Params(c, whole, 5, three.data());
  omp_set_num_threads(was);
  EXPECT_EQ(one, three);
  const ParamTensor& t = whole.tensors()[whole.block(2).qkv_w];
  Rng rng(HashCoords({5, std::hash<std::string>{}(t.name)}));
  for (size_t i = 0; i < t.size; ++i) ASSERT_EQ(one[t.offset + i], static_cast<float>(rng.Normal()) * 0.02f) << i;
  EXPECT_EQ(one[whole.tensors()[whole.block(2).qkv_b].offset], 0.0f);
}

}  // namespace
}  // namespace longhaul
