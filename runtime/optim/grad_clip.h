#pragma once
// Global gradient-norm clipping, split in two so a distributed run can add the squared norms of
// every stage before deciding the scale.
#include <cstddef>

namespace longhaul {

// Σ g² over n floats, summed in a fixed order (deterministic for a given thread count).
double SquaredNorm(const float* g, size_t n);

// The factor torch.nn.utils.clip_grad_norm_ applies: min(1, max_norm / (norm + 1e-6)).
// max_norm <= 0 disables clipping (factor 1).
float ClipFactor(double norm, float max_norm);

void Scale(float* g, size_t n, float factor);

}  // namespace longhaul
