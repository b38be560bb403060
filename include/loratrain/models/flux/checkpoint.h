// Flux.1 files as users have them, loaded into the diffusers-named modules:
//
//   BFL single file       flux1-dev.safetensors / flux1-schnell.safetensors: the transformer only, in
//                         BFL names (double_blocks.N.img_attn.qkv, single_blocks.N.linear1, ...); the
//                         text encoders and VAE come from clip_l.safetensors, t5xxl*.safetensors and
//                         ae.safetensors beside it (ComfyUI's file names)
//   ComfyUI all-in-one    the same under model.diffusion_model., plus text_encoders.clip_l.transformer.*,
//                         text_encoders.t5xxl.transformer.* and vae.* (LDM VAE names)
//   diffusers folder      model_index.json, transformer/ (sharded diffusion_pytorch_model-0000N-of-0000M
//                         + index json, or one file), text_encoder/ (CLIP-L), text_encoder_2/ (T5),
//                         vae/, tokenizer/ (CLIP BPE), tokenizer_2/ (spiece.model)
//
// BFL -> diffusers: fused qkv rows split into to_q/to_k/to_v (add_*_proj for text), single blocks'
// linear1 rows split into to_q/to_k/to_v/proj_mlp, final_layer.adaLN_modulation.1's halves swapped
// (BFL shift, scale; diffusers scale, shift). Block counts and widths come from the shapes.
// fp8 files (plain or ComfyUI scaled) are widened to the compute dtype as they are read, or, for a
// base that trains quantized to fp8 (keep_fp8), their Linear weights stay the 8-bit codes they are.
#pragma once
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/flux/transformer.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_tokenizer.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/models/text/t5_tokenizer.h"

namespace lt::models::flux {

inline constexpr const char* kComfyTransformerRoot = "model.diffusion_model.";
inline constexpr const char* kComfyClipLRoot = "text_encoders.clip_l.transformer.";
inline constexpr const char* kComfyT5Root = "text_encoders.t5xxl.transformer.";
inline constexpr const char* kComfyVAERoot = "vae.";

// A Linear of BFL's Flux blocks and the diffusers Linears it holds, stacked on rows in this order
// (img_attn.qkv holds attn.to_q, to_k, to_v); paths relative to the block (double_blocks.N. /
// transformer_blocks.N., single_blocks.N. / single_transformer_blocks.N.).
struct BflBlockLinear {
  std::string bfl;
  std::vector<std::string> diffusers;
};
// Every Linear of a double-stream and of a single-stream block.
const std::vector<BflBlockLinear>& bfl_double_block_linears();
const std::vector<BflBlockLinear>& bfl_single_block_linears();

// The transformer's config from BFL-named shapes under `root`.
FluxConfig detect_bfl_config(const io::SafetensorsFile& file, const std::string& root);

// Loads a BFL-named transformer under `root` strictly (every missing, unexpected, mis-shaped key
// at once, in BFL names). `dtype`: weights converted as read (nullopt: fp32). `keep_fp8`: fp8
// Linear weights stay 8-bit codes (LoadOptions::keep_fp8_linear_weights).
void load_bfl_transformer(FluxTransformer2DModelImpl& model, const io::SafetensorsFile& file, const std::string& root,
                          std::optional<at::ScalarType> dtype = std::nullopt, bool keep_fp8 = false);

// The model's weights in BFL names under `root` (fused qkv and linear1, BFL's adaLN order), as
// BFL and ComfyUI files store them.
std::vector<std::pair<std::string, at::Tensor>> bfl_tensors(FluxTransformer2DModelImpl& model, const std::string& root);

// A Flux.1 checkpoint opened and checked once; components load on demand, frozen, in eval mode.
class FluxCheckpoint {
 public:
  // Throws lt::InputError for a missing path, a non-Flux.1 file (Flux.2, Chroma, a T5 file, ...),
  // or missing parts (naming every one). `vae_path` replaces the bundled or companion VAE.
  static FluxCheckpoint open(const std::filesystem::path& path, const std::optional<std::filesystem::path>& vae_path = {});

  bool is_single_file() const { return file_ != nullptr; }
  bool guidance_embeds() const { return config_.guidance_embeds; }
  const FluxConfig& config() const { return config_; }

  // `keep_fp8`: Linear weights an fp8 file stores as e4m3fn stay 8-bit codes with their scales (the
  // frozen fp8 path of model.quantize), never widened to `dtype`.
  FluxTransformer2DModel load_transformer(std::optional<at::ScalarType> dtype = std::nullopt, bool keep_fp8 = false) const;
  CLIPTextModel load_text_encoder(std::optional<at::ScalarType> dtype = std::nullopt) const;      // CLIP-L
  T5EncoderModel load_text_encoder_2(std::optional<at::ScalarType> dtype = std::nullopt, bool keep_fp8 = false) const;
  sd::AutoencoderKL load_vae() const;  // fp32, scaling/shift of Flux (0.3611, 0.1159) for single files
  // tokenizer/ (CLIP BPE): `tokenizer_path`, the folder's, or tokenizer/ beside a single file.
  CLIPTokenizer load_tokenizer(const std::optional<std::filesystem::path>& tokenizer_path) const;
  // tokenizer_2/ (spiece.model): the folder's, or tokenizer_2/ beside the single file or beside
  // `tokenizer_path`; `max_length` is the T5 sequence length (512 dev, 256 schnell).
  T5Tokenizer load_tokenizer_2(const std::optional<std::filesystem::path>& tokenizer_path) const;

 private:
  std::filesystem::path path_;
  std::shared_ptr<io::SafetensorsFile> file_;  // the single file (transformer, or all-in-one)
  std::string root_;                           // transformer root in file_
  bool all_in_one_ = false;
  std::filesystem::path clip_path_, t5_path_;  // companions of a bare BFL file
  std::optional<std::filesystem::path> vae_path_;
  FluxConfig config_;
};

}  // namespace lt::models::flux
