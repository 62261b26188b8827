#pragma once
// Row-major single-precision BLAS, through OpenBLAS (OpenMP build) loaded at run time.
//
// Why not plain linking: OpenBLAS picks its kernels when the library loads, and on virtualised
// CPUs it often fails to recognise the model and falls back to SSE3 ("Prescott") kernels, 3-4x
// slower. Loading it ourselves lets us set OPENBLAS_CORETYPE from the CPU's actual features
// first (a value the user sets wins). Child processes inherit the setting.
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace longhaul::cpu {

// Loads OpenBLAS, once (later calls return the first outcome). Everything that computes on the CPU
// calls it before the functions below, which need it loaded (GptStage::Create does); the error
// names the libraries tried and the packages that provide them.
absl::Status LoadBlas();
// What LoadBlas would say with `libraries` tried in order, without keeping any (for tests).
absl::Status CheckBlasLibraries(const std::vector<std::string>& libraries);

// C (M, N) = alpha · op(A) (M, K) · op(B) (K, N) + beta · C
void Sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc);
// y (N) = alpha · A^T (N, M) · x (M) + beta · y, for A stored (M, N) with leading dimension lda
void SgemvTrans(int M, int N, float alpha, const float* A, int lda, const float* x, float beta, float* y);

// The kernel family OpenBLAS runs (for logs), e.g. "SkylakeX"; "unavailable" when it did not load.
const char* BlasCoreName();

}  // namespace longhaul::cpu
