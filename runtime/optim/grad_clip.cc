#include "optim/grad_clip.h"

#include <omp.h>

#include <algorithm>
#include <vector>

namespace longhaul {

double SquaredNorm(const float* g, size_t n) {
  // Fixed chunks, each summed by one thread, then the chunks in order: same bits on every run.
  constexpr size_t kChunk = 1 << 16;
  const long chunks = static_cast<long>((n + kChunk - 1) / kChunk);
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (long c = 0; c < chunks; ++c) {
    const size_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0.0;
    for (size_t i = lo; i < hi; ++i) s += static_cast<double>(g[i]) * g[i];
    partial[c] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

float ClipFactor(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

void Scale(float* g, size_t n, float factor) {
  if (factor == 1.0f) return;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) g[i] *= factor;
}

}  // namespace longhaul
