#pragma once
// The low-rank codec's method (BoundaryShape::rank), shared by its CPU and CUDA twins and by the
// planner's price of them: the random directions and the passes of an encoding. Each
// micro-batch's directions are signs drawn from a seed of its coordinates, so a run, a resend
// after a recovery and a resumed run send the same factors, and both twins draw the same ones.
#include <cstddef>
#include <cstdint>

#include "model/micro_batch.h"
#include "util/hash.h"

namespace longhaul {

// The seed of mb's activations' directions (gradient false) or of their gradients'.
inline uint64_t LowRankSeed(const MicroBatch& mb, bool gradient) {
  constexpr uint64_t kStream = 0x4c6f7752616e6b00ULL;  // "LowRank": apart from every other hashed stream
  return HashCoords({kStream, static_cast<uint64_t>(mb.iteration), static_cast<uint64_t>(mb.global_index), gradient});
}

// An encoding orthonormalises three sketches (A·Ω, A^T·Q, A·Z), each in kLowRankPasses passes,
// the second mending what rounding left of the first: Gram-Schmidt on the host, Cholesky QR on the
// device. The planner prices both codecs by these counts (BoundaryShape).
inline constexpr int kLowRankOrthonormalisations = 3;
inline constexpr int kLowRankPasses = 2;

// Shared directions (transport.shared_directions) travel padded to whole pieces of this many
// floats: a whole number of every wire format's blocks (format/wire_dtype.h's kWirePiece, which
// the worker checks is a divisor), so the coordinates behind them are encoded as they would be
// alone and the directions as the sender rounds them.
inline constexpr size_t kDirectionsPiece = 4096;

// Entry i of Ω^T (rank × cols, row-major) for `seed`: ±1.
constexpr float LowRankSign(uint64_t seed, size_t i) { return (SplitMix64(seed + i) >> 63) ? 1.0f : -1.0f; }

}  // namespace longhaul
