// The sampling loop for preview images: seeded initial noise, classifier-free guidance, scheduler
// steps. Mirrors the denoising loop of diffusers' StableDiffusionPipeline / FluxPipeline
// (scale_model_input -> denoiser -> guidance -> scheduler.step), with its own generator so the
// training RNG (global and the trainer's) is never advanced.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "loratrain/sample/scheduler.h"

namespace lt::sample {

// Denoiser for one branch: latents [B, ...] (already scale_model_input'ed, in the options' dtype),
// t = the scheduler's timestep as a 0-d CPU tensor (int64 for DDPM/DDIM, float32 otherwise; a
// flow model divides by 1000 itself), uncond = use the negative/empty prompt's conditioning.
// Returns the model's prediction, same shape as latents.
using DenoiseFn = std::function<at::Tensor(const at::Tensor& latents, const at::Tensor& t, bool uncond)>;
// Both branches in one call. with_uncond: latents [2B, ...] = cat(uncond [B], cond [B]) in
// diffusers' order, the output in the same order; otherwise latents [B] are conditional only.
using BatchedDenoiseFn =
    std::function<at::Tensor(const at::Tensor& latents, const at::Tensor& t, bool with_uncond)>;

struct SamplerOptions {
  int64_t steps = 20;
  // > 1 runs classifier-free guidance; <= 1 runs the conditional branch only (diffusers:
  // do_classifier_free_guidance = guidance_scale > 1), as for guidance-distilled Flux.
  double guidance_scale = 7.0;
  double guidance_rescale = 0.0;  // Lin et al. 2023 section 3.4 (AI Toolkit `guidance_rescale`)
  uint64_t seed = 0;
  std::vector<int64_t> latent_shape;  // [B, C, H, W] (or any model latent layout)
  at::ScalarType dtype = at::kFloat;  // dtype of the denoiser's input
  at::Device device = at::kCPU;
  std::optional<PredictionType> prediction_type;  // overrides the scheduler's (e.g. is_v_pred)
  TimestepOptions timestep_options;               // mu / sigmas for flow matching
  at::Tensor initial_latents;  // when defined, used instead of seeded noise (scaled by init_noise_sigma)
  std::function<void(int64_t step, int64_t steps)> on_step;  // progress, after each step
};

// Seeded standard-normal latents: torch.randn(shape, generator=torch.Generator("cpu").manual_seed(
// seed)) like diffusers' prepare_latents, then moved to device/dtype.
at::Tensor initial_noise(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kFloat,
                         at::Device device = at::kCPU);

// uncond + s (cond - uncond), optionally rescaled towards cond's per-sample std (diffusers
// rescale_noise_cfg). Computed in float32.
at::Tensor apply_cfg(const at::Tensor& uncond, const at::Tensor& cond, double guidance_scale,
                     double guidance_rescale = 0.0);

// Runs the whole reverse process and returns the final latents (float32, on options.device).
// Sets the scheduler's timesteps (and prediction type when given). Runs under no-grad; the model's
// train/eval mode is the caller's. The global CPU RNG and every caller generator are untouched.
at::Tensor sample(Scheduler& scheduler, const DenoiseFn& denoise, const SamplerOptions& options);
at::Tensor sample_batched(Scheduler& scheduler, const BatchedDenoiseFn& denoise, const SamplerOptions& options);

// ---- Preview images ----

// Decoded images [B, 3, H, W] in [-1, 1] -> B uint8 [H, W, 3] CPU tensors, as diffusers'
// VaeImageProcessor.postprocess does (x / 2 + 0.5, clamp to [0, 1], * 255, round half to even).
std::vector<at::Tensor> to_uint8_images(const at::Tensor& decoded);
// One grid image [H, W, 3] uint8 of `images` ([h_i, w_i, 3] uint8; sizes may differ, as prompts
// may set --w/--h), `columns` per row (0: ceil(sqrt(n))), each centred in a cell of the largest
// height and width, cells `padding` pixels apart on a `background` canvas.
at::Tensor make_image_grid(const std::vector<at::Tensor>& images, int64_t columns = 0, int64_t padding = 0,
                           uint8_t background = 0);

}  // namespace lt::sample
