#pragma once
// The outer optimizer of local updates (DiLoCo): SGD with Nesterov momentum over the replicas'
// averaged change since the last exchange, as torch.optim.SGD(nesterov=True) steps it.
#include <cstddef>

namespace longhaul {

// m = momentum·m + g; params -= lr·(g + momentum·m), over n elements.
void NesterovStep(float* params, const float* g, float* m, size_t n, float lr, float momentum);

}  // namespace longhaul
