#pragma once
// What one optimizer step needs besides the parameters and gradients, and what it reports; shared
// by the parameter-server shards and by a stage that steps its own parameters (one process).
#include "optim/adamw.h"
#include "optim/lr_schedule.h"

namespace longhaul {

struct OptimizerSettings {
  AdamWConfig adamw;
  LrSchedule schedule;
  float grad_clip = 1.0f;  // global norm; 0 = no clipping
};

struct OptimizerStepResult {
  double grad_norm = 0;  // before clipping (unscaled under fp16 loss scaling)
  float lr = 0;
  bool skipped = false;  // fp16 overflow: no update this step
  float loss_scale = 1;  // after this step
};

}  // namespace longhaul
