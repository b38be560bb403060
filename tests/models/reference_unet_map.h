// An independent re-statement of how ComfyUI numbers an LDM/SGM UNet (comfy/utils.py
// unet_to_diffusers): diffusers weight key -> LDM key without "diffusion_model.", from the layout
// ComfyUI describes a UNet by (resnets per level, transformer depth per input block, per output
// block, in the middle). Tests compare the project's table-driven key map and its LoRA names with
// it; nothing here is used by the project itself.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace lt::test {

struct ReferenceUNetLayout {
  std::vector<int> res_blocks;        // resnets per down level (num_res_blocks)
  std::vector<int> depth_in;          // transformer blocks per input-side resnet, in order (0 = none)
  std::vector<int> depth_out;         // transformer blocks per output-side resnet, in order
  int depth_mid = 1;                  // transformer blocks of the middle attention
};

inline std::map<std::string, std::string> reference_unet_to_ldm(const ReferenceUNetLayout& l) {
  static const std::vector<std::pair<std::string, std::string>> kResnet = {
      {"in_layers.2", "conv1"},          {"emb_layers.1", "time_emb_proj"}, {"out_layers.3", "conv2"},
      {"skip_connection", "conv_shortcut"}, {"in_layers.0", "norm1"},       {"out_layers.0", "norm2"}};
  static const std::vector<std::string> kAttention = {"proj_in", "proj_out", "norm"};
  static const std::vector<std::string> kBlock = {"norm1", "norm2", "norm3", "attn1.to_q", "attn1.to_k", "attn1.to_v",
                                                  "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
                                                  "attn2.to_out.0", "ff.net.0.proj", "ff.net.2"};
  auto s = [](int v) { return std::to_string(v); };
  std::map<std::string, std::string> m;
  auto add = [&m](const std::string& d, const std::string& ldm) {
    m[d + ".weight"] = ldm + ".weight";
    m[d + ".bias"] = ldm + ".bias";
  };
  auto attention = [&](const std::string& d, const std::string& ldm, int depth) {
    for (const auto& a : kAttention) add(d + "." + a, ldm + "." + a);
    for (int t = 0; t < depth; ++t)
      for (const auto& b : kBlock) add(d + ".transformer_blocks." + s(t) + "." + b, ldm + ".transformer_blocks." + s(t) + "." + b);
  };
  const int levels = static_cast<int>(l.res_blocks.size());
  size_t in_index = 0;
  for (int x = 0; x < levels; ++x) {
    int n = 1 + (l.res_blocks[x] + 1) * x;
    for (int i = 0; i < l.res_blocks[x]; ++i, ++n) {
      for (const auto& [ldm, d] : kResnet) add("down_blocks." + s(x) + ".resnets." + s(i) + "." + d, "input_blocks." + s(n) + ".0." + ldm);
      const int depth = l.depth_in[in_index++];
      if (depth > 0) attention("down_blocks." + s(x) + ".attentions." + s(i), "input_blocks." + s(n) + ".1", depth);
    }
    add("down_blocks." + s(x) + ".downsamplers.0.conv", "input_blocks." + s(n) + ".0.op");
  }
  attention("mid_block.attentions.0", "middle_block.1", l.depth_mid);
  for (int i = 0; i < 2; ++i)
    for (const auto& [ldm, d] : kResnet) add("mid_block.resnets." + s(i) + "." + d, "middle_block." + s(2 * i) + "." + ldm);
  std::vector<int> depth_out = l.depth_out;  // consumed from the back, as ComfyUI pops it
  for (int x = 0; x < levels; ++x) {
    const int layers = l.res_blocks[levels - 1 - x] + 1;
    int n = layers * x;
    for (int i = 0; i < layers; ++i, ++n) {
      for (const auto& [ldm, d] : kResnet) add("up_blocks." + s(x) + ".resnets." + s(i) + "." + d, "output_blocks." + s(n) + ".0." + ldm);
      int c = 1;
      const int depth = depth_out.back();
      depth_out.pop_back();
      if (depth > 0) {
        ++c;
        attention("up_blocks." + s(x) + ".attentions." + s(i), "output_blocks." + s(n) + ".1", depth);
      }
      if (i == layers - 1) add("up_blocks." + s(x) + ".upsamplers.0.conv", "output_blocks." + s(n) + "." + s(c) + ".conv");
    }
  }
  for (const auto& [d, ldm] : std::vector<std::pair<std::string, std::string>>{
           {"add_embedding.linear_1", "label_emb.0.0"}, {"add_embedding.linear_2", "label_emb.0.2"},
           {"conv_in", "input_blocks.0.0"},            {"conv_norm_out", "out.0"},
           {"conv_out", "out.2"},                      {"time_embedding.linear_1", "time_embed.0"},
           {"time_embedding.linear_2", "time_embed.2"}}) {
    add(d, ldm);
  }
  return m;
}

// ComfyUI's SDXL base layout (comfy/supported_models.py SDXL unet_config): 2 resnets per level,
// transformer depths 0,0,2,2,10,10 (input), 0,0,0,2,2,2,10,10,10 (output), 10 in the middle.
// `depths` scales them for test-sized copies: {0, 2, 10} is SDXL's.
inline ReferenceUNetLayout reference_sdxl_layout(int d0 = 0, int d1 = 2, int d2 = 10) {
  return ReferenceUNetLayout{{2, 2, 2}, {d0, d0, d1, d1, d2, d2}, {d0, d0, d0, d1, d1, d1, d2, d2, d2}, d2};
}

}  // namespace lt::test
