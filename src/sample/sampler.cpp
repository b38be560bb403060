#include "loratrain/sample/sampler.h"

#include <torch/torch.h>

#include <cmath>

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

std::vector<at::Tensor> to_uint8_images(const at::Tensor& decoded) {
  TORCH_CHECK(decoded.dim() == 4 && decoded.size(1) == 3, "expected decoded images [B, 3, H, W], got ",
              decoded.sizes());
  auto x = (decoded.detach().to(at::kFloat) / 2 + 0.5).clamp(0, 1);
  auto u8 = (x * 255).round().to(at::kByte).permute({0, 2, 3, 1}).contiguous().cpu();
  std::vector<at::Tensor> out;
  for (int64_t b = 0; b < u8.size(0); ++b) out.push_back(u8[b].clone());
  return out;
}

at::Tensor make_image_grid(const std::vector<at::Tensor>& images, int64_t columns, int64_t padding,
                           uint8_t background) {
  if (images.empty()) throw InputError("make_image_grid: no images");
  const auto n = static_cast<int64_t>(images.size());
  if (columns <= 0) columns = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  columns = std::min(columns, n);
  const int64_t rows = (n + columns - 1) / columns;
  int64_t cell_h = 0, cell_w = 0;
  for (const auto& im : images) {
    TORCH_CHECK(im.dim() == 3 && im.size(2) == 3 && im.scalar_type() == at::kByte,
                "grid images must be uint8 [H, W, 3], got ", im.sizes(), " ", im.scalar_type());
    cell_h = std::max(cell_h, im.size(0));
    cell_w = std::max(cell_w, im.size(1));
  }
  auto grid = torch::full({rows * cell_h + (rows - 1) * padding, columns * cell_w + (columns - 1) * padding, 3},
                          background, torch::kByte);
  for (int64_t k = 0; k < n; ++k) {
    const auto& im = images[static_cast<size_t>(k)];
    const int64_t y = (k / columns) * (cell_h + padding) + (cell_h - im.size(0)) / 2;
    const int64_t x = (k % columns) * (cell_w + padding) + (cell_w - im.size(1)) / 2;
    grid.slice(0, y, y + im.size(0)).slice(1, x, x + im.size(1)).copy_(im.cpu());
  }
  return grid;
}

}  // namespace lt::sample
