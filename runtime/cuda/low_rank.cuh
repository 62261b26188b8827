#pragma once
// The low-rank codec (cpu/low_rank.h) on the device: a GPU stage puts its boundary in low rank
// before it crosses the bus, so the factors cross it and a slow link instead of the tensor, and
// multiplies out what it receives there. The same algorithm and the same random directions
// (model/low_rank_method.h) as the CPU twin, and the same layout of what is sent (Q^T, then B), so
// either end may be a CPU or a GPU worker.
//
// The products are fp32 cuBLAS GEMMs. The orthonormalisations, which the CPU twin does row by row
// (Gram-Schmidt twice), are here Cholesky QR twice in fp64 (Fukaya et al., 2014: CholeskyQR2):
// Gram matrix, its Cholesky factor L, X ← X·L^-T, so that everything is a GEMM, a triangular solve
// or a small kernel instead of rank × rank matrix-vector products. A pivot with less than 10^-12
// of its column's squared length left is the CPU's row with less than a millionth of its length
// left: that column becomes zeros. A NaN spreads as it does there.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "cuda/cuda_memory.cuh"

namespace longhaul::cuda {

class LowRankCodec {
 public:
  // Device scratch for tensors of up to rows × cols at up to `rank`, once: the first Encode
  // allocates it for its own shape where nothing called this before.
  absl::Status Init(size_t rows, size_t cols, size_t rank);
  // out (device, rank·(rows + cols) floats) = Q^T (rank × rows) then B (rank × cols), row-major,
  // from a (device, rows × cols, row-major), queued on `stream` (blas's stream).
  absl::Status Encode(cublasHandle_t blas, cudaStream_t stream, const float* a, size_t rows, size_t cols,
                      size_t rank, uint64_t seed, float* out);
  // a (device, rows × cols) = Q·B from what Encode wrote (device).
  static absl::Status Decode(cublasHandle_t blas, const float* in, size_t rows, size_t cols, size_t rank, float* a) {
    return Decode(blas, in, in + rank * rows, rows, cols, rank, a);
  }
  // a = q^T·b for Q^T (rank × rows) and B (rank × cols) apart (cpu/low_rank.h's twin).
  static absl::Status Decode(cublasHandle_t blas, const float* q, const float* b, size_t rows, size_t cols,
                             size_t rank, float* a);
  // Shared directions (cpu/low_rank.h's twins): `directions` (device, rank × cols) = Z^T of
  // Encode's range finder for `a`; out (rank × rows) = directions · A^T.
  absl::Status Directions(cublasHandle_t blas, cudaStream_t stream, const float* a, size_t rows, size_t cols,
                          size_t rank, uint64_t seed, float* directions);
  static absl::Status Project(cublasHandle_t blas, const float* a, size_t rows, size_t cols, size_t rank,
                              const float* directions, float* out);

 private:
  // The columns of x (n × r, column-major, ld n) made orthonormal in order, or zeros (above).
  absl::Status Orthonormalize(cublasHandle_t blas, cudaStream_t stream, float* x, size_t n, size_t r);

  size_t rows_ = 0, cols_ = 0, rank_ = 0;
  DeviceArray<float> omega_, y_, z_;  // Ω (cols × rank), Y (rows × rank), Z (cols × rank), column-major
  DeviceArray<double> x64_, gram_, diag_;  // the columns being orthonormalised, their Gram matrix and its diagonal
  DeviceArray<int> dead_;                  // per column: left as zeros
};

}  // namespace longhaul::cuda
