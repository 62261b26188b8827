#include "cpu/low_rank.h"

#include <algorithm>
#include <cmath>

#include "cpu/blas.h"
#include "model/low_rank_method.h"
#include "util/status_macros.h"

namespace longhaul::cpu {
namespace {

float Norm(const float* v, size_t n) {
  double s = 0;
  for (size_t k = 0; k < n; ++k) s += static_cast<double>(v[k]) * v[k];
  return static_cast<float>(std::sqrt(s));
}

// The rows of m (r × n) made orthonormal in order, each by classical Gram-Schmidt against the
// rows before it, twice ("twice is enough": one pass loses orthogonality as the rows grow alike),
// as matrix-vector products. A row with less than a millionth of its length left is made zeros.
void OrthonormalRows(float* m, size_t r, size_t n, std::vector<float>& c) {
  c.resize(r);
  const int N = static_cast<int>(n);
  for (size_t i = 0; i < r; ++i) {
    float* v = m + i * n;
    const float before = Norm(v, n);
    for (int pass = 0; pass < kLowRankPasses && i > 0; ++pass) {
      const int I = static_cast<int>(i);
      Sgemm(false, false, I, 1, N, 1.0f, m, N, v, 1, 0.0f, c.data(), 1);  // c (i) = m[0:i] · v
      SgemvTrans(I, N, -1.0f, m, N, c.data(), 1.0f, v);                  // v -= m[0:i]^T · c
    }
    const float after = Norm(v, n);
    // Not `!(after > ...)`: a NaN must go on to spread rather than be zeroed.
    if (after <= before * 1e-6f) {
      std::fill(v, v + n, 0.0f);
    } else {
      const float inv = 1.0f / after;
      for (size_t k = 0; k < n; ++k) v[k] *= inv;
    }
  }
}

}  // namespace

absl::Status LowRankCodec::Directions(const float* a, size_t rows, size_t cols, size_t rank, uint64_t seed,
                                      float* directions) {
  if (absl::Status s = LoadBlas(); !s.ok()) return s;
  const int R = static_cast<int>(rank), T = static_cast<int>(rows), C = static_cast<int>(cols);
  omega_.resize(rank * cols);
  for (size_t i = 0; i < omega_.size(); ++i) omega_[i] = LowRankSign(seed, i);
  y_.resize(rank * rows);
  Sgemm(false, true, R, T, C, 1.0f, omega_.data(), C, a, C, 0.0f, y_.data(), T);  // Y^T = Ω^T · A^T
  OrthonormalRows(y_.data(), rank, rows, omega_);  // Ω is read once, then serves as scratch
  Sgemm(false, false, R, C, T, 1.0f, y_.data(), T, a, C, 0.0f, directions, C);  // Z^T = Y^T · A
  OrthonormalRows(directions, rank, cols, omega_);
  return absl::OkStatus();
}

absl::Status LowRankCodec::Encode(const float* a, size_t rows, size_t cols, size_t rank, uint64_t seed, float* out) {
  z_.resize(rank * cols);
  LH_RETURN_IF_ERROR(Directions(a, rows, cols, rank, seed, z_.data()));
  const int R = static_cast<int>(rank), T = static_cast<int>(rows), C = static_cast<int>(cols);
  float* q = out;                                                       // Q^T (rank × rows)
  LH_RETURN_IF_ERROR(Project(a, rows, cols, rank, z_.data(), q));      // Y^T = Z^T · A^T
  OrthonormalRows(q, rank, rows, omega_);
  Sgemm(false, false, R, C, T, 1.0f, q, T, a, C, 0.0f, out + rank * rows, C);  // B = Q^T · A
  return absl::OkStatus();
}

absl::Status LowRankCodec::Project(const float* a, size_t rows, size_t cols, size_t rank, const float* directions,
                                   float* out) {
  if (absl::Status s = LoadBlas(); !s.ok()) return s;
  const int R = static_cast<int>(rank), T = static_cast<int>(rows), C = static_cast<int>(cols);
  Sgemm(false, true, R, T, C, 1.0f, directions, C, a, C, 0.0f, out, T);  // out = D · A^T
  return absl::OkStatus();
}

absl::Status LowRankCodec::Decode(const float* q, const float* b, size_t rows, size_t cols, size_t rank, float* a) {
  if (absl::Status s = LoadBlas(); !s.ok()) return s;
  const int R = static_cast<int>(rank), T = static_cast<int>(rows), C = static_cast<int>(cols);
  Sgemm(true, false, T, C, R, 1.0f, q, T, b, C, 0.0f, a, C);  // A = Q · B
  return absl::OkStatus();
}

}  // namespace longhaul::cpu
