#pragma once
// Shape of a GPT model and of the stage one process runs.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
// nothing it trains).
struct BoundaryShape {
  size_t rows = 0;
  int width = 0, kept = 0;

  size_t floats() const { return rows * static_cast<size_t>(width); }  // as a stage reads and writes it
  size_t sent() const { return rows * static_cast<size_t>(kept); }     // as a link carries it
  bool narrowed() const { return kept < width; }
  // (rows, width) -> (rows, kept), and back with zeros in the columns not kept (for the stage to
  // fill).
  void Keep(const float* full, float* sent) const;
  void Restore(const float* sent, float* full) const;
};

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
