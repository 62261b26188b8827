#pragma once
// The offset table of the flat, layer-major parameter buffer.
//
// Order: [embedding: wte, wpe] [block 0] [block 1] ... [final: ln_f, lm_head]. A stage's
// parameters are therefore one contiguous range, which a parameter server can shard by offsets.
// Parameters, gradients and AdamW moments all use this same table.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace longhaul {

struct ParamTensor {
  std::string name;          // PyTorch-style name, used in safetensors checkpoints
  std::vector<int64_t> shape;
  size_t offset = 0;         // in floats, from the start of the buffer the layout describes
  size_t size = 0;
  bool decay = false;        // AdamW weight decay applies (matrices and embeddings, not biases/norms)
  // A subspace model's embedding: its columns from here on are fixed (FixedEmbedding), and no
  // decay moves them. -1: none.
  int64_t fixed_from = -1;
};

// Floats [offset + r·stride, + length) for r in [0, rows) of a flat buffer.
struct StridedRun {
  size_t offset = 0, rows = 1, stride = 0, length = 0;
};

// Indices of one block's tensors inside ParamLayout::tensors().
struct BlockTensors {
  int ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b, ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b;
};

class ParamLayout {
 public:
  // Layout of the parameters one stage owns; offsets start at 0 for the stage's first tensor.
  ParamLayout(const ModelConfig& cfg, const StageSpec& spec);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  size_t total() const { return total_; }
  // Index of a tensor by name, or -1.
  int Find(const std::string& name) const;

  // Float offsets [begin, end) of tensors [first, end) in this layout's buffer.
  std::pair<size_t, size_t> Range(int first, int end) const;
  // Per float of [begin, end) of this layout's buffer: 1 where AdamW's weight decay applies (the
  // float's tensor has `decay`, and the float is not fixed), else 0. Whole: [0, total()).
  std::vector<uint8_t> DecayFlags(size_t begin, size_t end) const;
  std::vector<uint8_t> DecayFlags() const { return DecayFlags(0, total_); }
  // Tensors [first, end) re-based to offset 0: the layout of a parameter-server shard.
  ParamLayout Slice(int first, int end) const;
  // Cuts the tensors into `shards` contiguous groups of about equal size, at tensor boundaries
  // (so each shard checkpoints whole, named tensors). Returns [first, end) tensor index pairs; a
  // shard may be empty when there are fewer tensors than shards.
  std::vector<std::pair<int, int>> SplitIntoShards(int shards) const;
  // The stage's parameter-server shards as a job places them: all tensors on replica 0 (central),
  // or SplitIntoShards(replicas) with replica k hosting the k-th; empty ones left out. The
  // coordinator's plan, a worker's memory check and the simulator all size shards by this.
  struct PsShardCut {
    int owner_replica = 0;
    int first_tensor = 0, end_tensor = 0;
    size_t floats = 0;
  };
  std::vector<PsShardCut> PsShards(int replicas, bool central) const;
  // Floats of PsShards(replicas, central) that replica `replica` hosts, shard k on owner(k) (a
  // plan may have moved a shard from replica k, its home): what a replica's memory counts.
  double HostedShardFloats(int replicas, bool central, int replica, const std::function<int(int)>& owner) const;

  // What a subspace model (ModelConfig::subspace_divisor > 1) holds so that its blocks write only
  // the first k = residual_width() coordinates of the residual stream: the rows from k on of each
  // block's output projections (attention and MLP) and their biases at zero (SubspaceZeroRuns),
  // and the token and position embeddings' columns from k on at their initial values
  // (SubspaceFixedRuns, FixedEmbedding). Coordinates from k on of the stream are then the fixed
  // embedding's at every boundary. Their gradients only ever reach these held floats (each
  // projection's input gradient reads its rows below k), so they are zeroed too
  // (SubspaceRuns: both), which keeps the clipping norm and every step off them. Empty without a
  // subspace; runs ascend.
  std::vector<StridedRun> SubspaceZeroRuns() const;
  std::vector<StridedRun> SubspaceFixedRuns() const;  // the token embedding's, then the position's
  std::vector<StridedRun> SubspaceRuns() const;

  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int lnf_w() const { return lnf_w_; }
  int lnf_b() const { return lnf_b_; }
  // -1 when the head is tied to wte.
  int lm_head() const { return lm_head_; }
  // Tensors of block `b` of the model (must belong to this stage).
  const BlockTensors& block(int b) const { return blocks_[b - first_block_]; }
  // Float offsets [begin, end) of block `b`'s tensors, which are contiguous.
  std::pair<size_t, size_t> BlockRange(int b) const { return Range(block(b).ln1_w, block(b).fc_proj_b + 1); }

 private:
  ParamLayout() = default;
  int Add(std::string name, std::vector<int64_t> shape, bool decay, int64_t fixed_from = -1);

  std::vector<ParamTensor> tensors_;
  std::vector<BlockTensors> blocks_;
  size_t total_ = 0;
  int first_block_ = 0;
  size_t d_model_ = 0, kept_ = 0;  // the residual stream's width and the subspace's (ModelConfig::residual_width)
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, lm_head_ = -1;
};

// GPT-2 initialisation of every tensor of `layout` into params: N(0, 0.02) weights, residual
// projections scaled by 1/sqrt(2·n_layer), zero biases, unit LayerNorm gains. Each tensor draws
// from a stream keyed by (seed, its name), so any split of the model starts from the same weights
// on any backend.
// A subspace model's zero runs (ParamLayout::SubspaceZeroRuns) start at zero.
void InitGpt2Params(const ModelConfig& cfg, const ParamLayout& layout, uint64_t seed, float* params);

// A subspace model's embeddings from column k on, as InitGpt2Params draws them from the seed: the
// fixed coordinates of its residual stream. Each stage draws them, so a stage after the first
// rebuilds those coordinates of its input from its tokens instead of receiving them, and a stage
// holding the embedding puts them back wherever it is given other values (a lossy pull, a
// checkpoint whose parameter servers decayed them).
class FixedEmbedding {
 public:
  FixedEmbedding() = default;  // none: the model has no subspace
  FixedEmbedding(const ModelConfig& cfg, uint64_t seed);
  bool empty() const { return width_ == 0; }
  int from() const { return from_; }    // k: the first fixed column
  int width() const { return width_; }  // d_model - k
  const std::vector<float>& wte() const { return wte_; }  // (vocab_size, width)
  const std::vector<float>& wpe() const { return wpe_; }  // (max_seq_len, width)

  // Where they go in `layout`'s embedding rows within floats [begin, end): each copy's `to` in the
  // buffer, read from `wte() or wpe()` at `from`, rows `from_stride` apart.
  struct Copy {
    StridedRun to;
    bool position = false;  // from wpe(), else wte()
    size_t from = 0, from_stride = 0;
  };
  std::vector<Copy> Copies(const ParamLayout& layout, size_t begin, size_t end) const;
  void WriteInto(const ParamLayout& layout, float* params, size_t begin, size_t end) const;

 private:
  int from_ = 0, width_ = 0;
  std::vector<float> wte_, wpe_;
};

// The parts of `runs` that lie in floats [begin, end) of the buffer, in the same order.
std::vector<StridedRun> ClipRuns(const std::vector<StridedRun>& runs, size_t begin, size_t end);
// Zeroes every float of `runs` in `buffer`.
void ZeroRuns(const std::vector<StridedRun>& runs, float* buffer);

}  // namespace longhaul
