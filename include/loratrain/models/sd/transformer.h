// The spatial transformer of the SD UNet: Transformer2DModel (continuous input), its
// BasicTransformerBlock and the GEGLU FeedForward, under diffusers' module names.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>

#include "loratrain/models/layers.h"
#include "loratrain/models/sd/blocks.h"

namespace lt::models::sd {

// Mirrors diffusers `GEGLU`: proj to 2*dim_out, then value * gelu(gate).
class GEGLUImpl : public torch::nn::Module {
 public:
  GEGLUImpl(int64_t dim_in, int64_t dim_out);
  // x: [..., dim_in] -> [..., dim_out]
  at::Tensor forward(const at::Tensor& x);
  Linear proj{nullptr};
};
TORCH_MODULE(GEGLU);

// Mirrors diffusers `FeedForward` with activation "geglu": net.0 = GEGLU, net.1 = Dropout,
// net.2 = Linear (inner -> dim).
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t mult = 4, double dropout = 0.0);
  // x: [B, L, dim] -> [B, L, dim]
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList net{nullptr};
  GEGLU act{nullptr};
  torch::nn::Dropout drop{nullptr};
  Linear out{nullptr};
};
TORCH_MODULE(FeedForward);

struct BasicTransformerBlockOptions {
  int64_t dim = 0;
  int64_t num_attention_heads = 0;
  int64_t attention_head_dim = 0;
  std::optional<int64_t> cross_attention_dim;  // nullopt: attn2 is self-attention too
  bool only_cross_attention = false;           // attn1 attends to encoder_hidden_states
  bool upcast_attention = false;
  double dropout = 0.0;
  double norm_eps = 1e-5;
  int64_t query_chunk = -1;                    // see AttentionModuleOptions::query_chunk
};

// Mirrors diffusers `BasicTransformerBlock` (norm_type "layer_norm"): self-attention, cross-attention
// and a GEGLU feed-forward, each pre-normed and residual.
class BasicTransformerBlockImpl : public torch::nn::Module {
 public:
  explicit BasicTransformerBlockImpl(const BasicTransformerBlockOptions& options);
  // hidden: [B, L, dim], encoder_hidden_states: [B, S, cross_attention_dim] -> [B, L, dim].
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& encoder_hidden_states = {});

  BasicTransformerBlockOptions options;
  bool gradient_checkpointing = false;

  torch::nn::LayerNorm norm1{nullptr};
  Attention attn1{nullptr};
  torch::nn::LayerNorm norm2{nullptr};
  Attention attn2{nullptr};
  torch::nn::LayerNorm norm3{nullptr};
  FeedForward ff{nullptr};

 private:
  at::Tensor forward_impl(const at::Tensor& hidden, const at::Tensor& encoder_hidden_states);
};
TORCH_MODULE(BasicTransformerBlock);

struct Transformer2DModelOptions {
  int64_t num_attention_heads = 0;
  int64_t attention_head_dim = 0;
  int64_t in_channels = 0;
  int64_t num_layers = 1;
  std::optional<int64_t> cross_attention_dim;
  int64_t norm_num_groups = 32;
  bool use_linear_projection = false;
  bool only_cross_attention = false;
  bool upcast_attention = false;
  double dropout = 0.0;
  int64_t query_chunk = -1;
};

// Mirrors diffusers `Transformer2DModel` for continuous input: GroupNorm(eps 1e-6), proj_in
// (1x1 conv, or Linear with use_linear_projection), transformer_blocks, proj_out, residual.
class Transformer2DModelImpl : public torch::nn::Module {
 public:
  explicit Transformer2DModelImpl(const Transformer2DModelOptions& options);
  // x: [B, C, H, W], encoder_hidden_states: [B, S, D] -> [B, C, H, W].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& encoder_hidden_states);

  Transformer2DModelOptions options;
  torch::nn::GroupNorm norm{nullptr};
  Conv2d proj_in_conv{nullptr};  // registered as proj_in / proj_out, one of conv or linear
  Linear proj_in_linear{nullptr};
  torch::nn::ModuleList transformer_blocks{nullptr};
  Conv2d proj_out_conv{nullptr};
  Linear proj_out_linear{nullptr};

  void set_gradient_checkpointing(bool on);
};
TORCH_MODULE(Transformer2DModel);

}  // namespace lt::models::sd
