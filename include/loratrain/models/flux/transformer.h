// Flux.1's denoiser: mirrors diffusers `FluxTransformer2DModel` with its module tree, so diffusers
// state-dict keys load by name (transformer/ folders) and BFL/ComfyUI single files load through
// flux/checkpoint.h's conversion.
//
//   x_embedder, context_embedder              packed latent tokens / T5 states -> inner_dim
//   time_text_embed                           timestep (+ guidance, dev) + CLIP pooled -> temb
//   transformer_blocks.N  (double stream)     text and image streams with their own weights,
//                                             attention over [text; image]
//   single_transformer_blocks.N               one stream over [text; image], attention and MLP
//                                             in parallel
//   norm_out, proj_out                        the image tokens -> packed prediction
//
// Attention runs on q/k after a per-head RMSNorm and 3-axis rotary embedding on adjacent pairs
// (axes_dims_rope; text ids are zero, image ids (0, row, col)). Timestep and guidance come in as
// sigma in [0, 1] and the guidance value; the model scales both by 1000 as diffusers does.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "loratrain/models/attention.h"
#include "loratrain/models/layers.h"

namespace lt::models::flux {

// The diffusers FluxTransformer2DModel config.json keys, verbatim. Defaults: FLUX.1-dev.
struct FluxConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;               // 16 latent channels x 2 x 2 packed cells
  std::optional<int64_t> out_channels;    // null: in_channels
  int64_t num_layers = 19;                // double-stream blocks
  int64_t num_single_layers = 38;         // single-stream blocks
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;     // T5 width
  int64_t pooled_projection_dim = 768;    // CLIP-L pooled width
  bool guidance_embeds = true;            // dev: true, schnell: false
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};  // sums to attention_head_dim

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t output_channels() const { return out_channels.value_or(in_channels); }

  // Throws lt::InputError naming the key for wrong types or inconsistent values.
  static FluxConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  nlohmann::json to_json() const;
  // Checks the rope axes against the head width and the sizes are positive.
  void validate(const std::string& source) const;
};

// Mirrors diffusers `FluxAttention`: to_q/k/v with per-head RMSNorm; with `context` (double
// blocks) add_q/k/v_proj, norm_added_q/k, to_out.0 and to_add_out; without (single blocks,
// pre_only) no output projection.
class FluxAttentionImpl : public torch::nn::Module {
 public:
  FluxAttentionImpl(const FluxConfig& config, bool context);
  // x [B, L, D] (image stream, or the joint stream in single blocks), ctx [B, T, D] or undefined,
  // rope {cos, sin} [T+L, head_dim] -> {image/joint output, text output (undefined without ctx)}.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& ctx, const at::Tensor& cos,
                                            const at::Tensor& sin);

  int64_t heads;
  int64_t head_dim;
  AttentionOptions options;
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
  Linear add_q_proj{nullptr}, add_k_proj{nullptr}, add_v_proj{nullptr};
  RMSNorm norm_added_q{nullptr}, norm_added_k{nullptr};
  torch::nn::ModuleList to_out{nullptr};  // [Linear] (to_out.0)
  Linear to_add_out{nullptr};
};
TORCH_MODULE(FluxAttention);

// Mirrors diffusers `AdaLayerNormZero` (chunks shift, scale, gate for attention and MLP) and
// `AdaLayerNormZeroSingle` (shift, scale, gate): linear(silu(temb)) modulating a LayerNorm
// without affine (eps 1e-6).
class AdaLayerNormZeroImpl : public torch::nn::Module {
 public:
  AdaLayerNormZeroImpl(int64_t dim, int64_t chunks);
  // x [B, L, D], temb [B, D] -> {modulated norm of x, the chunks [B, D] each (shift, scale, gate, ...)}
  std::pair<at::Tensor, std::vector<at::Tensor>> forward(const at::Tensor& x, const at::Tensor& temb);
  int64_t chunks;
  Linear linear{nullptr};
};
TORCH_MODULE(AdaLayerNormZero);

// Mirrors diffusers `GELU(dim, inner, approximate="tanh")`: proj, then tanh-approximated GELU.
class GELUProjImpl : public torch::nn::Module {
 public:
  GELUProjImpl(int64_t dim, int64_t inner);
  at::Tensor forward(const at::Tensor& x);
  Linear proj{nullptr};
};
TORCH_MODULE(GELUProj);

// Mirrors diffusers `FeedForward(dim, activation_fn="gelu-tanh")`: net = [GELU with proj, Dropout, Linear].
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t inner);
  at::Tensor forward(const at::Tensor& x);
  GELUProj act{nullptr};  // net.0
  Linear out{nullptr};    // net.2
  torch::nn::ModuleList net{nullptr};
};
TORCH_MODULE(FeedForward);

// Mirrors diffusers `FluxTransformerBlock` (double stream).
class FluxTransformerBlockImpl : public torch::nn::Module {
 public:
  explicit FluxTransformerBlockImpl(const FluxConfig& config);
  // -> {image [B, L, D], text [B, T, D]}
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& ctx, const at::Tensor& temb,
                                            const at::Tensor& cos, const at::Tensor& sin);
  AdaLayerNormZero norm1{nullptr}, norm1_context{nullptr};
  FluxAttention attn{nullptr};
  FeedForward ff{nullptr}, ff_context{nullptr};
};
TORCH_MODULE(FluxTransformerBlock);

// Mirrors diffusers `FluxSingleTransformerBlock`: x = [text; image] tokens.
class FluxSingleTransformerBlockImpl : public torch::nn::Module {
 public:
  explicit FluxSingleTransformerBlockImpl(const FluxConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& cos, const at::Tensor& sin);
  AdaLayerNormZero norm{nullptr};
  Linear proj_mlp{nullptr};
  FluxAttention attn{nullptr};
  Linear proj_out{nullptr};
};
TORCH_MODULE(FluxSingleTransformerBlock);

// Mirrors diffusers `TimestepEmbedding` / `PixArtAlphaTextProjection`: linear_1, SiLU, linear_2.
class MLPEmbedderImpl : public torch::nn::Module {
 public:
  MLPEmbedderImpl(int64_t in, int64_t dim);
  at::Tensor forward(const at::Tensor& x);
  Linear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(MLPEmbedder);

// Mirrors diffusers `CombinedTimestepGuidanceTextProjEmbeddings` (dev) and
// `CombinedTimestepTextProjEmbeddings` (schnell: no guidance_embedder).
class FluxTimeTextEmbedImpl : public torch::nn::Module {
 public:
  FluxTimeTextEmbedImpl(const FluxConfig& config);
  // timestep, guidance: [B], already x1000; guidance undefined = not embedded. pooled [B, P] -> [B, D]
  at::Tensor forward(const at::Tensor& timestep, const at::Tensor& guidance, const at::Tensor& pooled);
  MLPEmbedder timestep_embedder{nullptr};
  MLPEmbedder guidance_embedder{nullptr};  // null for schnell
  MLPEmbedder text_embedder{nullptr};
};
TORCH_MODULE(FluxTimeTextEmbed);

// Mirrors diffusers `AdaLayerNormContinuous` as norm_out uses it (chunks scale, shift).
class AdaLayerNormContinuousImpl : public torch::nn::Module {
 public:
  explicit AdaLayerNormContinuousImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& temb);
  Linear linear{nullptr};
};
TORCH_MODULE(AdaLayerNormContinuous);

struct FluxInputs {
  at::Tensor hidden_states;          // [B, L, in_channels] packed latents
  at::Tensor encoder_hidden_states;  // [B, T, joint_attention_dim]
  at::Tensor pooled_projections;     // [B, pooled_projection_dim]
  at::Tensor timestep;               // [B] sigma in [0, 1]
  at::Tensor img_ids;                // [L, 3]
  at::Tensor txt_ids;                // [T, 3]
  at::Tensor guidance;               // [B] (dev) or undefined
};

class FluxTransformer2DModelImpl : public torch::nn::Module {
 public:
  explicit FluxTransformer2DModelImpl(const FluxConfig& config);
  // -> [B, L, output_channels], in the weights' dtype.
  at::Tensor forward(const FluxInputs& in);
  void set_gradient_checkpointing(bool enabled) { gradient_checkpointing_ = enabled; }
  // Query rows per attention chunk (0: plain) and whether the CPU's speed rule may override that
  // (AttentionOptions::cpu_speed_rule).
  void set_attention_query_chunk(int64_t rows, bool cpu_speed_rule = true);
  // AI Toolkit's bypass_guidance_embedding: the guidance embedder is left out of temb (training).
  void set_bypass_guidance(bool bypass) { bypass_guidance_ = bypass; }

  FluxConfig config;
  Linear x_embedder{nullptr};
  Linear context_embedder{nullptr};
  FluxTimeTextEmbed time_text_embed{nullptr};
  torch::nn::ModuleList transformer_blocks{nullptr};
  torch::nn::ModuleList single_transformer_blocks{nullptr};
  AdaLayerNormContinuous norm_out{nullptr};
  Linear proj_out{nullptr};

 private:
  bool gradient_checkpointing_ = false;
  bool bypass_guidance_ = false;
};
TORCH_MODULE(FluxTransformer2DModel);

// diffusers FluxPosEmbed: ids [S, 3] -> {cos, sin} [S, sum(axes)] fp32, each axis' frequencies
// theta^(-2j/d) repeated for the pair they rotate.
std::pair<at::Tensor, at::Tensor> flux_rope(const at::Tensor& ids, const std::vector<int64_t>& axes, double theta = 10000);

// Latents [B, C, h, w] -> tokens [B, (h/2)(w/2), 4C] (FluxPipeline._pack_latents), and back.
at::Tensor pack_latents(const at::Tensor& latents);
at::Tensor unpack_latents(const at::Tensor& tokens, int64_t channels, int64_t h, int64_t w);
// img_ids for an (h/2) x (w/2) token grid: [(h/2)(w/2), 3] rows (0, row, col), float32.
at::Tensor latent_image_ids(int64_t token_rows, int64_t token_cols);

}  // namespace lt::models::flux
