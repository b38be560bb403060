// Stable Diffusion VAE: mirrors diffusers `AutoencoderKL` (Encoder, quant_conv, post_quant_conv,
// Decoder) with the module tree of diffusers' vae/ state dict. Also serves Flux's 16-channel VAE
// (use_quant_conv false, shift_factor), which is a config value of the same class.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/sd/blocks.h"

namespace lt::models::sd {

// The diffusers AutoencoderKL config.json keys, verbatim.
struct VAEConfig {
  int64_t in_channels = 3;                      // image channels
  int64_t out_channels = 3;
  std::vector<std::string> down_block_types;    // DownEncoderBlock2D per level
  std::vector<std::string> up_block_types;      // UpDecoderBlock2D per level
  std::vector<int64_t> block_out_channels;      // SD: 128,256,512,512
  int64_t layers_per_block = 2;                 // resnets per encoder level (decoder: +1)
  std::string act_fn = "silu";                  // resnets' activation (conv_act is always SiLU)
  int64_t latent_channels = 4;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 512;                    // image tile size of tiled decoding
  double scaling_factor = 0.18215;              // latents fed to the UNet = (z - shift) * scale
  std::optional<double> shift_factor;           // Flux: 0.1159; SD: none
  bool force_upcast = true;                     // run in fp32 even when the rest is fp16
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;

  // Reads a diffusers vae/config.json; throws lt::InputError naming the key on unsupported values.
  static VAEConfig from_json(const nlohmann::json& j);
  // The SD1.x/2.x VAE (128,256,512,512, 4 latent channels, scaling 0.18215).
  static VAEConfig sd();
  // SDXL's VAE: the same architecture, latents scaled by 0.13025, 1024-px tiles.
  static VAEConfig sdxl();
  // Infers the config from tensor shapes in diffusers naming (`prefix` + encoder.conv_in.weight) or
  // LDM naming (`prefix` + encoder.down.0...; pass "first_stage_model."). scaling_factor and
  // shift_factor are not stored in weights: SD's values for 4 latent channels, Flux's for 16.
  static VAEConfig detect_from_weights(const io::SafetensorsFile& file, const std::string& prefix);
  nlohmann::json to_json() const;
  // Pixels per latent cell: every level but the last halves the image (SD's four levels: 8).
  int64_t downscale_factor() const { return int64_t{1} << (block_out_channels.size() - 1); }
};

// Mirrors diffusers `UNetMidBlock2D` as the VAE uses it: resnet, (attention, resnet); no time embedding.
class VAEMidBlockImpl : public torch::nn::Module {
 public:
  VAEMidBlockImpl(const VAEConfig& config, int64_t channels);
  // x: [B, C, H, W] -> [B, C, H, W]
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList attentions{nullptr};  // empty without mid_block_add_attention
  torch::nn::ModuleList resnets{nullptr};
};
TORCH_MODULE(VAEMidBlock);

// Mirrors diffusers `DownEncoderBlock2D` (resnets, then a padding-0 downsampler except at the end)
// and `UpDecoderBlock2D` (resnets, then an upsampler except at the end).
class VAEBlockImpl : public torch::nn::Module {
 public:
  VAEBlockImpl(const VAEConfig& config, int64_t in_channels, int64_t out_channels, int64_t num_layers,
               bool down, bool resample);
  // x: [B, in, H, W] -> [B, out, H', W'] (H' = H/2 down, 2H up, H at the last level)
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList downsamplers{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};
};
TORCH_MODULE(VAEBlock);

// Mirrors diffusers `Encoder` (double_z): image [B, in, H, W] -> moments [B, 2*latent, H/f, W/f].
class EncoderImpl : public torch::nn::Module {
 public:
  explicit EncoderImpl(const VAEConfig& config);
  at::Tensor forward(const at::Tensor& x);
  Conv2d conv_in{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};
  VAEMidBlock mid_block{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  Conv2d conv_out{nullptr};
};
TORCH_MODULE(Encoder);

// Mirrors diffusers `Decoder`: latent [B, latent, h, w] -> image [B, out, h*f, w*f].
class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const VAEConfig& config);
  at::Tensor forward(const at::Tensor& z);
  Conv2d conv_in{nullptr};
  VAEMidBlock mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  Conv2d conv_out{nullptr};
};
TORCH_MODULE(Decoder);

// Mirrors diffusers `DiagonalGaussianDistribution` (logvar clamped to [-30, 20]).
struct DiagonalGaussian {
  at::Tensor mean;    // [B, latent, h, w]
  at::Tensor logvar;
  at::Tensor stddev;  // diffusers `std`
  at::Tensor var;
  static DiagonalGaussian from_moments(const at::Tensor& moments);  // [B, 2*latent, h, w]
  // mean + std * N(0, 1), noise drawn from `generator` (default: the global CPU generator).
  at::Tensor sample(std::optional<at::Generator> generator = std::nullopt) const;
  const at::Tensor& mode() const { return mean; }
};

class AutoencoderKLImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLImpl(const VAEConfig& config);
  // image: [B, in, H, W] in [-1, 1] -> latent distribution over [B, latent, H/f, W/f].
  DiagonalGaussian encode(const at::Tensor& image);
  // latent (unscaled): [B, latent, h, w] -> image [B, out, h*f, w*f].
  at::Tensor decode(const at::Tensor& latent);
  // The latents the diffusion model sees: (z - shift_factor) * scaling_factor, and back.
  at::Tensor scale_latents(const at::Tensor& z) const;
  at::Tensor unscale_latents(const at::Tensor& z) const;

  // Memory options (diffusers enable_slicing / enable_tiling): slicing runs one image at a time;
  // tiling encodes and decodes overlapping tiles of tile_latent_min_size latent cells (the config's
  // sample_size in pixels) and blends the seams. An image no larger than a tile is tiled at about half
  // its larger side (not below kMinTileLatent latent cells; rounded up so that the tiles step by whole
  // latent cells), so tiling always lowers the peak.
  bool use_slicing = false;
  bool use_tiling = false;
  int64_t tile_latent_min_size;
  double tile_overlap_factor = 0.25;
  static constexpr int64_t kMinTileLatent = 8;

  void set_gradient_checkpointing(bool on);
  void set_attention_query_chunk(int64_t rows);
  int64_t downscale_factor() const { return config.downscale_factor(); }

  VAEConfig config;
  Encoder encoder{nullptr};
  Decoder decoder{nullptr};
  Conv2d quant_conv{nullptr};       // absent with use_quant_conv false
  Conv2d post_quant_conv{nullptr};  // absent with use_post_quant_conv false

 private:
  at::Tensor decode_one(const at::Tensor& latent);
  // The tile side in latent cells for a latent of h x w cells; 0 = do not tile.
  int64_t tile_latent_for(int64_t h, int64_t w) const;
  at::Tensor tiled_encode(const at::Tensor& image, int64_t tile_latent);
  at::Tensor tiled_decode(const at::Tensor& latent, int64_t tile_latent);
};
TORCH_MODULE(AutoencoderKL);

}  // namespace lt::models::sd
