// Building blocks shared by the Stable Diffusion UNet and VAE (and reused by later families):
// ResnetBlock2D, Downsample2D, Upsample2D and diffusers' `Attention` module. Submodules are
// registered under diffusers' names so named_parameters() equals the diffusers state-dict keys.
// Every Linear/Conv2d is an lt::models::Linear/Conv2d, the leaves LoRA attaches to.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/models/layers.h"

namespace lt::models::sd {

// diffusers get_activation(): "silu"/"swish", "gelu", "mish", "relu". Throws lt::InputError for
// any other name.
at::Tensor activation(const std::string& act_fn, const at::Tensor& x);
// True when activation() knows the name (configs are validated with it up front).
bool is_known_activation(const std::string& act_fn);

struct ResnetBlock2DOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;                 // 0 = in_channels
  std::optional<int64_t> temb_channels;     // nullopt: no time_emb_proj (the VAE's resnets)
  int64_t groups = 32;                      // GroupNorm groups of norm1
  int64_t groups_out = 0;                   // of norm2; 0 = groups
  double eps = 1e-6;
  double dropout = 0.0;
  std::string act_fn = "silu";
  double output_scale_factor = 1.0;
  bool skip_time_act = false;               // diffusers resnet_skip_time_act
};

// Mirrors diffusers `ResnetBlock2D` (time_embedding_norm "default", no up/down sampling inside).
class ResnetBlock2DImpl : public torch::nn::Module {
 public:
  explicit ResnetBlock2DImpl(const ResnetBlock2DOptions& options);
  // x: [B, in, H, W], temb: [B, temb_channels] or undefined -> [B, out, H, W].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb = {});

  ResnetBlock2DOptions options;
  // Recompute this block in backward instead of keeping its activations (models/checkpointing.h).
  bool gradient_checkpointing = false;

  torch::nn::GroupNorm norm1{nullptr};
  Conv2d conv1{nullptr};
  Linear time_emb_proj{nullptr};  // absent without temb_channels
  torch::nn::GroupNorm norm2{nullptr};
  torch::nn::Dropout dropout{nullptr};
  Conv2d conv2{nullptr};
  Conv2d conv_shortcut{nullptr};  // 1x1, only when in_channels != out_channels

 private:
  at::Tensor forward_impl(const at::Tensor& x, const at::Tensor& temb);
};
TORCH_MODULE(ResnetBlock2D);

// Mirrors diffusers `Downsample2D` with use_conv=True: a 3x3 stride-2 conv named `conv`.
// padding = 0 (the VAE) pads the input by (left 0, right 1, top 0, bottom 1) first, as LDM does.
class Downsample2DImpl : public torch::nn::Module {
 public:
  Downsample2DImpl(int64_t channels, int64_t out_channels, int64_t padding);
  // x: [B, C, H, W] -> [B, out, ceil(H/2), ceil(W/2)] (padding 1) or [B, out, H/2, W/2].
  at::Tensor forward(const at::Tensor& x);

  int64_t padding;
  Conv2d conv{nullptr};
};
TORCH_MODULE(Downsample2D);

// Mirrors diffusers `Upsample2D` with use_conv=True: nearest x2 (or to `output_size`) then 3x3 conv.
class Upsample2DImpl : public torch::nn::Module {
 public:
  Upsample2DImpl(int64_t channels, int64_t out_channels);
  // x: [B, C, H, W] -> [B, out, 2H, 2W] (or output_size {H', W'} when given).
  at::Tensor forward(const at::Tensor& x, std::optional<std::vector<int64_t>> output_size = std::nullopt);

  Conv2d conv{nullptr};
};
TORCH_MODULE(Upsample2D);

struct AttentionModuleOptions {
  int64_t query_dim = 0;
  std::optional<int64_t> cross_attention_dim;  // width of encoder_hidden_states; nullopt = query_dim
  int64_t heads = 8;
  int64_t dim_head = 64;
  bool bias = false;                  // bias of to_q / to_k / to_v
  bool out_bias = true;               // bias of to_out.0
  double dropout = 0.0;
  bool upcast_attention = false;      // scores and softmax in fp32
  std::optional<int64_t> norm_num_groups;  // GroupNorm `group_norm` over channels first (VAE)
  double eps = 1e-5;                  // of group_norm
  bool residual_connection = false;   // add the input back (VAE mid-block attention)
  double rescale_output_factor = 1.0;
  // Rows of queries per chunk for the memory-efficient path; -1 = lt::models::default_query_chunk()
  // at call time, 0 = plain attention.
  int64_t query_chunk = -1;
  bool cpu_speed_rule = true;  // lt::models::AttentionOptions::cpu_speed_rule
};

// Mirrors diffusers `Attention` with AttnProcessor2_0 (to_q, to_k, to_v, to_out.0, optional
// group_norm, residual and rescale). Self-attention when encoder_hidden_states is undefined.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionModuleOptions& options);
  // hidden: [B, L, query_dim] or [B, query_dim, H, W] (then attended over H*W positions);
  // encoder_hidden_states: [B, S, cross_attention_dim] or undefined -> same shape as hidden.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& encoder_hidden_states = {});

  AttentionModuleOptions options;
  torch::nn::GroupNorm group_norm{nullptr};
  Linear to_q{nullptr};
  Linear to_k{nullptr};
  Linear to_v{nullptr};
  torch::nn::ModuleList to_out{nullptr};  // [0] Linear, [1] Dropout (no parameters)
  Linear to_out_proj{nullptr};            // the same module as to_out[0]
  torch::nn::Dropout to_out_dropout{nullptr};
};
TORCH_MODULE(Attention);

}  // namespace lt::models::sd
