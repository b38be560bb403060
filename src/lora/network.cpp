#include "loratrain/lora/network.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <type_traits>

#include "loratrain/lora/format.h"
#include "loratrain/models/flux/checkpoint.h"
#include "loratrain/models/key_maps.h"
#include "loratrain/models/wan/checkpoint.h"
#include "loratrain/util/error.h"

namespace lt::lora {

using lt::models::Conv2dImpl;
using lt::models::LinearImpl;

// ---------------------------------------------------------------------------------------------
// Targets

ComponentSpec ComponentSpec::sd_unet() {
  ComponentSpec s;
  s.kohya_prefix = "lora_unet";
  s.peft_prefix = "unet";
  s.is_unet = true;
  s.target_classes = {"Transformer2DModel"};
  s.conv_target_classes = {"ResnetBlock2D", "Downsample2D", "Upsample2D"};
  return s;
}

ComponentSpec ComponentSpec::sdxl_unet(const lt::models::sd::UNetConfig& config) {
  ComponentSpec s = sd_unet();
  // One map for weights and adapter names: a module path plus "." is a key prefix of the map.
  auto map = std::make_shared<const lt::models::KeyMap>(lt::models::unet_ldm_key_map(config));
  s.kohya_path = [map](const std::string& path) {
    // Every UNet module has a row; a path that has none (a foreign PEFT file's) keeps its name.
    const std::string ldm = map->to_ldm(path + ".");
    const std::string& root = map->ldm_root();
    if (ldm.size() <= root.size() + 1) return path;
    return ldm.substr(root.size(), ldm.size() - root.size() - 1);
  };
  return s;
}

namespace {

// "transformer_blocks.3.attn.to_k" -> ("transformer_blocks", 3, "attn.to_k"); nullopt for other paths.
struct BlockPath {
  std::string kind;
  std::string index;
  std::string rest;
};
std::optional<BlockPath> split_block_path(const std::string& path) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos) return std::nullopt;
  const size_t dot2 = path.find('.', dot + 1);
  if (dot2 == std::string::npos) return std::nullopt;
  BlockPath b{path.substr(0, dot), path.substr(dot + 1, dot2 - dot - 1), path.substr(dot2 + 1)};
  if (b.index.empty() || b.index.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return b;
}

// The Flux block kinds: diffusers name, kohya stem prefix (BFL name), BFL Linears.
struct FluxBlockKind {
  const char* diffusers;
  const char* kohya;
  const std::vector<lt::models::flux::BflBlockLinear>& (*linears)();
};
const FluxBlockKind kFluxBlocks[] = {
    {"transformer_blocks", "lora_unet_double_blocks_", &lt::models::flux::bfl_double_block_linears},
    {"single_transformer_blocks", "lora_unet_single_blocks_", &lt::models::flux::bfl_single_block_linears},
};

}  // namespace

ComponentSpec ComponentSpec::flux_transformer() {
  ComponentSpec s;
  // The leaves' own kohya names are AI Toolkit's (lora_transformer_<diffusers path>, also
  // OneTrainer's; ComfyUI maps them): files with them load. kohya files are written in BFL's
  // modules, as kohya's flux_train_network writes them and ComfyUI and diffusers read them.
  s.kohya_prefix = "lora_transformer";
  s.peft_prefix = "transformer";
  s.is_unet = true;
  // Every Linear inside the blocks (AI Toolkit's transformer_only default): attention, MLPs and
  // the blocks' modulation; not the embedders or the final layer.
  s.target_classes = {"FluxTransformerBlock", "FluxSingleTransformerBlock"};
  s.kohya_fused_of = [](const std::string& path) -> std::optional<FusedFileModule> {
    const auto b = split_block_path(path);
    if (!b) return std::nullopt;
    for (const auto& kind : kFluxBlocks) {
      if (b->kind != kind.diffusers) continue;
      for (const auto& l : kind.linears()) {
        for (size_t i = 0; i < l.diffusers.size(); ++i) {
          if (l.diffusers[i] == b->rest) {
            return FusedFileModule{kohya_name(kind.kohya + b->index, l.bfl), i, l.diffusers.size()};
          }
        }
      }
    }
    return std::nullopt;
  };
  s.kohya_fused_parts = [](const std::string& stem, int64_t out, int64_t in) {
    std::vector<std::pair<std::string, int64_t>> parts;
    for (const auto& kind : kFluxBlocks) {
      const std::string prefix = kind.kohya;
      if (stem.compare(0, prefix.size(), prefix) != 0) continue;
      const size_t end = stem.find('_', prefix.size());
      if (end == std::string::npos) continue;
      const std::string index = stem.substr(prefix.size(), end - prefix.size());
      if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) continue;
      for (const auto& l : kind.linears()) {
        if (kohya_name(prefix + index, l.bfl) != stem) continue;
        // q, k and v are as wide as the block's input; linear1's MLP part takes the remaining rows.
        const auto n = static_cast<int64_t>(l.diffusers.size());
        for (int64_t i = 0; i < n; ++i) {
          const int64_t rows = n == 1 ? out : (i + 1 < n || out == n * in ? in : out - (n - 1) * in);
          parts.emplace_back(std::string(kind.diffusers) + "." + index + "." + l.diffusers[i], rows);
        }
      }
    }
    return parts;
  };
  return s;
}

ComponentSpec ComponentSpec::wan_transformer() {
  ComponentSpec s;
  s.kohya_prefix = "diffusion_model";
  s.peft_prefix = "transformer";
  s.is_unet = true;
  s.target_classes = {"WanTransformerBlock"};
  s.kohya_dotted = true;
  s.kohya_path = [](const std::string& module_path) {
    const std::string native = models::wan::native_transformer_key(module_path + ".weight");
    return native.substr(0, native.size() - std::string(".weight").size());
  };
  return s;
}

std::string ComponentSpec::kohya_name_of(const std::string& module_path) const {
  const std::string path = kohya_path ? kohya_path(module_path) : module_path;
  return kohya_dotted ? kohya_prefix + "." + path : kohya_name(kohya_prefix, path);
}

ComponentSpec ComponentSpec::text_encoder(int index) {
  TORCH_CHECK(index >= 0 && index <= 2, "text encoder index must be 0, 1 or 2");
  ComponentSpec s;
  s.kohya_prefix = index == 0 ? "lora_te" : (index == 1 ? "lora_te1" : "lora_te2");
  s.peft_prefix = index == 2 ? "text_encoder_2" : "text_encoder";
  s.is_unet = false;
  s.target_classes = {"CLIPAttention", "CLIPMLP"};
  return s;
}

std::string module_class_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const size_t colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  constexpr const char* kImpl = "Impl";
  if (name.size() > 4 && name.compare(name.size() - 4, 4, kImpl) == 0) name.resize(name.size() - 4);
  return name;
}

void freeze(torch::nn::Module& module) {
  for (auto& p : module.parameters()) p.requires_grad_(false);
}

// ---------------------------------------------------------------------------------------------
// LoKr factor shapes

const char* to_string(AdapterType type) {
  switch (type) {
    case AdapterType::LoKr: return "lokr";
    case AdapterType::LoHa: return "loha";
    default: return "lora";
  }
}

AdapterType adapter_type_from_name(const std::string& name) {
  if (name == "lokr") return AdapterType::LoKr;
  if (name == "loha") return AdapterType::LoHa;
  return AdapterType::LoRA;
}

std::pair<int64_t, int64_t> lokr_factorization(int64_t dimension, int64_t factor) {
  TORCH_CHECK(dimension > 0, "lokr_factorization: dimension must be positive");
  if (factor > 0 && dimension % factor == 0) {
    int64_t m = factor, n = dimension / factor;
    if (m > n) std::swap(m, n);
    return {m, n};
  }
  if (factor < 0) factor = dimension;
  // Grow m through the divisors while m + n shrinks (the split nearest the square root) and m
  // stays within the factor.
  int64_t m = 1, n = dimension;
  const int64_t length = m + n;
  while (m < n) {
    int64_t next_m = m + 1;
    while (dimension % next_m != 0) ++next_m;
    const int64_t next_n = dimension / next_m;
    if (next_m + next_n > length || next_m > factor) break;
    m = next_m;
    n = next_n;
  }
  if (m > n) std::swap(m, n);
  return {m, n};
}

LoKrShape lokr_shape(int64_t out, int64_t in, int64_t rank, int64_t factor, bool full_rank, bool decompose_both) {
  const auto [in_m, in_n] = lokr_factorization(in, factor);
  const auto [out_l, out_k] = lokr_factorization(out, factor);
  LoKrShape s;
  s.out_l = out_l;
  s.in_m = in_m;
  if (!full_rank) {
    if (decompose_both && 2 * rank < std::max(out_l, in_m)) s.w1_rank = rank;
    if (2 * rank < std::max(out_k, in_n)) s.w2_rank = rank;
  }
  return s;
}

int64_t adapter_parameters(const NetworkConfig& config, int64_t out, int64_t in, int64_t k, int64_t rank) {
  const int64_t kk = k * k;
  switch (config.type) {
    case AdapterType::LoRA: return rank * (in * kk + out);
    case AdapterType::LoHa: return 2 * rank * (in * kk + out);
    case AdapterType::LoKr: break;
  }
  const LoKrShape s = lokr_shape(out, in, rank, config.lokr_factor, config.lokr_full_rank, config.lokr_decompose_both);
  const int64_t out_k = out / s.out_l, in_n = in / s.in_m;
  const int64_t w1 = s.w1_rank > 0 ? s.w1_rank * (s.out_l + s.in_m) : s.out_l * s.in_m;
  const int64_t w2 = s.w2_rank > 0 ? s.w2_rank * (out_k + in_n * kk) : out_k * in_n * kk;
  return w1 + w2;
}

// ---------------------------------------------------------------------------------------------
// LoRAModule

LoRAModuleImpl::LoRAModuleImpl(std::string name, std::string peft, const std::shared_ptr<LinearImpl>& leaf,
                               int64_t rank_, double alpha_, double dropout_)
    : lora_name(std::move(name)),
      peft_name(std::move(peft)),
      rank(rank_),
      alpha(alpha_ == 0.0 ? static_cast<double>(rank_) : alpha_),
      dropout(dropout_) {
  TORCH_CHECK(leaf, "LoRA module ", lora_name, ": no leaf");
  linear_leaf_ = leaf;
  create_weights({rank, leaf->in_features}, {leaf->out_features, rank}, leaf->weight);
}

LoRAModuleImpl::LoRAModuleImpl(std::string name, std::string peft, const std::shared_ptr<Conv2dImpl>& leaf,
                               int64_t rank_, double alpha_, double dropout_)
    : lora_name(std::move(name)),
      peft_name(std::move(peft)),
      rank(rank_),
      alpha(alpha_ == 0.0 ? static_cast<double>(rank_) : alpha_),
      dropout(dropout_) {
  TORCH_CHECK(leaf, "LoRA module ", lora_name, ": no leaf");
  conv_leaf_ = leaf;
  is_conv_ = true;
  stride_ = leaf->stride;
  padding_ = leaf->padding;
  const int64_t k = leaf->kernel_size;
  create_weights({rank, leaf->in_channels, k, k}, {leaf->out_channels, rank, 1, 1}, leaf->weight);
}

LoRAModuleImpl::LoRAModuleImpl(std::string name, std::string peft, const std::shared_ptr<LinearImpl>& leaf,
                               const AdapterOptions& o)
    : LoRAModuleImpl(std::move(name), std::move(peft), leaf, o, 0) {}

LoRAModuleImpl::LoRAModuleImpl(std::string name, std::string peft, const std::shared_ptr<Conv2dImpl>& leaf,
                               const AdapterOptions& o)
    : LoRAModuleImpl(std::move(name), std::move(peft), leaf, o, 0) {}

namespace {
// The rank an adapter's scale divides by: a LoKr module's decomposed factors' rank (0 when none is).
int64_t effective_rank(const AdapterOptions& o) {
  if (o.type != AdapterType::LoKr) return o.rank;
  return o.lokr.w2_rank > 0 ? o.lokr.w2_rank : o.lokr.w1_rank;
}
}  // namespace

template <typename Leaf>
LoRAModuleImpl::LoRAModuleImpl(std::string name, std::string peft, const std::shared_ptr<Leaf>& leaf,
                               const AdapterOptions& o, int)
    : lora_name(std::move(name)),
      peft_name(std::move(peft)),
      rank(effective_rank(o)),
      alpha(o.alpha == 0.0 ? static_cast<double>(effective_rank(o)) : o.alpha),
      dropout(o.dropout) {
  TORCH_CHECK(leaf, "adapter module ", lora_name, ": no leaf");
  int64_t out = 0, in = 0, k = 1;
  if constexpr (std::is_same_v<Leaf, Conv2dImpl>) {
    conv_leaf_ = leaf;
    is_conv_ = true;
    stride_ = leaf->stride;
    padding_ = leaf->padding;
    out = leaf->out_channels;
    in = leaf->in_channels;
    k = leaf->kernel_size;
  } else {
    linear_leaf_ = leaf;
    out = leaf->out_features;
    in = leaf->in_features;
  }
  type_ = o.type;
  if (o.type == AdapterType::LoRA) {
    if (is_conv_) {
      create_weights({rank, in, k, k}, {out, rank, 1, 1}, leaf->weight);
    } else {
      create_weights({rank, in}, {out, rank}, leaf->weight);
    }
    return;
  }
  lokr_ = o.lokr;
  tucker_ = o.tucker && is_conv_ && k > 1;
  if (o.tucker && !tucker_) throw InputError("adapter module " + lora_name + ": Tucker weights are for k x k convolutions only");
  create_product_weights(out, in, k, leaf->weight);
}

void LoRAModuleImpl::create_product_weights(int64_t out, int64_t in, int64_t k, const at::Tensor& leaf_weight) {
  // A quantized Linear keeps an empty placeholder weight: its shape is [out, in].
  leaf_shape_ = leaf_weight.numel() > 0 ? leaf_weight.sizes().vec() : std::vector<int64_t>{out, in};
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(leaf_weight.device());
  auto add = [&](const std::string& key, std::vector<int64_t> shape) {
    product_parts_.emplace_back(key, register_parameter(key, torch::empty(shape, opts)));
    return product_parts_.back().second;
  };
  torch::NoGradGuard no_grad;
  const double a = std::sqrt(5.0);
  if (type_ == AdapterType::LoHa) {
    TORCH_CHECK(rank > 0, "LoHa module ", lora_name, ": rank must be positive");
    // Two low-rank pairs whose elementwise product is the delta; w2_a starts at zero so the
    // adapted model starts equal to the base, the others random so every factor gets gradient.
    if (tucker_) {
      add("hada_w1_a", {rank, out}).normal_(0.0, 0.1);
      add("hada_w1_b", {rank, in}).normal_(0.0, 1.0);
      add("hada_t1", {rank, rank, k, k}).normal_(0.0, 0.1);
      add("hada_w2_a", {rank, out}).zero_();
      add("hada_w2_b", {rank, in}).normal_(0.0, 1.0);
      add("hada_t2", {rank, rank, k, k}).normal_(0.0, 0.1);
      return;
    }
    add("hada_w1_a", {out, rank}).normal_(0.0, 0.1);
    add("hada_w1_b", {rank, in * k * k}).normal_(0.0, 1.0);
    add("hada_w2_a", {out, rank}).zero_();
    add("hada_w2_b", {rank, in * k * k}).normal_(0.0, 1.0);
    return;
  }
  const LoKrShape& s = lokr_;
  if (s.out_l <= 0 || s.in_m <= 0 || out % s.out_l != 0 || in % s.in_m != 0) {
    throw InputError("LoKr module " + lora_name + ": w1 [" + std::to_string(s.out_l) + ", " + std::to_string(s.in_m) +
                     "] does not divide the layer's " + std::to_string(out) + " x " + std::to_string(in) + " weight");
  }
  const int64_t out_k = out / s.out_l, in_n = in / s.in_m;
  // w1 random, w2 (or w2_b) zero: the Kronecker product starts at zero.
  if (s.w1_rank > 0) {
    torch::nn::init::kaiming_uniform_(add("lokr_w1_a", {s.out_l, s.w1_rank}), a);
    torch::nn::init::kaiming_uniform_(add("lokr_w1_b", {s.w1_rank, s.in_m}), a);
  } else {
    torch::nn::init::kaiming_uniform_(add("lokr_w1", {s.out_l, s.in_m}), a);
  }
  if (s.w2_rank > 0 && tucker_) {
    torch::nn::init::kaiming_uniform_(add("lokr_w2_a", {s.w2_rank, out_k}), a);
    add("lokr_w2_b", {s.w2_rank, in_n}).zero_();
    torch::nn::init::kaiming_uniform_(add("lokr_t2", {s.w2_rank, s.w2_rank, k, k}), a);
  } else if (s.w2_rank > 0) {
    torch::nn::init::kaiming_uniform_(add("lokr_w2_a", {out_k, s.w2_rank}), a);
    add("lokr_w2_b", {s.w2_rank, in_n * k * k}).zero_();
  } else {
    std::vector<int64_t> shape = {out_k, in_n};
    if (is_conv_) shape.insert(shape.end(), {k, k});
    add("lokr_w2", shape).zero_();
  }
}

at::Tensor LoRAModuleImpl::product_part(const std::string& key) const {
  for (const auto& [k, t] : product_parts_) {
    if (k == key) return t;
  }
  return {};
}

namespace {

// LyCORIS' Tucker rebuild: core [r, r, k, k] with the up [r, out] and down [r, in] factors ->
// [out, in, k, k] (out[p, q] = sum_ij core[i, j] up[i, p] down[j, q]).
at::Tensor tucker_rebuild(const at::Tensor& core, const at::Tensor& up, const at::Tensor& down) {
  return torch::einsum("ijkl,jr,ip->prkl", {core, down, up}).contiguous();  // kron() views its inputs
}

}  // namespace

at::Tensor LoRAModuleImpl::lokr_w2_kernel() const {
  if (tucker_) return tucker_rebuild(product_part("lokr_t2"), product_part("lokr_w2_a"), product_part("lokr_w2_b"));
  if (lokr_.w2_rank > 0) {
    const at::Tensor w2 = product_part("lokr_w2_a").matmul(product_part("lokr_w2_b"));
    return w2.reshape({w2.size(0), -1, leaf_shape_[2], leaf_shape_[3]});
  }
  return product_part("lokr_w2");
}

at::Tensor LoRAModuleImpl::product_weight() const {
  auto part = [this](const char* key) {
    at::Tensor t = product_part(key);
    if (!t.defined()) throw std::logic_error("adapter module " + lora_name + " has no " + key);
    return t;
  };
  if (type_ == AdapterType::LoHa) {
    if (tucker_) {
      return tucker_rebuild(part("hada_t1"), part("hada_w1_a"), part("hada_w1_b")) *
             tucker_rebuild(part("hada_t2"), part("hada_w2_a"), part("hada_w2_b"));
    }
    return (part("hada_w1_a").matmul(part("hada_w1_b")) * part("hada_w2_a").matmul(part("hada_w2_b")))
        .reshape(leaf_shape_);
  }
  at::Tensor w1 = lokr_.w1_rank > 0 ? part("lokr_w1_a").matmul(part("lokr_w1_b")) : part("lokr_w1");
  at::Tensor w2 = is_conv_ && leaf_shape_[2] * leaf_shape_[3] > 1 ? lokr_w2_kernel()
                  : lokr_.w2_rank > 0                             ? part("lokr_w2_a").matmul(part("lokr_w2_b"))
                                                                  : part("lokr_w2");
  // kron of [out_l, in_m] and [out_k, in_n * k * k] (or [out_k, in_n, k, k] with w1 widened to
  // 4-d) lays the output as [out, in * k * k]: the leaf's weight, kernel flattened.
  if (w2.dim() == 4) w1 = w1.unsqueeze(2).unsqueeze(3);
  return torch::kron(w1, w2).reshape(leaf_shape_);
}

at::Tensor LoRAModuleImpl::lokr_delta(const at::Tensor& x) {
  // kron(w1, w2) is never built: with x's input split as [in_m, in_n], the output [out_l, out_k]
  // is w1 @ X @ w2^T (Linear), or w2 convolved over each of the in_m channel groups and mixed by
  // w1 (Conv2d). The work and the saved tensors stay near the size of x and of the output.
  auto part = [this](const char* key) { return product_part(key); };
  at::Tensor xf = x.to(torch::kFloat);
  if (dropout > 0.0 && is_training()) xf = torch::dropout(xf, dropout, /*train=*/true);
  const double s = multiplier * scale();
  at::Tensor w1 = lokr_.w1_rank > 0 ? part("lokr_w1_a").matmul(part("lokr_w1_b")) : part("lokr_w1");
  if (s != 1.0) w1 = w1 * s;  // on the small factor
  const int64_t in_m = lokr_.in_m, out_l = lokr_.out_l;
  if (!is_conv_) {
    const int64_t in = xf.size(-1), in_n = in / in_m;
    std::vector<int64_t> lead(xf.sizes().begin(), xf.sizes().end() - 1);
    std::vector<int64_t> split = lead;
    split.insert(split.end(), {in_m, in_n});
    at::Tensor h = xf.reshape(split);  // [..., in_m, in_n]
    if (lokr_.w2_rank > 0) {
      h = torch::nn::functional::linear(h, part("lokr_w2_b"));  // [..., in_m, r]
      h = torch::nn::functional::linear(h, part("lokr_w2_a"));  // [..., in_m, out_k]
    } else {
      h = torch::nn::functional::linear(h, part("lokr_w2"));    // [..., in_m, out_k]
    }
    h = w1.matmul(h);  // [..., out_l, out_k]
    std::vector<int64_t> out = lead;
    out.push_back(h.size(-2) * h.size(-1));
    return h.reshape(out);
  }
  const int64_t n = xf.size(0), in_n = xf.size(1) / in_m;
  const at::Tensor w2 = lokr_w2_kernel();
  at::Tensor h = xf.reshape({n * in_m, in_n, xf.size(2), xf.size(3)});
  h = torch::conv2d(h, w2, {}, {stride_, stride_}, {padding_, padding_});  // [n * in_m, out_k, H', W']
  const int64_t out_k = h.size(1), ho = h.size(2), wo = h.size(3);
  h = h.reshape({n, in_m, out_k * ho * wo});
  h = torch::matmul(w1, h);  // [n, out_l, out_k * H' * W']
  return h.reshape({n, out_l * out_k, ho, wo});
}

std::vector<std::pair<std::string, at::Tensor>> LoRAModuleImpl::file_parts() const {
  if (type_ != AdapterType::LoRA) return product_parts_;
  return {{"lora_down.weight", lora_down}, {"lora_up.weight", lora_up}};
}

// Both leaf kinds: fp32 down/up on the leaf's device, initialised as kohya does.
void LoRAModuleImpl::create_weights(at::IntArrayRef down_shape, at::IntArrayRef up_shape, const at::Tensor& leaf_weight) {
  TORCH_CHECK(rank > 0, "LoRA module ", lora_name, ": rank must be positive");
  // A quantized Linear keeps an empty placeholder weight: its shape is [out, in(, k, k)].
  leaf_shape_ = leaf_weight.numel() > 0 ? leaf_weight.sizes().vec() : std::vector<int64_t>{up_shape[0]};
  if (leaf_weight.numel() == 0) leaf_shape_.insert(leaf_shape_.end(), down_shape.begin() + 1, down_shape.end());
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(leaf_weight.device());
  lora_down = register_parameter("lora_down_weight", torch::empty(down_shape, opts));
  lora_up = register_parameter("lora_up_weight", torch::empty(up_shape, opts));
  init_weights();
}

void LoRAModuleImpl::init_weights() {
  torch::NoGradGuard no_grad;
  // kohya/Microsoft LoRA: down ~ kaiming_uniform(a=sqrt(5)) (U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
  // up = 0, so the adapter starts as an exact no-op.
  torch::nn::init::kaiming_uniform_(lora_down, std::sqrt(5.0));
  lora_up.zero_();
}

namespace {

// LoHa's delta(x) = layer(x, ((w1_a @ w1_b) * (w2_a @ w2_b)) * scale) with a backward of its own: the
// Hadamard product has no factored form, so the layer-sized weight is built in forward, but only x and
// the four factors are kept for backward, which rebuilds the two products (LyCORIS' HadaWeight keeps
// the factors the same way). Plain autograd would keep both products and the weight: three layer-sized
// tensors per adapted layer from forward to backward.
struct HadamardLayer : public torch::autograd::Function<HadamardLayer> {
  struct Geometry {
    std::vector<int64_t> weight_shape;  // the leaf's
    bool conv = false;
    int64_t stride = 1, padding = 0;
  };

  static at::Tensor apply_layer(const at::Tensor& x, const at::Tensor& w, const Geometry& g) {
    return g.conv ? torch::conv2d(x, w, {}, {g.stride, g.stride}, {g.padding, g.padding})
                  : torch::nn::functional::linear(x, w);
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1_a,
                            const at::Tensor& w1_b, const at::Tensor& w2_a, const at::Tensor& w2_b, double scale,
                            const Geometry& g) {
    ctx->save_for_backward({x, w1_a, w1_b, w2_a, w2_b});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["shape"] = c10::List<int64_t>(g.weight_shape);
    ctx->saved_data["conv"] = g.conv;
    ctx->saved_data["stride"] = g.stride;
    ctx->saved_data["padding"] = g.padding;
    const at::Tensor w = (w1_a.matmul(w1_b) * w2_a.matmul(w2_b) * scale).reshape(g.weight_shape);
    return apply_layer(x, w, g);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w1_a = saved[1], &w1_b = saved[2], &w2_a = saved[3], &w2_b = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    Geometry g;
    g.weight_shape = ctx->saved_data["shape"].toIntVector();
    g.conv = ctx->saved_data["conv"].toBool();
    g.stride = ctx->saved_data["stride"].toInt();
    g.padding = ctx->saved_data["padding"].toInt();
    const at::Tensor& grad_y = grads[0];
    const at::Tensor p1 = w1_a.matmul(w1_b), p2 = w2_a.matmul(w2_b);
    at::Tensor grad_x, grad_w;
    if (g.conv) {
      const at::Tensor w = (p1 * p2 * scale).reshape(g.weight_shape);
      auto [gx, gw, gb] = at::convolution_backward(grad_y, x, w, c10::nullopt, {g.stride, g.stride}, {g.padding, g.padding},
                                                   {1, 1}, false, {0, 0}, 1, {ctx->needs_input_grad(0), true, false});
      grad_x = gx;
      grad_w = gw.flatten(1);
    } else {
      if (ctx->needs_input_grad(0)) grad_x = grad_y.matmul((p1 * p2 * scale).reshape(g.weight_shape));
      grad_w = grad_y.reshape({-1, grad_y.size(-1)}).t().matmul(x.reshape({-1, x.size(-1)}));
    }
    grad_w = grad_w * scale;  // d loss / d (p1 * p2)
    at::Tensor g1 = grad_w * p2;
    const at::Tensor grad_w1_a = g1.matmul(w1_b.t()), grad_w1_b = w1_a.t().matmul(g1);
    g1 = grad_w * p1;
    const at::Tensor grad_w2_a = g1.matmul(w2_b.t()), grad_w2_b = w2_a.t().matmul(g1);
    return {grad_x, grad_w1_a, grad_w1_b, grad_w2_a, grad_w2_b, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LoRAModuleImpl::delta(const at::Tensor& x) {
  if (type_ == AdapterType::LoKr) return lokr_delta(x);
  if (type_ == AdapterType::LoHa) {
    at::Tensor xf = x.to(torch::kFloat);
    if (dropout > 0.0 && is_training()) xf = torch::dropout(xf, dropout, /*train=*/true);
    if (tucker_) {
      // Tucker-form files (loaded, not trained here): plain autograd over the rebuilt weight.
      const at::Tensor w = product_weight() * (multiplier * scale());
      return is_conv_ ? torch::conv2d(xf, w, {}, {stride_, stride_}, {padding_, padding_})
                      : torch::nn::functional::linear(xf, w);
    }
    auto part = [this](const char* key) { return product_part(key); };
    return HadamardLayer::apply(xf, part("hada_w1_a"), part("hada_w1_b"), part("hada_w2_a"), part("hada_w2_b"),
                                multiplier * scale(), HadamardLayer::Geometry{leaf_shape_, is_conv_, stride_, padding_});
  }
  // x: [..., in] -> [..., out]; or [N, in, H, W] -> [N, out, H', W'] (the leaf's stride/padding).
  at::Tensor xf = x.to(torch::kFloat);
  at::Tensor lx = is_conv_ ? torch::conv2d(xf, lora_down, {}, {stride_, stride_}, {padding_, padding_})
                           : torch::nn::functional::linear(xf, lora_down);
  if (dropout > 0.0 && is_training()) lx = torch::dropout(lx, dropout, /*train=*/true);
  // The scale goes on the rank-wide tensor, not on the output: rank/out of the work, forward and
  // backward; at scale 1 (alpha = rank) there is nothing to multiply.
  const double s = multiplier * scale();
  if (s != 1.0) lx = lx * s;
  return is_conv_ ? torch::conv2d(lx, lora_up) : torch::nn::functional::linear(lx, lora_up);
}

at::Tensor LoRAModuleImpl::delta_weight(double m) const {
  if (type_ != AdapterType::LoRA) {
    torch::NoGradGuard no_grad;
    return product_weight() * (m * scale());
  }
  // up [out, rank] @ down [rank, in * k * k] -> the leaf's weight shape.
  at::Tensor w = lora_up.detach().flatten(1).matmul(lora_down.detach().flatten(1));
  return (w * (m * scale())).reshape(leaf_shape_);
}

void LoRAModuleImpl::attach() {
  auto self = std::dynamic_pointer_cast<LoRAModuleImpl>(shared_from_this());
  if (auto leaf = linear_leaf_.lock()) leaf->adapter = self;
  if (auto leaf = conv_leaf_.lock()) leaf->adapter = self;
}

void LoRAModuleImpl::detach() {
  const lt::models::Adapter* self = this;
  if (auto leaf = linear_leaf_.lock(); leaf && leaf->adapter.get() == self) leaf->adapter.reset();
  if (auto leaf = conv_leaf_.lock(); leaf && leaf->adapter.get() == self) leaf->adapter.reset();
}

at::Tensor LoRAModuleImpl::base_weight() const {
  if (auto leaf = linear_leaf_.lock()) return leaf->weight;
  if (auto leaf = conv_leaf_.lock()) return leaf->weight;
  return {};
}

// ---------------------------------------------------------------------------------------------
// LoRANetwork

LoRANetworkImpl::LoRANetworkImpl(NetworkConfig config) : config_(std::move(config)) {
  if (config_.linear <= 0) throw InputError("network.linear (rank) must be positive, got " + std::to_string(config_.linear));
  if (config_.conv && *config_.conv <= 0) throw InputError("network.conv (rank) must be positive, got " + std::to_string(*config_.conv));
  if (config_.dropout < 0.0 || config_.dropout >= 1.0) throw InputError("network.dropout must be in [0, 1)");
  if (config_.lokr_factor == 0 || config_.lokr_factor < -1)
    throw InputError("network.lokr_factor must be -1 or positive, got " + std::to_string(config_.lokr_factor));
}

namespace {

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "." + b;
}

bool contains_any(const std::vector<std::string>& words, const std::vector<std::string>& candidates) {
  for (const auto& w : words) {
    for (const auto& c : candidates) {
      if (c.find(w) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace

size_t LoRANetworkImpl::add_component(const ComponentSpec& spec, torch::nn::Module& root,
                                      const std::map<std::string, ModuleDims>* dims) {
  freeze(root);
  components_.push_back(spec);
  const bool trained = spec.is_unet ? config_.train_unet : config_.train_text_encoder;
  if (!trained && dims == nullptr) return 0;

  std::vector<std::string> classes = spec.target_classes;
  if (config_.conv || dims != nullptr)
    classes.insert(classes.end(), spec.conv_target_classes.begin(), spec.conv_target_classes.end());
  auto is_target = [&](const torch::nn::Module& m) {
    return std::find(classes.begin(), classes.end(), module_class_name(m)) != classes.end();
  };

  std::set<const void*> seen;
  for (const auto& m : modules_) seen.insert(m->base_weight().unsafeGetTensorImpl());
  size_t created = 0;
  auto visit_target = [&](const std::string& target_path, torch::nn::Module& target) {
    for (const auto& item : target.named_modules("", /*include_self=*/false)) {
      auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value());
      auto conv = std::dynamic_pointer_cast<Conv2dImpl>(item.value());
      if (!linear && !conv) continue;
      const void* key = linear ? linear->weight.unsafeGetTensorImpl() : conv->weight.unsafeGetTensorImpl();
      if (seen.count(key)) continue;
      const std::string path = join_path(spec.path_prefix, join_path(target_path, item.key()));
      const std::string kname = spec.kohya_name_of(path);
      const std::string pname = peft_name(spec.peft_prefix, path);
      const std::vector<std::string> names = {path, spec.kohya_prefix + "." + path, kname};
      if (contains_any(config_.ignore_if_contains, names)) continue;
      if (!config_.only_if_contains.empty() && !contains_any(config_.only_if_contains, names)) continue;

      int64_t rank = 0;
      double alpha = 0.0;
      const bool linear_like = linear || conv->kernel_size == 1;
      if (dims != nullptr) {
        auto it = dims->find(kname);
        if (it == dims->end()) continue;
        rank = it->second.rank;
        alpha = it->second.alpha;
      } else if (linear_like) {
        rank = config_.linear;
        alpha = config_.linear_alpha;
      } else if (config_.conv) {
        rank = *config_.conv;
        alpha = config_.conv_alpha.value_or(static_cast<double>(*config_.conv));
      }
      AdapterOptions options;
      options.type = config_.type;
      options.rank = rank;
      options.alpha = alpha;
      options.dropout = config_.dropout;
      if (dims != nullptr) {
        const ModuleDims& d = dims->at(kname);
        options.type = d.type;
        options.lokr = d.lokr;
        options.tucker = d.tucker;
      } else if (config_.type == AdapterType::LoKr) {
        const int64_t out = linear ? linear->out_features : conv->out_channels;
        const int64_t in = linear ? linear->in_features : conv->in_channels;
        options.lokr = lokr_shape(out, in, rank, config_.lokr_factor, config_.lokr_full_rank, config_.lokr_decompose_both);
      }
      const bool full_lokr = options.type == AdapterType::LoKr && options.lokr.w1_rank == 0 && options.lokr.w2_rank == 0;
      if (rank <= 0 && !full_lokr) continue;
      seen.insert(key);
      LoRAModule module = linear ? LoRAModule(kname, pname, linear, options) : LoRAModule(kname, pname, conv, options);
      // Registered names cannot hold dots (a dotted kohya layout's names have them).
      std::string registered = kname;
      std::replace(registered.begin(), registered.end(), '.', '_');
      register_module(registered, module);
      modules_.push_back(module);
      module_is_unet_.push_back(spec.is_unet);
      ++created;
    }
  };
  if (is_target(root)) visit_target("", root);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (is_target(*item.value())) visit_target(item.key(), *item.value());
  }
  return created;
}

void LoRANetworkImpl::apply_to() {
  for (auto& m : modules_) m->attach();
}

void LoRANetworkImpl::remove() {
  for (auto& m : modules_) m->detach();
}

void LoRANetworkImpl::set_multiplier(double multiplier) {
  for (auto& m : modules_) m->multiplier = multiplier;
}

size_t LoRANetworkImpl::count(bool unet) const {
  return static_cast<size_t>(std::count(module_is_unet_.begin(), module_is_unet_.end(), unet));
}

void LoRANetworkImpl::merge_to(double multiplier) {
  torch::NoGradGuard no_grad;
  for (auto& m : modules_) {
    at::Tensor w = m->base_weight();
    if (!w.defined()) continue;
    // kohya merge_to: in fp32, then back to the base dtype.
    w.copy_((w.to(torch::kFloat) + m->delta_weight(multiplier).to(w.device())).to(w.scalar_type()));
    m->detach();
  }
}

std::vector<std::pair<std::string, at::Tensor>> LoRANetworkImpl::merged_weights(double multiplier) const {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& m : modules_) {
    at::Tensor w = m->base_weight();
    if (!w.defined()) continue;
    out.emplace_back(m->peft_name,
                     (w.to(torch::kFloat) + m->delta_weight(multiplier).to(w.device())).to(w.scalar_type()));
  }
  return out;
}

}  // namespace lt::lora
