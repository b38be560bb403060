#include "loratrain/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::optim {

namespace {
struct Named {
  LRSchedulerType type;
  const char* name;
};
constexpr Named kNames[] = {
    {LRSchedulerType::Constant, "constant"},
    {LRSchedulerType::ConstantWithWarmup, "constant_with_warmup"},
    {LRSchedulerType::Linear, "linear"},
    {LRSchedulerType::Cosine, "cosine"},
    {LRSchedulerType::CosineWithRestarts, "cosine_with_restarts"},
};
constexpr double kPi = 3.14159265358979323846;
}  // namespace

LRSchedulerType parse_lr_scheduler(const std::string& name) {
  std::vector<std::string> all;
  for (const auto& n : kNames) {
    if (name == n.name) return n.type;
    all.emplace_back(n.name);
  }
  std::string msg = "lr_scheduler '" + name + "' is not supported (constant, constant_with_warmup, linear, cosine, "
                    "cosine_with_restarts)";
  if (auto m = closest_match(name, all)) msg += "; did you mean '" + *m + "'?";
  throw InputError(msg);
}

const char* lr_scheduler_name(LRSchedulerType type) {
  for (const auto& n : kNames) {
    if (n.type == type) return n.name;
  }
  return "?";
}

double LRSchedule::factor_at(int64_t step) const {
  if (type == LRSchedulerType::Constant) return 1.0;
  if (step < warmup_steps) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = static_cast<double>(step - warmup_steps) / decay_steps;
  switch (type) {
    case LRSchedulerType::Constant:
    case LRSchedulerType::ConstantWithWarmup:
      return 1.0;
    case LRSchedulerType::Linear:
      return std::max(0.0, static_cast<double>(total_steps - step) / decay_steps);
    case LRSchedulerType::Cosine:
      // diffusers' num_cycles = 0.5: one half-cosine from 1 down to 0 at total_steps.
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * progress)));
    case LRSchedulerType::CosineWithRestarts:
      if (progress >= 1.0) return 0.0;
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(static_cast<double>(num_cycles) * progress, 1.0))));
  }
  return 1.0;
}

}  // namespace lt::optim
