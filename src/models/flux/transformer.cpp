#include "loratrain/models/flux/transformer.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "loratrain/models/attention.h"
#include "loratrain/models/checkpointing.h"
#include "loratrain/models/json_fields.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/util/error.h"

namespace lt::models::flux {

namespace {

constexpr double kNormEps = 1e-6;

at::Tensor layer_norm(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, kNormEps); }

// bf16 Flux run in fp16 overflows: diffusers clips the streams after every block.
at::Tensor clip_fp16(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? x.clamp(-65504.0, 65504.0) : x;
}

// diffusers Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0): [cos | sin].
at::Tensor timestep_projection(const at::Tensor& t) { return sd::timestep_embedding(t.reshape({-1}), 256, true, 0.0); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config

FluxConfig FluxConfig::from_json(const nlohmann::json& j, const std::string& source) {
  FluxConfig c;
  const std::string what = "FluxTransformer2DModel (" + source + ")";
  const char* w = what.c_str();
  c.patch_size = json_get_or<int64_t>(j, "patch_size", c.patch_size, w);
  c.in_channels = json_get_or<int64_t>(j, "in_channels", c.in_channels, w);
  if (j.contains("out_channels") && !j["out_channels"].is_null()) c.out_channels = json_get_or<int64_t>(j, "out_channels", 0, w);
  c.num_layers = json_get_or<int64_t>(j, "num_layers", c.num_layers, w);
  c.num_single_layers = json_get_or<int64_t>(j, "num_single_layers", c.num_single_layers, w);
  c.attention_head_dim = json_get_or<int64_t>(j, "attention_head_dim", c.attention_head_dim, w);
  c.num_attention_heads = json_get_or<int64_t>(j, "num_attention_heads", c.num_attention_heads, w);
  c.joint_attention_dim = json_get_or<int64_t>(j, "joint_attention_dim", c.joint_attention_dim, w);
  c.pooled_projection_dim = json_get_or<int64_t>(j, "pooled_projection_dim", c.pooled_projection_dim, w);
  c.guidance_embeds = json_get_or<bool>(j, "guidance_embeds", c.guidance_embeds, w);
  c.axes_dims_rope = json_get_or<std::vector<int64_t>>(j, "axes_dims_rope", c.axes_dims_rope, w);
  c.validate(source);
  return c;
}

nlohmann::json FluxConfig::to_json() const {
  nlohmann::json j = {{"_class_name", "FluxTransformer2DModel"},
                      {"patch_size", patch_size},
                      {"in_channels", in_channels},
                      {"num_layers", num_layers},
                      {"num_single_layers", num_single_layers},
                      {"attention_head_dim", attention_head_dim},
                      {"num_attention_heads", num_attention_heads},
                      {"joint_attention_dim", joint_attention_dim},
                      {"pooled_projection_dim", pooled_projection_dim},
                      {"guidance_embeds", guidance_embeds},
                      {"axes_dims_rope", axes_dims_rope}};
  j["out_channels"] = out_channels ? nlohmann::json(*out_channels) : nlohmann::json(nullptr);
  return j;
}

void FluxConfig::validate(const std::string& source) const {
  if (patch_size != 1) {
    throw InputError(source + ": FluxTransformer2DModel patch_size " + std::to_string(patch_size) +
                     " is not supported (Flux.1 packs 2x2 latent cells before the model: patch_size 1)");
  }
  if (in_channels <= 0 || num_layers < 0 || num_single_layers < 0 || attention_head_dim <= 0 ||
      num_attention_heads <= 0 || joint_attention_dim <= 0 || pooled_projection_dim <= 0 || output_channels() <= 0) {
    throw InputError(source + ": FluxTransformer2DModel sizes must be positive");
  }
  int64_t sum = 0;
  for (int64_t a : axes_dims_rope) {
    if (a <= 0 || a % 2 != 0) throw InputError(source + ": axes_dims_rope entries must be positive and even");
    sum += a;
  }
  if (axes_dims_rope.size() != 3 || sum != attention_head_dim) {
    throw InputError(source + ": axes_dims_rope must be three axes summing to attention_head_dim " +
                     std::to_string(attention_head_dim) + " (got " + std::to_string(sum) + ")");
  }
}

// ---------------------------------------------------------------------------------------------
// Layers

FluxAttentionImpl::FluxAttentionImpl(const FluxConfig& config, bool context)
    : heads(config.num_attention_heads), head_dim(config.attention_head_dim) {
  const int64_t dim = config.inner_dim();
  options.query_chunk = default_query_chunk();
  to_q = register_module("to_q", Linear(dim, dim));
  to_k = register_module("to_k", Linear(dim, dim));
  to_v = register_module("to_v", Linear(dim, dim));
  norm_q = register_module("norm_q", RMSNorm(head_dim, kNormEps));
  norm_k = register_module("norm_k", RMSNorm(head_dim, kNormEps));
  if (context) {
    add_q_proj = register_module("add_q_proj", Linear(dim, dim));
    add_k_proj = register_module("add_k_proj", Linear(dim, dim));
    add_v_proj = register_module("add_v_proj", Linear(dim, dim));
    norm_added_q = register_module("norm_added_q", RMSNorm(head_dim, kNormEps));
    norm_added_k = register_module("norm_added_k", RMSNorm(head_dim, kNormEps));
    to_out = register_module("to_out", torch::nn::ModuleList(Linear(dim, dim)));
    to_add_out = register_module("to_add_out", Linear(dim, dim));
  }
}

std::pair<at::Tensor, at::Tensor> FluxAttentionImpl::forward(const at::Tensor& x, const at::Tensor& ctx,
                                                             const at::Tensor& cos, const at::Tensor& sin) {
  auto heads_of = [this](const at::Tensor& t) { return t.unflatten(-1, {heads, head_dim}); };  // [B, S, H, D]
  at::Tensor q = norm_q(heads_of(to_q(x)));
  at::Tensor k = norm_k(heads_of(to_k(x)));
  at::Tensor v = heads_of(to_v(x));
  const int64_t text = ctx.defined() ? ctx.size(1) : 0;
  if (ctx.defined()) {
    q = torch::cat({norm_added_q(heads_of(add_q_proj(ctx))), q}, 1);
    k = torch::cat({norm_added_k(heads_of(add_k_proj(ctx))), k}, 1);
    v = torch::cat({heads_of(add_v_proj(ctx)), v}, 1);
  }
  q = apply_rope(q, cos, sin);
  k = apply_rope(k, cos, sin);
  at::Tensor out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), options);  // [B, H, S, D]
  out = out.transpose(1, 2).flatten(2).to(x.scalar_type());                                      // [B, S, H*D]
  if (!ctx.defined()) return {out, at::Tensor()};
  at::Tensor text_out = out.narrow(1, 0, text);
  at::Tensor image_out = out.narrow(1, text, out.size(1) - text);
  return {to_out[0]->as<LinearImpl>()->forward(image_out), to_add_out(text_out)};
}

AdaLayerNormZeroImpl::AdaLayerNormZeroImpl(int64_t dim, int64_t chunks_) : chunks(chunks_) {
  linear = register_module("linear", Linear(dim, chunks * dim));
}

std::pair<at::Tensor, std::vector<at::Tensor>> AdaLayerNormZeroImpl::forward(const at::Tensor& x, const at::Tensor& temb) {
  std::vector<at::Tensor> parts = linear(torch::silu(temb)).chunk(chunks, 1);
  at::Tensor normed = layer_norm(x) * (1 + parts[1].unsqueeze(1)) + parts[0].unsqueeze(1);
  return {normed, parts};
}

GELUProjImpl::GELUProjImpl(int64_t dim, int64_t inner) { proj = register_module("proj", Linear(dim, inner)); }

at::Tensor GELUProjImpl::forward(const at::Tensor& x) { return torch::gelu(proj(x), "tanh"); }

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t inner) {
  act = GELUProj(dim, inner);
  out = Linear(inner, dim);
  net = register_module("net", torch::nn::ModuleList(act, torch::nn::Dropout(0.0), out));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) { return out(act(x)); }

// ---------------------------------------------------------------------------------------------
// Blocks

FluxTransformerBlockImpl::FluxTransformerBlockImpl(const FluxConfig& config) {
  const int64_t dim = config.inner_dim();
  norm1 = register_module("norm1", AdaLayerNormZero(dim, 6));
  norm1_context = register_module("norm1_context", AdaLayerNormZero(dim, 6));
  attn = register_module("attn", FluxAttention(config, /*context=*/true));
  ff = register_module("ff", FeedForward(dim, 4 * dim));
  ff_context = register_module("ff_context", FeedForward(dim, 4 * dim));
}

std::pair<at::Tensor, at::Tensor> FluxTransformerBlockImpl::forward(const at::Tensor& x, const at::Tensor& ctx,
                                                                    const at::Tensor& temb, const at::Tensor& cos,
                                                                    const at::Tensor& sin) {
  // Chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  auto [x_norm, m] = norm1(x, temb);
  auto [c_norm, cm] = norm1_context(ctx, temb);
  auto [x_attn, c_attn] = attn(x_norm, c_norm, cos, sin);
  auto modulate = [](const at::Tensor& t, const at::Tensor& shift, const at::Tensor& scale) {
    return layer_norm(t) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
  };
  at::Tensor h = x + m[2].unsqueeze(1) * x_attn;
  h = h + m[5].unsqueeze(1) * ff(modulate(h, m[3], m[4]));
  at::Tensor c = ctx + cm[2].unsqueeze(1) * c_attn;
  c = c + cm[5].unsqueeze(1) * ff_context(modulate(c, cm[3], cm[4]));
  return {clip_fp16(h), clip_fp16(c)};
}

FluxSingleTransformerBlockImpl::FluxSingleTransformerBlockImpl(const FluxConfig& config) {
  const int64_t dim = config.inner_dim();
  norm = register_module("norm", AdaLayerNormZero(dim, 3));
  proj_mlp = register_module("proj_mlp", Linear(dim, 4 * dim));
  attn = register_module("attn", FluxAttention(config, /*context=*/false));
  proj_out = register_module("proj_out", Linear(5 * dim, dim));
}

at::Tensor FluxSingleTransformerBlockImpl::forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& cos,
                                                   const at::Tensor& sin) {
  auto [x_norm, m] = norm(x, temb);  // shift, scale, gate
  at::Tensor mlp = torch::gelu(proj_mlp(x_norm), "tanh");
  at::Tensor attn_out = attn(x_norm, at::Tensor(), cos, sin).first;
  return clip_fp16(x + m[2].unsqueeze(1) * proj_out(torch::cat({attn_out, mlp}, 2)));
}

MLPEmbedderImpl::MLPEmbedderImpl(int64_t in, int64_t dim) {
  linear_1 = register_module("linear_1", Linear(in, dim));
  linear_2 = register_module("linear_2", Linear(dim, dim));
}

at::Tensor MLPEmbedderImpl::forward(const at::Tensor& x) { return linear_2(torch::silu(linear_1(x))); }

FluxTimeTextEmbedImpl::FluxTimeTextEmbedImpl(const FluxConfig& config) {
  const int64_t dim = config.inner_dim();
  timestep_embedder = register_module("timestep_embedder", MLPEmbedder(256, dim));
  if (config.guidance_embeds) guidance_embedder = register_module("guidance_embedder", MLPEmbedder(256, dim));
  text_embedder = register_module("text_embedder", MLPEmbedder(config.pooled_projection_dim, dim));
}

at::Tensor FluxTimeTextEmbedImpl::forward(const at::Tensor& timestep, const at::Tensor& guidance, const at::Tensor& pooled) {
  const auto dtype = pooled.scalar_type();
  at::Tensor temb = timestep_embedder(timestep_projection(timestep).to(dtype));
  if (guidance_embedder && guidance.defined()) temb = temb + guidance_embedder(timestep_projection(guidance).to(dtype));
  return temb + text_embedder(pooled);
}

AdaLayerNormContinuousImpl::AdaLayerNormContinuousImpl(int64_t dim) {
  linear = register_module("linear", Linear(dim, 2 * dim));
}

at::Tensor AdaLayerNormContinuousImpl::forward(const at::Tensor& x, const at::Tensor& temb) {
  auto parts = linear(torch::silu(temb).to(x.scalar_type())).chunk(2, 1);  // scale, shift
  return layer_norm(x) * (1 + parts[0].unsqueeze(1)) + parts[1].unsqueeze(1);
}

// ---------------------------------------------------------------------------------------------
// Model

FluxTransformer2DModelImpl::FluxTransformer2DModelImpl(const FluxConfig& c) : config(c) {
  config.validate("FluxTransformer2DModel");
  const int64_t dim = config.inner_dim();
  x_embedder = register_module("x_embedder", Linear(config.in_channels, dim));
  context_embedder = register_module("context_embedder", Linear(config.joint_attention_dim, dim));
  time_text_embed = register_module("time_text_embed", FluxTimeTextEmbed(config));
  transformer_blocks = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) transformer_blocks->push_back(FluxTransformerBlock(config));
  single_transformer_blocks = register_module("single_transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_single_layers; ++i) single_transformer_blocks->push_back(FluxSingleTransformerBlock(config));
  norm_out = register_module("norm_out", AdaLayerNormContinuous(dim));
  proj_out = register_module("proj_out", Linear(dim, config.patch_size * config.patch_size * config.output_channels()));
}

void FluxTransformer2DModelImpl::set_attention_query_chunk(int64_t rows, bool cpu_speed_rule) {
  for (auto& m : modules(false)) {
    if (auto* a = m->as<FluxAttentionImpl>()) {
      a->options.query_chunk = rows;
      a->options.cpu_speed_rule = cpu_speed_rule;
    }
  }
}

at::Tensor FluxTransformer2DModelImpl::forward(const FluxInputs& in) {
  const auto dtype = x_embedder->weight.scalar_type();
  const auto device = x_embedder->weight.device();
  at::Tensor x = x_embedder(in.hidden_states.to(device, dtype));
  at::Tensor ctx = context_embedder(in.encoder_hidden_states.to(device, dtype));
  const at::Tensor timestep = in.timestep.to(device, dtype) * 1000;
  at::Tensor guidance;
  if (config.guidance_embeds && !bypass_guidance_) {
    if (!in.guidance.defined()) throw InputError("this Flux transformer embeds guidance (dev): it needs a guidance value");
    guidance = in.guidance.to(device, dtype) * 1000;
  }
  const at::Tensor temb = time_text_embed(timestep, guidance, in.pooled_projections.to(device, dtype));
  const at::Tensor ids = torch::cat({in.txt_ids, in.img_ids}, 0).to(device);
  auto [cos, sin] = flux_rope(ids, config.axes_dims_rope);
  const bool recompute = gradient_checkpointing_ && torch::GradMode::is_enabled();

  for (const auto& module : *transformer_blocks) {
    auto* block = module->as<FluxTransformerBlockImpl>();
    auto run = [block](const std::vector<at::Tensor>& a) {
      auto [h, c] = block->forward(a[0], a[1], a[2], a[3], a[4]);
      return std::vector<at::Tensor>{h, c};
    };
    const std::vector<at::Tensor> inputs = {x, ctx, temb, cos, sin};
    const std::vector<at::Tensor> out = recompute ? checkpoint(run, inputs) : run(inputs);
    x = out[0];
    ctx = out[1];
  }
  const int64_t text = ctx.size(1);
  at::Tensor joint = torch::cat({ctx, x}, 1);
  for (const auto& module : *single_transformer_blocks) {
    auto* block = module->as<FluxSingleTransformerBlockImpl>();
    auto run = [block](const std::vector<at::Tensor>& a) { return block->forward(a[0], a[1], a[2], a[3]); };
    const std::vector<at::Tensor> inputs = {joint, temb, cos, sin};
    joint = recompute ? checkpoint(run, inputs) : run(inputs);
  }
  x = joint.narrow(1, text, joint.size(1) - text);
  return proj_out(norm_out(x, temb));
}

// ---------------------------------------------------------------------------------------------
// RoPE, packing

std::pair<at::Tensor, at::Tensor> flux_rope(const at::Tensor& ids, const std::vector<int64_t>& axes, double theta) {
  std::vector<at::Tensor> cos, sin;
  const at::Tensor pos = ids.to(at::kDouble);
  for (size_t a = 0; a < axes.size(); ++a) {
    const int64_t d = axes[a];
    const at::Tensor freqs =
        1.0 / torch::pow(theta, torch::arange(0, d, 2, pos.options()).div(static_cast<double>(d)));  // [d/2]
    const at::Tensor angles = pos.select(1, static_cast<int64_t>(a)).unsqueeze(1) * freqs.unsqueeze(0);  // [S, d/2]
    cos.push_back(angles.cos().repeat_interleave(2, 1).to(at::kFloat));
    sin.push_back(angles.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  return {torch::cat(cos, 1), torch::cat(sin, 1)};
}

at::Tensor pack_latents(const at::Tensor& latents) {
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2), w = latents.size(3);
  TORCH_CHECK(h % 2 == 0 && w % 2 == 0, "Flux latents need even sides, got ", h, "x", w);
  return latents.view({b, c, h / 2, 2, w / 2, 2}).permute({0, 2, 4, 1, 3, 5}).reshape({b, (h / 2) * (w / 2), c * 4});
}

at::Tensor unpack_latents(const at::Tensor& tokens, int64_t channels, int64_t h, int64_t w) {
  const int64_t b = tokens.size(0);
  return tokens.reshape({b, h / 2, w / 2, channels, 2, 2}).permute({0, 3, 1, 4, 2, 5}).reshape({b, channels, h, w});
}

at::Tensor latent_image_ids(int64_t rows, int64_t cols) {
  at::Tensor ids = torch::zeros({rows, cols, 3}, torch::kFloat);
  ids.select(2, 1).add_(torch::arange(rows, torch::kFloat).unsqueeze(1));
  ids.select(2, 2).add_(torch::arange(cols, torch::kFloat).unsqueeze(0));
  return ids.reshape({rows * cols, 3});
}

}  // namespace lt::models::flux
