// Wan 2.1's video denoiser: mirrors diffusers `WanTransformer3DModel` with its module tree, so
// diffusers state-dict keys load by name (transformer/ folders) and the official/ComfyUI single
// files load through wan/checkpoint.h's renaming.
//
//   patch_embedding                  Conv3d, kernel = stride = patch (1, 2, 2): latents -> tokens
//   condition_embedder               time_embedder (sinusoid -> temb), time_proj (temb -> 6 modulation
//                                    chunks), text_embedder (umT5 states -> dim)
//   blocks.N                         norm1 + attn1 (self, 3-D RoPE, modulated and gated),
//                                    norm2 + attn2 (cross to the text, affine norm, not modulated),
//                                    norm3 + ffn (modulated and gated); scale_shift_table [1, 6, dim]
//   norm_out, proj_out, scale_shift_table [1, 2, dim]   the tokens -> unpatchified prediction
//
// q and k are RMS-normalised over the full width (all heads together) before the heads split.
// The timestep comes in raw, in [0, 1000]. Modulation and the norms run in fp32.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/models/attention.h"
#include "loratrain/models/layers.h"

namespace lt::models::wan {

// The diffusers WanTransformer3DModel config.json keys, verbatim. Defaults: Wan2.1-T2V-1.3B.
struct WanTransformerConfig {
  std::vector<int64_t> patch_size = {1, 2, 2};
  int64_t num_attention_heads = 12;
  int64_t attention_head_dim = 128;
  int64_t in_channels = 16;
  int64_t out_channels = 16;
  int64_t text_dim = 4096;
  int64_t freq_dim = 256;
  int64_t ffn_dim = 8960;
  int64_t num_layers = 30;
  bool cross_attn_norm = true;
  std::string qk_norm = "rms_norm_across_heads";
  double eps = 1e-6;
  int64_t rope_max_seq_len = 1024;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  // Throws lt::InputError naming the key for wrong types or unsupported values (image
  // conditioning, I2V, is not built: image_dim and added_kv_proj_dim must be null).
  static WanTransformerConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  nlohmann::json to_json() const;
  void validate(const std::string& source) const;

  static WanTransformerConfig wan21_1_3b();
  static WanTransformerConfig wan21_14b();
};

// Mirrors torch.nn.Conv3d (groups 1, dilation 1, no padding) as the patch embedding uses it.
class PatchConv3dImpl : public torch::nn::Module {
 public:
  PatchConv3dImpl(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel);
  at::Tensor forward(const at::Tensor& x);
  std::vector<int64_t> kernel;
  at::Tensor weight;  // [out, in, kt, kh, kw]
  at::Tensor bias;    // [out]
};
TORCH_MODULE(PatchConv3d);

// Mirrors diffusers FP32LayerNorm: layer norm computed in fp32, with or without weight and bias.
class FP32LayerNormImpl : public torch::nn::Module {
 public:
  FP32LayerNormImpl(int64_t dim, double eps, bool affine);
  at::Tensor forward(const at::Tensor& x);  // -> fp32
  int64_t dim;
  double eps;
  at::Tensor weight, bias;  // undefined without affine
};
TORCH_MODULE(FP32LayerNorm);

// Mirrors diffusers `WanAttention` without image keys: to_q/k/v, norm_q/k over the full width,
// to_out.0. Self-attention rotates q and k; cross-attention takes k and v from the text.
class WanAttentionImpl : public torch::nn::Module {
 public:
  explicit WanAttentionImpl(const WanTransformerConfig& config);
  // x [B, L, D]; context [B, T, D] or undefined (self-attention); cos/sin [L, head_dim] or undefined.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& cos, const at::Tensor& sin);

  int64_t heads;
  int64_t head_dim;
  AttentionOptions options;
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
  torch::nn::ModuleList to_out{nullptr};  // [Linear] (to_out.0)
};
TORCH_MODULE(WanAttention);

// Mirrors diffusers `FeedForward(dim, inner, activation_fn="gelu-approximate")`:
// net.0.proj (then tanh GELU), net.1 dropout, net.2.
class WanFeedForwardImpl : public torch::nn::Module {
 public:
  WanFeedForwardImpl(int64_t dim, int64_t inner);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::ModuleList net{nullptr};
  Linear proj{nullptr}, out{nullptr};
};
TORCH_MODULE(WanFeedForward);

// linear_1, activation, linear_2: diffusers `TimestepEmbedding` (SiLU) and
// `PixArtAlphaTextProjection(act_fn="gelu_tanh")`.
class TwoLayerMLPImpl : public torch::nn::Module {
 public:
  TwoLayerMLPImpl(int64_t in, int64_t dim, bool gelu_tanh);
  at::Tensor forward(const at::Tensor& x);
  bool gelu_tanh;
  Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(TwoLayerMLP);

// Mirrors diffusers `WanTimeTextImageEmbedding` (text-to-video: no image_embedder).
class WanConditionEmbedderImpl : public torch::nn::Module {
 public:
  explicit WanConditionEmbedderImpl(const WanTransformerConfig& config);
  int64_t freq_dim;
  TwoLayerMLP time_embedder{nullptr};
  Linear time_proj{nullptr};
  TwoLayerMLP text_embedder{nullptr};
};
TORCH_MODULE(WanConditionEmbedder);

// Mirrors diffusers `WanTransformerBlock`. Note diffusers' norm2 is the affine cross-attention
// norm and norm3 the FFN norm (the official checkpoints have them the other way round).
class WanTransformerBlockImpl : public torch::nn::Module {
 public:
  explicit WanTransformerBlockImpl(const WanTransformerConfig& config);
  // x [B, L, D], context [B, T, D], modulation [B, 6, D] (fp32), cos/sin [L, head_dim] -> [B, L, D]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& modulation,
                     const at::Tensor& cos, const at::Tensor& sin);
  FP32LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  WanAttention attn1{nullptr}, attn2{nullptr};
  WanFeedForward ffn{nullptr};
  at::Tensor scale_shift_table;  // [1, 6, D]
};
TORCH_MODULE(WanTransformerBlock);

class WanTransformer3DModelImpl : public torch::nn::Module {
 public:
  explicit WanTransformer3DModelImpl(const WanTransformerConfig& config);
  // hidden_states [B, C, F, H, W] latents (H, W multiples of the patch), timestep [B] raw in
  // [0, 1000], encoder_hidden_states [B, T, text_dim] (rows past the prompt zero, as pipelines
  // pad them) -> [B, out_channels, F, H, W] in the weights' dtype.
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& timestep, const at::Tensor& encoder_hidden_states);
  void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }
  // Query rows per attention chunk (0: plain) and whether the CPU's speed rule may override that
  // (AttentionOptions::cpu_speed_rule).
  void set_attention_query_chunk(int64_t rows, bool cpu_speed_rule = true);

  WanTransformerConfig config;
  PatchConv3d patch_embedding{nullptr};
  WanConditionEmbedder condition_embedder{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  FP32LayerNorm norm_out{nullptr};
  Linear proj_out{nullptr};
  at::Tensor scale_shift_table;  // [1, 2, D]

 private:
  bool gradient_checkpointing_ = false;
};
TORCH_MODULE(WanTransformer3DModel);

// diffusers WanRotaryPosEmbed for an f x h x w token grid: {cos, sin} [f*h*w, head_dim] fp32. The
// head width splits into frame, row and column parts (h = w = 2*(head_dim/6), t the rest), each
// with its own frequencies theta^(-2j/d), repeated for the adjacent pair they rotate.
std::pair<at::Tensor, at::Tensor> wan_rope(int64_t frames, int64_t rows, int64_t cols, int64_t head_dim,
                                           int64_t max_positions, double theta = 10000);

}  // namespace lt::models::wan
