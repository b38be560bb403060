// The training objective: how a training example is made from clean latents (noise, timestep,
// noisy input, regression target, per-sample weights) and the loss of one micro-batch. The
// trainer's step and the learning test both call training_loss().
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "loratrain/train/diffusion_model.h"

namespace lt::train {

struct ObjectiveOptions {
  double noise_offset = 0.0;             // train.noise_offset
  std::optional<double> min_snr_gamma;   // train.min_snr_gamma (ddpm)
  std::string timestep_type = "sigmoid"; // train.timestep_type (flow matching)
};

struct TrainingExample {
  at::Tensor noisy;      // the denoiser's input, like the latents
  at::Tensor timesteps;  // [B]: int64 in [0, 1000) for ddpm, float32 sigma * 1000 for flow matching
  at::Tensor target;     // what the denoiser should predict, like the latents
  at::Tensor weights;    // [B] per-sample loss weights, undefined = equal
};

class TrainingObjective {
 public:
  TrainingObjective(const ModelTraits& traits, const ObjectiveOptions& options);
  // Draws noise (then offset, then timesteps: kohya's order) from `rng`.
  TrainingExample make_example(const at::Tensor& latents, at::Generator& rng) const;
  // Flow matching: the noise level of each of `batch` rows for latents of `height` x `width`
  // cells, as AI Toolkit draws it for timestep_type (float32 [batch] in (0, 1], CPU).
  at::Tensor draw_flow_sigmas(int64_t batch, int64_t height, int64_t width, at::Generator& rng) const;

 private:
  ModelTraits traits_;
  ObjectiveOptions options_;
  sample::NoiseSchedule schedule_;
};

// Where a rank's rows sit in the global batch of a data-parallel step (total 0: one device, the
// latents are the whole batch).
struct BatchShard {
  int64_t begin = 0;
  int64_t total = 0;
};

// One micro-batch: an example from `latents` [B, C, h, w] (on the device), the denoiser's
// prediction, the weighted MSE (float32 scalar). With a shard the noise and timesteps are drawn
// for the whole global batch and the shard's rows are used: the same values one device would
// draw for them.
at::Tensor training_loss(DiffusionModel& model, const TrainingObjective& objective, const at::Tensor& latents,
                         const Conditioning& conditioning, at::Generator& rng, const BatchShard& shard = {});

}  // namespace lt::train
