#include "loratrain/train/preview.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "loratrain/playbook/vocabulary.h"
#include "loratrain/sample/sampler.h"
#include "loratrain/sample/scheduler.h"
#include "loratrain/util/error.h"

namespace lt::train {

std::string sampler_for_model(const ModelTraits& traits, const std::string& configured) {
  const sample::SamplerKind kind = sample::sampler_kind_from_name(configured);
  const bool flow = traits.objective == Objective::flow_matching;
  const bool flow_sampler = kind == sample::SamplerKind::kFlowMatch || kind == sample::SamplerKind::kUniPC;
  const char* family = playbook::to_string(traits.family);
  if (flow && !flow_sampler) {
    spdlog::warn("sample.sampler: {} does not fit {}'s flow-matching objective; previews use flowmatch (set "
                 "sample.sampler: flowmatch to silence this)", configured, family);
    return "flowmatch";
  }
  if (!flow && flow_sampler) {
    throw InputError("sample.sampler: " + configured + " samples flow-matching models (Flux, Wan); this " + family +
                     " base predicts noise: use ddpm, ddim or euler");
  }
  // The family's scheduler config must suit it (UniPC: flow sigmas, which only Wan's config has).
  try {
    sample::make_scheduler(kind, sample::default_scheduler_config(traits.scheduler_config));
  } catch (const InputError& e) {
    throw InputError("sample.sampler: " + configured + " cannot sample " + family + " (" + e.what() +
                     "); use flowmatch");
  }
  return configured;
}

at::Tensor render_preview(DiffusionModel& model, const sample::SamplePrompt& prompt, const TextEmbedding& text,
                          const TextEmbedding& negative_text, const PreviewOptions& preview) {
  torch::NoGradGuard no_grad;
  const ModelTraits& traits = model.traits();
  // A preview is conditioned as a training image of its own size, uncropped.
  const ImageGeometry geometry{prompt.width, prompt.height, 0, 0, prompt.width, prompt.height};
  Conditioning cond{text, {geometry}};
  const Conditioning uncond{negative_text, {geometry}};
  sample::SamplerOptions options;
  options.steps = prompt.steps;
  options.guidance_scale = prompt.guidance_scale;
  options.guidance_rescale = prompt.guidance_rescale;
  if (traits.embedded_guidance) {
    cond.guidance = prompt.guidance_scale;
    options.guidance_scale = 1.0;  // the conditional branch alone
  }
  options.seed = static_cast<uint64_t>(prompt.seed);
  const int64_t latent_h = prompt.height / traits.latent_downscale, latent_w = prompt.width / traits.latent_downscale;
  options.latent_shape = {1, traits.latent_channels, latent_h, latent_w};
  if (traits.is_video) {
    // A causal video VAE: the first frame alone, then one latent frame per `stride` frames.
    const int64_t latent_frames = 1 + (std::max<int64_t>(preview.num_frames, 1) - 1) / traits.latent_frame_stride;
    options.latent_shape = {1, traits.latent_channels, latent_frames, latent_h, latent_w};
  }
  options.dtype = preview.dtype;
  options.device = preview.device;
  options.prediction_type = traits.prediction;

  const nlohmann::json scheduler_config = sample::default_scheduler_config(traits.scheduler_config);
  const sample::SamplerKind kind = sample::sampler_kind_from_name(preview.sampler);
  auto scheduler = sample::make_scheduler(kind, scheduler_config);
  // UniPC takes its own flow sigmas, linspace(1, 1/T, N + 1)[:-1], as WanPipeline calls it.
  if (kind == sample::SamplerKind::kFlowMatch) {
    // One schedule for every flow family: unshifted sigmas numpy.linspace(1, 1/N, N) as the Flux
    // pipelines pass them, shifted by the image's token count where the scheduler shifts
    // dynamically (Flux dev), else by its static shift (Wan 3.0; WanPipeline's own set_timesteps(N)
    // grid ends at the training sigma_min instead of 1/N).
    const double n = static_cast<double>(prompt.steps);
    const double step_size = prompt.steps > 1 ? (1.0 / n - 1.0) / (n - 1.0) : 0.0;
    for (int64_t k = 0; k < prompt.steps; ++k) options.timestep_options.sigmas.push_back(1.0 + static_cast<double>(k) * step_size);
    if (scheduler_config.value("use_dynamic_shifting", false)) {
      const auto flow = sample::FlowMatchEulerDiscreteSchedulerConfig::from_json(scheduler_config);
      const int64_t p = traits.latent_patch_size;
      options.timestep_options.mu = sample::calculate_shift((latent_h / p) * (latent_w / p), flow.base_image_seq_len,
                                                            flow.max_image_seq_len, flow.base_shift, flow.max_shift);
    }
  }
  at::Tensor latents = sample::sample(*scheduler, [&](const at::Tensor& x, const at::Tensor& t, bool use_uncond) {
    return model.predict(x, t, use_uncond ? uncond : cond);
  }, options);
  return model.decode_latents(latents)[0];
}

}  // namespace lt::train
