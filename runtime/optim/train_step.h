#pragma once
// The optimizer's half of one step over a flat buffer, shared by a stage that steps its own
// parameters and by the parameter-server shards (the gradients' half is the stage's; on the CPU in
// one process, cpu/gpt_stage.h AccumulateGradients).
#include <cstddef>
#include <cstdint>

#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer_settings.h"

namespace longhaul {

// Clips the global gradient norm to grad_clip, then applies AdamW at the scheduled rate of
// optimizer step `step` (0-based).
OptimizerStepResult ApplyOptimizerStep(float* params, float* grads, size_t n, AdamW& adamw, const LrSchedule& schedule,
                                       float grad_clip, int64_t step);
// The same with the global norm given: a parameter-server shard holds only part of the gradient,
// and the norm is reduced over every shard of every stage first.
OptimizerStepResult ApplyOptimizerStepWithNorm(float* params, float* grads, size_t n, AdamW& adamw,
                                               const LrSchedule& schedule, float grad_clip, int64_t step,
                                               double global_norm);

}  // namespace longhaul
