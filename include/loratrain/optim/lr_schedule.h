// Learning-rate schedules as a pure function of the optimizer step, with the formulas of diffusers'
// get_scheduler (which kohya sd-scripts uses): linear warmup from 0, then constant, linear decay to 0,
// half-cosine to 0, or hard-restart cosine. `step` counts completed optimizer steps (0 for the first
// update), as torch's LambdaLR does, so with warmup the first update uses lr 0.
//
// AI Toolkit's own `cosine` and `linear` differ (cosine spans `steps` after the warmup; `linear` is
// torch's LinearLR whose defaults ramp from lr/3 up to lr); docs/config-reference states ours.
#pragma once
#include <cstdint>
#include <string>

namespace lt::optim {

enum class LRSchedulerType { Constant, ConstantWithWarmup, Linear, Cosine, CosineWithRestarts };

// "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts"; anything else
// throws lt::InputError naming the closest valid value.
LRSchedulerType parse_lr_scheduler(const std::string& name);
const char* lr_scheduler_name(LRSchedulerType type);

struct LRSchedule {
  LRSchedulerType type = LRSchedulerType::Constant;
  double lr = 1e-4;           // base learning rate
  int64_t warmup_steps = 0;   // linear ramp 0 -> lr over these steps (ignored by `constant`)
  int64_t total_steps = 1;    // training steps (decay end for linear/cosine)
  int64_t num_cycles = 1;     // cosine_with_restarts only

  double factor_at(int64_t step) const;  // lr multiplier in [0, 1]
  double lr_at(int64_t step) const { return lr * factor_at(step); }
};

}  // namespace lt::optim
