#pragma once
// Linear warmup then cosine decay to min_lr.
#include <cstdint>

namespace longhaul {

struct LrSchedule {
  float lr = 3e-4f;
  float min_lr = 3e-5f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // Learning rate of optimizer step `step` (0-based): lr·(step+1)/warmup during warmup, then
  // min_lr + ½(lr − min_lr)(1 + cos(π·progress)) with progress from 0 to 1 over the remaining steps.
  float At(int64_t step) const;
};

}  // namespace longhaul
