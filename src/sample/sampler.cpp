#include "loratrain/sample/sampler.h"

#include <torch/torch.h>

#include "loratrain/util/error.h"

namespace lt::sample {

at::Tensor initial_noise(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype, at::Device device) {
  auto gen = make_generator(seed);
  return randn(shape, gen, dtype, device);
}

at::Tensor apply_cfg(const at::Tensor& uncond, const at::Tensor& cond, double guidance_scale,
                     double guidance_rescale) {
  auto u = uncond.to(at::kFloat), c = cond.to(at::kFloat);
  auto guided = u + guidance_scale * (c - u);
  if (guidance_rescale > 0) {
    // Match the guided prediction's std to the conditional one's, per sample, then blend
    // (fixes over-exposure with zero-terminal-SNR models).
    std::vector<int64_t> dims;
    for (int64_t d = 1; d < c.dim(); ++d) dims.push_back(d);
    auto std_text = c.std(dims, /*unbiased=*/true, /*keepdim=*/true);
    auto std_cfg = guided.std(dims, /*unbiased=*/true, /*keepdim=*/true);
    auto rescaled = guided * (std_text / std_cfg);
    guided = guidance_rescale * rescaled + (1 - guidance_rescale) * guided;
  }
  return guided;
}

namespace {

// prediction(latents_in, t) -> model output (float32), one CFG-combined prediction per step.
using Predict = std::function<at::Tensor(const at::Tensor& latents_in, const at::Tensor& t)>;

at::Tensor run_loop(Scheduler& scheduler, const Predict& predict, const SamplerOptions& o) {
  if (o.steps < 1) throw InputError("sample steps must be >= 1, got " + std::to_string(o.steps));
  if (!o.initial_latents.defined() && o.latent_shape.empty())
    throw InputError("sampler: latent_shape is empty and no initial latents were given");
  torch::NoGradGuard no_grad;
  if (o.prediction_type) scheduler.set_prediction_type(*o.prediction_type);
  scheduler.set_timesteps(o.steps, o.timestep_options);

  // One generator for the initial noise and every stochastic step, seeded per image (diffusers
  // passes the same generator to prepare_latents and scheduler.step).
  auto gen = make_generator(o.seed);
  at::Tensor latents = o.initial_latents.defined()
                           ? o.initial_latents.to(o.device, at::kFloat)
                           : randn(o.latent_shape, gen, at::kFloat, o.device);
  latents = latents * scheduler.init_noise_sigma();

  const auto& timesteps = scheduler.timesteps();
  const int64_t n = timesteps.size(0);
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor t = timesteps[i].clone();
    auto model_in = scheduler.scale_model_input(latents, i).to(o.dtype);
    auto pred = predict(model_in, t).to(at::kFloat);
    TORCH_CHECK(pred.sizes() == latents.sizes(), "denoiser returned ", pred.sizes(), " for latents ", latents.sizes());
    latents = scheduler.step(pred, i, latents, &gen).prev_sample.to(at::kFloat);
    if (o.on_step) o.on_step(i + 1, n);
  }
  return latents;
}

}  // namespace

at::Tensor sample(Scheduler& scheduler, const DenoiseFn& denoise, const SamplerOptions& o) {
  const bool cfg = o.guidance_scale > 1.0;
  Predict predict = [&](const at::Tensor& x, const at::Tensor& t) {
    auto cond = denoise(x, t, /*uncond=*/false);
    if (!cfg) return cond;
    auto uncond = denoise(x, t, /*uncond=*/true);
    return apply_cfg(uncond, cond, o.guidance_scale, o.guidance_rescale);
  };
  return run_loop(scheduler, predict, o);
}

at::Tensor sample_batched(Scheduler& scheduler, const BatchedDenoiseFn& denoise, const SamplerOptions& o) {
  const bool cfg = o.guidance_scale > 1.0;
  Predict predict = [&](const at::Tensor& x, const at::Tensor& t) {
    if (!cfg) return denoise(x, t, /*with_uncond=*/false);
    auto both = denoise(torch::cat({x, x}), t, /*with_uncond=*/true);
    auto halves = both.chunk(2, 0);
    return apply_cfg(halves[0], halves[1], o.guidance_scale, o.guidance_rescale);
  };
  return run_loop(scheduler, predict, o);
}

}  // namespace lt::sample
