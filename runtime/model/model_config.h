#pragma once
// Shape of a GPT model and of the stage one process runs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/low_rank_method.h"

namespace longhaul {

enum class AttentionMask {
  kCausal,    // position i attends to keys 0..i
  kPrefixLm,  // positions in a sample's prefix attend to the whole prefix, the rest causally
};

struct ModelConfig {
  int vocab_size = 256;
  int max_seq_len = 256;  // rows of the learned position table
  int n_layer = 4;
  int n_head = 4;
  int d_model = 256;
  bool tied_head = false;  // LM head reuses the token embedding
  AttentionMask attention = AttentionMask::kCausal;
  // > 1: the blocks write only the first d_model / subspace_divisor coordinates of the residual
  // stream, the rest being a fixed embedding (a subspace model, ParamLayout::SubspaceRuns), so a
  // pipeline boundary sends only those, losslessly.
  int subspace_divisor = 1;

  int head_dim() const { return d_model / n_head; }
  // Coordinates of the residual stream the blocks write: what crosses a pipeline boundary.
  int residual_width() const { return d_model / subspace_divisor; }
  // Checks the shape on its own; the error names the key and how to fix it.
  absl::Status Validate() const;
};

// A tensor between pipeline stages, an activation or its gradient: `rows` tokens of `width`
// floats, of which the first `kept` (ModelConfig::residual_width) cross the link; the rest are a
// subspace model's fixed embedding, which the next stage writes itself (or, in a gradient, reach
// nothing it trains). With `rank` > 0 the kept columns travel as a rank-`rank` product
// (cpu/low_rank.h), or with `shared` (transport.shared_directions) as their coordinates in `rank`
// directions an iteration's micro-batches share (cpu/low_rank.h's Project): the activations of
// the iteration's first micro-batch carry the directions too, and the gradients travel in the
// directions of their activations, which is the exact gradient of that projection.
struct BoundaryShape {
  size_t rows = 0;
  int width = 0, kept = 0, rank = 0;
  bool shared = false;

  size_t floats() const { return rows * static_cast<size_t>(width); }  // as a stage reads and writes it
  size_t kept_floats() const { return rows * static_cast<size_t>(kept); }
  // As a link carries it (cpu/low_rank.h's LowRankFloats where it has a rank; the coordinates,
  // rank x rows, where the directions are shared).
  size_t sent() const {
    if (rank == 0) return kept_floats();
    return static_cast<size_t>(rank) * (shared ? rows : rows + kept);
  }
  // The shared directions (rank x kept) as the first micro-batch's activations carry them, before
  // its coordinates: padded with zeros to whole pieces of kDirectionsPiece, so that a wire
  // format's blocks of the coordinates start where they would alone, and the sender can round
  // the directions as the link will (worker/executor.h). 0 where not shared.
  size_t directions() const {
    if (!shared || rank == 0) return 0;
    const size_t n = static_cast<size_t>(rank) * kept;
    return (n + kDirectionsPiece - 1) / kDirectionsPiece * kDirectionsPiece;
  }
  // An activation message of the iteration's first micro-batch (or of an evaluation's, each of
  // which has its own directions) against any other.
  size_t sent(bool with_directions) const { return sent() + (with_directions ? directions() : 0); }
  bool narrowed() const { return kept < width; }
  bool low_rank() const { return rank > 0; }
  // What a link carries is not the stage's tensor as it is: it leaves and arrives through a copy.
  bool recoded() const { return narrowed() || low_rank(); }
  // Floating-point operations of putting it in low rank (`encode`: four products of rows x kept
  // x rank, and the orthonormalisations of two sketches of rows x rank and one of kept x rank,
  // each pass 2 n r^2, cpu/low_rank.h) or of multiplying it out; 0 whole.
  // With shared directions a micro-batch's encoding is one product (its coordinates), and each
  // of an iteration's `micro_batches` bears its share of the first one's range finder.
  double LowRankFlops(bool encode, int micro_batches = 1) const {
    if (!low_rank()) return 0;
    const double T = static_cast<double>(rows), k = kept, r = rank;
    static_assert(kLowRankOrthonormalisations == 3, "the sketches' rows below: T, k, T");
    const double range_finder = 8 * T * k * r + kLowRankPasses * 2 * r * r * (2 * T + k);
    if (!encode) return 2 * T * k * r;
    return shared ? 2 * T * k * r + range_finder / std::max(micro_batches, 1) : range_finder;
  }
  // Pivots an encoding factors one after another on the device (a Cholesky factorisation of
  // `rank` pivots per pass of each orthonormalisation, cuda/low_rank.cuh); 0 whole.
  double LowRankPivots(int micro_batches = 1) const {
    if (!low_rank()) return 0;
    const double per_encoding = static_cast<double>(kLowRankOrthonormalisations) * kLowRankPasses * rank;
    return shared ? per_encoding / std::max(micro_batches, 1) : per_encoding;
  }
  // (rows, width) -> (rows, kept), and back with zeros in the columns not kept (for the stage to
  // fill).
  void Keep(const float* full, float* sent) const;
  void Restore(const float* sent, float* full) const;
};

// `rows` tokens of `model`'s residual stream as a boundary carries them: in low rank kept /
// `rank_divisor` where that is > 1 (transport.boundary_rank_divisor, or for gradients
// transport.gradient_rank_divisor where that is > 0: RankDivisor).
// `shared`: transport.shared_directions.
inline BoundaryShape BoundaryOf(const ModelConfig& model, size_t rows, int rank_divisor, bool shared = false) {
  BoundaryShape b{rows, model.d_model, model.residual_width()};
  if (rank_divisor > 1) b.rank = b.kept / rank_divisor, b.shared = shared;
  return b;
}
inline int RankDivisor(bool gradient, int boundary_divisor, int gradient_divisor) {
  return gradient && gradient_divisor > 0 ? gradient_divisor : boundary_divisor;
}

// Which part of the model one process runs: blocks [first_block, end_block), plus the embeddings
// if it is the first stage and the final LayerNorm, head and loss if it is the last.
struct StageSpec {
  int first_block = 0;
  int end_block = 0;
  bool has_embedding = true;
  bool has_head = true;

  static StageSpec Whole(const ModelConfig& cfg) { return {0, cfg.n_layer, true, true}; }
  // Stage `index` of `num_stages` with blocks split as evenly as possible (earlier stages get the
  // remainder).
  static StageSpec Even(const ModelConfig& cfg, int index, int num_stages);
  // Stage `index` of a cut giving each stage blocks_per_stage[s] blocks in order.
  static StageSpec OfCut(const std::vector<int>& blocks_per_stage, int index);
  absl::Status Validate(const ModelConfig& cfg) const;
};

const char* AttentionMaskName(AttentionMask m);
absl::StatusOr<AttentionMask> ParseAttentionMask(const std::string& name);

// Compute precision: fp32 everywhere, or bf16/fp16 compute with fp32 master weights (CUDA only).
enum class Precision { kFp32, kBf16, kFp16 };
absl::StatusOr<Precision> ParsePrecision(const std::string& name);
const char* PrecisionName(Precision p);

}  // namespace longhaul
