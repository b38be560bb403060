// Stable Diffusion XL (base 1.0 and its fine-tunes, which share its keys): the components a LoRA is
// trained on, loaded strictly from a single file as downloaded (model.diffusion_model.*,
// conditioner.embedders.0.transformer.* CLIP ViT-L, conditioner.embedders.1.model.* OpenCLIP
// ViT-bigG, first_stage_model.*; fp32/fp16/bf16) or from a diffusers folder (unet/, vae/,
// text_encoder/, text_encoder_2/, tokenizer/, tokenizer_2/), and SDXL's conditioning: both
// encoders' text embeddings and the size micro-conditioning (add_time_ids).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/registry.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_tokenizer.h"

namespace lt::models::sd {

// SDXL's tokenizer_2 pads with "!" (id 0 in the CLIP vocabulary), tokenizer with <|endoftext|>.
inline constexpr const char* kSDXLTokenizer2PadToken = "!";

// An SDXL checkpoint, opened and checked once; each component is then built from its config
// (config.json, or the weights' shapes for a single file) and loaded strictly, on the CPU, in eval
// mode, with every parameter frozen (requires_grad false). `dtype` converts weights as they are
// read (nullopt: fp32). Components can be loaded again (the low-VRAM path releases and reloads).
class SDXLCheckpoint {
 public:
  // `path`: a .safetensors single file or a diffusers folder. Throws lt::InputError when it does
  // not exist, is a LoRA, is another family (naming the family found and its evidence, e.g. "an
  // sd1 checkpoint (... cross-attention width 768 ...)"), holds one component only, or lacks a
  // part (one message naming every missing key or folder). With `separate_vae` the bundled VAE
  // may be absent.
  static SDXLCheckpoint open(const std::filesystem::path& path, bool separate_vae = false);

  const std::filesystem::path& path() const { return path_; }
  bool is_single_file() const { return file_ != nullptr; }
  const Detection& detection() const { return detection_; }

  UNet2DConditionModel load_unet(std::optional<at::ScalarType> dtype = std::nullopt) const;
  // CLIP ViT-L (text_encoder/, conditioner.embedders.0.transformer.).
  CLIPTextModel load_text_encoder(std::optional<at::ScalarType> dtype = std::nullopt) const;
  // OpenCLIP ViT-bigG with its projection (text_encoder_2/, conditioner.embedders.1.model.).
  CLIPTextModelWithProjection load_text_encoder_2(std::optional<at::ScalarType> dtype = std::nullopt) const;
  // The bundled VAE, or `vae_path` (a VAE .safetensors in either layout, or a diffusers vae/
  // folder). scaling_factor: the folder's config.json, else VAEConfig::sdxl()'s 0.13025 (single
  // files do not store it). fp32 unless asked: SDXL's VAE
  // overflows in fp16 (black or NaN images); bf16 is safe on GPUs.
  AutoencoderKL load_vae(const std::optional<std::filesystem::path>& vae_path = std::nullopt,
                         at::ScalarType dtype = at::kFloat) const;
  // tokenizer/: `tokenizer_path` when given, else the folder's tokenizer/ (diffusers) or a
  // tokenizer/ folder next to the single file; lt::InputError saying how to name one otherwise.
  CLIPTokenizer load_tokenizer(const std::optional<std::filesystem::path>& tokenizer_path = std::nullopt) const;
  // tokenizer_2/: the folder's own (its special_tokens_map.json gives the pad token), else a
  // tokenizer_2/ beside the tokenizer folder used, else the first tokenizer's vocabulary padding
  // with "!" (SDXL's convention; kohya sets pad_token_id 0, diffusers ships pad_token "!").
  CLIPTokenizer load_tokenizer_2(const std::optional<std::filesystem::path>& tokenizer_path = std::nullopt) const;

 private:
  std::filesystem::path path_;
  std::shared_ptr<io::SafetensorsFile> file_;  // single file (null for a folder)
  Detection detection_;
};

struct SDXLLoadOptions {
  std::optional<at::ScalarType> dtype;                  // UNet and text encoders (nullopt: fp32)
  at::ScalarType vae_dtype = at::kFloat;
  std::optional<std::filesystem::path> tokenizer_path;  // single files: the CLIP vocabulary
  std::optional<std::filesystem::path> vae_path;        // a VAE replacing the bundled one
};

struct SDXLComponents {
  UNet2DConditionModel unet{nullptr};
  AutoencoderKL vae{nullptr};
  CLIPTextModel text_encoder{nullptr};
  CLIPTextModelWithProjection text_encoder_2{nullptr};
  std::optional<CLIPTokenizer> tokenizer;
  std::optional<CLIPTokenizer> tokenizer_2;
};

// Every component of the SDXL checkpoint at `path`, loaded and checked against each other
// (check_sdxl_components).
SDXLComponents load_sdxl_components(const std::filesystem::path& path, const SDXLLoadOptions& options = {});

// The widths that must agree between SDXL's parts: UNet cross_attention_dim = text_encoder hidden
// + text_encoder_2 hidden; projection_class_embeddings_input_dim = text_encoder_2 projection_dim +
// 6 * addition_time_embed_dim. Throws lt::InputError naming the mismatch (`source` for context).
void check_sdxl_components(const UNetConfig& unet, const CLIPTextConfig& text_encoder,
                           const CLIPTextConfig& text_encoder_2, const std::string& source);

// The text conditioning of one batch.
struct SDXLTextEmbeddings {
  // [B, L, hidden_1 + hidden_2] (B x 77 x 2048 for SDXL): the penultimate layer's hidden states
  // of both encoders (no final layer norm), concatenated on features. clip_skip does not apply:
  // kohya ignores it for SDXL (with a warning) and AI Toolkit always takes the penultimate layer.
  at::Tensor context;
  // [B, projection_dim] (B x 1280): text_encoder_2's projected pooled output (its text_embeds),
  // the UNet's added `text_embeds`.
  at::Tensor pooled;
};

// Runs both encoders on token ids [B, L] (each from its own tokenizer) on their device.
SDXLTextEmbeddings encode_sdxl_text(CLIPTextModelImpl& text_encoder, CLIPTextModelWithProjectionImpl& text_encoder_2,
                                    const at::Tensor& input_ids, const at::Tensor& input_ids_2);

// Captions -> token ids [B, model_max_length] as SD pipelines tokenize (padding to max length,
// truncation), on the CPU.
at::Tensor clip_input_ids(const CLIPTokenizer& tokenizer, const std::vector<std::string>& captions);

// One sample's size micro-conditioning, in pixels of the training image.
struct SDXLSizeConditioning {
  int64_t original_height = 0;  // the source image before it was resized
  int64_t original_width = 0;
  int64_t crop_top = 0;         // where the crop starts in the resized image
  int64_t crop_left = 0;
  int64_t target_height = 0;    // the size trained at (the bucket) / generated
  int64_t target_width = 0;
};

// add_time_ids [B, 6] float32, diffusers' order: original (h, w), crop (top, left), target (h, w).
at::Tensor sdxl_add_time_ids(const std::vector<SDXLSizeConditioning>& samples);

}  // namespace lt::models::sd
