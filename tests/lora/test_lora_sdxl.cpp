// SDXL LoRA naming and interoperability. kohya names SDXL's UNet modules by their LDM/SGM paths
// (lora_unet_input_blocks_4_1_...), the text encoders lora_te1_ / lora_te2_. The files are checked
// against re-statements of the two loaders users have:
//   - ComfyUI (comfy/lora.py model_lora_keys_unet / model_lora_keys_clip, weight_adapter/lora.py):
//     lora_unet_<LDM key with '_'> -> the LDM weight; the text encoders' layer names;
//     W += (alpha / rank) * up @ down.
//   - diffusers (StableDiffusionXLLoraLoaderMixin.load_lora_weights: lora_conversion_utils.py
//     _maybe_map_sgm_blocks_to_diffusers + _convert_non_diffusers_lora_to_diffusers, then
//     state_dict_utils.py's PEFT renames and peft_utils.get_peft_kwargs for r / lora_alpha).
// Every saved key must reach a module of the diffusers-named model and the merged weights must
// equal the ones the adapters compute in training.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "loratrain/io/safetensors.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/util/error.h"
#include "models/reference_unet_map.h"
#include "lora/network_helpers.h"
#include "test_paths.h"

using namespace lt::lora;
using lt::models::sd::UNetConfig;

using lt::test::names_of;
using lt::test::randomize_up;

namespace {

// SDXL's topology (levels, resnets, transformer depths 0/2/10, linear projections) at narrow
// widths: the module tree, hence every name and count, equals the full-size model's.
UNetConfig sdxl_topology() {
  UNetConfig c = UNetConfig::sdxl();
  c.block_out_channels = {32, 64, 128};
  c.attention_head_dim = {1, 1, 2};
  c.cross_attention_dim = {48, 48, 48};
  c.projection_class_embeddings_input_dim = 16 + 6 * 256;
  return c;
}

// A smaller SDXL-shaped UNet for the file tests (depths 1 and 2 instead of 2 and 10).
UNetConfig sdxl_small() {
  UNetConfig c = sdxl_topology();
  c.transformer_layers_per_block = {1, 1, 2};
  return c;
}

lt::models::CLIPTextConfig clip_config(int64_t hidden, int64_t layers) {
  lt::models::CLIPTextConfig c;
  c.vocab_size = 64;
  c.hidden_size = hidden;
  c.intermediate_size = 2 * hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 8;
  c.projection_dim = 16;
  c.hidden_act = "gelu";
  c.eos_token_id = 2;
  return c;
}

// kohya's SDXL UNet names written out from its rules: the SpatialTransformers at input blocks
// 4, 5 (2 blocks), 7, 8 (10), middle_block.1 (10), output blocks 0-2 (10) and 3-5 (2).
std::set<std::string> kohya_sdxl_unet_names(int d1, int d2) {
  std::vector<std::pair<std::string, int>> transformers = {
      {"input_blocks_4_1", d1},  {"input_blocks_5_1", d1},  {"input_blocks_7_1", d2},  {"input_blocks_8_1", d2},
      {"middle_block_1", d2},    {"output_blocks_0_1", d2}, {"output_blocks_1_1", d2}, {"output_blocks_2_1", d2},
      {"output_blocks_3_1", d1}, {"output_blocks_4_1", d1}, {"output_blocks_5_1", d1}};
  std::set<std::string> names;
  for (const auto& [t, depth] : transformers) {
    names.insert("lora_unet_" + t + "_proj_in");
    names.insert("lora_unet_" + t + "_proj_out");
    for (int b = 0; b < depth; ++b) {
      const std::string block = "lora_unet_" + t + "_transformer_blocks_" + std::to_string(b) + "_";
      for (const char* attn : {"attn1", "attn2"})
        for (const char* p : {"to_q", "to_k", "to_v", "to_out_0"}) names.insert(block + attn + "_" + p);
      names.insert(block + "ff_net_0_proj");
      names.insert(block + "ff_net_2");
    }
  }
  return names;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

std::vector<std::string> split(const std::string& s, char d) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == d) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, size_t from, size_t to, char d) {
  std::string out;
  for (size_t i = from; i < to && i < parts.size(); ++i) out += (out.empty() && i == from ? "" : std::string(1, d)) + parts[i];
  return out;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

using StateDict = std::map<std::string, at::Tensor>;

StateDict read_all(const lt::io::SafetensorsFile& f) {
  StateDict sd;
  for (const auto& t : f.tensors()) sd[t.name] = f.load(t.name, at::kFloat);
  return sd;
}

// The weight delta a loader applies: scale * up @ down, shaped like the module's weight.
at::Tensor delta_of(const at::Tensor& up, const at::Tensor& down, double scale, at::IntArrayRef shape) {
  return (up.flatten(1).matmul(down.flatten(1)) * scale).reshape(shape);
}

// ---------------------------------------------------------------------------------------------
// ComfyUI's rules. key_map: LoRA name -> model weight, built from the model's own weight names.

struct Patch {
  std::string component;  // "unet", "text_encoder", "text_encoder_2"
  std::string weight;     // the diffusers-named weight it changes
  at::Tensor delta;
};

std::vector<Patch> comfyui_load(const StateDict& lora, const std::map<std::string, std::string>& unet_ldm_to_diffusers,
                                int64_t te1_layers, int64_t te2_layers, std::set<std::string>& not_loaded,
                                const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::map<std::string, std::pair<std::string, std::string>> key_map;  // lora name -> (component, weight)
  for (const auto& [ldm, diffusers] : unet_ldm_to_diffusers) {
    if (ldm.size() > 7 && ldm.compare(ldm.size() - 7, 7, ".weight") == 0) {
      key_map["lora_unet_" + replace_all(ldm.substr(0, ldm.size() - 7), ".", "_")] = {"unet", diffusers};
    }
  }
  const std::vector<std::pair<std::string, std::string>> clip_map = {
      {"mlp.fc1", "mlp_fc1"}, {"mlp.fc2", "mlp_fc2"}, {"self_attn.k_proj", "self_attn_k_proj"},
      {"self_attn.q_proj", "self_attn_q_proj"}, {"self_attn.v_proj", "self_attn_v_proj"},
      {"self_attn.out_proj", "self_attn_out_proj"}};
  for (int64_t b = 0; b < std::max(te1_layers, te2_layers); ++b) {
    for (const auto& [c, k] : clip_map) {
      const std::string weight = "text_model.encoder.layers." + std::to_string(b) + "." + c + ".weight";
      if (b < te1_layers) key_map["lora_te1_text_model_encoder_layers_" + std::to_string(b) + "_" + k] = {"text_encoder", weight};
      if (b < te2_layers) key_map["lora_te2_text_model_encoder_layers_" + std::to_string(b) + "_" + k] = {"text_encoder_2", weight};
    }
  }
  std::set<std::string> loaded;
  std::vector<Patch> patches;
  for (const auto& [name, target] : key_map) {
    auto up = lora.find(name + ".lora_up.weight");
    if (up == lora.end()) continue;
    const at::Tensor& down = lora.at(name + ".lora_down.weight");
    double alpha_scale = 1.0;
    if (auto a = lora.find(name + ".alpha"); a != lora.end()) {
      alpha_scale = a->second.item<double>() / static_cast<double>(down.size(0));
      loaded.insert(name + ".alpha");
    }
    loaded.insert(up->first);
    loaded.insert(name + ".lora_down.weight");
    patches.push_back({target.first, target.second,
                       delta_of(up->second, down, alpha_scale, shapes.at(target.first + "." + target.second))});
  }
  for (const auto& [k, v] : lora) {
    if (!loaded.count(k)) not_loaded.insert(k);
  }
  return patches;
}

// ---------------------------------------------------------------------------------------------
// diffusers' rules for a kohya file, down to PEFT module names, ranks and alphas.

// _maybe_map_sgm_blocks_to_diffusers with delimiter '_' and block_slice_pos 5.
StateDict sgm_to_diffusers_blocks(StateDict sd, int64_t layers_per_block) {
  const std::vector<std::string> sgm = {"input_blocks", "middle_block", "output_blocks"};
  const std::vector<std::string> inner = {"resnets", "attentions", "upsamplers"};
  StateDict out;
  for (auto& [key, value] : sd) {
    const bool is_sgm = contains(key, "input_blocks") || contains(key, "middle_block") || contains(key, "output_blocks");
    if (contains(key, "text") || !is_sgm || contains(key, "input_blocks_0_0")) {
      out[key] = value;
      continue;
    }
    const auto parts = split(key, '_');
    const int64_t id = std::stoll(parts.at(4));
    std::vector<std::string> head(parts.begin(), parts.begin() + 4);
    std::vector<std::string> tail;
    std::string new_key;
    auto assemble = [&](const std::vector<std::string>& middle, size_t rest) {
      std::vector<std::string> all = head;
      all.insert(all.end(), middle.begin(), middle.end());
      all.insert(all.end(), parts.begin() + static_cast<long>(rest), parts.end());
      return join(all, 0, all.size(), '_');
    };
    if (contains(key, "input_blocks")) {
      const int64_t block = (id - 1) / (layers_per_block + 1);
      const int64_t layer = (id - 1) % (layers_per_block + 1);
      const bool op = contains(key, "op");
      const std::string inner_key = op ? "downsamplers" : inner.at(std::stoul(parts.at(5)));
      new_key = assemble({std::to_string(block), inner_key, op ? "0" : std::to_string(layer)}, 6);
    } else if (contains(key, "middle_block")) {
      const std::vector<std::string> part = id == 0 ? std::vector<std::string>{"resnets", "0"}
                                            : id == 1 ? std::vector<std::string>{"attentions", "0"}
                                                      : std::vector<std::string>{"resnets", "1"};
      new_key = assemble(part, 5);
    } else {
      const int64_t block = id / (layers_per_block + 1);
      const int64_t layer = id % (layers_per_block + 1);
      const auto inner_id = std::stoul(parts.at(5));
      new_key = assemble({std::to_string(block), inner.at(inner_id), inner_id < 2 ? std::to_string(layer) : "0"}, 6);
    }
    out[new_key] = value;
  }
  return out;
}

// _convert_unet_lora_key, in its order of renames.
std::string unet_lora_key(const std::string& key) {
  std::string n = replace_all(replace_all(key, "lora_unet_", ""), "_", ".");
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"input.blocks.0.0", "conv_in"}, {"out.2", "conv_out"}, {"input.blocks", "down_blocks"},
           {"down.blocks", "down_blocks"}, {"middle.block", "mid_block"}, {"mid.block", "mid_block"},
           {"output.blocks", "up_blocks"}, {"up.blocks", "up_blocks"}, {"transformer.blocks", "transformer_blocks"},
           {"to.q.lora", "to_q_lora"}, {"to.k.lora", "to_k_lora"}, {"to.v.lora", "to_v_lora"},
           {"to.out.0.lora", "to_out_lora"}, {"proj.in", "proj_in"}, {"proj.out", "proj_out"},
           {"emb.layers", "time_emb_proj"}, {"conv.in", "conv_in"}, {"conv.out", "conv_out"},
           {"time.embed.0", "time_embedding.linear_1"}, {"time.embed.2", "time_embedding.linear_2"},
           {"label.emb.0.0", "add_embedding.linear_1"}, {"label.emb.0.2", "add_embedding.linear_2"},
           {"time.embedding.linear.1", "time_embedding.linear_1"}, {"time.embedding.linear.2", "time_embedding.linear_2"}}) {
    n = replace_all(n, a, b);
  }
  if (contains(n, "emb") && !contains(n, "time.emb.proj")) {
    n = std::regex_replace(n, std::regex(R"(\.\d+(?=\D*$))"), "", std::regex_constants::format_first_only);
  }
  if (contains(n, ".in.")) n = replace_all(n, "in.layers.2", "conv1");
  if (contains(n, ".out.")) n = replace_all(n, "out.layers.3", "conv2");
  if (contains(n, "downsamplers") || contains(n, "upsamplers")) n = replace_all(n, "op", "conv");
  if (contains(n, "skip")) n = replace_all(n, "skip.connection", "conv_shortcut");
  if (contains(n, "time.emb.proj")) n = replace_all(n, "time.emb.proj", "time_emb_proj");
  if (contains(n, "conv.shortcut")) n = replace_all(n, "conv.shortcut", "conv_shortcut");
  if (contains(n, "transformer_blocks") && (contains(n, "attn1") || contains(n, "attn2"))) {
    n = replace_all(replace_all(n, "attn1", "attn1.processor"), "attn2", "attn2.processor");
  }
  return n;
}

// _convert_text_encoder_lora_key.
std::string text_encoder_lora_key(const std::string& key, const std::string& prefix) {
  std::string n = replace_all(replace_all(key, prefix, ""), "_", ".");
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"text.model", "text_model"}, {"self.attn", "self_attn"}, {"q.proj.lora", "to_q_lora"},
           {"k.proj.lora", "to_k_lora"}, {"v.proj.lora", "to_v_lora"}, {"out.proj.lora", "to_out_lora"},
           {"text.projection", "text_projection"}}) {
    n = replace_all(n, a, b);
  }
  if (!contains(n, "self_attn") && !contains(n, "text_projection") && contains(n, "mlp")) {
    n = replace_all(n, ".lora.", ".lora_linear_layer.");
  }
  return n;
}

// convert_state_dict: ".processor." -> ".", then the first pattern of `mapping` that occurs.
std::string convert_key(std::string k, const std::vector<std::pair<std::string, std::string>>& mapping) {
  k = replace_all(k, ".processor.", ".");
  for (const auto& [a, b] : mapping) {
    if (contains(k, a)) return replace_all(k, a, b);
  }
  return k;
}

// One component's PEFT adapter as diffusers configures it: module -> (A, B, scale).
struct PeftModule {
  at::Tensor a, b;
  double scale = 1.0;
};
using PeftComponent = std::map<std::string, PeftModule>;

// get_peft_kwargs: r / lora_alpha = the most common rank / alpha, patterns for the others.
template <typename K>
K most_common(const std::vector<K>& values) {
  std::map<K, size_t> count;
  for (const auto& v : values) ++count[v];
  return std::max_element(count.begin(), count.end(), [](const auto& x, const auto& y) { return x.second < y.second; })->first;
}

bool pattern_matches(const std::string& pattern, const std::string& module) {
  if (!pattern.empty() && pattern[0] == '^') return module == pattern.substr(1);
  return module == pattern || (module.size() > pattern.size() &&
                               module.compare(module.size() - pattern.size() - 1, pattern.size() + 1, "." + pattern) == 0);
}

PeftComponent peft_component(const StateDict& sd, const std::map<std::string, double>& alphas, bool is_unet) {
  std::map<std::string, int64_t> rank;  // module -> rank (from lora_B)
  for (const auto& [k, v] : sd) {
    const size_t at = k.find(".lora_B.weight");
    if (at != std::string::npos) rank[k.substr(0, at)] = v.size(1);
  }
  std::vector<int64_t> ranks;
  for (const auto& [m, r] : rank) ranks.push_back(r);
  const int64_t r = most_common(ranks);
  std::vector<double> alpha_values;
  for (const auto& [k, a] : alphas) alpha_values.push_back(a);
  const bool has_alphas = !alphas.empty();
  const double lora_alpha = has_alphas ? most_common(alpha_values) : static_cast<double>(r);
  std::map<std::string, double> alpha_pattern;
  if (has_alphas) {
    for (const auto& [k, a] : alphas) {
      if (a == lora_alpha) continue;
      std::string p;
      if (is_unet) {
        p = replace_all(k.substr(0, k.find(".lora_A.") == std::string::npos ? k.size() : k.find(".lora_A.")), ".alpha", "");
      } else {
        const auto parts = split(k.substr(0, k.find(".down.") == std::string::npos ? k.size() : k.find(".down.")), '.');
        p = join(parts, 0, parts.size() - 1, '.');
      }
      alpha_pattern[p] = a;
    }
  }
  PeftComponent out;
  for (const auto& [module, module_rank] : rank) {
    double alpha = has_alphas ? lora_alpha : static_cast<double>(module_rank);
    for (const auto& [p, a] : alpha_pattern) {
      if (pattern_matches(p, module)) alpha = a;
    }
    out[module] = {sd.at(module + ".lora_A.weight"), sd.at(module + ".lora_B.weight"), alpha / static_cast<double>(module_rank)};
  }
  return out;
}

// StableDiffusionXLLoraLoaderMixin on a kohya file: component -> PEFT modules; `left` gets keys
// the conversion did not consume (diffusers raises on them).
std::map<std::string, PeftComponent> diffusers_load_kohya(StateDict sd, int64_t layers_per_block, std::set<std::string>& left) {
  sd = sgm_to_diffusers_blocks(std::move(sd), layers_per_block);
  std::map<std::string, StateDict> converted;               // component -> old-diffusers keys
  std::map<std::string, std::map<std::string, double>> alphas;  // component -> alpha name -> alpha
  std::vector<std::string> keys;
  for (const auto& [k, v] : sd) keys.push_back(k);
  for (const auto& key : keys) {
    if (key.size() < 16 || key.compare(key.size() - 16, 16, "lora_down.weight") != 0) continue;
    const std::string name = key.substr(0, key.find('.'));
    std::string component, d;
    if (name.rfind("lora_unet_", 0) == 0) {
      component = "unet";
      d = unet_lora_key(key);
    } else if (name.rfind("lora_te1_", 0) == 0 || name.rfind("lora_te_", 0) == 0) {
      component = "text_encoder";
      d = text_encoder_lora_key(key, name.rfind("lora_te1_", 0) == 0 ? "lora_te1_" : "lora_te_");
    } else if (name.rfind("lora_te2_", 0) == 0) {
      component = "text_encoder_2";
      d = text_encoder_lora_key(key, "lora_te2_");
    } else {
      continue;
    }
    converted[component][d] = sd.at(key);
    converted[component][replace_all(d, ".down.", ".up.")] = sd.at(name + ".lora_up.weight");
    sd.erase(key);
    sd.erase(name + ".lora_up.weight");
    if (auto a = sd.find(name + ".alpha"); a != sd.end()) {
      const size_t cut = d.find(".lora.");
      alphas[component][(cut == std::string::npos ? d : d.substr(0, cut)) + ".alpha"] = a->second.item<double>();
      sd.erase(a);
    }
  }
  for (const auto& [k, v] : sd) left.insert(k);

  const std::vector<std::pair<std::string, std::string>> unet_to_peft = {
      {".to_out_lora.up", ".to_out.0.lora_B"}, {".to_out_lora.down", ".to_out.0.lora_A"},
      {".to_q_lora.down", ".to_q.lora_A"},     {".to_q_lora.up", ".to_q.lora_B"},
      {".to_k_lora.down", ".to_k.lora_A"},     {".to_k_lora.up", ".to_k.lora_B"},
      {".to_v_lora.down", ".to_v.lora_A"},     {".to_v_lora.up", ".to_v.lora_B"},
      {".lora.up", ".lora_B"},                 {".lora.down", ".lora_A"}};
  const std::vector<std::pair<std::string, std::string>> old_to_diffusers = {
      {".to_q_lora.up", ".q_proj.lora_linear_layer.up"},     {".to_q_lora.down", ".q_proj.lora_linear_layer.down"},
      {".to_k_lora.up", ".k_proj.lora_linear_layer.up"},     {".to_k_lora.down", ".k_proj.lora_linear_layer.down"},
      {".to_v_lora.up", ".v_proj.lora_linear_layer.up"},     {".to_v_lora.down", ".v_proj.lora_linear_layer.down"},
      {".to_out_lora.up", ".out_proj.lora_linear_layer.up"}, {".to_out_lora.down", ".out_proj.lora_linear_layer.down"}};
  const std::vector<std::pair<std::string, std::string>> diffusers_to_peft = {
      {".q_proj.lora_linear_layer.up", ".q_proj.lora_B"},     {".q_proj.lora_linear_layer.down", ".q_proj.lora_A"},
      {".k_proj.lora_linear_layer.up", ".k_proj.lora_B"},     {".k_proj.lora_linear_layer.down", ".k_proj.lora_A"},
      {".v_proj.lora_linear_layer.up", ".v_proj.lora_B"},     {".v_proj.lora_linear_layer.down", ".v_proj.lora_A"},
      {".out_proj.lora_linear_layer.up", ".out_proj.lora_B"}, {".out_proj.lora_linear_layer.down", ".out_proj.lora_A"},
      {".lora_linear_layer.up", ".lora_B"},                   {".lora_linear_layer.down", ".lora_A"}};
  std::map<std::string, PeftComponent> out;
  for (auto& [component, state] : converted) {
    StateDict peft;
    for (const auto& [k, v] : state) {
      peft[component == "unet" ? convert_key(k, unet_to_peft) : convert_key(convert_key(k, old_to_diffusers), diffusers_to_peft)] = v;
    }
    out[component] = peft_component(peft, alphas[component], component == "unet");
  }
  return out;
}

// A PEFT file under diffusers' rules: the component prefix, lora_A/lora_B, and LoraConfig from
// the file's lora_adapter_metadata (r, lora_alpha, rank_pattern, alpha_pattern).
std::map<std::string, PeftComponent> diffusers_load_peft(const lt::io::SafetensorsFile& file) {
  const auto meta = nlohmann::json::parse(file.metadata().at("lora_adapter_metadata"));
  std::map<std::string, PeftComponent> out;
  const StateDict sd = read_all(file);
  for (const std::string component : {"unet", "text_encoder", "text_encoder_2"}) {
    const std::string p = component + ".";
    if (!meta.contains(p + "r")) continue;
    const double r = meta.at(p + "r").get<double>();
    const double lora_alpha = meta.at(p + "lora_alpha").get<double>();
    for (const auto& [k, v] : sd) {
      if (k.rfind(p, 0) != 0 || k.find(".lora_A.weight") == std::string::npos) continue;
      const std::string module = k.substr(p.size(), k.find(".lora_A.weight") - p.size());
      double rank = r, alpha = lora_alpha;
      for (const auto& [pat, value] : meta.at(p + "rank_pattern").items()) if (pattern_matches(pat, module)) rank = value.get<double>();
      for (const auto& [pat, value] : meta.at(p + "alpha_pattern").items()) if (pattern_matches(pat, module)) alpha = value.get<double>();
      out[component][module] = {v, sd.at(p + module + ".lora_B.weight"), alpha / rank};
    }
  }
  return out;
}

// The three models and their LoRA network with trained (random) up weights.
struct SDXLModels {
  lt::models::sd::UNet2DConditionModel unet{nullptr};
  lt::models::CLIPTextModel te1{nullptr};
  lt::models::CLIPTextModelWithProjection te2{nullptr};
  LoRANetwork net{nullptr};
  std::vector<ComponentSpec> specs;

  // "<component>.<weight>" -> shape, and the base weight.
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, at::Tensor> weights;
};

SDXLModels make_models(const NetworkConfig& cfg) {
  SDXLModels m;
  torch::manual_seed(31);
  m.unet = lt::models::sd::UNet2DConditionModel(sdxl_small());
  m.te1 = lt::models::CLIPTextModel(clip_config(16, 2));
  m.te2 = lt::models::CLIPTextModelWithProjection(clip_config(32, 3));
  m.net = LoRANetwork(cfg);
  m.specs = {ComponentSpec::text_encoder(1), ComponentSpec::text_encoder(2), ComponentSpec::sdxl_unet(m.unet->config)};
  m.net->add_component(m.specs[0], *m.te1);
  m.net->add_component(m.specs[1], *m.te2);
  m.net->add_component(m.specs[2], *m.unet);
  randomize_up(m.net, 32);
  for (const auto& [component, module] : std::vector<std::pair<std::string, torch::nn::Module*>>{
           {"unet", m.unet.get()}, {"text_encoder", m.te1.get()}, {"text_encoder_2", m.te2.get()}}) {
    for (const auto& p : module->named_parameters()) {
      m.shapes[component + "." + p.key()] = p.value().sizes().vec();
      m.weights[component + "." + p.key()] = p.value().detach();
    }
  }
  return m;
}

// Every module of the network merged by a loader's deltas equals the training-time merge.
void check_merges(const SDXLModels& m, const std::map<std::string, at::Tensor>& deltas) {
  const auto ours = m.net->merged_weights(1.0);
  CATCH_CHECK(deltas.size() == ours.size());
  for (const auto& [peft_name, merged] : ours) {
    CATCH_INFO(peft_name);
    auto it = deltas.find(peft_name + ".weight");
    CATCH_REQUIRE(it != deltas.end());
    const at::Tensor loader = m.weights.at(peft_name + ".weight") + it->second;
    CATCH_CHECK(torch::allclose(loader, merged, 1e-5, 1e-6));
  }
}

}  // namespace

CATCH_TEST_CASE("SDXL UNet: kohya's 722 targets named by the SGM/LDM module paths", "[lora][naming][sdxl]") {
  lt::models::sd::UNet2DConditionModel unet(sdxl_topology());
  LoRANetwork net(NetworkConfig{});
  CATCH_CHECK(net->add_component(ComponentSpec::sdxl_unet(unet->config), *unet) == 722);
  CATCH_CHECK(names_of(net) == kohya_sdxl_unet_names(2, 10));
  for (const auto& m : net->modules()) {
    if (m->lora_name == "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q") {
      CATCH_CHECK(m->peft_name == "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q");
    }
    if (m->lora_name == "lora_unet_middle_block_1_transformer_blocks_9_ff_net_2") {
      CATCH_CHECK(m->peft_name == "unet.mid_block.attentions.0.transformer_blocks.9.ff.net.2");
    }
    if (m->lora_name == "lora_unet_output_blocks_5_1_proj_out") {
      CATCH_CHECK(m->peft_name == "unet.up_blocks.1.attentions.2.proj_out");
      CATCH_CHECK_FALSE(m->is_conv());  // SDXL's projections are Linear
    }
  }
  // The text encoders: CLIP ViT-L (12 layers) and OpenCLIP ViT-bigG (32 layers) at narrow widths.
  lt::models::CLIPTextModel te1(clip_config(16, 12));
  lt::models::CLIPTextModelWithProjection te2(clip_config(32, 32));
  NetworkConfig tec;
  tec.train_text_encoder = true;
  LoRANetwork text(tec);
  CATCH_CHECK(text->add_component(ComponentSpec::text_encoder(1), *te1) == 72);
  CATCH_CHECK(text->add_component(ComponentSpec::text_encoder(2), *te2) == 192);  // text_projection is not a target
  const auto names = names_of(text);
  CATCH_CHECK(names.count("lora_te1_text_model_encoder_layers_11_mlp_fc2") == 1);
  CATCH_CHECK(names.count("lora_te2_text_model_encoder_layers_31_self_attn_out_proj") == 1);
  for (const auto& m : text->modules()) {
    if (m->lora_name == "lora_te2_text_model_encoder_layers_0_self_attn_q_proj")
      CATCH_CHECK(m->peft_name == "text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj");
    if (m->lora_name == "lora_te1_text_model_encoder_layers_0_self_attn_q_proj")
      CATCH_CHECK(m->peft_name == "text_encoder.text_model.encoder.layers.0.self_attn.q_proj");
  }
}

CATCH_TEST_CASE("SDXL UNet with conv rank: kohya's LoCon names on the SGM resnets and samplers", "[lora][naming][sdxl]") {
  lt::models::sd::UNet2DConditionModel unet(sdxl_topology());
  NetworkConfig cfg;
  cfg.conv = 4;
  LoRANetwork net(cfg);
  // 722 + 17 resnets x (conv1, conv2, time_emb_proj) + 11 skip connections + 2 down- and 2 upsamplers.
  CATCH_CHECK(net->add_component(ComponentSpec::sdxl_unet(unet->config), *unet) == 722 + 51 + 11 + 4);
  const auto names = names_of(net);
  for (const char* n : {"lora_unet_input_blocks_1_0_in_layers_2", "lora_unet_input_blocks_1_0_emb_layers_1",
                        "lora_unet_input_blocks_2_0_out_layers_3", "lora_unet_input_blocks_4_0_skip_connection",
                        "lora_unet_input_blocks_3_0_op", "lora_unet_input_blocks_6_0_op",
                        "lora_unet_middle_block_0_in_layers_2", "lora_unet_middle_block_2_emb_layers_1",
                        "lora_unet_output_blocks_2_2_conv", "lora_unet_output_blocks_5_2_conv",
                        "lora_unet_output_blocks_8_0_skip_connection"}) {
    CATCH_INFO(n);
    CATCH_CHECK(names.count(n) == 1);
  }
  for (const auto& n : names) {
    CATCH_INFO(n);
    CATCH_CHECK((n.rfind("lora_unet_input_blocks_", 0) == 0 || n.rfind("lora_unet_middle_block_", 0) == 0 ||
                 n.rfind("lora_unet_output_blocks_", 0) == 0));
  }
}

CATCH_TEST_CASE("SDXL kohya file: every key loads under ComfyUI's and diffusers' rules with the trained effect",
                "[lora][interop][sdxl]") {
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.linear_alpha = 2.0;
  cfg.conv = 2;
  cfg.conv_alpha = 1.0;  // a second alpha: diffusers must take it from the file per module
  cfg.train_text_encoder = true;
  SDXLModels m = make_models(cfg);
  const auto dir = lt::test::scratch_dir("lora_sdxl_kohya");
  SaveOptions opts;
  opts.dtype = torch::kFloat;
  opts.metadata = kohya_base_model_metadata("sdxl");
  m.net->save(dir / "sdxl.safetensors", opts);
  auto file = lt::io::SafetensorsFile::open(dir / "sdxl.safetensors");
  CATCH_CHECK(file->metadata().at("ss_base_model_version") == "sdxl_base_v1-0");
  CATCH_CHECK(file->metadata().at("modelspec.architecture") == "stable-diffusion-xl-v1-base/lora");
  CATCH_CHECK(file->metadata().count("lora_adapter_metadata") == 0);  // diffusers refuses alphas + metadata together
  const StateDict lora = read_all(*file);
  for (const auto& t : file->tensors()) {
    const std::string& k = t.name;
    const bool prefix = k.rfind("lora_unet_", 0) == 0 || k.rfind("lora_te1_", 0) == 0 || k.rfind("lora_te2_", 0) == 0;
    CATCH_CHECK(prefix);  // diffusers' kohya detection: every key has one of these prefixes
  }

  // ComfyUI: the LDM names come from its own numbering of the SDXL UNet (reference_unet_map.h).
  std::map<std::string, std::string> ldm_to_diffusers;
  for (const auto& [d, ldm] : lt::test::reference_unet_to_ldm(lt::test::reference_sdxl_layout(0, 1, 2))) ldm_to_diffusers[ldm] = d;
  std::set<std::string> comfy_left;
  const auto patches = comfyui_load(lora, ldm_to_diffusers, 2, 3, comfy_left, m.shapes);
  CATCH_CHECK(comfy_left.empty());  // no "lora key not loaded"
  std::map<std::string, at::Tensor> comfy_deltas;
  for (const auto& p : patches) comfy_deltas[p.component + "." + p.weight] = p.delta;
  check_merges(m, comfy_deltas);

  // diffusers.
  std::set<std::string> diffusers_left;
  const auto components = diffusers_load_kohya(lora, 2, diffusers_left);
  CATCH_CHECK(diffusers_left.empty());  // "The following keys have not been correctly renamed" otherwise
  std::map<std::string, at::Tensor> diffusers_deltas;
  for (const auto& [component, modules] : components) {
    for (const auto& [module, p] : modules) {
      const std::string weight = component + "." + module + ".weight";
      CATCH_INFO(weight);
      CATCH_REQUIRE(m.shapes.count(weight) == 1);  // PEFT finds the target module
      diffusers_deltas[weight] = delta_of(p.b, p.a, p.scale, m.shapes.at(weight));
    }
  }
  check_merges(m, diffusers_deltas);
}

CATCH_TEST_CASE("SDXL PEFT file: diffusers' prefixes and folded scales give the trained effect", "[lora][interop][sdxl][peft]") {
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.linear_alpha = 1.0;
  cfg.conv = 2;
  cfg.train_text_encoder = true;
  SDXLModels m = make_models(cfg);
  const auto dir = lt::test::scratch_dir("lora_sdxl_peft");
  SaveOptions opts;
  opts.format = LoRAFormat::PEFT;
  opts.dtype = torch::kFloat;
  m.net->save(dir / "pytorch_lora_weights.safetensors", opts);
  auto file = lt::io::SafetensorsFile::open(dir / "pytorch_lora_weights.safetensors");
  CATCH_CHECK(file->contains("unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight"));
  CATCH_CHECK(file->contains("text_encoder_2.text_model.encoder.layers.2.mlp.fc2.lora_B.weight"));
  CATCH_CHECK(file->contains("text_encoder.text_model.encoder.layers.1.self_attn.out_proj.lora_A.weight"));
  std::map<std::string, at::Tensor> deltas;
  size_t keys = 0;
  for (const auto& [component, modules] : diffusers_load_peft(*file)) {
    for (const auto& [module, p] : modules) {
      const std::string weight = component + "." + module + ".weight";
      CATCH_INFO(weight);
      CATCH_REQUIRE(m.shapes.count(weight) == 1);
      deltas[weight] = delta_of(p.b, p.a, p.scale, m.shapes.at(weight));
      keys += 2;
    }
  }
  CATCH_CHECK(keys == file->tensors().size());
  check_merges(m, deltas);

  // Read back by kohya name (the SGM names) through module_dims_from_file: the same modules.
  auto dims = module_dims_from_file(*file, m.specs);
  std::set<std::string> dim_names;
  for (const auto& [k, v] : dims) dim_names.insert(k);
  CATCH_CHECK(dim_names == names_of(m.net));
}

CATCH_TEST_CASE("kohya base-model metadata per family", "[lora][metadata]") {
  CATCH_CHECK(kohya_base_model_metadata("sdxl").at("ss_base_model_version") == "sdxl_base_v1-0");
  CATCH_CHECK(kohya_base_model_metadata("sdxl").at("ss_v2") == "False");
  CATCH_CHECK(kohya_base_model_metadata("sdxl").at("modelspec.implementation") == "https://github.com/Stability-AI/generative-models");
  CATCH_CHECK(kohya_base_model_metadata("sd1").at("ss_base_model_version") == "sd_v1");
  CATCH_CHECK(kohya_base_model_metadata("sd2", true).at("ss_base_model_version") == "sd_v2_v");
  CATCH_CHECK(kohya_base_model_metadata("sd2").at("ss_v2") == "True");
  CATCH_CHECK(kohya_base_model_metadata("flux").at("ss_base_model_version") == "flux1");
  CATCH_CHECK(kohya_base_model_metadata("flux").at("modelspec.architecture") == "flux-1-dev/lora");
  CATCH_CHECK(kohya_base_model_metadata("flux_schnell").at("modelspec.architecture") == "flux-1-schnell/lora");
  CATCH_CHECK_THROWS_AS(kohya_base_model_metadata("wan"), lt::InputError);
}
