// Wan 2.1 files as users have them, loaded into the diffusers-named modules:
//
//   official / ComfyUI    wan2.1_t2v_1.3B_fp16.safetensors, wan2.1_t2v_14B_fp8_scaled.safetensors, ...:
//   transformer file      native names (blocks.N.self_attn.q, ffn.0, head.modulation), optionally under
//                         model.diffusion_model.; bf16/fp16, plain fp8 or ComfyUI scaled fp8
//   official / ComfyUI    wan_2.1_vae.safetensors: native names (encoder.downsamples.K.residual.N,
//   VAE file              decoder.upsamples.K, conv1/conv2 = quant convs, head)
//   diffusers folder      model_index.json, transformer/, vae/ (config.json + weights in diffusers names)
//
// native -> diffusers renames: self_attn/cross_attn -> attn1/attn2, q/k/v/o -> to_q/to_k/to_v/to_out.0,
// norm3 (the cross-attention norm) -> norm2, ffn.0/ffn.2 -> ffn.net.0.proj/ffn.net.2, modulation ->
// scale_shift_table, head.head -> proj_out, time/text embeddings -> condition_embedder.*. The
// transformer's sizes come from the shapes (head width 128, as every Wan 2.1 model has).
#pragma once
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/wan/transformer.h"
#include "loratrain/models/wan/vae.h"

namespace lt::models::wan {

inline constexpr const char* kComfyTransformerRoot = "model.diffusion_model.";

// The native (official/ComfyUI) name of a diffusers module key; the key itself when it has none.
std::string native_transformer_key(const std::string& diffusers_key);
std::string native_vae_key(const std::string& diffusers_key, const WanVaeConfig& config);

// How a transformer file names its tensors.
struct TransformerLayout {
  bool native = true;  // native names (else diffusers names)
  std::string root;    // "" or "model.diffusion_model."
};

// Throws lt::InputError with one clear message when the file is not a Wan 2.1 text-to-video
// transformer (another family, a VAE or text encoder, Wan I2V / 2.2 TI2V / VACE).
TransformerLayout detect_transformer_layout(const io::SafetensorsFile& file);
// The config from the shapes (head width 128).
WanTransformerConfig detect_transformer_config(const io::SafetensorsFile& file, const TransformerLayout& layout);

// Loads strictly (every missing, unexpected and mis-shaped key at once); fp8 and scaled fp8 are
// widened to `dtype` (nullopt: the model's dtype) as they are read.
void load_transformer(WanTransformer3DModelImpl& model, const io::SafetensorsFile& file, const TransformerLayout& layout,
                      std::optional<at::ScalarType> dtype = std::nullopt);
// A single transformer file (layout and config detected from the keys and shapes), or a diffusers
// transformer/ folder (config.json + diffusion_pytorch_model.safetensors): model built and loaded.
WanTransformer3DModel load_transformer_file(const std::filesystem::path& path, std::optional<at::ScalarType> dtype = std::nullopt);

// Native or diffusers VAE names, detected from the keys; throws lt::InputError for a non-Wan VAE file.
void load_vae(AutoencoderKLWanImpl& vae, const io::SafetensorsFile& file);

// The model's tensors under their native names (as official and ComfyUI files store them).
std::vector<std::pair<std::string, at::Tensor>> native_transformer_tensors(WanTransformer3DModelImpl& model,
                                                                           const std::string& root = "");
std::vector<std::pair<std::string, at::Tensor>> native_vae_tensors(AutoencoderKLWanImpl& vae);

}  // namespace lt::models::wan
