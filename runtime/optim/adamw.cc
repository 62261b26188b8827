#include "optim/adamw.h"

#include <cmath>
#include <utility>

namespace longhaul {

AdamW::AdamW(const AdamWConfig& cfg, std::vector<uint8_t> decay, size_t begin)
    : cfg_(cfg),
      begin_(begin),
      end_(begin + decay.size()),
      m_(decay.size(), 0.0f),
      v_(decay.size(), 0.0f),
      decay_(std::move(decay)) {}

void AdamW::Step(float* params, const float* grads, float lr, int64_t step) {
  const float b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float bc2_sqrt = std::sqrt(1.0f - std::pow(b2, static_cast<float>(step)));
  const float step_size = lr / bc1;
  const float decay_factor = 1.0f - lr * cfg_.weight_decay;
  const long n = static_cast<long>(end_ - begin_);
  float* p = params + begin_;
  const float* g = grads + begin_;
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m_[i] = b1 * m_[i] + (1.0f - b1) * gi;
    const float vi = v_[i] = b2 * v_[i] + (1.0f - b2) * gi * gi;
    float pi = decay_[i] ? p[i] * decay_factor : p[i];
    p[i] = pi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

}  // namespace longhaul
