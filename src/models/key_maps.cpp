#include "loratrain/models/key_maps.h"

#include <algorithm>

namespace lt::models {

KeyMap::KeyMap(std::string ldm_root, std::vector<KeyRule> rules) : rules_(std::move(rules)), ldm_root_(std::move(ldm_root)) {
  for (size_t i = 0; i < rules_.size(); ++i) {
    by_ldm_.push_back(i);
    if (rules_[i].reversible) by_diffusers_.push_back(i);
  }
  std::stable_sort(by_ldm_.begin(), by_ldm_.end(),
                   [this](size_t a, size_t b) { return rules_[a].ldm.size() > rules_[b].ldm.size(); });
  std::stable_sort(by_diffusers_.begin(), by_diffusers_.end(),
                   [this](size_t a, size_t b) { return rules_[a].diffusers.size() > rules_[b].diffusers.size(); });
}

std::string KeyMap::to_diffusers(const std::string& key) const {
  for (size_t i : by_ldm_) {
    const auto& r = rules_[i];
    if (key.compare(0, r.ldm.size(), r.ldm) == 0) return r.diffusers + key.substr(r.ldm.size());
  }
  return {};
}

std::string KeyMap::to_ldm(const std::string& key) const {
  for (size_t i : by_diffusers_) {
    const auto& r = rules_[i];
    if (key.compare(0, r.diffusers.size(), r.diffusers) == 0) return r.ldm + key.substr(r.diffusers.size());
  }
  return {};
}

namespace {

std::string num(size_t i) { return std::to_string(i); }

// LDM ResBlock (UNet) sub-layers -> diffusers ResnetBlock2D.
void add_unet_resnet(std::vector<KeyRule>& rules, const std::string& ldm, const std::string& diffusers) {
  static const std::pair<const char*, const char*> kResnet[] = {
      {"in_layers.0.", "norm1."},          {"in_layers.2.", "conv1."},  {"emb_layers.1.", "time_emb_proj."},
      {"out_layers.0.", "norm2."},         {"out_layers.3.", "conv2."}, {"skip_connection.", "conv_shortcut."},
  };
  for (const auto& [from, to] : kResnet) rules.push_back({ldm + from, diffusers + to});
}

}  // namespace

KeyMap unet_ldm_key_map(const sd::UNetConfig& c) {
  const std::string root = "model.diffusion_model.";
  std::vector<KeyRule> rules = {
      {root + "time_embed.0.", "time_embedding.linear_1."},
      {root + "time_embed.2.", "time_embedding.linear_2."},
      {root + "label_emb.0.0.", "add_embedding.linear_1."},  // SDXL
      {root + "label_emb.0.2.", "add_embedding.linear_2."},
      {root + "input_blocks.0.0.", "conv_in."},
      {root + "out.0.", "conv_norm_out."},
      {root + "out.2.", "conv_out."},
  };
  const size_t n = c.num_blocks();
  // input_blocks: [1 + sum of (layers + downsampler)] — each resnet at .0, its transformer at .1.
  size_t k = 1;
  for (size_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c.layers_per_block[i]; ++j, ++k) {
      const std::string ldm = root + "input_blocks." + num(k) + ".";
      const std::string d = "down_blocks." + num(i) + ".";
      add_unet_resnet(rules, ldm + "0.", d + "resnets." + num(j) + ".");
      if (c.down_has_attention(i)) rules.push_back({ldm + "1.", d + "attentions." + num(j) + "."});
    }
    if (i + 1 < n) {
      rules.push_back({root + "input_blocks." + num(k) + ".0.op.", "down_blocks." + num(i) + ".downsamplers.0.conv."});
      ++k;
    }
  }
  add_unet_resnet(rules, root + "middle_block.0.", "mid_block.resnets.0.");
  rules.push_back({root + "middle_block.1.", "mid_block.attentions.0."});
  add_unet_resnet(rules, root + "middle_block.2.", "mid_block.resnets.1.");
  // output_blocks: per up level (layers + 1) entries; the upsampler sits after the last resnet's
  // transformer (index 2) or directly after the resnet (index 1).
  k = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t layers = c.layers_per_block[n - 1 - i] + 1;
    for (int64_t j = 0; j < layers; ++j, ++k) {
      const std::string ldm = root + "output_blocks." + num(k) + ".";
      const std::string d = "up_blocks." + num(i) + ".";
      add_unet_resnet(rules, ldm + "0.", d + "resnets." + num(j) + ".");
      if (c.up_has_attention(i)) rules.push_back({ldm + "1.", d + "attentions." + num(j) + "."});
      if (j == layers - 1 && i + 1 < n) {
        rules.push_back({ldm + (c.up_has_attention(i) ? "2." : "1.") + "conv.", d + "upsamplers.0.conv."});
      }
    }
  }
  return KeyMap(root, std::move(rules));
}

namespace {

void add_vae_resnet(std::vector<KeyRule>& rules, const std::string& ldm, const std::string& diffusers) {
  rules.push_back({ldm, diffusers});  // norm1, conv1, norm2, conv2 keep their names
  rules.push_back({ldm + "nin_shortcut.", diffusers + "conv_shortcut."});
}

void add_vae_mid(std::vector<KeyRule>& rules, const std::string& ldm, const std::string& diffusers) {
  add_vae_resnet(rules, ldm + "block_1.", diffusers + "resnets.0.");
  add_vae_resnet(rules, ldm + "block_2.", diffusers + "resnets.1.");
  static const std::pair<const char*, const char*> kAttention[] = {
      {"norm.", "group_norm."}, {"q.", "to_q."}, {"k.", "to_k."}, {"v.", "to_v."}, {"proj_out.", "to_out.0."},
  };
  for (const auto& [from, to] : kAttention) rules.push_back({ldm + "attn_1." + from, diffusers + "attentions.0." + to});
}

}  // namespace

KeyMap vae_ldm_key_map(const sd::VAEConfig& c, const std::string& root) {
  std::vector<KeyRule> rules = {
      {root + "encoder.conv_in.", "encoder.conv_in."},
      {root + "encoder.norm_out.", "encoder.conv_norm_out."},
      {root + "encoder.conv_out.", "encoder.conv_out."},
      {root + "decoder.conv_in.", "decoder.conv_in."},
      {root + "decoder.norm_out.", "decoder.conv_norm_out."},
      {root + "decoder.conv_out.", "decoder.conv_out."},
      {root + "quant_conv.", "quant_conv."},
      {root + "post_quant_conv.", "post_quant_conv."},
  };
  const size_t n = c.block_out_channels.size();
  for (size_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      add_vae_resnet(rules, root + "encoder.down." + num(i) + ".block." + num(j) + ".",
                     "encoder.down_blocks." + num(i) + ".resnets." + num(j) + ".");
    }
    if (i + 1 < n) {
      rules.push_back({root + "encoder.down." + num(i) + ".downsample.conv.", "encoder.down_blocks." + num(i) + ".downsamplers.0.conv."});
    }
  }
  add_vae_mid(rules, root + "encoder.mid.", "encoder.mid_block.");
  add_vae_mid(rules, root + "decoder.mid.", "decoder.mid_block.");
  // LDM numbers decoder levels from the lowest resolution's end: up.{n-1} runs first.
  for (size_t i = 0; i < n; ++i) {
    const std::string ldm = root + "decoder.up." + num(n - 1 - i) + ".";
    const std::string d = "decoder.up_blocks." + num(i) + ".";
    for (int64_t j = 0; j <= c.layers_per_block; ++j) add_vae_resnet(rules, ldm + "block." + num(j) + ".", d + "resnets." + num(j) + ".");
    if (i + 1 < n) rules.push_back({ldm + "upsample.conv.", d + "upsamplers.0.conv."});
  }
  return KeyMap(root, std::move(rules));
}

bool is_vae_attention_weight(const std::string& key) {
  static const char* kSuffixes[] = {".attentions.0.to_q.weight", ".attentions.0.to_k.weight",
                                    ".attentions.0.to_v.weight", ".attentions.0.to_out.0.weight"};
  for (const char* s : kSuffixes) {
    const std::string suffix(s);
    if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        key.find("mid_block") != std::string::npos) {
      return true;
    }
  }
  return false;
}

KeyMap clip_ldm_key_map(const std::string& root) {
  return KeyMap(root, {
      {root + "text_model.", "text_model."},
      {root, "text_model.", /*reversible=*/false},  // transformers < 4.x layout
  });
}

KeyMap open_clip_key_map(const std::string& root, int64_t layers) {
  std::vector<KeyRule> rules = {
      {root + "token_embedding.", "text_model.embeddings.token_embedding."},
      {root + "positional_embedding", "text_model.embeddings.position_embedding.weight"},
      {root + "ln_final.", "text_model.final_layer_norm."},
      {root + "text_projection", "text_projection.weight"},
  };
  static const std::pair<const char*, const char*> kBlock[] = {
      {"ln_1.", "layer_norm1."},      {"ln_2.", "layer_norm2."},         {"mlp.c_fc.", "mlp.fc1."},
      {"mlp.c_proj.", "mlp.fc2."},    {"attn.out_proj.", "self_attn.out_proj."},
      {"attn.in_proj_", "self_attn.in_proj_"},
  };
  for (int64_t i = 0; i < layers; ++i) {
    const std::string ldm = root + "transformer.resblocks." + num(static_cast<size_t>(i)) + ".";
    const std::string d = "text_model.encoder.layers." + num(static_cast<size_t>(i)) + ".";
    for (const auto& [from, to] : kBlock) rules.push_back({ldm + from, d + to});
  }
  return KeyMap(root, std::move(rules));
}

std::vector<std::string> fused_qkv_parts(const std::string& key) {
  static const std::string kFused = "self_attn.in_proj_";
  const size_t at = key.rfind(kFused);
  if (at == std::string::npos) return {};
  const std::string kind = key.substr(at + kFused.size());  // "weight" or "bias"
  if (kind != "weight" && kind != "bias") return {};
  const std::string stem = key.substr(0, at) + "self_attn.";
  return {stem + "q_proj." + kind, stem + "k_proj." + kind, stem + "v_proj." + kind};
}

}  // namespace lt::models
