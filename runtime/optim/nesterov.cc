#include "optim/nesterov.h"

namespace longhaul {

void NesterovStep(float* params, const float* g, float* m, size_t n, float lr, float momentum) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    m[i] = momentum * m[i] + g[i];
    params[i] -= lr * (g[i] + momentum * m[i]);
  }
}

}  // namespace longhaul
