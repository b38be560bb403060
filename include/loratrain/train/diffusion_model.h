// The one interface the trainer calls for a model family: a frozen denoiser with its text
// encoders, tokenizers and VAE, loaded from the files users have. One implementation per family,
// one file each (src/train/family_<name>.cpp); the trainer loop names no family.
//
//   model = load_diffusion_model(options)            detect the family, load strictly
//   text  = model->encode_text(captions)             named embeddings (cached as they are)
//   z     = model->encode_pixels(pixels, rng)        scaled latents
//   pred  = model->predict(noisy, t, conditioning)   the denoiser
//   image = model->decode_latents(z)                 previews
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/data/cache.h"
#include "loratrain/playbook/vocabulary.h"
#include "loratrain/sample/noise.h"
#include "loratrain/sample/scheduler.h"

namespace torch::nn {
class Module;
}
namespace lt::lora {
struct ComponentSpec;
}
namespace lt::models {
enum class WeightQuantization;  // models/layers.h
}

namespace lt::train {

using playbook::ModelFamily;

// Named text tensors: {"hidden_states": [B, 77, 768]} for SD, + {"pooled": [B, 1280]} for SDXL
// (with a leading batch dimension here; the cache stores them per caption without it).
using data::TextEmbedding;

// What happened to one training image on its way into the bucket (SDXL's micro-conditioning
// reads it; other families ignore it). Pixels, as kohya and AI Toolkit count them.
struct ImageGeometry {
  int64_t original_width = 0;   // the file's size
  int64_t original_height = 0;
  int64_t crop_left = 0;        // offset of the crop in the resized image
  int64_t crop_top = 0;
  int64_t target_width = 0;     // the bucket
  int64_t target_height = 0;
};

// Everything the denoiser is conditioned on besides the noisy latents and the timestep.
struct Conditioning {
  TextEmbedding text;                // from encode_text (or the cache), on the device
  std::vector<ImageGeometry> images; // one per batch row
  // The guidance value a guidance-distilled denoiser embeds (Flux dev: train.cfg_scale while
  // training, sample.guidance_scale in previews); models without a guidance embedder ignore it.
  double guidance = 1.0;
};

// How the training examples are built: DDPM noise on a beta schedule (SD, SDXL), or rectified
// flow (Flux, Wan): x_t = (1 - sigma) x0 + sigma noise, target noise - x0.
enum class Objective { ddpm, flow_matching };

// Facts of a loaded model the trainer needs, read once.
struct ModelTraits {
  ModelFamily family = ModelFamily::kUnknown;
  int64_t latent_channels = 4;
  int64_t latent_downscale = 8;          // pixels per latent cell
  int64_t bucket_divisibility = 16;      // bucket sides are multiples of this (pixels)
  bool is_video = false;
  // Video: frames per latent frame after the first (Wan's causal VAE: F frames -> 1 + (F-1)/4).
  int64_t latent_frame_stride = 1;
  Objective objective = Objective::ddpm;
  sample::PredictionType prediction = sample::PredictionType::kEpsilon;
  sample::NoiseScheduleConfig noise_schedule;  // the training noise schedule (ddpm)
  // The training sigma shift (flow_matching): AI Toolkit's flowmatch scheduler config of the family.
  sample::FlowMatchEulerDiscreteSchedulerConfig flow_schedule;
  int64_t latent_patch_size = 1;         // latent cells per token side (Flux packs 2x2 cells)
  // Guidance is an input of the denoiser (Conditioning::guidance), not classifier-free guidance:
  // previews run the conditional branch alone with the prompt's guidance scale embedded.
  bool embedded_guidance = false;
  std::string scheduler_config;          // sample::default_scheduler_config name for previews
};

// One set of modules LoRA adapters attach to: the component's names in both file formats and
// the module tree to search.
struct LoRATarget {
  const lora::ComponentSpec* spec;
  torch::nn::Module* root;
};

// How the model computes where that saves memory without changing what it learns: attention a
// chunk of query rows at a time (exact), VAE encode/decode in blended tiles (within the VAE's
// tiling tolerance). The OOM guard's cheapest levers.
struct ComputeMode {
  int64_t attention_chunk = 0;  // query rows at a time; 0 = the whole sequence
  bool vae_tiling = false;
  // A CPU run under memory.simulate_vram stands for a GPU: attention takes the configured path as
  // the GPU would, not the CPU's faster blocks (models/attention_blocks.h), and convolutions keep
  // no packed weights (models/packed_conv.h), so that it runs out of memory where the GPU would and
  // as the planner predicts.
  bool simulated_device = false;
};

struct ModelLoadOptions {
  std::filesystem::path name_or_path;                   // model.name_or_path (resolved)
  std::optional<ModelFamily> expected;                  // model.arch, when the config names one
  std::optional<std::filesystem::path> tokenizer_path;  // model.tokenizer_path (single files)
  std::optional<std::filesystem::path> vae_path;        // model.vae_path: replaces the bundled VAE
  bool v_prediction = false;                            // model.is_v_pred
  at::ScalarType dtype = at::kFloat;                    // frozen weights and compute
  c10::Device device = c10::Device(c10::kCPU);
  // The low-VRAM path: load only the denoiser now; the VAE and text encoders when first used.
  bool defer_encoders = false;
  bool train_text_encoder = false;                      // text encoders get adapters
  // train.bypass_guidance_embedding: a guidance-distilled denoiser trains without its guidance
  // embedding (previews keep it).
  bool bypass_guidance_embedding = false;
  // model.assistant_lora_path (resolved): a LoRA applied to the frozen denoiser while training and
  // switched off in previews (AI Toolkit's assistant adapter); only families that take one accept it.
  std::optional<std::filesystem::path> assistant_lora;
  // model.quantize: the frozen denoiser's 8-bit format. Every family quantizes its Linears on the
  // host before the module is placed, so the device never holds the widened base; under fp8 e4m3 the
  // Linear weights of an fp8 file (Flux, Wan) load as the codes they are stored as, never widened.
  std::optional<models::WeightQuantization> denoiser_quantization;
  // model.quantize_te (with model.quantize): the text encoders' format; every family quantizes them
  // on the host before placing them (T5 / umT5 fp8 files keep their codes when it is fp8).
  std::optional<models::WeightQuantization> text_quantization;
  ComputeMode compute;
};

enum class Encoder { vae, text };

class DiffusionModel {
 public:
  virtual ~DiffusionModel() = default;

  virtual const ModelTraits& traits() const = 0;
  // Identifies the weights for cache keys: family, file identity, dtype.
  virtual const std::string& model_id() const = 0;

  // Captions -> named embeddings [B, ...] on the device. Gradients flow when the text encoder
  // trains (the caller decides with a NoGradGuard).
  virtual TextEmbedding encode_text(const std::vector<std::string>& captions) = 0;
  // pixels [B, 3, H, W] in [-1, 1] -> scaled latents [B, C, h, w]; a video model takes clips
  // [B, 3, F, H, W] (images as F = 1) -> [B, C, f, h, w]. With a generator the VAE's distribution
  // is sampled (as AI Toolkit and kohya cache), otherwise its mean is used.
  virtual at::Tensor encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) = 0;
  // scaled latents -> images [B, 3, H, W] (video: clips [B, 3, F, H, W]) in [-1, 1], float32 on the CPU.
  virtual at::Tensor decode_latents(const at::Tensor& latents) = 0;
  // The denoiser: noisy latents [B, C, h, w] (video [B, C, f, h, w]), timesteps [B] -> prediction
  // like the latents.
  virtual at::Tensor predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) = 0;

  // The modules adapters attach to (denoiser first, then text encoders when they train).
  virtual std::vector<LoRATarget> lora_targets() = 0;
  // ss_* keys of the LoRA file that describe the base (ss_base_model_version, ss_v2, ...).
  virtual std::map<std::string, std::string> lora_metadata() const = 0;

  virtual void set_gradient_checkpointing(bool enabled) = 0;
  virtual void set_compute_mode(const ComputeMode& mode) = 0;
  // Training mode of the denoiser (dropout); previews run it in eval mode (see EvalScope).
  virtual void set_training(bool training) = 0;
  // The frozen denoiser's Linear weights (and the text encoders' with `text_encoders`) to one byte
  // per value (int8 or fp8 e4m3 codes) with per-channel scales, in place. Returns the bytes released.
  virtual int64_t quantize_base(bool text_encoders, models::WeightQuantization format) = 0;
  // The low-VRAM path: the encoder leaves the device until it is used again.
  virtual void release(Encoder which) = 0;
};

// The denoiser in eval mode while this lives (previews), back in training mode after.
class EvalScope {
 public:
  explicit EvalScope(DiffusionModel& model) : model_(model) { model_.set_training(false); }
  ~EvalScope() { model_.set_training(true); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  DiffusionModel& model_;
};

// The family of `options.name_or_path` (single file or diffusers folder), read from the file
// headers only, checked against `options.expected` and against the families `run` trains.
// lt::InputError for a missing, broken, unsupported or wrong-family checkpoint, or a LoRA file.
ModelFamily identify_model(const ModelLoadOptions& options);

// identify_model(), then the family's loader: strict, every missing, unexpected or mis-shaped
// tensor reported at once.
std::unique_ptr<DiffusionModel> load_diffusion_model(const ModelLoadOptions& options);

// at::ScalarType for the config's dtype names (fp32/fp16/bf16 and their long forms).
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace lt::train
