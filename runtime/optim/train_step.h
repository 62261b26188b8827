#pragma once
// The two halves of one optimizer step in a single process, shared by the trainer and the tests.
#include <cstdint>
#include <vector>

#include "model/micro_batch.h"
#include "model/gpt_stage.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer_settings.h"

namespace longhaul {

// Zeroes the gradients, runs forward and backward of every micro-batch (each scaled by 1/M) and
// returns the mean micro-batch loss. The stage must hold the whole model.
double AccumulateGradients(GptStage& stage, GptStage::Activations& act, const std::vector<MicroBatch>& micro_batches);

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
