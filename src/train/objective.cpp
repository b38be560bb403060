#include "loratrain/train/objective.h"

#include <torch/torch.h>

#include <cmath>

#include "loratrain/util/error.h"

namespace lt::train {

namespace {

const char* const kFlowTimestepTypes = "sigmoid, linear, shift, flux_shift";

bool is_flow_timestep_type(const std::string& type) {
  return type == "sigmoid" || type == "linear" || type == "shift" || type == "flux_shift";
}

}  // namespace

TrainingObjective::TrainingObjective(const ModelTraits& traits, const ObjectiveOptions& options)
    : traits_(traits), options_(options), schedule_(traits.noise_schedule) {
  if (options_.min_snr_gamma && *options_.min_snr_gamma <= 0) {
    throw InputError("train.min_snr_gamma must be > 0 (got " + std::to_string(*options_.min_snr_gamma) + ")");
  }
  if (traits_.objective == Objective::flow_matching) {
    if (options_.min_snr_gamma) {
      throw InputError("train.min_snr_gamma weights DDPM timesteps by their SNR; this model trains by flow matching: "
                       "remove it (timestep_type shapes the flow's noise levels)");
    }
    if (!is_flow_timestep_type(options_.timestep_type)) {
      throw InputError("train.timestep_type '" + options_.timestep_type + "' is not available for flow matching; use " +
                       kFlowTimestepTypes);
    }
  }
}

at::Tensor TrainingObjective::draw_flow_sigmas(int64_t batch, int64_t height, int64_t width, at::Generator& rng) const {
  const std::string& type = options_.timestep_type;
  if (type == "sigmoid") {
    // AI Toolkit sorts 1000 draws of 1 - sigmoid(N(0, 1)) and picks one uniformly: the same
    // distribution as one draw (N(0, 1) is symmetric).
    return torch::sigmoid(sample::randn({batch}, rng));
  }
  // linear, shift, flux_shift: one of the training table's noise levels, 1 .. 1/T (AI Toolkit's
  // randint(0, T - 1) leaves out the smallest), shifted for shift/flux_shift as at inference.
  const auto& config = traits_.flow_schedule;
  const int64_t T = config.num_train_timesteps;
  const at::Tensor index = torch::randint(0, T - 1, {batch}, rng, torch::kLong);
  at::Tensor sigma = (static_cast<double>(T) - index.to(torch::kDouble)) / static_cast<double>(T);
  if (type != "linear") {
    if (config.use_dynamic_shifting) {
      const int64_t p = traits_.latent_patch_size;
      const double mu = sample::calculate_shift(height * width / (p * p), config.base_image_seq_len,
                                                config.max_image_seq_len, config.base_shift, config.max_shift);
      const double e = config.time_shift_type == "exponential" ? std::exp(mu) : mu;
      sigma = e / (e + (1.0 / sigma - 1.0));
    } else {
      sigma = config.shift * sigma / (1.0 + (config.shift - 1.0) * sigma);
    }
  }
  return sigma.to(torch::kFloat32);
}

TrainingExample TrainingObjective::make_example(const at::Tensor& latents, at::Generator& rng) const {
  TrainingExample example;
  if (traits_.objective == Objective::flow_matching) {
    at::Tensor noise = sample::randn(latents.sizes(), rng, latents.scalar_type(), latents.device());
    noise = sample::apply_noise_offset(noise, options_.noise_offset, rng);
    const at::Tensor sigma = draw_flow_sigmas(latents.size(0), latents.size(-2), latents.size(-1), rng);
    example.noisy = sample::FlowMatchEulerDiscreteScheduler::scale_noise(latents, noise, sigma);
    example.timesteps = (sigma * static_cast<double>(traits_.flow_schedule.num_train_timesteps)).to(latents.device());
    example.target = noise - latents;
    return example;
  }
  sample::TrainingNoiseOptions noise_options;
  noise_options.noise_offset = options_.noise_offset;
  auto noise = sample::make_training_noise(schedule_, latents, rng, noise_options);
  example.noisy = noise.noisy_latents;
  example.timesteps = noise.timesteps;
  example.target = schedule_.target(traits_.prediction, latents, noise.noise, noise.timesteps);
  if (options_.min_snr_gamma) {
    example.weights = schedule_.min_snr_weights(noise.timesteps, *options_.min_snr_gamma, traits_.prediction);
  }
  return example;
}

at::Tensor training_loss(DiffusionModel& model, const TrainingObjective& objective, const at::Tensor& latents,
                         const Conditioning& conditioning, at::Generator& rng, const BatchShard& shard) {
  TrainingExample example;
  const int64_t rows = latents.size(0);
  if (shard.total > rows) {
    // Zeros stand in for the other ranks' rows: every draw is made for all rows, in order.
    std::vector<int64_t> sizes = latents.sizes().vec();
    sizes[0] = shard.total;
    at::Tensor global = torch::zeros(sizes, latents.options());
    global.narrow(0, shard.begin, rows).copy_(latents);
    TrainingExample whole = objective.make_example(global, rng);
    auto mine = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, shard.begin, rows) : t; };
    example = {mine(whole.noisy), mine(whole.timesteps), mine(whole.target), mine(whole.weights)};
  } else {
    example = objective.make_example(latents, rng);
  }
  at::Tensor prediction = model.predict(example.noisy, example.timesteps, conditioning);
  return sample::weighted_mean(sample::mse_loss_per_sample(prediction, example.target), example.weights);
}

}  // namespace lt::train
