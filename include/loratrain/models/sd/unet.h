// Stable Diffusion UNet: mirrors diffusers `UNet2DConditionModel` over the SD1.x / SD2.x
// configuration space (and SDXL's "text_time" added embedding, which is a config value of the same
// class). The module tree is diffusers' key tree, so a diffusers `unet/` state dict loads by name.
#pragma once
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
#include "loratrain/models/sd/transformer.h"

namespace lt::models::sd {

// The diffusers UNet2DConditionModel config.json keys this implementation honours, verbatim.
// Per-block values given as a single int/bool in config.json are expanded to one per down block.
// Keys describing features outside SD1.x/2.x/XL (class embeddings, GLIGEN, ...) must be at their
// defaults; from_json() rejects anything else with a message naming the key.
struct UNetConfig {
  int64_t in_channels = 4;                        // latent channels in
  int64_t out_channels = 4;                       // latent channels out
  bool center_input_sample = false;               // sample = 2*sample - 1 first
  bool flip_sin_to_cos = true;                    // timestep embedding order cos, sin
  double freq_shift = 0;                          // downscale_freq_shift of the sinusoid
  std::vector<std::string> down_block_types;      // CrossAttnDownBlock2D | DownBlock2D
  std::string mid_block_type = "UNetMidBlock2DCrossAttn";
  std::vector<std::string> up_block_types;        // UpBlock2D | CrossAttnUpBlock2D
  std::vector<bool> only_cross_attention;         // per down block (attn1 attends to the context)
  std::vector<int64_t> block_out_channels;        // channels per level, e.g. 320,640,1280,1280
  std::vector<int64_t> layers_per_block;          // resnets per down block (up blocks have +1)
  int64_t downsample_padding = 1;
  double mid_block_scale_factor = 1.0;            // output_scale_factor of the mid resnets
  double dropout = 0.0;
  std::string act_fn = "silu";
  int64_t norm_num_groups = 32;
  double norm_eps = 1e-5;
  std::vector<int64_t> cross_attention_dim;       // per down block: text embedding width
  std::vector<int64_t> transformer_layers_per_block;  // BasicTransformerBlocks per attention
  // diffusers' historic naming: this is the NUMBER OF HEADS per down block (SD1: 8 everywhere,
  // SD2: 5,10,20,20 = channels/64); the head width is channels / heads.
  std::vector<int64_t> attention_head_dim;
  bool use_linear_projection = false;             // proj_in/proj_out Linear (SD2) or 1x1 conv (SD1)
  bool upcast_attention = false;                  // attention scores in fp32 (SD2.1)
  double resnet_out_scale_factor = 1.0;
  bool resnet_skip_time_act = false;
  int64_t conv_in_kernel = 3;
  int64_t conv_out_kernel = 3;
  std::optional<std::string> addition_embed_type;     // "text_time" (SDXL) or none
  std::optional<int64_t> addition_time_embed_dim;     // SDXL: 256
  std::optional<int64_t> projection_class_embeddings_input_dim;  // SDXL: 2816
  std::optional<int64_t> sample_size;             // informational (latent size of training)

  // Reads a diffusers unet/config.json. Throws lt::InputError naming the key on unsupported values.
  static UNetConfig from_json(const nlohmann::json& j);
  // The diffusers default config (SD1.5: 320,640,1280,1280, 8 heads, cross_attention_dim 768).
  static UNetConfig sd15();
  // SDXL base 1.0's config (320,640,1280; transformer depths 1,2,10 with no attention at the first
  // level; 2048-wide context; text_time added embedding of 1280 + 6 x 256 inputs).
  static UNetConfig sdxl();
  // Infers the config from tensor names and shapes, in diffusers naming (keys `prefix` + conv_in...)
  // or LDM naming (`prefix` + input_blocks...; pass "model.diffusion_model."). Values that weights do
  // not carry follow the family convention: 8 heads when cross_attention_dim is 768 (SD1), else
  // channels/64 heads (SD2, SDXL); conventional_groups(); upcast_attention false.
  static UNetConfig detect_from_weights(const io::SafetensorsFile& file, const std::string& prefix);
  nlohmann::json to_json() const;

  size_t num_blocks() const { return block_out_channels.size(); }
  bool down_has_attention(size_t i) const { return down_block_types.at(i) == "CrossAttnDownBlock2D"; }
  bool up_has_attention(size_t i) const { return up_block_types.at(i) == "CrossAttnUpBlock2D"; }
};

// Mirrors diffusers `TimestepEmbedding`: linear_1, act, linear_2.
class TimestepEmbeddingImpl : public torch::nn::Module {
 public:
  TimestepEmbeddingImpl(int64_t in_channels, int64_t time_embed_dim, std::string act_fn);
  // x: [B, in] -> [B, time_embed_dim]
  at::Tensor forward(const at::Tensor& x);
  std::string act_fn;
  Linear linear_1{nullptr};
  Linear linear_2{nullptr};
};
TORCH_MODULE(TimestepEmbedding);

// GroupNorm groups are not stored in weights: 32 (every released SD model), or the largest power of
// two dividing all `channels` for narrower test-sized models.
int64_t conventional_groups(const std::vector<int64_t>& channels);

// diffusers get_timestep_embedding (max_period 10000, scale 1): timesteps [N] -> [N, dim] fp32.
at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim, bool flip_sin_to_cos,
                              double downscale_freq_shift);

// Mirrors diffusers `CrossAttnDownBlock2D` (with attentions) and `DownBlock2D` (without).
class UNetDownBlockImpl : public torch::nn::Module {
 public:
  UNetDownBlockImpl(const UNetConfig& config, size_t index);
  // x: [B, in, H, W] -> [B, out, H/2, W/2] (or H, W in the last block); appends every resnet /
  // attention output and the downsampled one to `skips` for the up path.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& encoder_hidden_states,
                     std::vector<at::Tensor>& skips);
  bool has_cross_attention;
  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList attentions{nullptr};
  torch::nn::ModuleList downsamplers{nullptr};
};
TORCH_MODULE(UNetDownBlock);

// Mirrors diffusers `UNetMidBlock2DCrossAttn`: resnet, (attention, resnet) x 1.
class UNetMidBlock2DCrossAttnImpl : public torch::nn::Module {
 public:
  explicit UNetMidBlock2DCrossAttnImpl(const UNetConfig& config);
  // x: [B, C, H, W] -> [B, C, H, W]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& encoder_hidden_states);
  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList attentions{nullptr};
};
TORCH_MODULE(UNetMidBlock2DCrossAttn);

// Mirrors diffusers `CrossAttnUpBlock2D` (with attentions) and `UpBlock2D` (without).
class UNetUpBlockImpl : public torch::nn::Module {
 public:
  UNetUpBlockImpl(const UNetConfig& config, size_t index);
  // x: [B, prev, H, W]; consumes resnets.size() tensors from the back of `skips` (concatenated on
  // channels) -> [B, out, 2H, 2W] (or upsample_size; H, W in the last block).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& encoder_hidden_states,
                     std::vector<at::Tensor>& skips, std::optional<std::vector<int64_t>> upsample_size);
  bool has_cross_attention;
  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList attentions{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};
};
TORCH_MODULE(UNetUpBlock);

// SDXL's micro-conditioning inputs (addition_embed_type "text_time").
struct UNetAddedCond {
  at::Tensor text_embeds;  // [B, pooled text width]
  at::Tensor time_ids;     // [B, 6]: original size, crop top-left, target size
};

class UNet2DConditionModelImpl : public torch::nn::Module {
 public:
  explicit UNet2DConditionModelImpl(const UNetConfig& config);
  // sample: [B, in_channels, H, W]; timestep: [B] or a scalar tensor (int or float);
  // encoder_hidden_states: [B, S, cross_attention_dim] -> [B, out_channels, H, W].
  at::Tensor forward(const at::Tensor& sample, const at::Tensor& timestep,
                     const at::Tensor& encoder_hidden_states, const UNetAddedCond& added = {});

  // Recompute every resnet and transformer block in backward (diffusers enable_gradient_checkpointing).
  void set_gradient_checkpointing(bool on);
  // Rows per query chunk in every attention (-1: follow lt::models::default_query_chunk(); 0: plain).
  void set_attention_query_chunk(int64_t rows);

  UNetConfig config;
  int64_t num_upsamplers = 0;
  Conv2d conv_in{nullptr};
  TimestepEmbedding time_embedding{nullptr};
  TimestepEmbedding add_embedding{nullptr};  // SDXL only
  torch::nn::ModuleList down_blocks{nullptr};
  UNetMidBlock2DCrossAttn mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  torch::nn::GroupNorm conv_norm_out{nullptr};
  Conv2d conv_out{nullptr};
};
TORCH_MODULE(UNet2DConditionModel);

}  // namespace lt::models::sd
