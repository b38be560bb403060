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
KeyMap vae_ldm_key_map(const sd::VAEConfig& config);

// True for the diffusers VAE keys whose LDM tensor may be a 1x1 conv to reshape into a Linear weight.
bool is_vae_attention_weight(const std::string& diffusers_key);

// CLIP text encoder (SD1.x): cond_stage_model.transformer.text_model.* <-> text_model.*; the older
// spelling without `text_model.` is accepted when reading.
KeyMap clip_ldm_key_map();

}  // namespace lt::models
