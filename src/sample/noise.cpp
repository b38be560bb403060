#include "loratrain/sample/noise.h"

#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::sample {

BetaSchedule beta_schedule_from_string(std::string_view name) {
  if (name == "linear") return BetaSchedule::kLinear;
  if (name == "scaled_linear") return BetaSchedule::kScaledLinear;
  if (name == "squaredcos_cap_v2") return BetaSchedule::kSquaredCosCapV2;
  std::string msg = "unsupported beta_schedule '" + std::string(name) +
                    "' (supported: linear, scaled_linear, squaredcos_cap_v2)";
  if (auto m = closest_match(name, {"linear", "scaled_linear", "squaredcos_cap_v2"}))
    msg += "; did you mean '" + *m + "'?";
  throw InputError(msg);
}

const char* to_string(BetaSchedule s) {
  switch (s) {
    case BetaSchedule::kLinear: return "linear";
    case BetaSchedule::kScaledLinear: return "scaled_linear";
    case BetaSchedule::kSquaredCosCapV2: return "squaredcos_cap_v2";
  }
  return "?";
}

PredictionType prediction_type_from_string(std::string_view name) {
  if (name == "epsilon") return PredictionType::kEpsilon;
  if (name == "v_prediction") return PredictionType::kVPrediction;
  if (name == "sample") return PredictionType::kSample;
  if (name == "flow_prediction") return PredictionType::kFlow;
  throw InputError("unsupported prediction_type '" + std::string(name) +
                   "' (supported: epsilon, v_prediction, sample, flow_prediction)");
}

const char* to_string(PredictionType p) {
  switch (p) {
    case PredictionType::kEpsilon: return "epsilon";
    case PredictionType::kVPrediction: return "v_prediction";
    case PredictionType::kSample: return "sample";
    case PredictionType::kFlow: return "flow_prediction";
  }
  return "?";
}

at::Tensor make_betas(const NoiseScheduleConfig& c) {
  if (c.num_train_timesteps < 2) throw InputError("num_train_timesteps must be at least 2");
  at::Tensor betas;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  switch (c.beta_schedule) {
    case BetaSchedule::kLinear:
      betas = torch::linspace(c.beta_start, c.beta_end, c.num_train_timesteps, f32);
      break;
    case BetaSchedule::kScaledLinear:
      // The latent-diffusion schedule: square a float32 linspace of square roots.
      betas = torch::linspace(std::pow(c.beta_start, 0.5), std::pow(c.beta_end, 0.5),
                              c.num_train_timesteps, f32)
                  .pow(2);
      break;
    case BetaSchedule::kSquaredCosCapV2: {
      // Glide cosine: alpha_bar(t) = cos^2((t + 0.008) / 1.008 * pi / 2), beta capped at 0.999.
      auto alpha_bar = [](double t) {
        double v = std::cos((t + 0.008) / 1.008 * M_PI / 2);
        return v * v;
      };
      std::vector<float> v(static_cast<size_t>(c.num_train_timesteps));
      const double n = static_cast<double>(c.num_train_timesteps);
      for (int64_t i = 0; i < c.num_train_timesteps; ++i) {
        double t1 = static_cast<double>(i) / n, t2 = static_cast<double>(i + 1) / n;
        v[static_cast<size_t>(i)] = static_cast<float>(std::min(1 - alpha_bar(t2) / alpha_bar(t1), 0.999));
      }
      betas = torch::tensor(v, f32);
      break;
    }
  }
  if (c.rescale_betas_zero_snr) betas = rescale_zero_terminal_snr(betas);
  return betas;
}

at::Tensor rescale_zero_terminal_snr(const at::Tensor& betas) {
  auto alphas = 1.0 - betas;
  auto alphas_bar_sqrt = torch::cumprod(alphas, 0).sqrt();
  auto first = alphas_bar_sqrt[0].clone();
  auto last = alphas_bar_sqrt[-1].clone();
  alphas_bar_sqrt -= last;                      // last timestep now has zero signal
  alphas_bar_sqrt *= first / (first - last);    // first timestep keeps its old value
  auto alphas_bar = alphas_bar_sqrt.pow(2);
  auto ratios = alphas_bar.slice(0, 1) / alphas_bar.slice(0, 0, -1);
  return 1 - torch::cat({alphas_bar.slice(0, 0, 1), ratios});
}

NoiseSchedule::NoiseSchedule(const NoiseScheduleConfig& config) : config_(config) {
  betas_ = make_betas(config_);
  alphas_ = 1.0 - betas_;
  alphas_cumprod_ = torch::cumprod(alphas_, 0);
  // kohya prepare_scheduler_for_custom_training: (sqrt(abar) / sqrt(1 - abar))^2 in float32.
  all_snr_ = (alphas_cumprod_.sqrt() / (1.0 - alphas_cumprod_).sqrt()).pow(2);
}

namespace {

// table[timesteps] on `like`'s device and dtype, shaped [B, 1, ...] to broadcast over `like`.
at::Tensor gather_broadcast(const at::Tensor& table, const at::Tensor& timesteps, const at::Tensor& like) {
  TORCH_CHECK(timesteps.scalar_type() == at::kLong || timesteps.scalar_type() == at::kInt,
              "timesteps must be an integer tensor, got ", timesteps.scalar_type());
  auto t = table.to(like.device()).to(like.scalar_type());
  auto v = t.index({timesteps.to(like.device()).to(at::kLong)}).flatten();
  while (v.dim() < like.dim()) v = v.unsqueeze(-1);
  return v;
}

}  // namespace

at::Tensor NoiseSchedule::add_noise(const at::Tensor& x0, const at::Tensor& noise,
                                    const at::Tensor& timesteps) const {
  auto sqrt_alpha_prod = gather_broadcast(alphas_cumprod_, timesteps, x0).pow(0.5);
  auto sqrt_one_minus = (1 - gather_broadcast(alphas_cumprod_, timesteps, x0)).pow(0.5);
  return sqrt_alpha_prod * x0 + sqrt_one_minus * noise;
}

at::Tensor NoiseSchedule::get_velocity(const at::Tensor& x0, const at::Tensor& noise,
                                       const at::Tensor& timesteps) const {
  auto sqrt_alpha_prod = gather_broadcast(alphas_cumprod_, timesteps, x0).pow(0.5);
  auto sqrt_one_minus = (1 - gather_broadcast(alphas_cumprod_, timesteps, x0)).pow(0.5);
  return sqrt_alpha_prod * noise - sqrt_one_minus * x0;
}

at::Tensor NoiseSchedule::target(PredictionType prediction, const at::Tensor& x0, const at::Tensor& noise,
                                 const at::Tensor& timesteps) const {
  switch (prediction) {
    case PredictionType::kEpsilon: return noise;
    case PredictionType::kVPrediction: return get_velocity(x0, noise, timesteps);
    case PredictionType::kSample: return x0;
    case PredictionType::kFlow: return noise - x0;
  }
  return noise;
}

at::Tensor NoiseSchedule::snr(const at::Tensor& timesteps) const {
  TORCH_CHECK(timesteps.dim() == 1, "timesteps must be [B], got ", timesteps.sizes());
  return all_snr_.index({timesteps.cpu().to(at::kLong)}).to(timesteps.device());
}

at::Tensor NoiseSchedule::min_snr_weights(const at::Tensor& timesteps, double gamma,
                                          PredictionType prediction) const {
  if (!(gamma > 0)) throw InputError("min_snr_gamma must be > 0, got " + std::to_string(gamma));
  if (prediction == PredictionType::kFlow)
    throw InputError("min_snr_gamma weights the DDPM schedule's SNR; flow-matching models have none here");
  auto s = snr(timesteps);
  auto clipped = torch::minimum(s, torch::full_like(s, gamma));
  if (prediction == PredictionType::kVPrediction) return torch::div(clipped, s + 1);
  return torch::div(clipped, s);
}

at::Tensor NoiseSchedule::debiased_estimation_weights(const at::Tensor& timesteps,
                                                      PredictionType prediction) const {
  if (prediction == PredictionType::kFlow)
    throw InputError("debiased estimation weights the DDPM schedule's SNR; not for flow-matching models");
  auto s = snr(timesteps).clamp_max(1000.0);  // kohya caps SNR so near-clean timesteps stay bounded
  if (prediction == PredictionType::kVPrediction) return 1 / (s + 1);
  return 1 / torch::sqrt(s);
}

at::Generator make_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor generator_state(const at::Generator& generator) { return generator.get_state(); }

void set_generator_state(at::Generator& generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

at::Tensor randn(at::IntArrayRef shape, at::Generator& generator, at::ScalarType dtype, at::Device device) {
  auto cpu = torch::randn(shape, generator, torch::TensorOptions().dtype(torch::kFloat32));
  return cpu.to(device, dtype);
}

at::Tensor apply_noise_offset(const at::Tensor& noise, double offset, at::Generator& generator) {
  if (std::abs(offset) < 1e-6) return noise;
  TORCH_CHECK(noise.dim() >= 2, "noise offset needs [B, C, ...] noise, got ", noise.sizes());
  std::vector<int64_t> shape(static_cast<size_t>(noise.dim()), 1);
  shape[0] = noise.size(0);
  shape[1] = noise.size(1);
  return noise + offset * randn(shape, generator, noise.scalar_type(), noise.device());
}

at::Tensor sample_timesteps(int64_t batch, at::Generator& generator, int64_t min_timestep, int64_t max_timestep) {
  if (min_timestep < 0 || max_timestep < min_timestep)
    throw InputError("timestep range [" + std::to_string(min_timestep) + ", " + std::to_string(max_timestep) +
                     ") is empty or negative");
  if (min_timestep == max_timestep) return torch::full({batch}, max_timestep, torch::kLong);
  return torch::randint(min_timestep, max_timestep, {batch}, generator, torch::kLong);
}

TrainingNoise make_training_noise(const NoiseSchedule& schedule, const at::Tensor& latents,
                                  at::Generator& generator, const TrainingNoiseOptions& options) {
  if (options.max_timestep > schedule.num_train_timesteps())
    throw InputError("max_timestep " + std::to_string(options.max_timestep) + " exceeds num_train_timesteps " +
                     std::to_string(schedule.num_train_timesteps()));
  TrainingNoise out;
  out.noise = randn(latents.sizes(), generator, latents.scalar_type(), latents.device());
  out.noise = apply_noise_offset(out.noise, options.noise_offset, generator);
  out.timesteps = sample_timesteps(latents.size(0), generator, options.min_timestep, options.max_timestep)
                      .to(latents.device());
  out.noisy_latents = schedule.add_noise(latents, out.noise, out.timesteps);
  return out;
}

at::Tensor mse_loss_per_sample(const at::Tensor& prediction, const at::Tensor& target) {
  TORCH_CHECK(prediction.sizes() == target.sizes(), "prediction ", prediction.sizes(), " and target ",
              target.sizes(), " differ in shape");
  auto sq = (prediction.to(at::kFloat) - target.to(at::kFloat)).pow(2);
  if (sq.dim() <= 1) return sq;
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < sq.dim(); ++d) dims.push_back(d);
  return sq.mean(dims);
}

at::Tensor weighted_mean(const at::Tensor& per_sample, const at::Tensor& weights) {
  if (!weights.defined()) return per_sample.mean();
  TORCH_CHECK(weights.sizes() == per_sample.sizes(), "weights ", weights.sizes(), " do not match losses ",
              per_sample.sizes());
  return (per_sample * weights.to(per_sample.device(), per_sample.scalar_type())).mean();
}

}  // namespace lt::sample
