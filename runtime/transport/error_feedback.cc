#include "transport/error_feedback.h"

#include <algorithm>

namespace longhaul {

const float* ErrorFeedback::Apply(const float* g, size_t n, float* rounded) {
  if (residual_.size() != n) residual_.assign(n, 0.0f);
  out_.resize(n);
  for (size_t i = 0; i < n; ++i) out_[i] = g[i] + residual_[i];
  std::copy(out_.begin(), out_.end(), residual_.begin());
  RoundThroughWire(residual_.data(), residual_.data(), n, dtype_);
  if (rounded != nullptr) std::copy(residual_.begin(), residual_.end(), rounded);
  for (size_t i = 0; i < n; ++i) residual_[i] = out_[i] - residual_[i];
  return out_.data();
}

}  // namespace longhaul
