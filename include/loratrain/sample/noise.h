// Training-side noise math for DDPM-family models (SD1.5, SDXL): the beta schedule, the forward
// process, prediction targets, noise offset, seeded timestep sampling, Min-SNR loss weights.
// Mirrors diffusers 0.38 `DDPMScheduler` (betas, alphas_cumprod, add_noise, get_velocity),
// diffusers `training_utils.compute_snr`, and kohya sd-scripts `custom_train_functions`
// (apply_snr_weight, apply_debiased_estimation, apply_noise_offset) in float32, so the numbers are
// the reference's own.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace lt::sample {

// diffusers `beta_schedule` values that are implemented.
enum class BetaSchedule { kLinear, kScaledLinear, kSquaredCosCapV2 };
BetaSchedule beta_schedule_from_string(std::string_view name);  // throws lt::InputError
const char* to_string(BetaSchedule s);                          // "scaled_linear", ...

// What the denoiser predicts (diffusers `prediction_type`; AI Toolkit `model.is_v_pred`).
// kFlow: the rectified-flow velocity noise - x0 of flow-matching models (Flux, SD3, Wan).
enum class PredictionType { kEpsilon, kVPrediction, kSample, kFlow };
// "epsilon", "v_prediction", "sample", "flow_prediction"
PredictionType prediction_type_from_string(std::string_view name);
const char* to_string(PredictionType p);

// The DDPM schedule's config keys (diffusers names); defaults are Stable Diffusion 1.x/2.x/XL's.
struct NoiseScheduleConfig {
  int64_t num_train_timesteps = 1000;
  double beta_start = 0.00085;
  double beta_end = 0.012;
  BetaSchedule beta_schedule = BetaSchedule::kScaledLinear;
  bool rescale_betas_zero_snr = false;  // Lin et al. 2023 (kohya --zero_terminal_snr)
};

// betas [T] float32, exactly as diffusers builds them (linspace in float32; scaled_linear squares
// a linspace of square roots; squaredcos_cap_v2 is the Glide cosine in float64 then float32).
at::Tensor make_betas(const NoiseScheduleConfig& config);
// Rescales betas so that the last timestep has zero SNR (diffusers `rescale_zero_terminal_snr`).
at::Tensor rescale_zero_terminal_snr(const at::Tensor& betas);

// The forward diffusion process q(x_t | x_0) used to build training examples. All tables are
// float32 CPU tensors of length T; per-sample inputs may live on any device and dtype (tables are
// moved and cast to them like diffusers does).
class NoiseSchedule {
 public:
  explicit NoiseSchedule(const NoiseScheduleConfig& config = {});

  const NoiseScheduleConfig& config() const { return config_; }
  int64_t num_train_timesteps() const { return config_.num_train_timesteps; }
  const at::Tensor& betas() const { return betas_; }                    // [T]
  const at::Tensor& alphas() const { return alphas_; }                  // [T] 1 - beta
  const at::Tensor& alphas_cumprod() const { return alphas_cumprod_; }  // [T] alpha-bar

  // x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise. x0, noise [B, ...]; timesteps [B] int64.
  at::Tensor add_noise(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& timesteps) const;
  // v = sqrt(abar_t) noise - sqrt(1 - abar_t) x0 (the v-prediction target).
  at::Tensor get_velocity(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& timesteps) const;
  // The regression target for `prediction`: noise (epsilon), velocity, x0 (sample), or
  // noise - x0 (flow).
  at::Tensor target(PredictionType prediction, const at::Tensor& x0, const at::Tensor& noise,
                    const at::Tensor& timesteps) const;

  // SNR_t = abar_t / (1 - abar_t) for every t: [T] float32 (kohya `all_snr`).
  const at::Tensor& all_snr() const { return all_snr_; }
  // SNR of each sample's timestep: [B] float32 on timesteps' device.
  at::Tensor snr(const at::Tensor& timesteps) const;

  // Min-SNR-gamma per-sample loss weights [B] float32 (Hang et al. 2023; kohya apply_snr_weight,
  // diffusers --snr_gamma): min(SNR, gamma) / SNR for epsilon, min(SNR, gamma) / (SNR + 1) for
  // v-prediction (sample prediction uses the epsilon form). gamma must be > 0; flow throws.
  // AI Toolkit's own apply_snr_weight differs for v-prediction (it uses the epsilon form there);
  // this follows kohya and diffusers.
  at::Tensor min_snr_weights(const at::Tensor& timesteps, double gamma, PredictionType prediction) const;
  // kohya --debiased_estimation_loss weights [B]: 1/sqrt(SNR) (epsilon) or 1/(SNR+1) (v), SNR
  // clamped to 1000 so t = 0 stays finite.
  at::Tensor debiased_estimation_weights(const at::Tensor& timesteps, PredictionType prediction) const;

 private:
  NoiseScheduleConfig config_;
  at::Tensor betas_, alphas_, alphas_cumprod_, all_snr_;
};

// ---- Seeded randomness (own generators, never the global one) ----

// A CPU generator seeded like torch.Generator().manual_seed(seed): the same seed gives the same
// draws as PyTorch on CPU. Its state can be saved and restored for bit-identical resume.
at::Generator make_generator(uint64_t seed);
at::Tensor generator_state(const at::Generator& generator);  // uint8 CPU tensor (copy)
void set_generator_state(at::Generator& generator, const at::Tensor& state);

// Standard normal noise of `shape`, drawn on the CPU from `generator` in float32 and then moved to
// `device`/`dtype` (diffusers `randn_tensor` with a CPU generator): identical on every device.
at::Tensor randn(at::IntArrayRef shape, at::Generator& generator, at::ScalarType dtype = at::kFloat,
                 at::Device device = at::kCPU);

// noise + offset * N(0, 1) of shape [B, C, 1, 1(, 1)]: one random shift per sample and channel
// (Guttenberg's offset noise; AI Toolkit / kohya `apply_noise_offset`). |offset| < 1e-6 returns
// `noise` unchanged and draws nothing (AI Toolkit's test).
at::Tensor apply_noise_offset(const at::Tensor& noise, double offset, at::Generator& generator);

// Timesteps uniform in [min_timestep, max_timestep): int64 [batch] (torch.randint, kohya
// get_timesteps). min == max gives a constant batch of max (kohya).
at::Tensor sample_timesteps(int64_t batch, at::Generator& generator, int64_t min_timestep = 0,
                            int64_t max_timestep = 1000);

// One training example's noise, drawn in kohya's order (noise, then offset, then timesteps) so a
// restored generator state replays the same batch.
struct TrainingNoiseOptions {
  double noise_offset = 0.0;
  int64_t min_timestep = 0;
  int64_t max_timestep = 1000;  // exclusive
};
struct TrainingNoise {
  at::Tensor noise;          // like latents (with offset applied)
  at::Tensor timesteps;      // [B] int64, on latents' device
  at::Tensor noisy_latents;  // add_noise(latents, noise, timesteps)
};
TrainingNoise make_training_noise(const NoiseSchedule& schedule, const at::Tensor& latents,
                                  at::Generator& generator, const TrainingNoiseOptions& options = {});

// ---- Loss ----

// Mean squared error per sample: [B] float32, mean over every dim but the first, computed in
// float32 whatever the inputs' dtype (kohya: loss(pred.float(), target.float(), "none").mean(dims)).
at::Tensor mse_loss_per_sample(const at::Tensor& prediction, const at::Tensor& target);
// mean_b(per_sample[b] * weights[b]); undefined `weights` means plain mean. Scalar float32.
at::Tensor weighted_mean(const at::Tensor& per_sample, const at::Tensor& weights = {});

}  // namespace lt::sample
