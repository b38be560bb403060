// The exponential moving average of the trained adapter weights (train.ema_config), as AI Toolkit
// keeps it (toolkit/ema.py ExponentialMovingAverage, built by its trainer without use_num_updates):
// after every optimizer step,
//     tmp = (average - weights) * (1 - decay);  average -= tmp
// from the first step on: no warm-up, no bias correction. Optionally the live weights are then
// pulled toward the average (use_feedback: weights += 10 * tmp) and scaled (param_multiplier).
// Saved adapters and previews use the average; training continues on the live weights.
//
// Differences from AI Toolkit, both only for adapters not kept in fp32: the average is always
// fp32 (AI Toolkit keeps it in the adapter's dtype with stochastic rounding), and weights changed
// by feedback/multiplier are rounded to nearest. For fp32 adapters every value is bit-identical.
//
// Like the optimizers, update() is all-or-nothing: it computes every new value into fresh tensors
// (the only phase that allocates or can throw, e.g. an OOM) and then commits them, so a failure
// leaves the average and the weights as they were.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "loratrain/optim/optimizer.h"  // NamedTensors

namespace lt::optim {

struct EMAOptions {
  double decay = 0.999;           // train.ema_config.ema_decay, in [0, 1]
  bool use_feedback = false;      // train.ema_config.use_feedback
  double param_multiplier = 1.0;  // train.ema_config.param_multiplier
};

class AdapterEMA {
 public:
  // `params`: the trainable adapter tensors (those the optimizer steps, same order). The average
  // starts as an fp32 copy of their current values.
  explicit AdapterEMA(std::vector<at::Tensor> params, EMAOptions options = {});
  AdapterEMA(const AdapterEMA&) = delete;
  AdapterEMA& operator=(const AdapterEMA&) = delete;

  // Call after each optimizer step (not after accumulation micro-batches), with the live weights
  // in place.
  void update();

  // Puts the average into the adapter tensors and keeps the live values aside (one copy of the
  // adapter); restore_live() puts the live values back bit-identically. Prefer AverageScope.
  void swap_in_average();
  void restore_live();
  bool average_in_place() const { return !live_.empty(); }

  // The average in place for the scope's lifetime (saving, previews). A scope opened while the
  // average is already in place does nothing, so scopes nest.
  class AverageScope {
   public:
    explicit AverageScope(AdapterEMA& ema);
    ~AverageScope();
    AverageScope(const AverageScope&) = delete;
    AverageScope& operator=(const AverageScope&) = delete;

   private:
    AdapterEMA& ema_;
    bool swapped_;
  };

  const EMAOptions& options() const { return options_; }
  int64_t updates() const { return updates_; }                  // update() calls so far
  const std::vector<at::Tensor>& average() const { return average_; }  // fp32, one per parameter
  int64_t state_bytes() const;                                  // memory the average holds

  // The resumable state: "<param index>.average" (fp32) per parameter and "updates". The live
  // weights are not in it (they are the adapter's own). load_state_dict() restores it
  // bit-identically; it checks names, shapes and dtypes first and throws lt::InputError listing
  // every problem, changing nothing, when they do not match.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> average_;
  std::vector<at::Tensor> live_;  // the live weights while the average is in place
  EMAOptions options_;
  int64_t updates_ = 0;
};

}  // namespace lt::optim
