#pragma once
// A pipeline boundary's tensor as a rank-r product (transport.boundary_rank_divisor): A (rows ×
// cols) travels as Q^T (r × rows) and B = Q^T·A (r × cols), r·(rows + cols) floats instead of
// rows·cols, and arrives as Q·B: A projected on the r directions Q spans, chosen to hold most
// of A.
//
// Q comes from a randomized range finder with one power iteration (Halko, Martinsson and Tropp,
// 2011): Y = A·Ω for a random Ω (cols × r), then Y ← A·orth(A^T·orth(Y)), Q = orth(Y). The power
// iteration weighs the directions by their singular values squared, which a residual stream's
// slowly falling spectrum needs; a matrix of rank ≤ r comes back exactly (up to rounding). Ω's
// signs are a hash of (seed, index), so the same tensor and seed send the same floats (a recovery's
// resend among them), and the receiver needs neither: it multiplies what it got.
//
// A row of Q left with no length after orthogonalisation (A of lower rank than r, or zeros) is
// sent as zeros; a NaN or an infinity in A spreads through Q and B to what arrives, so a
// non-finite activation still stops the step. The host's BLAS computes it for CPU workers; a GPU
// worker's stage computes it on the device (cuda/low_rank.cuh), where the tensor is.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace longhaul::cpu {

// Floats that travel for a rows × cols tensor at rank r.
inline size_t LowRankFloats(size_t rows, size_t cols, size_t rank) { return rank * (rows + cols); }

class LowRankCodec {
 public:
  // out (LowRankFloats) = Q^T (rank × rows) then B (rank × cols), both row-major, from `a`
  // (rows × cols, row-major). rank ≤ min(rows, cols).
  absl::Status Encode(const float* a, size_t rows, size_t cols, size_t rank, uint64_t seed, float* out);
  // a (rows × cols) = Q·B from what Encode wrote.
  static absl::Status Decode(const float* in, size_t rows, size_t cols, size_t rank, float* a) {
    return Decode(in, in + rank * rows, rows, cols, rank, a);
  }
  // a = q^T·b, for Q^T (rank × rows) and B (rank × cols) apart: a tensor's coordinates (Project)
  // and their directions.
  static absl::Status Decode(const float* q, const float* b, size_t rows, size_t cols, size_t rank, float* a);

  // Shared directions (model/model_config.h's BoundaryShape::shared). `directions` (rank × cols,
  // orthonormal rows) = Z^T of Encode's range finder for `a`: the directions A's rows lie in most,
  // as far as one power iteration finds them.
  absl::Status Directions(const float* a, size_t rows, size_t cols, size_t rank, uint64_t seed, float* directions);
  // out (rank × rows) = directions · A^T: A's coordinates in `directions` (rank × cols), which
  // Decode(out, directions, ...) multiplies back to A projected on them. The same product takes a
  // gradient into its activation's directions: the gradient of that projection.
  static absl::Status Project(const float* a, size_t rows, size_t cols, size_t rank, const float* directions,
                              float* out);

 private:
  std::vector<float> omega_, y_, z_;  // Ω^T (rank × cols), then Y^T (rank × rows) and Z^T (rank × cols)
};

}  // namespace longhaul::cpu
