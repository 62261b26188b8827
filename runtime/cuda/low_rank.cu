#include "cuda/low_rank.cuh"

#include <algorithm>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "cuda/cublas_api.h"
#include "model/low_rank_method.h"

namespace longhaul::cuda {
namespace {

constexpr int kThreads = 256;
// Columns of the Gram matrix factored at once by one thread block, in shared memory.
constexpr int kPanel = 64;
// A pivot at or below this share of its column's squared length leaves the column as zeros.
constexpr double kDeadShare = 1e-12;

int Blocks(size_t n) { return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 4096)); }

__global__ void SignKernel(float* out, uint64_t seed, size_t n) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < n; i += size_t{gridDim.x} * kThreads) {
    out[i] = LowRankSign(seed, i);
  }
}

template <typename From, typename To>
__global__ void CastKernel(To* out, const From* in, size_t n) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < n; i += size_t{gridDim.x} * kThreads) {
    out[i] = static_cast<To>(in[i]);
  }
}

// diag (r) = the diagonal of g (r × r, column-major).
__global__ void DiagonalKernel(double* diag, const double* g, int r) {
  for (int i = blockIdx.x * kThreads + threadIdx.x; i < r; i += gridDim.x * kThreads) diag[i] = g[i + size_t(i) * r];
}

// Column c of x (rows × cols, column-major, ld) becomes zeros where dead[c].
__global__ void ZeroDeadColumnsKernel(double* x, size_t rows, size_t ld, const int* dead, int cols) {
  for (size_t e = blockIdx.x * size_t{kThreads} + threadIdx.x; e < rows * cols; e += size_t{gridDim.x} * kThreads) {
    const size_t c = e / rows;
    if (dead[c]) x[e % rows + c * ld] = 0.0;
  }
}

// The Cholesky factor of g's leading kb × kb block (column-major, ld; kb ≤ kPanel) in its lower
// triangle, unblocked, right-looking, by one block of kThreads threads. A dead pivot (at or below
// kDeadShare of diag, the column's squared length before any projection) becomes 1 with zeros
// below it, so that no later column is projected on it, and is flagged in dead.
__global__ void FactorPanelKernel(double* g, int ld, int kb, const double* diag, int* dead) {
  __shared__ double a[kPanel][kPanel + 1];  // a[column][row]
  __shared__ double pivot;
  __shared__ bool gone;
  for (int e = threadIdx.x; e < kb * kb; e += kThreads) a[e / kb][e % kb] = g[e % kb + size_t(e / kb) * ld];
  __syncthreads();
  for (int j = 0; j < kb; ++j) {
    if (threadIdx.x == 0) {
      const double d = a[j][j];
      gone = d <= kDeadShare * diag[j];  // not !(d > ...): a NaN goes on to spread
      pivot = gone ? 1.0 : sqrt(d);
      a[j][j] = pivot;
      dead[j] = gone;
    }
    __syncthreads();
    for (int i = j + 1 + threadIdx.x; i < kb; i += kThreads) a[j][i] = gone ? 0.0 : a[j][i] / pivot;
    __syncthreads();
    const int m = kb - j - 1;
    for (int e = threadIdx.x; e < m * m; e += kThreads) {
      const int i = j + 1 + e % m, c = j + 1 + e / m;
      if (i >= c) a[c][i] -= a[j][i] * a[j][c];
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < kb * kb; e += kThreads) {
    const int i = e % kb, c = e / kb;
    if (i >= c) g[i + size_t(c) * ld] = a[c][i];
  }
}

absl::Status Blas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("cuBLAS error %d in the low-rank codec's %s", static_cast<int>(s), what));
}

// Column-major C (m × n) = alpha · op(A) · op(B) + beta · C in F's precision: fp32 without TF32
// (the factors keep fp32's precision), or fp64.
template <typename F>
absl::Status Gemm(cublasHandle_t h, bool ta, bool tb, size_t m, size_t n, size_t k, F alpha, const F* A, size_t lda,
                  const F* B, size_t ldb, F beta, F* C, size_t ldc) {
  constexpr bool f32 = std::is_same_v<F, float>;
  constexpr cudaDataType_t type = f32 ? CUDA_R_32F : CUDA_R_64F;
  return Blas(LoadedCublas().gemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, int(m), int(n),
                                  int(k), &alpha, A, type, int(lda), B, type, int(ldb), &beta, C, type, int(ldc),
                                  f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
              "product");
}

// b (m × n, column-major, ldb) = b · L^-T for L lower triangular (n × n, ldl).
absl::Status SolveRight(cublasHandle_t h, size_t m, size_t n, const double* l, size_t ldl, double* b, size_t ldb) {
  const double one = 1.0;
  return Blas(LoadedCublas().trsm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, CUBLAS_DIAG_NON_UNIT,
                                  int(m), int(n), &one, l, int(ldl), b, int(ldb)),
              "triangular solve");
}

}  // namespace

absl::Status LowRankCodec::Init(size_t rows, size_t cols, size_t rank) {
  if (rank_ > 0) {
    if (rows <= rows_ && cols <= cols_ && rank <= rank_) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "a %d x %d tensor at rank %d is larger than the %d x %d at rank %d this codec was made for", rows, cols,
        rank, rows_, cols_, rank_));
  }
  rows_ = rows, cols_ = cols, rank_ = rank;
  LH_RETURN_IF_ERROR(omega_.Alloc(cols * rank));
  LH_RETURN_IF_ERROR(y_.Alloc(rows * rank));
  LH_RETURN_IF_ERROR(z_.Alloc(cols * rank));
  LH_RETURN_IF_ERROR(x64_.Alloc(std::max(rows, cols) * rank));
  LH_RETURN_IF_ERROR(gram_.Alloc(rank * rank));
  LH_RETURN_IF_ERROR(diag_.Alloc(rank));
  return dead_.Alloc(rank);
}

absl::Status LowRankCodec::Orthonormalize(cublasHandle_t blas, cudaStream_t s, float* x, size_t n, size_t r) {
  double* g = gram_.p;
  CastKernel<<<Blocks(n * r), kThreads, 0, s>>>(x64_.p, x, n * r);
  for (int pass = 0; pass < kLowRankPasses; ++pass) {
    LH_RETURN_IF_ERROR(Gemm(blas, true, false, r, r, n, 1.0, x64_.p, n, x64_.p, n, 0.0, g, r));  // G = X^T X
    DiagonalKernel<<<Blocks(r), kThreads, 0, s>>>(diag_.p, g, static_cast<int>(r));
    // G = L L^T, a panel of columns at a time: factor the panel's diagonal block, solve for the
    // rows below it, subtract their product from the rest.
    for (size_t k0 = 0; k0 < r; k0 += kPanel) {
      const size_t kb = std::min<size_t>(kPanel, r - k0), rest = r - k0 - kb;
      double* l11 = g + k0 + k0 * r;
      FactorPanelKernel<<<1, kThreads, 0, s>>>(l11, static_cast<int>(r), static_cast<int>(kb), diag_.p + k0,
                                               dead_.p + k0);
      if (rest == 0) break;
      double* l21 = l11 + kb;
      LH_RETURN_IF_ERROR(SolveRight(blas, rest, kb, l11, r, l21, r));
      ZeroDeadColumnsKernel<<<Blocks(rest * kb), kThreads, 0, s>>>(l21, rest, r, dead_.p + k0, static_cast<int>(kb));
      LH_RETURN_IF_ERROR(Gemm(blas, false, true, rest, rest, kb, -1.0, l21, r, l21, r, 1.0, l21 + kb * r, r));
    }
    LH_RETURN_IF_ERROR(SolveRight(blas, n, r, g, r, x64_.p, n));  // X = X L^-T
    ZeroDeadColumnsKernel<<<Blocks(n * r), kThreads, 0, s>>>(x64_.p, n, n, dead_.p, static_cast<int>(r));
  }
  CastKernel<<<Blocks(n * r), kThreads, 0, s>>>(x, x64_.p, n * r);
  return Check(cudaGetLastError(), "the low-rank codec's orthonormalisation");
}

// In column-major terms: a is A^T (cols × rows); Q^T (rank × rows, row-major) is Q (rows ×
// rank); B (rank × cols, row-major) is B^T = A^T·Q (cols × rank); the directions Z^T (rank ×
// cols, row-major) are Z (cols × rank).
absl::Status LowRankCodec::Directions(cublasHandle_t blas, cudaStream_t s, const float* a, size_t rows, size_t cols,
                                      size_t rank, uint64_t seed, float* directions) {
  if (rank == 0 || rank > std::min(rows, cols)) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d for a %d x %d tensor", rank, rows, cols));
  }
  LH_RETURN_IF_ERROR(Init(rows, cols, rank));
  const size_t T = rows, C = cols, R = rank;
  SignKernel<<<Blocks(C * R), kThreads, 0, s>>>(omega_.p, seed, C * R);
  LH_RETURN_IF_ERROR(Gemm(blas, true, false, T, R, C, 1.0f, a, C, omega_.p, C, 0.0f, y_.p, T));  // Y = A·Ω
  LH_RETURN_IF_ERROR(Orthonormalize(blas, s, y_.p, T, R));
  LH_RETURN_IF_ERROR(Gemm(blas, false, false, C, R, T, 1.0f, a, C, y_.p, T, 0.0f, directions, C));  // Z = A^T·Y
  return Orthonormalize(blas, s, directions, C, R);
}

absl::Status LowRankCodec::Encode(cublasHandle_t blas, cudaStream_t s, const float* a, size_t rows, size_t cols,
                                  size_t rank, uint64_t seed, float* out) {
  LH_RETURN_IF_ERROR(Directions(blas, s, a, rows, cols, rank, seed, z_.p));
  const size_t T = rows, C = cols, R = rank;
  float *q = out, *b = out + R * T;
  LH_RETURN_IF_ERROR(Project(blas, a, T, C, R, z_.p, q));  // Y = A·Z
  LH_RETURN_IF_ERROR(Orthonormalize(blas, s, q, T, R));
  return Gemm(blas, false, false, C, R, T, 1.0f, a, C, q, T, 0.0f, b, C);  // B^T = A^T·Q
}

absl::Status LowRankCodec::Project(cublasHandle_t blas, const float* a, size_t rows, size_t cols, size_t rank,
                                   const float* directions, float* out) {
  const size_t T = rows, C = cols, R = rank;
  return Gemm(blas, true, false, T, R, C, 1.0f, a, C, directions, C, 0.0f, out, T);  // out = A·Z
}

absl::Status LowRankCodec::Decode(cublasHandle_t blas, const float* q, const float* b, size_t rows, size_t cols,
                                  size_t rank, float* a) {
  const size_t T = rows, C = cols, R = rank;
  return Gemm(blas, false, true, C, T, R, 1.0f, b, C, q, T, 0.0f, a, C);  // A^T = B^T·Q^T
}

}  // namespace longhaul::cuda
