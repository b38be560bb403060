#include "loratrain/models/sd/blocks.h"

#include <torch/torch.h>

#include "loratrain/models/attention.h"
#include "loratrain/models/checkpointing.h"
#include "loratrain/util/error.h"

namespace lt::models::sd {

namespace F = torch::nn::functional;

bool is_known_activation(const std::string& act_fn) {
  return act_fn == "silu" || act_fn == "swish" || act_fn == "gelu" || act_fn == "mish" || act_fn == "relu";
}

at::Tensor activation(const std::string& act_fn, const at::Tensor& x) {
  if (act_fn == "silu" || act_fn == "swish") return torch::silu(x);
  if (act_fn == "gelu") return torch::gelu(x);
  if (act_fn == "mish") return torch::mish(x);
  if (act_fn == "relu") return torch::relu(x);
  throw InputError("unsupported activation function '" + act_fn + "' (expected silu, swish, gelu, mish or relu)");
}

// ---------------------------------------------------------------------------------------------
// ResnetBlock2D

ResnetBlock2DImpl::ResnetBlock2DImpl(const ResnetBlock2DOptions& o) : options(o) {
  if (options.out_channels == 0) options.out_channels = options.in_channels;
  if (options.groups_out == 0) options.groups_out = options.groups;
  const int64_t in = options.in_channels, out = options.out_channels;
  norm1 = register_module("norm1", torch::nn::GroupNorm(
                                       torch::nn::GroupNormOptions(options.groups, in).eps(options.eps).affine(true)));
  conv1 = register_module("conv1", Conv2d(in, out, 3, 1, 1));
  if (options.temb_channels) time_emb_proj = register_module("time_emb_proj", Linear(*options.temb_channels, out));
  norm2 = register_module("norm2", torch::nn::GroupNorm(
                                       torch::nn::GroupNormOptions(options.groups_out, out).eps(options.eps).affine(true)));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout));
  conv2 = register_module("conv2", Conv2d(out, out, 3, 1, 1));
  if (in != out) conv_shortcut = register_module("conv_shortcut", Conv2d(in, out, 1, 1, 0));
}

at::Tensor ResnetBlock2DImpl::forward(const at::Tensor& x, const at::Tensor& temb) {
  if (gradient_checkpointing && torch::GradMode::is_enabled()) {
    // keep_results: the 3x3 convolutions' outputs are kept rather than recomputed (Conv2d on
    // packed weights, CPU): a resnet's recomputation is then its norms and activations.
    return checkpoint([this](const std::vector<at::Tensor>& in) { return forward_impl(in[0], in[1]); }, {x, temb},
                      /*keep_results=*/true);
  }
  return forward_impl(x, temb);
}

at::Tensor ResnetBlock2DImpl::forward_impl(const at::Tensor& x, const at::Tensor& temb) {
  at::Tensor h = activation(options.act_fn, norm1(x));  // [B, in, H, W]
  h = conv1(h);                                         // [B, out, H, W]
  if (time_emb_proj && temb.defined()) {
    at::Tensor t = options.skip_time_act ? temb : activation(options.act_fn, temb);
    h = h + time_emb_proj(t).unsqueeze(-1).unsqueeze(-1);  // [B, out, 1, 1] broadcast
  }
  h = activation(options.act_fn, norm2(h));
  h = conv2(dropout(h));
  at::Tensor shortcut = conv_shortcut ? conv_shortcut(x) : x;
  at::Tensor y = shortcut + h;
  if (options.output_scale_factor != 1.0) y = y / options.output_scale_factor;
  return y;
}

// ---------------------------------------------------------------------------------------------
// Downsample2D / Upsample2D

Downsample2DImpl::Downsample2DImpl(int64_t channels, int64_t out_channels, int64_t pad) : padding(pad) {
  conv = register_module("conv", Conv2d(channels, out_channels, 3, 2, padding));
}

at::Tensor Downsample2DImpl::forward(const at::Tensor& x) {
  if (padding == 0) {
    // LDM's asymmetric padding: one extra row/column at the bottom/right.
    return conv(F::pad(x, F::PadFuncOptions({0, 1, 0, 1}).mode(torch::kConstant).value(0)));
  }
  return conv(x);
}

Upsample2DImpl::Upsample2DImpl(int64_t channels, int64_t out_channels) {
  conv = register_module("conv", Conv2d(channels, out_channels, 3, 1, 1));
}

at::Tensor Upsample2DImpl::forward(const at::Tensor& x, std::optional<std::vector<int64_t>> output_size) {
  // Nearest upsampling has no bf16 kernel in older PyTorch; diffusers goes through fp32 the same way.
  const auto dtype = x.scalar_type();
  at::Tensor h = dtype == torch::kBFloat16 ? x.to(torch::kFloat) : x;
  auto opts = F::InterpolateFuncOptions().mode(torch::kNearest);
  if (output_size) {
    opts.size(*output_size);
  } else {
    opts.scale_factor(std::vector<double>{2.0, 2.0});
  }
  h = F::interpolate(h.contiguous(), opts);  // [B, C, 2H, 2W]
  if (dtype == torch::kBFloat16) h = h.to(dtype);
  return conv(h);
}

// ---------------------------------------------------------------------------------------------
// Attention

AttentionImpl::AttentionImpl(const AttentionModuleOptions& o) : options(o) {
  const int64_t inner = options.heads * options.dim_head;
  const int64_t kv_dim = options.cross_attention_dim.value_or(options.query_dim);
  if (options.norm_num_groups) {
    group_norm = register_module(
        "group_norm", torch::nn::GroupNorm(
                          torch::nn::GroupNormOptions(*options.norm_num_groups, options.query_dim).eps(options.eps).affine(true)));
  }
  to_q = register_module("to_q", Linear(options.query_dim, inner, options.bias));
  to_k = register_module("to_k", Linear(kv_dim, inner, options.bias));
  to_v = register_module("to_v", Linear(kv_dim, inner, options.bias));
  to_out_proj = Linear(inner, options.query_dim, options.out_bias);
  to_out_dropout = torch::nn::Dropout(options.dropout);
  to_out = register_module("to_out", torch::nn::ModuleList(to_out_proj, to_out_dropout));
}

at::Tensor AttentionImpl::forward(const at::Tensor& hidden, const at::Tensor& encoder_hidden_states) {
  const bool spatial = hidden.dim() == 4;
  int64_t b = hidden.size(0), c = 0, height = 0, width = 0;
  at::Tensor h = hidden;
  if (spatial) {
    c = hidden.size(1), height = hidden.size(2), width = hidden.size(3);
    h = hidden.view({b, c, height * width}).transpose(1, 2);  // [B, HW, C]
  }
  if (group_norm) h = group_norm(h.transpose(1, 2)).transpose(1, 2);  // norm over channels
  at::Tensor context = encoder_hidden_states.defined() ? encoder_hidden_states : h;

  const int64_t heads = options.heads, dh = options.dim_head;
  auto split_heads = [&](const at::Tensor& t) { return t.view({b, -1, heads, dh}).transpose(1, 2); };
  at::Tensor q = split_heads(to_q(h));        // [B, heads, L, dh]
  at::Tensor k = split_heads(to_k(context));  // [B, heads, S, dh]
  at::Tensor v = split_heads(to_v(context));  // [B, heads, S, dh]

  lt::models::AttentionOptions attn;
  attn.query_chunk = options.query_chunk < 0 ? default_query_chunk() : options.query_chunk;
  attn.upcast = options.upcast_attention;
  attn.cpu_speed_rule = options.cpu_speed_rule;
  at::Tensor out = lt::models::attention(q, k, v, attn);           // [B, heads, L, dh]
  out = out.transpose(1, 2).reshape({b, -1, heads * dh}).to(q.scalar_type());  // [B, L, inner]
  out = to_out_dropout(to_out_proj(out));                          // [B, L, query_dim]

  if (spatial) out = out.transpose(-1, -2).reshape({b, c, height, width});
  if (options.residual_connection) out = out + hidden;
  if (options.rescale_output_factor != 1.0) out = out / options.rescale_output_factor;
  return out;
}

}  // namespace lt::models::sd
