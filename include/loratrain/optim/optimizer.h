// Optimizers for the adapter parameters: AdamW (torch.optim.AdamW), AdamW8bit (bitsandbytes'
// block-wise 8-bit states) and Adafactor (transformers.optimization.Adafactor), over LibTorch ops.
//
// Every step is all-or-nothing: step() first computes every new parameter and state value into
// fresh tensors (the only phase that allocates and the only one that can throw, e.g. an OOM), then
// commits them: parameters with copy_ into the existing storage (same shape, dtype and device, no
// allocation) and states by swapping tensor handles. A failure in the first phase leaves
// parameters, states and step counters exactly as they were, so the OOM guard can retry the step.
// The price is one transient copy of the parameters and states, small for LoRA adapters.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lt::optim {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class Optimizer {
 public:
  explicit Optimizer(std::vector<at::Tensor> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual const char* name() const = 0;  // "adamw", "adamw8bit", "adafactor"

  // One update from each parameter's .grad() with learning rate `lr` (parameters without a
  // gradient are skipped and their step count does not advance, as in torch.optim).
  void step(double lr);
  void zero_grad();  // resets gradients to undefined (set_to_none, as torch's default)

  const std::vector<at::Tensor>& params() const { return params_; }
  // Per-parameter learning-rate factors (default 1): parameter i is stepped with lr * scale[i]
  // (e.g. text_encoder_lr / lr for text-encoder adapters, so one schedule drives both groups).
  void set_lr_scales(std::vector<double> scales);
  int64_t steps_taken() const { return steps_taken_; }  // completed step() calls

  // Every state tensor under a stable name ("<param index>.<state name>", plus "steps_taken");
  // load_state_dict() restores them bit-identically. It checks names, shapes and dtypes first and
  // throws lt::InputError listing every problem, changing nothing, when they do not match.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

  // Bytes held by the optimizer state (what the 8-bit variant saves memory on).
  int64_t state_bytes() const;

  // Test hook: called in the compute phase before each parameter's update (argument: parameter
  // index); throwing from it simulates a failure in the middle of a step.
  std::function<void(size_t)> before_param_update;

 protected:
  // The state of one parameter, by name (e.g. "exp_avg", "step"); empty until its first update.
  using ParamState = std::map<std::string, at::Tensor>;

  // Computes the new parameter value (fp32 or param dtype, same shape) and the new state into
  // fresh tensors; must not modify `param`, `grad` or `state`.
  virtual void compute_update(const at::Tensor& param, const at::Tensor& grad, const ParamState& state,
                              double lr, at::Tensor& new_param, ParamState& new_state) = 0;

 private:
  std::vector<at::Tensor> params_;
  std::vector<ParamState> state_;
  std::vector<double> lr_scales_;
  int64_t steps_taken_ = 0;
};

// torch.optim.AdamW (amsgrad off). Defaults follow AI Toolkit's `adamw` (eps 1e-6) over torch's
// betas (0.9, 0.999) and weight_decay 0.01.
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<at::Tensor> params, AdamWOptions options = {});
  const char* name() const override { return "adamw"; }
  const AdamWOptions& options() const { return options_; }

 protected:
  void compute_update(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, double lr,
                      at::Tensor& new_param, ParamState& new_state) override;

 private:
  AdamWOptions options_;
};

// bitsandbytes.optim.AdamW8bit (block-wise, optim_bits 8): both moments stored as uint8 codes into
// the dynamic quantisation maps (signed for exp_avg, unsigned for exp_avg_sq) with one fp32 absmax
// per block of 256 values; parameters with fewer than min_8bit_size elements keep fp32 states.
// Each step dequantises, applies the AdamW update in fp32 and requantises to the nearest map entry.
// Defaults: AI Toolkit passes eps 1e-6 to bitsandbytes (whose own default is 1e-8).
struct AdamW8bitOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  int64_t min_8bit_size = 4096;
  int64_t block_size = 256;
};

class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(std::vector<at::Tensor> params, AdamW8bitOptions options = {});
  const char* name() const override { return "adamw8bit"; }
  const AdamW8bitOptions& options() const { return options_; }

 protected:
  void compute_update(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, double lr,
                      at::Tensor& new_param, ParamState& new_state) override;

 private:
  AdamW8bitOptions options_;
  at::Tensor qmap_signed_;    // [256] fp32, sorted
  at::Tensor qmap_unsigned_;  // [256] fp32, sorted
};

// transformers.optimization.Adafactor. For LoRA, AI Toolkit's defaults: relative_step, scale_parameter
// and warmup_init off, so the given lr is used as is; beta1 off (no first moment) unless > 0.
struct AdafactorOptions {
  double eps1 = 1e-30;  // added to grad^2
  double eps2 = 1e-3;   // floor of the parameter RMS when scale_parameter is on
  double clip_threshold = 1.0;
  double decay_rate = -0.8;
  double beta1 = 0.0;  // 0 = None (no first moment)
  double weight_decay = 0.0;
  bool scale_parameter = false;
  bool relative_step = false;
  bool warmup_init = false;
};

class Adafactor : public Optimizer {
 public:
  Adafactor(std::vector<at::Tensor> params, AdafactorOptions options = {});
  const char* name() const override { return "adafactor"; }
  const AdafactorOptions& options() const { return options_; }

 protected:
  void compute_update(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, double lr,
                      at::Tensor& new_param, ParamState& new_state) override;

 private:
  AdafactorOptions options_;
};

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): 256 sorted fp32
// values in [-1, 1] (signed) or [0, 1] (unsigned), dense near zero.
at::Tensor create_dynamic_map(bool is_signed);

// Block-wise quantisation as the 8-bit optimizer stores its states: codes (uint8, x's shape) are
// the nearest entries of `qmap` to x / absmax of their block; absmax is [ceil(numel / block)] fp32.
std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& x, const at::Tensor& qmap, int64_t block);
at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& qmap,
                                int64_t block);

// Optimizer by AI Toolkit name ("adamw", "adamw8bit", "adafactor"; case-insensitive) with
// `optimizer_params` as in the YAML (scalars are one-element lists; booleans 0/1; "betas" takes two).
// Unknown names or keys throw lt::InputError naming the closest valid one.
using OptimizerParams = std::map<std::string, std::vector<double>>;
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<at::Tensor> params,
                                          const OptimizerParams& optimizer_params = {});

// torch.nn.utils.clip_grad_norm_ over all gradients (2-norm of the per-tensor 2-norms): when
// max_norm > 0 and the total exceeds it, every gradient is scaled by max_norm / (total + 1e-6).
// Returns the total norm before clipping (inf/nan are returned as they are, nothing is scaled).
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace lt::optim
