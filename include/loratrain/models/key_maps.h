// Key maps between the original LDM single-file checkpoint layout (as downloaded from model sites:
// `model.diffusion_model.*`, `first_stage_model.*`, `cond_stage_model.transformer.*`) and diffusers
// names, which are our module names. Every rename lives in one table per component, built from the
// config where numbering depends on it; each row maps a key prefix in both directions.
#pragma once
#include <string>
#include <vector>

#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"

namespace lt::models {

// One row: keys starting with `ldm` correspond to keys starting with `diffusers` (both end in '.').
struct KeyRule {
  std::string ldm;
  std::string diffusers;
  bool reversible = true;  // false: a legacy spelling accepted when reading, never written
};

// A table of prefix rules, matched longest-prefix-first. Pure: no state besides the table.
class KeyMap {
 public:
  // ldm_root: the prefix every LDM key of this component starts with (e.g. "model.diffusion_model.").
  KeyMap(std::string ldm_root, std::vector<KeyRule> rules);
  // LDM key -> diffusers key; "" when no row covers the key (it belongs to another component).
  std::string to_diffusers(const std::string& ldm_key) const;
  // diffusers key -> LDM key; "" when no row covers it.
  std::string to_ldm(const std::string& diffusers_key) const;
  const std::vector<KeyRule>& rules() const { return rules_; }
  const std::string& ldm_root() const { return ldm_root_; }

 private:
  std::vector<KeyRule> rules_;
  std::vector<size_t> by_ldm_;        // rule indices, longest ldm prefix first
  std::vector<size_t> by_diffusers_;  // reversible rule indices, longest diffusers prefix first
  std::string ldm_root_;
};

// UNet: model.diffusion_model.{time_embed, input_blocks, middle_block, output_blocks, out, label_emb}
// <-> diffusers; input/output block numbering follows the config's layers_per_block and levels.
KeyMap unet_ldm_key_map(const sd::UNetConfig& config);

// VAE: first_stage_model.{encoder,decoder}.{down,mid,up,norm_out}, quant convs <-> diffusers; the
// mid attention's norm/q/k/v/proj_out become group_norm/to_q/to_k/to_v/to_out.0 (older files store
// those weights as 1x1 convs [C, C, 1, 1]; see is_vae_attention_weight).
// `root`: where the VAE lives in the file (ComfyUI's Flux all-in-one files use "vae.", BFL's
// ae.safetensors "").
KeyMap vae_ldm_key_map(const sd::VAEConfig& config, const std::string& root = "first_stage_model.");

// True for the diffusers VAE keys whose LDM tensor may be a 1x1 conv to reshape into a Linear weight.
bool is_vae_attention_weight(const std::string& diffusers_key);

// CLIP text encoder stored with transformers' names under `root`: SD1.x's
// cond_stage_model.transformer.text_model.* (and SDXL's conditioner.embedders.0.transformer.) <->
// text_model.*; the older spelling without `text_model.` is accepted when reading.
KeyMap clip_ldm_key_map(const std::string& root = "cond_stage_model.transformer.");

// OpenCLIP's text tower under `root` (SD2.x cond_stage_model.model., SDXL conditioner.embedders.1.model.)
// <-> transformers CLIPTextModel(WithProjection) names, for `layers` resblocks:
//   token_embedding -> text_model.embeddings.token_embedding, positional_embedding ->
//   text_model.embeddings.position_embedding.weight, transformer.resblocks.N.{ln_1, ln_2, mlp.c_fc,
//   mlp.c_proj, attn.out_proj} -> text_model.encoder.layers.N.{layer_norm1, layer_norm2, mlp.fc1,
//   mlp.fc2, self_attn.out_proj}, ln_final -> text_model.final_layer_norm, text_projection ->
//   text_projection.weight.
// Two of these are not plain renames and are completed by the loader: attn.in_proj_weight/bias
// (q, k, v stacked on rows) map to the fused name self_attn.in_proj_weight/bias (see
// fused_qkv_parts), and text_projection is stored as P in x @ P, i.e. transposed.
KeyMap open_clip_key_map(const std::string& root, int64_t layers);

// For a fused OpenCLIP attention key in transformers naming (`...self_attn.in_proj_weight` / `_bias`):
// the q_proj, k_proj, v_proj keys its three row blocks belong to, in order; empty for other keys.
std::vector<std::string> fused_qkv_parts(const std::string& key);

}  // namespace lt::models
