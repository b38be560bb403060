#include "loratrain/models/wan/transformer.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "loratrain/models/attention.h"
#include "loratrain/models/checkpointing.h"
#include "loratrain/models/json_fields.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/util/error.h"

namespace lt::models::wan {

namespace {

// diffusers get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0): [cos | sin].
at::Tensor sinusoid(const at::Tensor& t, int64_t dim) { return sd::timestep_embedding(t, dim, true, 0.0); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config

WanTransformerConfig WanTransformerConfig::from_json(const nlohmann::json& j, const std::string& source) {
  WanTransformerConfig c;
  const std::string what = "WanTransformer3DModel (" + source + ")";
  const char* w = what.c_str();
  c.patch_size = json_get_or<std::vector<int64_t>>(j, "patch_size", c.patch_size, w);
  c.num_attention_heads = json_get_or<int64_t>(j, "num_attention_heads", c.num_attention_heads, w);
  c.attention_head_dim = json_get_or<int64_t>(j, "attention_head_dim", c.attention_head_dim, w);
  c.in_channels = json_get_or<int64_t>(j, "in_channels", c.in_channels, w);
  c.out_channels = json_get_or<int64_t>(j, "out_channels", c.out_channels, w);
  c.text_dim = json_get_or<int64_t>(j, "text_dim", c.text_dim, w);
  c.freq_dim = json_get_or<int64_t>(j, "freq_dim", c.freq_dim, w);
  c.ffn_dim = json_get_or<int64_t>(j, "ffn_dim", c.ffn_dim, w);
  c.num_layers = json_get_or<int64_t>(j, "num_layers", c.num_layers, w);
  c.cross_attn_norm = json_get_or<bool>(j, "cross_attn_norm", c.cross_attn_norm, w);
  c.qk_norm = json_get_or<std::string>(j, "qk_norm", c.qk_norm, w);
  c.eps = json_get_or<double>(j, "eps", c.eps, w);
  c.rope_max_seq_len = json_get_or<int64_t>(j, "rope_max_seq_len", c.rope_max_seq_len, w);
  for (const char* key : {"image_dim", "added_kv_proj_dim", "pos_embed_seq_len"}) {
    if (j.contains(key) && !j[key].is_null()) {
      throw InputError(source + ": WanTransformer3DModel '" + key +
                       "' is set: image-to-video Wan is not supported (text-to-video only)");
    }
  }
  c.validate(source);
  return c;
}

nlohmann::json WanTransformerConfig::to_json() const {
  return {{"_class_name", "WanTransformer3DModel"},
          {"patch_size", patch_size},
          {"num_attention_heads", num_attention_heads},
          {"attention_head_dim", attention_head_dim},
          {"in_channels", in_channels},
          {"out_channels", out_channels},
          {"text_dim", text_dim},
          {"freq_dim", freq_dim},
          {"ffn_dim", ffn_dim},
          {"num_layers", num_layers},
          {"cross_attn_norm", cross_attn_norm},
          {"qk_norm", qk_norm},
          {"eps", eps},
          {"image_dim", nullptr},
          {"added_kv_proj_dim", nullptr},
          {"rope_max_seq_len", rope_max_seq_len}};
}

void WanTransformerConfig::validate(const std::string& source) const {
  if (patch_size.size() != 3 || patch_size[0] <= 0 || patch_size[1] <= 0 || patch_size[2] <= 0) {
    throw InputError(source + ": WanTransformer3DModel patch_size must be three positive sizes");
  }
  if (num_attention_heads <= 0 || attention_head_dim <= 0 || in_channels <= 0 || out_channels <= 0 || text_dim <= 0 ||
      freq_dim <= 0 || freq_dim % 2 != 0 || ffn_dim <= 0 || num_layers < 0 || rope_max_seq_len <= 0) {
    throw InputError(source + ": WanTransformer3DModel sizes must be positive (freq_dim even)");
  }
  if (attention_head_dim % 2 != 0 || attention_head_dim < 6) {
    throw InputError(source + ": WanTransformer3DModel attention_head_dim must be even and at least 6 (3-D RoPE)");
  }
  if (qk_norm != "rms_norm_across_heads") {
    throw InputError(source + ": WanTransformer3DModel qk_norm '" + qk_norm +
                     "' is not supported (Wan 2.1 uses rms_norm_across_heads)");
  }
}

WanTransformerConfig WanTransformerConfig::wan21_1_3b() { return {}; }

WanTransformerConfig WanTransformerConfig::wan21_14b() {
  WanTransformerConfig c;
  c.num_attention_heads = 40;
  c.ffn_dim = 13824;
  c.num_layers = 40;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Layers

PatchConv3dImpl::PatchConv3dImpl(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel_)
    : kernel(std::move(kernel_)) {
  weight = register_parameter("weight", torch::empty({out_channels, in_channels, kernel[0], kernel[1], kernel[2]}));
  bias = register_parameter("bias", torch::zeros({out_channels}));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_channels * kernel[0] * kernel[1] * kernel[2]));
  torch::NoGradGuard no_grad;
  weight.uniform_(-bound, bound);
  bias.uniform_(-bound, bound);
}

at::Tensor PatchConv3dImpl::forward(const at::Tensor& x) {
  return at::conv3d(x.to(weight.scalar_type()), weight, bias, kernel);
}

FP32LayerNormImpl::FP32LayerNormImpl(int64_t dim_, double eps_, bool affine) : dim(dim_), eps(eps_) {
  if (affine) {
    weight = register_parameter("weight", torch::ones({dim}));
    bias = register_parameter("bias", torch::zeros({dim}));
  }
}

at::Tensor FP32LayerNormImpl::forward(const at::Tensor& x) {
  const at::Tensor w = weight.defined() ? weight.to(at::kFloat) : at::Tensor();
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat) : at::Tensor();
  return at::layer_norm(x.to(at::kFloat), {dim}, w, b, eps);
}

WanAttentionImpl::WanAttentionImpl(const WanTransformerConfig& config)
    : heads(config.num_attention_heads), head_dim(config.attention_head_dim) {
  const int64_t dim = config.inner_dim();
  options.query_chunk = default_query_chunk();
  to_q = register_module("to_q", Linear(dim, dim));
  to_k = register_module("to_k", Linear(dim, dim));
  to_v = register_module("to_v", Linear(dim, dim));
  to_out = register_module("to_out", torch::nn::ModuleList(Linear(dim, dim)));
  norm_q = register_module("norm_q", RMSNorm(dim, config.eps));
  norm_k = register_module("norm_k", RMSNorm(dim, config.eps));
}

at::Tensor WanAttentionImpl::forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& cos,
                                     const at::Tensor& sin) {
  const at::Tensor& kv = context.defined() ? context : x;
  auto heads_of = [this](const at::Tensor& t) { return t.unflatten(-1, {heads, head_dim}); };  // [B, L, H, D]
  at::Tensor q = heads_of(norm_q(to_q(x)));
  at::Tensor k = heads_of(norm_k(to_k(kv)));
  at::Tensor v = heads_of(to_v(kv));
  if (cos.defined()) {
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
  }
  at::Tensor out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), options);  // [B, H, L, D]
  out = out.transpose(1, 2).flatten(2).to(x.scalar_type());
  return to_out[0]->as<LinearImpl>()->forward(out);
}

WanFeedForwardImpl::WanFeedForwardImpl(int64_t dim, int64_t inner) {
  // net.0 is diffusers' GELU module, which holds the projection as `proj`.
  auto gelu = std::make_shared<torch::nn::Module>();
  proj = gelu->register_module("proj", Linear(dim, inner));
  out = Linear(inner, dim);
  net = register_module("net", torch::nn::ModuleList(gelu, torch::nn::Dropout(0.0), out));
}

at::Tensor WanFeedForwardImpl::forward(const at::Tensor& x) { return out(torch::gelu(proj(x), "tanh")); }

TwoLayerMLPImpl::TwoLayerMLPImpl(int64_t in, int64_t dim, bool gelu_tanh_) : gelu_tanh(gelu_tanh_) {
  linear_1 = register_module("linear_1", Linear(in, dim));
  linear_2 = register_module("linear_2", Linear(dim, dim));
}

at::Tensor TwoLayerMLPImpl::forward(const at::Tensor& x) {
  const at::Tensor h = linear_1(x);
  return linear_2(gelu_tanh ? torch::gelu(h, "tanh") : torch::silu(h));
}

WanConditionEmbedderImpl::WanConditionEmbedderImpl(const WanTransformerConfig& config) : freq_dim(config.freq_dim) {
  const int64_t dim = config.inner_dim();
  time_embedder = register_module("time_embedder", TwoLayerMLP(config.freq_dim, dim, /*gelu_tanh=*/false));
  time_proj = register_module("time_proj", Linear(dim, 6 * dim));
  text_embedder = register_module("text_embedder", TwoLayerMLP(config.text_dim, dim, /*gelu_tanh=*/true));
}

// ---------------------------------------------------------------------------------------------
// Block and model

WanTransformerBlockImpl::WanTransformerBlockImpl(const WanTransformerConfig& config) {
  const int64_t dim = config.inner_dim();
  norm1 = register_module("norm1", FP32LayerNorm(dim, config.eps, /*affine=*/false));
  attn1 = register_module("attn1", WanAttention(config));
  attn2 = register_module("attn2", WanAttention(config));
  norm2 = register_module("norm2", FP32LayerNorm(dim, config.eps, /*affine=*/config.cross_attn_norm));
  ffn = register_module("ffn", WanFeedForward(dim, config.ffn_dim));
  norm3 = register_module("norm3", FP32LayerNorm(dim, config.eps, /*affine=*/false));
  scale_shift_table = register_parameter("scale_shift_table", torch::randn({1, 6, dim}) / std::sqrt(static_cast<double>(dim)));
}

at::Tensor WanTransformerBlockImpl::forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& modulation,
                                            const at::Tensor& cos, const at::Tensor& sin) {
  const auto dtype = x.scalar_type();
  // Chunks: shift, scale, gate of self-attention; shift, scale, gate of the FFN. All fp32.
  const std::vector<at::Tensor> m = (scale_shift_table.to(at::kFloat) + modulation.to(at::kFloat)).chunk(6, 1);
  at::Tensor h = (norm1(x) * (1 + m[1]) + m[0]).to(dtype);
  at::Tensor out = (x.to(at::kFloat) + attn1(h, at::Tensor(), cos, sin) * m[2]).to(dtype);
  // norm2 is identity without cross_attn_norm (it then holds no weight): LayerNorm-free input.
  h = norm2->weight.defined() ? norm2(out).to(dtype) : out;
  out = out + attn2(h, context, at::Tensor(), at::Tensor());
  h = (norm3(out) * (1 + m[4]) + m[3]).to(dtype);
  return (out.to(at::kFloat) + ffn(h).to(at::kFloat) * m[5]).to(dtype);
}

WanTransformer3DModelImpl::WanTransformer3DModelImpl(const WanTransformerConfig& c) : config(c) {
  config.validate("WanTransformer3DModel");
  const int64_t dim = config.inner_dim();
  patch_embedding = register_module("patch_embedding", PatchConv3d(config.in_channels, dim, config.patch_size));
  condition_embedder = register_module("condition_embedder", WanConditionEmbedder(config));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) blocks->push_back(WanTransformerBlock(config));
  norm_out = register_module("norm_out", FP32LayerNorm(dim, config.eps, /*affine=*/false));
  const int64_t patch_volume = config.patch_size[0] * config.patch_size[1] * config.patch_size[2];
  proj_out = register_module("proj_out", Linear(dim, config.out_channels * patch_volume));
  scale_shift_table = register_parameter("scale_shift_table", torch::randn({1, 2, dim}) / std::sqrt(static_cast<double>(dim)));
}

void WanTransformer3DModelImpl::set_attention_query_chunk(int64_t rows, bool cpu_speed_rule) {
  for (auto& m : modules(false)) {
    if (auto* a = m->as<WanAttentionImpl>()) {
      a->options.query_chunk = rows;
      a->options.cpu_speed_rule = cpu_speed_rule;
    }
  }
}

at::Tensor WanTransformer3DModelImpl::forward(const at::Tensor& hidden_states, const at::Tensor& timestep,
                                              const at::Tensor& encoder_hidden_states) {
  const auto dtype = patch_embedding->weight.scalar_type();
  const auto device = patch_embedding->weight.device();
  if (hidden_states.dim() != 5) {
    throw InputError("WanTransformer3DModel: hidden_states must be [B, C, F, H, W], got " +
                     std::to_string(hidden_states.dim()) + " dimensions");
  }
  const int64_t b = hidden_states.size(0);
  const auto& p = config.patch_size;
  const int64_t f = hidden_states.size(2) / p[0], rows = hidden_states.size(3) / p[1], cols = hidden_states.size(4) / p[2];
  if (hidden_states.size(2) % p[0] != 0 || hidden_states.size(3) % p[1] != 0 || hidden_states.size(4) % p[2] != 0) {
    throw InputError("WanTransformer3DModel: latent frames/height/width must be multiples of the patch size");
  }
  auto [cos, sin] = wan_rope(f, rows, cols, config.attention_head_dim, config.rope_max_seq_len);
  cos = cos.to(device);
  sin = sin.to(device);

  at::Tensor x = patch_embedding(hidden_states.to(device)).flatten(2).transpose(1, 2).to(dtype);  // [B, L, D]
  // Condition: temb from the sinusoid in the time embedder's dtype; time_proj gives the blocks'
  // six modulation chunks; the text goes through its own projection.
  auto& cond = *condition_embedder;
  const at::Tensor freq = sinusoid(timestep.to(device).reshape({-1}), cond.freq_dim).to(cond.time_embedder->linear_1->weight.scalar_type());
  const at::Tensor temb = cond.time_embedder(freq).to(dtype);                                    // [B, D]
  const at::Tensor modulation = cond.time_proj(torch::silu(temb)).unflatten(1, {6, -1});         // [B, 6, D]
  const at::Tensor context = cond.text_embedder(encoder_hidden_states.to(device, dtype));

  const bool recompute = gradient_checkpointing_ && torch::GradMode::is_enabled();
  for (const auto& module : *blocks) {
    auto* block = module->as<WanTransformerBlockImpl>();
    auto run = [block](const std::vector<at::Tensor>& a) { return block->forward(a[0], a[1], a[2], a[3], a[4]); };
    const std::vector<at::Tensor> inputs = {x, context, modulation, cos, sin};
    x = recompute ? checkpoint(run, inputs) : run(inputs);
  }

  const std::vector<at::Tensor> shift_scale = (scale_shift_table.to(at::kFloat) + temb.to(at::kFloat).unsqueeze(1)).chunk(2, 1);
  x = (norm_out(x) * (1 + shift_scale[1]) + shift_scale[0]).to(dtype);
  x = proj_out(x);  // [B, L, pt*ph*pw*C]
  // Unpatchify: (f h w pt ph pw c) -> (c, f pt, h ph, w pw).
  x = x.reshape({b, f, rows, cols, p[0], p[1], p[2], -1}).permute({0, 7, 1, 4, 2, 5, 3, 6});
  return x.reshape({b, -1, f * p[0], rows * p[1], cols * p[2]});
}

// ---------------------------------------------------------------------------------------------
// RoPE

std::pair<at::Tensor, at::Tensor> wan_rope(int64_t frames, int64_t rows, int64_t cols, int64_t head_dim,
                                           int64_t max_positions, double theta) {
  if (frames > max_positions || rows > max_positions || cols > max_positions) {
    throw InputError("Wan: a token grid of " + std::to_string(frames) + "x" + std::to_string(rows) + "x" +
                     std::to_string(cols) + " exceeds the model's " + std::to_string(max_positions) +
                     " rotary positions per axis");
  }
  const int64_t hw_dim = 2 * (head_dim / 6);
  const int64_t t_dim = head_dim - 2 * hw_dim;
  const std::vector<std::pair<int64_t, int64_t>> axes = {{t_dim, frames}, {hw_dim, rows}, {hw_dim, cols}};
  std::vector<at::Tensor> cos, sin;
  const auto opts = torch::TensorOptions().dtype(at::kDouble);
  for (size_t a = 0; a < axes.size(); ++a) {
    const auto [d, n] = axes[a];
    const at::Tensor freqs = 1.0 / torch::pow(theta, torch::arange(0, d, 2, opts).div(static_cast<double>(d)));
    const at::Tensor angles = torch::arange(n, opts).unsqueeze(1) * freqs.unsqueeze(0);  // [n, d/2]
    std::vector<int64_t> view = {1, 1, 1, d};
    view[a] = n;
    const std::vector<int64_t> grid = {frames, rows, cols, d};
    cos.push_back(angles.cos().repeat_interleave(2, 1).to(at::kFloat).view(view).expand(grid));
    sin.push_back(angles.sin().repeat_interleave(2, 1).to(at::kFloat).view(view).expand(grid));
  }
  const int64_t tokens = frames * rows * cols;
  return {torch::cat(cos, -1).reshape({tokens, head_dim}), torch::cat(sin, -1).reshape({tokens, head_dim})};
}

}  // namespace lt::models::wan
