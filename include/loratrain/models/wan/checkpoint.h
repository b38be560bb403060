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
#include "loratrain/models/text/t5.h"
#include "loratrain/models/text/t5_tokenizer.h"
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
// widened to `dtype` (nullopt: the model's dtype) as they are read, except the Linear weights under
// `keep_fp8`: their codes and scales become the Linears' fp8 weights (a base that trains in qfloat8).
void load_transformer(WanTransformer3DModelImpl& model, const io::SafetensorsFile& file, const TransformerLayout& layout,
                      std::optional<at::ScalarType> dtype = std::nullopt, bool keep_fp8 = false);
// A single transformer file (layout and config detected from the keys and shapes), or a diffusers
// transformer/ folder (config.json + diffusion_pytorch_model.safetensors): model built and loaded.
WanTransformer3DModel load_transformer_file(const std::filesystem::path& path, std::optional<at::ScalarType> dtype = std::nullopt,
                                            bool keep_fp8 = false);

// Native or diffusers VAE names, detected from the keys; throws lt::InputError for a non-Wan VAE file.
void load_vae(AutoencoderKLWanImpl& vae, const io::SafetensorsFile& file);

// The VAE's sizes from a file's shapes (native or diffusers names): base_dim and z_dim; the levels,
// res blocks and temporal downsampling of Wan 2.1 (a file of another layout fails the strict load).
WanVaeConfig detect_vae_config(const io::SafetensorsFile& file);
// A VAE file (native or diffusers names) or a diffusers vae/ folder (config.json + weights), loaded
// in fp32 (the VAE's causal convolutions run in fp32, as the pipelines upcast it).
AutoencoderKLWan load_vae_file(const std::filesystem::path& path);

// A Wan 2.1 text-to-video checkpoint opened and checked once; components load on demand, frozen,
// in eval mode:
//   single file        the transformer (native, ComfyUI or diffusers names); beside it, as ComfyUI
//                      users keep them: umt5_xxl*.safetensors (umT5, with its spiece_model) and
//                      wan_2.1_vae*.safetensors / Wan2_1_VAE*.safetensors
//   diffusers folder   model_index.json, transformer/ (one file or shards), vae/, text_encoder/
//                      (UMT5EncoderModel), tokenizer/ (spiece.model)
class WanCheckpoint {
 public:
  // Throws lt::InputError for a missing path, a non-Wan-2.1-T2V transformer, or missing parts
  // (naming every one). `vae_path` replaces the companion VAE; `tokenizer_path` (a spiece.model or
  // a folder holding one) the embedded or companion tokenizer.
  static WanCheckpoint open(const std::filesystem::path& path, const std::optional<std::filesystem::path>& vae_path = {},
                            const std::optional<std::filesystem::path>& tokenizer_path = {});

  bool is_single_file() const { return !std::filesystem::is_directory(path_); }
  const WanTransformerConfig& config() const { return config_; }
  // The file or folder whose identity names the transformer's weights (cache keys).
  std::filesystem::path transformer_path() const { return is_single_file() ? path_ : path_ / "transformer"; }

  // `keep_fp8`: an fp8 file's Linear weights stay codes (load_transformer above).
  WanTransformer3DModel load_transformer(std::optional<at::ScalarType> dtype = std::nullopt, bool keep_fp8 = false) const;
  AutoencoderKLWan load_vae() const;
  T5EncoderModel load_text_encoder(std::optional<at::ScalarType> dtype = std::nullopt, bool keep_fp8 = false) const;  // umT5
  T5Tokenizer load_tokenizer() const;

 private:
  std::filesystem::path path_;
  std::filesystem::path vae_path_, text_encoder_path_;
  std::optional<std::filesystem::path> tokenizer_path_;
  WanTransformerConfig config_;
};

// The model's tensors under their native names (as official and ComfyUI files store them).
std::vector<std::pair<std::string, at::Tensor>> native_transformer_tensors(WanTransformer3DModelImpl& model,
                                                                           const std::string& root = "");
std::vector<std::pair<std::string, at::Tensor>> native_vae_tensors(AutoencoderKLWanImpl& vae);

}  // namespace lt::models::wan
