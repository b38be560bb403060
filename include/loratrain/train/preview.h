// One preview image from a loaded model: the denoising loop of the family's pipeline (seeded
// noise, classifier-free or embedded guidance, the scheduler's steps, the VAE decode). The
// trainer's previews and `lora-train sample` call it: one sampling path.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

#include "loratrain/sample/prompt.h"
#include "loratrain/train/diffusion_model.h"

namespace lt::train {

struct PreviewOptions {
  std::string sampler;  // sample.sampler ("ddpm", "ddim", "euler", "flowmatch")
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  int64_t num_frames = 1;  // video models: frames of the clip (sample.num_frames, 4k+1)
};

// The sampler previews use with a model of `traits`: the configured one when it fits the model's
// objective. A flow-matching model (Flux, Wan) samples with the flow-match Euler scheduler only:
// another name (ddpm is AI Toolkit's default sample.sampler; its Flux examples name flowmatch) gets
// a warning and flowmatch. flowmatch on a noise-prediction model (SD, SDXL) throws lt::InputError.
std::string sampler_for_model(const ModelTraits& traits, const std::string& configured);

// `text` / `negative_text`: the prompt's and the negative prompt's embeddings on the device
// (negative_text is not used by models that embed guidance). Runs under no-grad; the caller sets
// eval mode (EvalScope) and the adapters' multiplier. -> [3, H, W] (video models: [3, F, H, W]) in
// [-1, 1], float32 CPU.
at::Tensor render_preview(DiffusionModel& model, const sample::SamplePrompt& prompt, const TextEmbedding& text,
                          const TextEmbedding& negative_text, const PreviewOptions& options);

}  // namespace lt::train
