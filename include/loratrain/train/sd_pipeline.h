// The Stable Diffusion 1.x/2.x model bundle a LoRA is trained on: UNet, VAE, CLIP text encoder and
// tokenizer, loaded from a single-file checkpoint (LDM key names, as downloaded from model sites)
// or a diffusers folder (unet/, vae/, text_encoder/, tokenizer/).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/models/registry.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_tokenizer.h"

namespace lt::train {

struct SDLoadOptions {
  std::filesystem::path name_or_path;             // model.name_or_path
  std::optional<std::filesystem::path> tokenizer_path;  // model.tokenizer_path (single files)
  std::optional<std::filesystem::path> vae_path;  // model.vae_path: a VAE file replacing the bundled one
  at::ScalarType dtype = at::kFloat;              // frozen weights and compute
  c10::Device device = c10::Device(c10::kCPU);
  // The low-VRAM path: load only the UNet now; the VAE and text encoder are loaded when first
  // used, so they never sit on the device together with everything else during the load.
  bool defer_encoders = false;
};

// Which components to (re)load: the OOM guard's low-VRAM path drops the VAE and text encoder
// while they are not needed and loads them again for sampling.
enum class Component { unet, vae, text_encoder };

class SDPipeline {
 public:
  // Detects the family (SD1/SD2; others are reported as not supported yet), builds the modules from
  // config.json or the weights' shapes, and loads them strictly. Throws lt::InputError for a
  // missing, broken or wrong-architecture checkpoint.
  explicit SDPipeline(SDLoadOptions options);

  models::ModelFamily family() const { return family_; }
  const std::string& model_id() const { return model_id_; }  // for cache keys
  const SDLoadOptions& options() const { return options_; }

  models::sd::UNet2DConditionModel& unet() { return unet_; }
  models::sd::AutoencoderKL& vae();                 // loads it again when it was released
  models::CLIPTextModel& text_encoder();      // likewise
  const models::CLIPTokenizer& tokenizer() const { return *tokenizer_; }
  bool has(Component c) const;
  // The low-VRAM path: the module leaves the device until it is used again.
  void release(Component c);

  // Captions -> encoder_hidden_states [B, 77, D] (the final layer's normalised output).
  at::Tensor encode_text(const std::vector<std::string>& captions);
  // pixels [B, 3, H, W] in [-1, 1] -> scaled latents [B, 4, H/8, W/8]. With a generator the
  // latent distribution is sampled (as AI Toolkit and kohya do), otherwise its mean is used.
  at::Tensor encode_images(const at::Tensor& pixels, std::optional<at::Generator> generator = std::nullopt);
  // scaled latents -> images [B, 3, H, W] in [-1, 1] (float32, CPU).
  at::Tensor decode_latents(const at::Tensor& latents);
  int64_t vae_scale_factor();

 private:
  void load_vae();
  void load_text_encoder();

  SDLoadOptions options_;
  models::ModelFamily family_ = models::ModelFamily::kUnknown;
  bool single_file_ = false;
  std::string model_id_;
  std::shared_ptr<io::SafetensorsFile> single_file_handle_;
  models::sd::UNet2DConditionModel unet_{nullptr};
  models::sd::AutoencoderKL vae_{nullptr};
  models::CLIPTextModel text_encoder_{nullptr};
  std::unique_ptr<models::CLIPTokenizer> tokenizer_;
  bool vae_offloaded_ = false;           // released: in host RAM (GPU) or not loaded (CPU)
  bool text_encoder_offloaded_ = false;
};

// at::ScalarType for the config's dtype names (fp32/fp16/bf16 and their long forms).
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace lt::train
