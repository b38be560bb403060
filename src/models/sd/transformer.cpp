#include "loratrain/models/sd/transformer.h"

#include <torch/torch.h>

#include "loratrain/models/checkpointing.h"

namespace lt::models::sd {

GEGLUImpl::GEGLUImpl(int64_t dim_in, int64_t dim_out) {
  proj = register_module("proj", Linear(dim_in, dim_out * 2));
}

at::Tensor GEGLUImpl::forward(const at::Tensor& x) {
  auto parts = proj(x).chunk(2, -1);  // value, gate: [..., dim_out] each
  return parts[0] * torch::gelu(parts[1]);
}

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t mult, double dropout) {
  const int64_t inner = dim * mult;
  act = GEGLU(dim, inner);
  drop = torch::nn::Dropout(dropout);
  out = Linear(inner, dim);
  net = register_module("net", torch::nn::ModuleList(act, drop, out));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) { return out(drop(act(x))); }

BasicTransformerBlockImpl::BasicTransformerBlockImpl(const BasicTransformerBlockOptions& o) : options(o) {
  const int64_t dim = options.dim;
  auto layer_norm = [&] {
    return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(options.norm_eps).elementwise_affine(true));
  };
  AttentionModuleOptions a;
  a.query_dim = dim;
  a.heads = options.num_attention_heads;
  a.dim_head = options.attention_head_dim;
  a.dropout = options.dropout;
  a.bias = false;
  a.out_bias = true;
  a.upcast_attention = options.upcast_attention;
  a.query_chunk = options.query_chunk;

  AttentionModuleOptions a1 = a;
  if (options.only_cross_attention) a1.cross_attention_dim = options.cross_attention_dim;
  norm1 = register_module("norm1", layer_norm());
  attn1 = register_module("attn1", Attention(a1));

  AttentionModuleOptions a2 = a;
  a2.cross_attention_dim = options.cross_attention_dim;
  norm2 = register_module("norm2", layer_norm());
  attn2 = register_module("attn2", Attention(a2));

  norm3 = register_module("norm3", layer_norm());
  ff = register_module("ff", FeedForward(dim, 4, options.dropout));
}

at::Tensor BasicTransformerBlockImpl::forward(const at::Tensor& hidden, const at::Tensor& encoder_hidden_states) {
  if (gradient_checkpointing && torch::GradMode::is_enabled()) {
    // keep_results: the blocked attention's outputs are kept rather than recomputed (attention.cpp).
    return checkpoint([this](const std::vector<at::Tensor>& in) { return forward_impl(in[0], in[1]); },
                      {hidden, encoder_hidden_states}, /*keep_results=*/true);
  }
  return forward_impl(hidden, encoder_hidden_states);
}

at::Tensor BasicTransformerBlockImpl::forward_impl(const at::Tensor& hidden, const at::Tensor& context) {
  // hidden: [B, L, dim]
  at::Tensor h = hidden + attn1(norm1(hidden), options.only_cross_attention ? context : at::Tensor());
  h = h + attn2(norm2(h), context);
  h = h + ff(norm3(h));
  return h;
}

Transformer2DModelImpl::Transformer2DModelImpl(const Transformer2DModelOptions& o) : options(o) {
  const int64_t inner = options.num_attention_heads * options.attention_head_dim;
  norm = register_module("norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(options.norm_num_groups, options.in_channels)
                                                          .eps(1e-6)
                                                          .affine(true)));
  if (options.use_linear_projection) {
    proj_in_linear = register_module("proj_in", Linear(options.in_channels, inner));
  } else {
    proj_in_conv = register_module("proj_in", Conv2d(options.in_channels, inner, 1, 1, 0));
  }
  transformer_blocks = register_module("transformer_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < options.num_layers; ++i) {
    BasicTransformerBlockOptions b;
    b.dim = inner;
    b.num_attention_heads = options.num_attention_heads;
    b.attention_head_dim = options.attention_head_dim;
    b.cross_attention_dim = options.cross_attention_dim;
    b.only_cross_attention = options.only_cross_attention;
    b.upcast_attention = options.upcast_attention;
    b.dropout = options.dropout;
    b.query_chunk = options.query_chunk;
    transformer_blocks->push_back(BasicTransformerBlock(b));
  }
  if (options.use_linear_projection) {
    proj_out_linear = register_module("proj_out", Linear(inner, options.in_channels));
  } else {
    proj_out_conv = register_module("proj_out", Conv2d(inner, options.in_channels, 1, 1, 0));
  }
}

void Transformer2DModelImpl::set_gradient_checkpointing(bool on) {
  for (auto& m : *transformer_blocks) m->as<BasicTransformerBlockImpl>()->gradient_checkpointing = on;
}

at::Tensor Transformer2DModelImpl::forward(const at::Tensor& x, const at::Tensor& encoder_hidden_states) {
  const int64_t b = x.size(0), height = x.size(2), width = x.size(3);
  at::Tensor h = norm(x);  // [B, C, H, W]
  int64_t inner = 0;
  if (proj_in_conv) {
    h = proj_in_conv(h);
    inner = h.size(1);
    h = h.permute({0, 2, 3, 1}).reshape({b, height * width, inner});  // [B, HW, inner]
  } else {
    h = h.permute({0, 2, 3, 1}).reshape({b, height * width, h.size(1)});
    h = proj_in_linear(h);  // [B, HW, inner]
    inner = h.size(2);
  }
  for (auto& m : *transformer_blocks) h = m->as<BasicTransformerBlockImpl>()->forward(h, encoder_hidden_states);
  if (proj_out_conv) {
    h = h.reshape({b, height, width, inner}).permute({0, 3, 1, 2}).contiguous();
    h = proj_out_conv(h);
  } else {
    h = proj_out_linear(h);
    h = h.reshape({b, height, width, -1}).permute({0, 3, 1, 2}).contiguous();
  }
  return h + x;  // [B, C, H, W]
}

}  // namespace lt::models::sd
