#include "loratrain/train/objective.h"

#include <torch/torch.h>

#include "loratrain/util/error.h"

namespace lt::train {

TrainingObjective::TrainingObjective(const ModelTraits& traits, const ObjectiveOptions& options)
    : traits_(traits), options_(options), schedule_(traits.noise_schedule) {
  if (options_.min_snr_gamma && *options_.min_snr_gamma <= 0) {
    throw InputError("train.min_snr_gamma must be > 0 (got " + std::to_string(*options_.min_snr_gamma) + ")");
  }
}

TrainingExample TrainingObjective::make_example(const at::Tensor& latents, at::Generator& rng) const {
  sample::TrainingNoiseOptions noise_options;
  noise_options.noise_offset = options_.noise_offset;
  auto noise = sample::make_training_noise(schedule_, latents, rng, noise_options);
  TrainingExample example;
  example.noisy = noise.noisy_latents;
  example.timesteps = noise.timesteps;
  example.target = schedule_.target(traits_.prediction, latents, noise.noise, noise.timesteps);
  if (options_.min_snr_gamma) {
    example.weights = schedule_.min_snr_weights(noise.timesteps, *options_.min_snr_gamma, traits_.prediction);
  }
  return example;
}

at::Tensor training_loss(DiffusionModel& model, const TrainingObjective& objective, const at::Tensor& latents,
                         const Conditioning& conditioning, at::Generator& rng) {
  TrainingExample example = objective.make_example(latents, rng);
  at::Tensor prediction = model.predict(example.noisy, example.timesteps, conditioning);
  return sample::weighted_mean(sample::mse_loss_per_sample(prediction, example.target), example.weights);
}

}  // namespace lt::train
