#include "optim/train_step.h"

#include <cmath>

#include "optim/grad_clip.h"

namespace longhaul {

OptimizerStepResult ApplyOptimizerStep(float* params, float* grads, size_t n, AdamW& adamw, const LrSchedule& schedule,
                                       float grad_clip, int64_t step) {
  return ApplyOptimizerStepWithNorm(params, grads, n, adamw, schedule, grad_clip, step,
                                    std::sqrt(SquaredNorm(grads, n)));
}

OptimizerStepResult ApplyOptimizerStepWithNorm(float* params, float* grads, size_t n, AdamW& adamw,
                                               const LrSchedule& schedule, float grad_clip, int64_t step,
                                               double global_norm) {
  OptimizerStepResult r;
  r.grad_norm = global_norm;
  if (!std::isfinite(r.grad_norm)) return r;
  Scale(grads, n, ClipFactor(r.grad_norm, grad_clip));
  r.lr = schedule.At(step);
  adamw.Step(params, grads, r.lr, step + 1);
  return r;
}

}  // namespace longhaul
