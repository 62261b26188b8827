#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace longhaul {

float LrSchedule::At(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  return static_cast<float>(min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress)));
}

}  // namespace longhaul
