// LoRA adapters on frozen lt::models::Linear / Conv2d leaves, selected and named as kohya
// sd-scripts' networks/lora.py does (the file format ComfyUI, A1111/Forge and diffusers load).
//
//   y = W x + multiplier * (alpha / rank) * up(dropout(down(x)))
//
// The same leaves can instead carry LyCORIS' weight-product adapters (AI Toolkit's network.type
// lokr / loha; the keys ComfyUI and A1111/Forge merge):
//   LoKr: dW = scale * kron(w1, w2), w1 [out_l, in_m] and w2 [out_k, in_n(, k, k)] with
//         out = out_l * out_k, in = in_m * in_n; either factor may be the product of a low-rank
//         pair (w1_a @ w1_b, w2_a @ w2_b). scale = alpha / rank when a factor is decomposed, else 1.
//   LoHa: dW = (alpha / rank) * (w1_a @ w1_b) * (w2_a @ w2_b) (elementwise), kernels flattened.
// LoKr's delta(x) runs in factored form (kron(w1, w2) is never built); LoHa's builds dW and runs
// the leaf's op with it. Both apply dropout to the leaf's input.
//
// down: Linear in->rank, or for a conv leaf a Conv2d in->rank with the leaf's kernel, stride and
// padding (LoCon for 3x3); up: Linear rank->out or a 1x1 Conv2d. Init as kohya/Microsoft LoRA:
// down kaiming_uniform(a=sqrt(5)), up zeros, so the adapted model starts equal to the base.
// Adapter weights are fp32 whatever the base dtype; delta() computes in fp32.
#pragma once
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/models/layers.h"

namespace lt::io {
class SafetensorsFile;
}
namespace lt::models::sd {
struct UNetConfig;
}

namespace lt::lora {

// One model component an adapter set is built on, with its names in both file formats.
// One leaf's place in a fused kohya file module (see ComponentSpec::kohya_fused_of).
struct FusedFileModule {
  std::string stem;  // e.g. lora_unet_double_blocks_0_img_attn_qkv
  size_t part = 0;
  size_t parts = 1;
};

struct ComponentSpec {
  std::string kohya_prefix;  // "lora_unet", "lora_te", "lora_te1", "lora_te2"
  std::string peft_prefix;   // "unet", "text_encoder", "text_encoder_2"
  bool is_unet = true;       // governed by train_unet (else by train_text_encoder)
  // Module paths are taken relative to the root passed to add_component(); `path_prefix` is
  // prepended (e.g. "text_model" when the root is a CLIPTextTransformer rather than CLIPTextModel).
  std::string path_prefix;
  // Linear and 1x1 Conv2d leaves inside modules of these classes get the linear rank...
  std::vector<std::string> target_classes;
  // ...and, when a conv rank is set (or dims come from a file), leaves inside these classes too,
  // k x k convs (k > 1) getting the conv rank.
  std::vector<std::string> conv_target_classes;
  // Module path (as walked, diffusers naming) -> the module path kohya names it by; unset: the
  // same path. kohya trains SDXL on its own SGM/LDM-named UNet, so its files say input_blocks.4.1
  // where the diffusers module is down_blocks.1.attentions.0.
  std::function<std::string(const std::string&)> kohya_path;
  // The kohya layout keeps the dots of the module path (`<kohya_prefix>.<kohya_path>`), as the
  // musubi/ComfyUI Wan files do (diffusion_model.blocks.0.self_attn.q.lora_down.weight + .alpha).
  bool kohya_dotted = false;

  // kohya_name(kohya_prefix, kohya_path(module_path)), or dotted as above.
  std::string kohya_name_of(const std::string& module_path) const;

  // Where kohya's own trainer has one module for several of these leaves, kohya files name that
  // module: Flux's to_q/to_k/to_v of double block N are parts 0-2 of
  // lora_unet_double_blocks_N_img_attn_qkv (BFL's fused Linear). Such a file module stacks its
  // parts' downs and holds their ups block-diagonally (kohya's split_qkv layout). Unset: every leaf
  // is its own file module under kohya_name_of.
  std::function<std::optional<FusedFileModule>(const std::string& module_path)> kohya_fused_of;
  // The inverse: the module paths a file module `stem` holds and each one's rows of the fused
  // weight, given the fused weight's out rows and in features; empty when `stem` is not one.
  std::function<std::vector<std::pair<std::string, int64_t>>(const std::string& stem, int64_t out, int64_t in)>
      kohya_fused_parts;

  // kohya LoRANetwork.UNET_TARGET_REPLACE_MODULE (+ _CONV2D_3X3) over diffusers' UNet names.
  static ComponentSpec sd_unet();
  // The same targets on SDXL's UNet, kohya-named by the LDM/SGM module paths of `config`'s LDM key
  // map (lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q, lora_unet_middle_block_1_...,
  // lora_unet_output_blocks_..., with conv rank lora_unet_input_blocks_1_0_in_layers_2 ...), as
  // kohya's sdxl_train_network writes them; PEFT names stay diffusers' (unet.down_blocks...).
  static ComponentSpec sdxl_unet(const lt::models::sd::UNetConfig& config);
  // Every Linear of Flux's double- and single-stream blocks (FluxTransformer2DModel, diffusers
  // names). kohya files use BFL's modules, as kohya's flux_train_network writes them
  // (lora_unet_double_blocks_0_img_attn_qkv fused, lora_unet_single_blocks_0_linear1 ...);
  // files with AI Toolkit's/OneTrainer's lora_transformer_transformer_blocks_0_attn_to_q names load
  // too; PEFT names are transformer.transformer_blocks.0.attn.to_q.
  static ComponentSpec flux_transformer();
  // Every Linear of Wan 2.1's transformer blocks (self/cross attention q/k/v/o, ffn.0/ffn.2: 10 per
  // block, as musubi's lora_wan and AI Toolkit target): PEFT keys in diffusers names
  // (transformer.blocks.0.attn1.to_q, AI Toolkit's), the kohya layout in the native names ComfyUI and
  // musubi use (diffusion_model.blocks.0.self_attn.q, dotted, with .alpha).
  static ComponentSpec wan_transformer();
  // CLIPAttention/CLIPMLP of a CLIPTextModel. index 0: SD1/SD2's single text encoder (lora_te,
  // text_encoder); 1 and 2: SDXL's (lora_te1/text_encoder, lora_te2/text_encoder_2).
  static ComponentSpec text_encoder(int index = 0);
};

enum class AdapterType { LoRA, LoKr, LoHa };
const char* to_string(AdapterType type);  // "lora", "lokr", "loha"
AdapterType adapter_type_from_name(const std::string& name);  // network.type: "lokr", "loha", else LoRA

// How a LoKr module splits its weight: w1 is [out_l, in_m], w2 [out / out_l, in / in_m(, k, k)];
// a rank of 0 means the factor is a full matrix, otherwise the product of a rank-r pair.
struct LoKrShape {
  int64_t out_l = 1;
  int64_t in_m = 1;
  int64_t w1_rank = 0;
  int64_t w2_rank = 0;
};

// LyCORIS' factorization(): dimension = m * n with m <= n; with factor > 0 dividing it, m is the
// factor (swapped when larger); otherwise the most balanced split with m <= factor (-1: any).
std::pair<int64_t, int64_t> lokr_factorization(int64_t dimension, int64_t factor);

// The LoKr split LyCORIS chooses for a leaf with `out` x `in` channels: w1 is decomposed only with
// decompose_both, a factor only when rank < half its larger side; full_rank decomposes neither.
LoKrShape lokr_shape(int64_t out, int64_t in, int64_t rank, int64_t factor, bool full_rank, bool decompose_both);

// The `network:` section of the config, in AI Toolkit's vocabulary.
struct NetworkConfig {
  AdapterType type = AdapterType::LoRA;
  int64_t lokr_factor = -1;            // LoKr: the size of w1's sides (-1: the most balanced split)
  bool lokr_full_rank = false;         // LoKr: both factors full matrices (scale 1)
  bool lokr_decompose_both = false;    // LoKr: w1 low-rank too (LyCORIS decompose_both)
  int64_t linear = 4;                  // rank of Linear / 1x1 conv adapters
  double linear_alpha = 1.0;           // alpha (0 = rank, i.e. scale 1, as kohya)
  std::optional<int64_t> conv;         // rank of k x k conv adapters (LoCon); nullopt = none
  std::optional<double> conv_alpha;    // nullopt = conv (AI Toolkit's default)
  double dropout = 0.0;                // dropout on the rank-dim activation after down (kohya)
  // network_kwargs: substring filters on the module's dotted path ("down_blocks.0.attentions"),
  // its prefixed path ("lora_unet.down_blocks...") and its kohya name; ignore wins over only.
  std::vector<std::string> only_if_contains;
  std::vector<std::string> ignore_if_contains;
  bool train_unet = true;
  bool train_text_encoder = false;
};

// Trainable parameters of one module of `config`'s adapter type on a leaf with `out` x `in` channels and
// a k x k kernel at `rank` (LoRA: rank (in k^2 + out); LoHa: twice that; LoKr: its two factors as
// lokr_shape splits them). The planner counts adapters with it; a network's modules have exactly these.
int64_t adapter_parameters(const NetworkConfig& config, int64_t out, int64_t in, int64_t k, int64_t rank);

// Which weights a module's file key set describes: name -> (rank, alpha); built from a LoRA file
// so that a network can be created with exactly the file's modules and dims.
struct ModuleDims {
  int64_t rank = 0;
  double alpha = 0.0;
  AdapterType type = AdapterType::LoRA;
  LoKrShape lokr;  // LoKr only
  bool tucker = false;  // LyCORIS' Tucker (CP) form of a k x k conv: lokr_t2 / hada_t1, hada_t2
};

// What one adapter module is: its kind, rank, alpha and (LoKr) factor split.
struct AdapterOptions {
  AdapterType type = AdapterType::LoRA;
  int64_t rank = 4;
  double alpha = 0.0;  // 0 = rank
  double dropout = 0.0;
  LoKrShape lokr;      // LoKr only; rank is then the decomposed factors' rank (0: none is)
  // LyCORIS' Tucker form (use_tucker / use_cp) of a k x k conv, as other trainers write it: LoKr's
  // w2 = einsum(lokr_t2 [r, r, k, k], lokr_w2_a [r, out], lokr_w2_b [r, in]); LoHa's two products
  // likewise from hada_t1/hada_t2 with hada_w*_a [r, out], hada_w*_b [r, in]. Loaded, not trained.
  bool tucker = false;
};

// Mirrors kohya LoRAModule; implements the leaf's Adapter hook.
class LoRAModuleImpl : public torch::nn::Module, public lt::models::Adapter {
 public:
  LoRAModuleImpl(std::string lora_name, std::string peft_name,
                 const std::shared_ptr<lt::models::LinearImpl>& leaf, int64_t rank, double alpha, double dropout);
  LoRAModuleImpl(std::string lora_name, std::string peft_name,
                 const std::shared_ptr<lt::models::Conv2dImpl>& leaf, int64_t rank, double alpha, double dropout);
  // Any adapter type (LoRA, LoKr, LoHa) on either leaf kind.
  LoRAModuleImpl(std::string lora_name, std::string peft_name,
                 const std::shared_ptr<lt::models::LinearImpl>& leaf, const AdapterOptions& options);
  LoRAModuleImpl(std::string lora_name, std::string peft_name,
                 const std::shared_ptr<lt::models::Conv2dImpl>& leaf, const AdapterOptions& options);

  // x: the leaf's input ([..., in] or [N, in, H, W], any float dtype) -> fp32 delta of the
  // leaf's output shape: multiplier * scale * up(dropout(down(x))).
  at::Tensor delta(const at::Tensor& x) override;

  // The equivalent weight delta in fp32, shaped like the leaf's weight:
  // multiplier * scale * up @ down (kernels flattened for convs, kohya's convention), or the
  // LoKr / LoHa product.
  at::Tensor delta_weight(double multiplier) const;

  // The module's weights under their kohya/LyCORIS key suffixes, in file order:
  // lora_down.weight, lora_up.weight | lokr_w1 (or lokr_w1_a, lokr_w1_b), lokr_w2 (or _a, _b) |
  // hada_w1_a, hada_w1_b, hada_w2_a, hada_w2_b (and the Tucker cores lokr_t2 | hada_t1, hada_t2).
  std::vector<std::pair<std::string, at::Tensor>> file_parts() const;
  AdapterType type() const { return type_; }
  const LoKrShape& lokr_shape() const { return lokr_; }

  void attach();  // sets the leaf's adapter to this module (no-op when the leaf is gone)
  void detach();  // clears it (only if it is still this module)
  bool is_conv() const { return is_conv_; }
  // alpha / rank; 1 for a LoKr module with no decomposed factor (ComfyUI and A1111 ignore its alpha).
  double scale() const { return rank > 0 ? alpha / static_cast<double>(rank) : 1.0; }
  // The leaf's weight; undefined when the leaf no longer exists.
  at::Tensor base_weight() const;
  std::vector<int64_t> leaf_weight_shape() const { return leaf_shape_; }

  const std::string lora_name;  // kohya key stem, e.g. lora_unet_mid_block_attentions_0_proj_in
  const std::string peft_name;  // e.g. unet.mid_block.attentions.0.proj_in
  const int64_t rank;
  double alpha;
  double multiplier = 1.0;
  double dropout;
  at::Tensor lora_down;  // [rank, in] or [rank, in, k, k], fp32, registered "lora_down_weight"
  at::Tensor lora_up;    // [out, rank] or [out, rank, 1, 1], fp32, registered "lora_up_weight"

 private:
  template <typename Leaf>
  LoRAModuleImpl(std::string lora_name, std::string peft_name, const std::shared_ptr<Leaf>& leaf,
                 const AdapterOptions& options, int);
  void create_weights(at::IntArrayRef down_shape, at::IntArrayRef up_shape, const at::Tensor& leaf_weight);
  void init_weights();
  // LoKr / LoHa weights for a leaf of `out` x `in` channels and kernel k.
  void create_product_weights(int64_t out, int64_t in, int64_t k, const at::Tensor& leaf_weight);
  at::Tensor product_weight() const;  // the LoKr/LoHa delta before scaling, leaf-shaped, with grad
  at::Tensor lokr_delta(const at::Tensor& x);  // LoKr's delta(x) in factored form
  at::Tensor product_part(const std::string& key) const;  // undefined when the module has none
  at::Tensor lokr_w2_kernel() const;  // LoKr's w2 of a conv, [out_k, in_n, k, k]
  AdapterType type_ = AdapterType::LoRA;
  LoKrShape lokr_;
  bool tucker_ = false;
  std::vector<std::pair<std::string, at::Tensor>> product_parts_;  // LoKr/LoHa weights, file order
  bool is_conv_ = false;
  int64_t stride_ = 1;
  int64_t padding_ = 0;
  std::vector<int64_t> leaf_shape_;
  // Weak: the leaf owns the adapter (shared_ptr); the adapter must not keep the leaf alive.
  std::weak_ptr<lt::models::LinearImpl> linear_leaf_;
  std::weak_ptr<lt::models::Conv2dImpl> conv_leaf_;
};
TORCH_MODULE(LoRAModule);

enum class LoRAFormat { Kohya, PEFT };

struct SaveOptions {
  LoRAFormat format = LoRAFormat::Kohya;
  at::ScalarType dtype = at::kHalf;                 // save.dtype
  std::map<std::string, std::string> metadata;      // ss_* training metadata from the caller
};

struct LoadReport {
  LoRAFormat format = LoRAFormat::Kohya;
  size_t loaded = 0;                      // modules whose weights were set
  std::vector<std::string> missing;       // network modules the file has no weights for
  std::vector<std::string> unexpected;    // file modules the network does not have
};

// Mirrors kohya LoRANetwork: owns every LoRAModule (registered under its kohya name, so
// parameters() is exactly the trainable set) and attaches them to the model's leaves.
class LoRANetworkImpl : public torch::nn::Module {
 public:
  explicit LoRANetworkImpl(NetworkConfig config = {});

  // Creates adapters for `spec`'s targets under `root` and freezes every parameter of `root`
  // (requires_grad false): the base never trains. A component that is not trained
  // (train_unet / train_text_encoder false) gets no adapters. Returns the number created.
  // With `dims` (from a LoRA file), exactly the modules named there are created, with their dims.
  size_t add_component(const ComponentSpec& spec, torch::nn::Module& root,
                       const std::map<std::string, ModuleDims>* dims = nullptr);

  void apply_to();  // attach every adapter to its leaf (kohya apply_to)
  void remove();    // detach them: the model computes the base output again
  void set_multiplier(double multiplier);

  const NetworkConfig& config() const { return config_; }
  const std::vector<LoRAModule>& modules() const { return modules_; }
  const std::vector<ComponentSpec>& components() const { return components_; }
  std::vector<at::Tensor> trainable_parameters() const { return parameters(); }
  size_t count(bool unet) const;  // modules of UNet / text-encoder components
  // modules()[i] adapts the denoiser (UNet / transformer), not a text encoder.
  bool is_denoiser_module(size_t i) const { return module_is_unet_.at(i); }

  // Save and load (lora/format.cpp). Kohya: `<lora_name>.lora_down.weight`, `.lora_up.weight`,
  // `.alpha` for every module, plus ss_* metadata. PEFT/diffusers: `<peft_name>.lora_A.weight` /
  // `.lora_B.weight` with alpha/rank folded into lora_B (PEFT files carry no alpha) and diffusers'
  // `lora_adapter_metadata` (r = lora_alpha per component, rank_pattern/alpha_pattern when ranks
  // differ) so every tool applies scale 1 to the folded weights.
  std::vector<std::pair<std::string, at::Tensor>> state_dict(LoRAFormat format, at::ScalarType dtype) const;
  std::map<std::string, std::string> network_metadata(LoRAFormat format) const;
  void save(const std::filesystem::path& path, const SaveOptions& options = {}) const;
  // Detects the format from the keys and sets every module it names. kohya alphas are taken from
  // the file; PEFT's folded lora_B is unfolded with the module's alpha (up = B * rank / alpha).
  // Shape mismatches throw lt::InputError listing all of them; with `strict`, so do missing and
  // unexpected modules.
  LoadReport load_weights(const io::SafetensorsFile& file, bool strict = true);

  // Adds multiplier * delta_weight into each leaf's weight in place (kohya merge_to) and detaches
  // the adapters; the model then computes the adapted output without them.
  void merge_to(double multiplier = 1.0);
  // Merged copies, leaving the model untouched: (peft_name, i.e. "<component>.<module path>",
  // (W + multiplier * delta) in W's dtype) per module.
  std::vector<std::pair<std::string, at::Tensor>> merged_weights(double multiplier = 1.0) const;

 private:
  NetworkConfig config_;
  std::vector<ComponentSpec> components_;
  std::vector<LoRAModule> modules_;
  std::vector<bool> module_is_unet_;
};
TORCH_MODULE(LoRANetwork);

// Requires-grad off for every parameter of `module` (the frozen base).
void freeze(torch::nn::Module& module);

// The last component of a demangled class name without a trailing "Impl":
// "lt::models::sd::Transformer2DModelImpl" -> "Transformer2DModel".
std::string module_class_name(const torch::nn::Module& module);

}  // namespace lt::lora
