#include "loratrain/lora/network.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "loratrain/lora/format.h"
#include "loratrain/models/key_maps.h"
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

ComponentSpec ComponentSpec::flux_transformer() {
  ComponentSpec s;
  // AI Toolkit's names for Flux (diffusers module paths): lora_transformer_<path> in kohya keys
  // (also OneTrainer's; ComfyUI maps them), transformer.<path> in PEFT keys (AI Toolkit's default).
  s.kohya_prefix = "lora_transformer";
  s.peft_prefix = "transformer";
  s.is_unet = true;
  // Every Linear inside the blocks (AI Toolkit's transformer_only default): attention, MLPs and
  // the blocks' modulation; not the embedders or the final layer.
  s.target_classes = {"FluxTransformerBlock", "FluxSingleTransformerBlock"};
  return s;
}

std::string ComponentSpec::kohya_name_of(const std::string& module_path) const {
  return kohya_name(kohya_prefix, kohya_path ? kohya_path(module_path) : module_path);
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

// Both leaf kinds: fp32 down/up on the leaf's device, initialised as kohya does.
void LoRAModuleImpl::create_weights(at::IntArrayRef down_shape, at::IntArrayRef up_shape, const at::Tensor& leaf_weight) {
  TORCH_CHECK(rank > 0, "LoRA module ", lora_name, ": rank must be positive");
  leaf_shape_ = leaf_weight.sizes().vec();
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

at::Tensor LoRAModuleImpl::delta(const at::Tensor& x) {
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
      if (rank <= 0) continue;
      seen.insert(key);
      LoRAModule module = linear ? LoRAModule(kname, pname, linear, rank, alpha, config_.dropout)
                                 : LoRAModule(kname, pname, conv, rank, alpha, config_.dropout);
      register_module(kname, module);
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
