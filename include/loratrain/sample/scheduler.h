// Sampling schedulers with one interface, each mirroring its diffusers 0.38 class step for step
// (scheduling_ddpm.py, scheduling_ddim.py, scheduling_euler_discrete.py,
// scheduling_flow_match_euler_discrete.py), including numpy's float64/float32 rounding where the
// reference computes timesteps and sigmas in numpy. Configs read a diffusers scheduler_config.json
// (keys verbatim; keys another class uses are ignored, as diffusers' from_config does).
//
// Unlike diffusers, step() takes the step *index* into timesteps() rather than a timestep value,
// and keeps no hidden step counter: a scheduler is immutable between set_timesteps() calls, except
// the multistep UniPC, which remembers its previous steps (they must come in order).
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loratrain/sample/noise.h"

namespace lt::sample {

enum class TimestepSpacing { kLinspace, kLeading, kTrailing };
TimestepSpacing timestep_spacing_from_string(std::string_view name);
const char* to_string(TimestepSpacing s);

struct StepOutput {
  at::Tensor prev_sample;           // x_{t-1}, same shape and dtype as model_output
  at::Tensor pred_original_sample;  // x0 estimate (undefined for flow matching)
};

// Extra inputs to set_timesteps for flow matching: `mu` for dynamic shifting (Flux: from the
// image sequence length, see calculate_shift) and optional explicit unshifted sigmas (the Flux
// pipeline passes linspace(1, 1/N, N)).
struct TimestepOptions {
  std::optional<double> mu;
  std::vector<double> sigmas;
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;
  virtual const char* class_name() const = 0;  // diffusers class, e.g. "DDIMScheduler"

  // Builds the inference schedule of `num_inference_steps` steps.
  virtual void set_timesteps(int64_t num_inference_steps, const TimestepOptions& options = {}) = 0;
  // [N] CPU: int64 for DDPM/DDIM, float32 for Euler and flow matching. Passed to the denoiser.
  const at::Tensor& timesteps() const { return timesteps_; }
  int64_t num_inference_steps() const { return timesteps_.defined() ? timesteps_.size(0) : 0; }
  // [N + 1] float32 CPU noise levels for sigma-parameterised schedulers; undefined otherwise.
  const at::Tensor& sigmas() const { return sigmas_; }

  // Scale of the initial noise (1 for DDPM/DDIM/flow; sqrt(sigma_max^2 + 1) or sigma_max for Euler).
  virtual double init_noise_sigma() const { return 1.0; }
  // The denoiser's input at step `step_index` (Euler divides by sqrt(sigma^2 + 1)).
  virtual at::Tensor scale_model_input(const at::Tensor& sample, int64_t step_index) const;
  // One reverse step from timesteps()[step_index]. `generator` supplies the noise of stochastic
  // steps (DDPM, DDIM with eta > 0, stochastic flow sampling); they throw when it is null.
  virtual StepOutput step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample,
                          at::Generator* generator = nullptr) const = 0;

  virtual PredictionType prediction_type() const = 0;
  virtual void set_prediction_type(PredictionType p) = 0;  // throws for a type the class lacks
  virtual int64_t num_train_timesteps() const = 0;
  // The effective config as diffusers would write scheduler_config.json.
  virtual nlohmann::json config_json() const = 0;

  // Index of timestep value `t` in timesteps() (the second match when it repeats, as diffusers).
  int64_t index_for_timestep(double t) const;

 protected:
  void check_step_index(int64_t step_index) const;
  at::Tensor timesteps_;
  at::Tensor sigmas_;
};

// ---- DDPM ----

// diffusers variance_type values with a fixed variance (fixed_large_log is left out: diffusers
// takes the square root of a negative log there; learned* need a variance-predicting model).
enum class VarianceType { kFixedSmall, kFixedSmallLog, kFixedLarge };

// Defaults are the diffusers class defaults (not SD's); see default_scheduler_config().
struct DDPMSchedulerConfig {
  NoiseScheduleConfig schedule{1000, 0.0001, 0.02, BetaSchedule::kLinear, false};
  std::vector<double> trained_betas;  // overrides the beta schedule when non-empty
  VarianceType variance_type = VarianceType::kFixedSmall;
  bool clip_sample = true;
  double clip_sample_range = 1.0;
  PredictionType prediction_type = PredictionType::kEpsilon;
  bool thresholding = false;
  double dynamic_thresholding_ratio = 0.995;
  double sample_max_value = 1.0;
  TimestepSpacing timestep_spacing = TimestepSpacing::kLeading;
  int64_t steps_offset = 0;

  static DDPMSchedulerConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

class DDPMScheduler final : public Scheduler {
 public:
  explicit DDPMScheduler(const DDPMSchedulerConfig& config = {});
  const char* class_name() const override { return "DDPMScheduler"; }
  const DDPMSchedulerConfig& config() const { return config_; }
  const at::Tensor& betas() const { return betas_; }
  const at::Tensor& alphas_cumprod() const { return alphas_cumprod_; }
  // The forward process with this scheduler's tables (diffusers DDPMScheduler.add_noise).
  at::Tensor add_noise(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& timesteps) const;

  void set_timesteps(int64_t num_inference_steps, const TimestepOptions& options = {}) override;
  StepOutput step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample,
                  at::Generator* generator = nullptr) const override;
  PredictionType prediction_type() const override { return config_.prediction_type; }
  void set_prediction_type(PredictionType p) override;
  int64_t num_train_timesteps() const override { return config_.schedule.num_train_timesteps; }
  nlohmann::json config_json() const override;

 private:
  DDPMSchedulerConfig config_;
  at::Tensor betas_, alphas_, alphas_cumprod_;
};

// ---- DDIM ----

struct DDIMSchedulerConfig {
  NoiseScheduleConfig schedule{1000, 0.0001, 0.02, BetaSchedule::kLinear, false};
  std::vector<double> trained_betas;
  bool clip_sample = true;
  double clip_sample_range = 1.0;
  bool set_alpha_to_one = true;
  int64_t steps_offset = 0;
  PredictionType prediction_type = PredictionType::kEpsilon;
  bool thresholding = false;
  double dynamic_thresholding_ratio = 0.995;
  double sample_max_value = 1.0;
  TimestepSpacing timestep_spacing = TimestepSpacing::kLeading;

  static DDIMSchedulerConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

class DDIMScheduler final : public Scheduler {
 public:
  explicit DDIMScheduler(const DDIMSchedulerConfig& config = {});
  const char* class_name() const override { return "DDIMScheduler"; }
  const DDIMSchedulerConfig& config() const { return config_; }
  const at::Tensor& alphas_cumprod() const { return alphas_cumprod_; }
  // Stochasticity of the step (0 = deterministic DDIM, 1 = DDPM-like); default 0.
  void set_eta(double eta) { eta_ = eta; }
  double eta() const { return eta_; }

  void set_timesteps(int64_t num_inference_steps, const TimestepOptions& options = {}) override;
  StepOutput step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample,
                  at::Generator* generator = nullptr) const override;
  PredictionType prediction_type() const override { return config_.prediction_type; }
  void set_prediction_type(PredictionType p) override;
  int64_t num_train_timesteps() const override { return config_.schedule.num_train_timesteps; }
  nlohmann::json config_json() const override;

 private:
  DDIMSchedulerConfig config_;
  at::Tensor alphas_cumprod_;
  float final_alpha_cumprod_ = 1.0f;
  double eta_ = 0.0;
};

// ---- Euler (k-diffusion Algorithm 2, deterministic: s_churn = 0) ----

struct EulerDiscreteSchedulerConfig {
  NoiseScheduleConfig schedule{1000, 0.0001, 0.02, BetaSchedule::kLinear, false};
  std::vector<double> trained_betas;
  PredictionType prediction_type = PredictionType::kEpsilon;
  std::string interpolation_type = "linear";  // or "log_linear"
  bool use_karras_sigmas = false;
  bool use_exponential_sigmas = false;
  std::optional<double> sigma_min;
  std::optional<double> sigma_max;
  TimestepSpacing timestep_spacing = TimestepSpacing::kLinspace;
  std::string timestep_type = "discrete";  // or "continuous" (v-prediction EDM-style models)
  int64_t steps_offset = 0;
  std::string final_sigmas_type = "zero";  // or "sigma_min"

  static EulerDiscreteSchedulerConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

class EulerDiscreteScheduler final : public Scheduler {
 public:
  explicit EulerDiscreteScheduler(const EulerDiscreteSchedulerConfig& config = {});
  const char* class_name() const override { return "EulerDiscreteScheduler"; }
  const EulerDiscreteSchedulerConfig& config() const { return config_; }
  const at::Tensor& alphas_cumprod() const { return alphas_cumprod_; }

  void set_timesteps(int64_t num_inference_steps, const TimestepOptions& options = {}) override;
  double init_noise_sigma() const override;
  at::Tensor scale_model_input(const at::Tensor& sample, int64_t step_index) const override;
  StepOutput step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample,
                  at::Generator* generator = nullptr) const override;
  PredictionType prediction_type() const override { return config_.prediction_type; }
  void set_prediction_type(PredictionType p) override;
  int64_t num_train_timesteps() const override { return config_.schedule.num_train_timesteps; }
  nlohmann::json config_json() const override;

 private:
  EulerDiscreteSchedulerConfig config_;
  at::Tensor alphas_cumprod_;
};

// ---- Flow matching Euler (SD3, Flux, Wan) ----

struct FlowMatchEulerDiscreteSchedulerConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  bool invert_sigmas = false;
  std::optional<double> shift_terminal;
  bool use_karras_sigmas = false;
  bool use_exponential_sigmas = false;
  std::string time_shift_type = "exponential";  // or "linear"
  bool stochastic_sampling = false;

  static FlowMatchEulerDiscreteSchedulerConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

// Flux's mu for an image of `image_seq_len` latent tokens: a line through (base_seq_len,
// base_shift) and (max_seq_len, max_shift) (diffusers pipeline_flux.calculate_shift).
double calculate_shift(int64_t image_seq_len, int64_t base_seq_len = 256, int64_t max_seq_len = 4096,
                       double base_shift = 0.5, double max_shift = 1.15);

class FlowMatchEulerDiscreteScheduler final : public Scheduler {
 public:
  explicit FlowMatchEulerDiscreteScheduler(const FlowMatchEulerDiscreteSchedulerConfig& config = {});
  const char* class_name() const override { return "FlowMatchEulerDiscreteScheduler"; }
  const FlowMatchEulerDiscreteSchedulerConfig& config() const { return config_; }
  // calculate_shift with this config's base/max values.
  double mu_for_image_seq_len(int64_t image_seq_len) const;
  // Training-time forward process x_t = sigma * noise + (1 - sigma) * x0; sigma [B] in [0, 1].
  static at::Tensor scale_noise(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& sigma);

  // With use_dynamic_shifting, options.mu is required.
  void set_timesteps(int64_t num_inference_steps, const TimestepOptions& options = {}) override;
  StepOutput step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample,
                  at::Generator* generator = nullptr) const override;
  PredictionType prediction_type() const override { return PredictionType::kFlow; }
  void set_prediction_type(PredictionType p) override;
  int64_t num_train_timesteps() const override { return config_.num_train_timesteps; }
  nlohmann::json config_json() const override;

 private:
  FlowMatchEulerDiscreteSchedulerConfig config_;
  double sigma_min_ = 0, sigma_max_ = 1;  // of the training schedule, as float32 values
};

// ---- UniPC multistep with flow sigmas (Wan) ----

// The part of diffusers' UniPCMultistepScheduler the Wan pipelines use: use_flow_sigmas with a
// static flow_shift, flow_prediction with predict_x0, the B(h) predictor/corrector of order
// solver_order. The VP (beta schedule) variants and dynamic shifting are refused at load.
struct UniPCMultistepSchedulerConfig {
  int64_t num_train_timesteps = 1000;
  int64_t solver_order = 2;
  double flow_shift = 1.0;
  std::string solver_type = "bh2";             // or "bh1"
  bool lower_order_final = true;
  std::string final_sigmas_type = "zero";      // or "sigma_min"
  std::vector<int64_t> disable_corrector;      // step indices whose corrector is skipped

  // Reads a diffusers scheduler config; the keys of features left out must keep their defaults
  // (use_flow_sigmas must be true and prediction_type flow_prediction).
  static UniPCMultistepSchedulerConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

// Multistep: step(i) uses the model outputs of the steps before it, so after set_timesteps() the
// steps must come in order 0, 1, 2, ... (a step out of order throws). Timesteps are int64: the
// shifted sigma * num_train_timesteps truncated, as diffusers casts them.
class UniPCMultistepScheduler final : public Scheduler {
 public:
  explicit UniPCMultistepScheduler(const UniPCMultistepSchedulerConfig& config = {});
  const char* class_name() const override { return "UniPCMultistepScheduler"; }
  const UniPCMultistepSchedulerConfig& config() const { return config_; }
  // options.sigmas: unshifted sigmas to use instead of linspace(1, 1/T, N + 1)[:-1]; mu is refused.
  void set_timesteps(int64_t num_inference_steps, const TimestepOptions& options = {}) override;
  StepOutput step(const at::Tensor& model_output, int64_t step_index, const at::Tensor& sample,
                  at::Generator* generator = nullptr) const override;
  PredictionType prediction_type() const override { return PredictionType::kFlow; }
  void set_prediction_type(PredictionType p) override;
  int64_t num_train_timesteps() const override { return config_.num_train_timesteps; }
  nlohmann::json config_json() const override;

 private:
  // (x, order) -> x at the next sigma (UniP), or the corrected x at this sigma (UniC).
  at::Tensor predictor(const at::Tensor& x, int64_t i, int64_t order) const;
  at::Tensor corrector(const at::Tensor& model_x0, const at::Tensor& last_sample, const at::Tensor& this_sample,
                       int64_t i, int64_t order) const;
  at::Tensor lambda(int64_t sigma_index) const;  // log(alpha) - log(sigma), alpha = 1 - sigma

  UniPCMultistepSchedulerConfig config_;
  // The multistep history, reset by set_timesteps (newest last).
  mutable std::vector<at::Tensor> model_outputs_;
  mutable at::Tensor last_sample_;
  mutable int64_t lower_order_nums_ = 0;
  mutable int64_t this_order_ = 0;
  mutable int64_t next_step_ = 0;
};

// ---- Construction ----

// The samplers users name in configs (AI Toolkit `sample.sampler` / `train.noise_scheduler`,
// kohya `--sample_sampler`).
enum class SamplerKind { kDDPM, kDDIM, kEuler, kFlowMatch, kUniPC };
// "ddpm", "ddim", "euler" (also "k_euler"), "flowmatch" (also "flow_match", "flowmatch_euler"),
// "unipc" (flow sigmas only), or a diffusers class name. Names of samplers the reference tools know but this project does not
// implement (euler_a, dpmsolver, lms, pndm, heun, ...) and unknown names throw lt::InputError
// listing the supported ones.
SamplerKind sampler_kind_from_name(std::string_view name);
const char* to_string(SamplerKind k);  // "ddpm", "ddim", "euler", "flowmatch", "unipc"

// Builds `kind` from a diffusers scheduler config (possibly another class's, e.g. the model's
// PNDMScheduler config: shared keys carry over, like diffusers' X.from_config(other.config)).
std::unique_ptr<Scheduler> make_scheduler(SamplerKind kind, const nlohmann::json& config);
// Builds the class named by config["_class_name"].
std::unique_ptr<Scheduler> make_scheduler_from_config(const nlohmann::json& config);
// Reads a scheduler_config.json; `kind` overrides its class.
std::unique_ptr<Scheduler> load_scheduler(const std::filesystem::path& scheduler_config_json,
                                          std::optional<SamplerKind> kind = std::nullopt);

// The reference scheduler config of a model family: "sd15" (and "sd15_v" / "sd2_v" for
// v-prediction), "sdxl", "flux" (FLUX.1-dev: dynamic shifting), "flux_schnell" (shift 1),
// "wan" (Wan 2.1's diffusers UniPC config, flow_shift 3, with the flow-match Euler shift 3 of
// AI Toolkit's Wan 2.1 beside it).
nlohmann::json default_scheduler_config(std::string_view family);

}  // namespace lt::sample
