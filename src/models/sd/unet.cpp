#include "loratrain/models/sd/unet.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "loratrain/models/json_fields.h"
#include "loratrain/util/error.h"

namespace lt::models::sd {

// ---------------------------------------------------------------------------------------------
// UNetConfig

namespace {

[[noreturn]] void unet_config_error(const std::string& message) { throw InputError("UNet config: " + message); }

template <typename T>
T unet_get_or(const nlohmann::json& j, const char* key, T fallback) {
  return json_get_or(j, key, fallback, "UNet");
}

// A value given either once for all blocks or as one per down block (diffusers expands ints).
template <typename T>
std::vector<T> per_block(const nlohmann::json& j, const char* key, size_t n, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::vector<T>(n, fallback);
  try {
    if (it->is_array()) {
      auto v = it->get<std::vector<T>>();
      if (v.size() != n) {
        unet_config_error(std::string("'") + key + "' has " + std::to_string(v.size()) + " entries, expected one per block (" +
                     std::to_string(n) + ")");
      }
      return v;
    }
    return std::vector<T>(n, it->get<T>());
  } catch (const nlohmann::json::exception&) {
    unet_config_error(std::string("'") + key + "' has the wrong type (" + it->dump() + ")");
  }
}

// Config keys of UNet2DConditionModel for features outside SD1.x/2.x/XL: they must keep their
// default (null unless stated) or the model would silently compute something else.
void reject_unsupported(const nlohmann::json& j) {
  const std::vector<std::pair<const char*, nlohmann::json>> defaults = {
      {"num_attention_heads", nullptr},
      {"class_embed_type", nullptr},
      {"num_class_embeds", nullptr},
      {"encoder_hid_dim", nullptr},
      {"encoder_hid_dim_type", nullptr},
      {"time_embedding_type", "positional"},
      {"time_embedding_dim", nullptr},
      {"time_embedding_act_fn", nullptr},
      {"timestep_post_act", nullptr},
      {"time_cond_proj_dim", nullptr},
      {"resnet_time_scale_shift", "default"},
      {"attention_type", "default"},
      {"dual_cross_attention", false},
      {"class_embeddings_concat", false},
      {"cross_attention_norm", nullptr},
      {"reverse_transformer_layers_per_block", nullptr},
      {"mid_block_only_cross_attention", nullptr},
  };
  for (const auto& [key, expected] : defaults) {
    auto it = j.find(key);
    if (it == j.end() || *it == expected) continue;
    // Accept null for keys whose default is a value (older configs write null).
    if (it->is_null()) continue;
    unet_config_error(std::string("'") + key + "' = " + it->dump() + " is not supported (only " + expected.dump() +
                 "); this UNet implements the SD1.x/SD2.x/SDXL configuration space");
  }
}

void validate(const UNetConfig& c) {
  const size_t n = c.down_block_types.size();
  if (n == 0) unet_config_error("'down_block_types' is empty");
  if (c.block_out_channels.size() != n) unet_config_error("'block_out_channels' must have one entry per down block");
  if (c.up_block_types.size() != n) unet_config_error("'up_block_types' must have as many entries as 'down_block_types'");
  for (const auto& t : c.down_block_types) {
    if (t != "CrossAttnDownBlock2D" && t != "DownBlock2D") unet_config_error("unsupported down block type '" + t + "'");
  }
  for (const auto& t : c.up_block_types) {
    if (t != "CrossAttnUpBlock2D" && t != "UpBlock2D") unet_config_error("unsupported up block type '" + t + "'");
  }
  if (!c.mid_block_type.empty() && c.mid_block_type != "UNetMidBlock2DCrossAttn") {
    unet_config_error("unsupported mid block type '" + c.mid_block_type + "'");
  }
  if (c.addition_embed_type && *c.addition_embed_type != "text_time") {
    unet_config_error("'addition_embed_type' = '" + *c.addition_embed_type + "' is not supported (only text_time)");
  }
  if (c.addition_embed_type && (!c.addition_time_embed_dim || !c.projection_class_embeddings_input_dim)) {
    unet_config_error("addition_embed_type text_time needs addition_time_embed_dim and projection_class_embeddings_input_dim");
  }
  if (!is_known_activation(c.act_fn)) unet_config_error("unsupported act_fn '" + c.act_fn + "'");
  for (size_t i = 0; i < n; ++i) {
    const int64_t ch = c.block_out_channels[i];
    if (ch % c.norm_num_groups != 0) {
      unet_config_error("block_out_channels[" + std::to_string(i) + "] = " + std::to_string(ch) +
                   " is not divisible by norm_num_groups = " + std::to_string(c.norm_num_groups));
    }
    if (c.attention_head_dim[i] <= 0 || ch % c.attention_head_dim[i] != 0) {
      unet_config_error("block_out_channels[" + std::to_string(i) + "] = " + std::to_string(ch) +
                   " is not divisible by the head count attention_head_dim[" + std::to_string(i) +
                   "] = " + std::to_string(c.attention_head_dim[i]));
    }
  }
}

}  // namespace

UNetConfig UNetConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) unet_config_error("expected a JSON object");
  if (auto it = j.find("_class_name"); it != j.end() && it->is_string() && *it != "UNet2DConditionModel") {
    unet_config_error("_class_name is '" + it->get<std::string>() + "', expected UNet2DConditionModel");
  }
  reject_unsupported(j);
  UNetConfig c;
  c.in_channels = unet_get_or<int64_t>(j, "in_channels", 4);
  c.out_channels = unet_get_or<int64_t>(j, "out_channels", 4);
  c.center_input_sample = unet_get_or<bool>(j, "center_input_sample", false);
  c.flip_sin_to_cos = unet_get_or<bool>(j, "flip_sin_to_cos", true);
  c.freq_shift = unet_get_or<double>(j, "freq_shift", 0);
  const UNetConfig d = sd15();
  c.down_block_types = unet_get_or<std::vector<std::string>>(j, "down_block_types", d.down_block_types);
  c.up_block_types = unet_get_or<std::vector<std::string>>(j, "up_block_types", d.up_block_types);
  {
    auto it = j.find("mid_block_type");
    c.mid_block_type = it == j.end() ? "UNetMidBlock2DCrossAttn" : (it->is_null() ? "" : it->get<std::string>());
  }
  const size_t n = c.down_block_types.size();
  c.block_out_channels = unet_get_or<std::vector<int64_t>>(j, "block_out_channels", d.block_out_channels);
  c.only_cross_attention = per_block<bool>(j, "only_cross_attention", n, false);
  c.layers_per_block = per_block<int64_t>(j, "layers_per_block", n, 2);
  c.downsample_padding = unet_get_or<int64_t>(j, "downsample_padding", 1);
  c.mid_block_scale_factor = unet_get_or<double>(j, "mid_block_scale_factor", 1.0);
  c.dropout = unet_get_or<double>(j, "dropout", 0.0);
  c.act_fn = unet_get_or<std::string>(j, "act_fn", "silu");
  c.norm_num_groups = unet_get_or<int64_t>(j, "norm_num_groups", 32);
  c.norm_eps = unet_get_or<double>(j, "norm_eps", 1e-5);
  c.cross_attention_dim = per_block<int64_t>(j, "cross_attention_dim", n, 1280);
  c.transformer_layers_per_block = per_block<int64_t>(j, "transformer_layers_per_block", n, 1);
  c.attention_head_dim = per_block<int64_t>(j, "attention_head_dim", n, 8);
  c.use_linear_projection = unet_get_or<bool>(j, "use_linear_projection", false);
  c.upcast_attention = unet_get_or<bool>(j, "upcast_attention", false);
  c.resnet_out_scale_factor = unet_get_or<double>(j, "resnet_out_scale_factor", 1.0);
  c.resnet_skip_time_act = unet_get_or<bool>(j, "resnet_skip_time_act", false);
  c.conv_in_kernel = unet_get_or<int64_t>(j, "conv_in_kernel", 3);
  c.conv_out_kernel = unet_get_or<int64_t>(j, "conv_out_kernel", 3);
  if (auto it = j.find("addition_embed_type"); it != j.end() && !it->is_null()) c.addition_embed_type = it->get<std::string>();
  if (auto it = j.find("addition_time_embed_dim"); it != j.end() && !it->is_null()) c.addition_time_embed_dim = it->get<int64_t>();
  if (auto it = j.find("projection_class_embeddings_input_dim"); it != j.end() && !it->is_null()) {
    c.projection_class_embeddings_input_dim = it->get<int64_t>();
  }
  if (auto it = j.find("sample_size"); it != j.end() && it->is_number_integer()) c.sample_size = it->get<int64_t>();
  validate(c);
  return c;
}

UNetConfig UNetConfig::sd15() {
  UNetConfig c;
  c.down_block_types = {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"};
  c.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"};
  c.block_out_channels = {320, 640, 1280, 1280};
  c.only_cross_attention = std::vector<bool>(4, false);
  c.layers_per_block = std::vector<int64_t>(4, 2);
  c.cross_attention_dim = std::vector<int64_t>(4, 768);
  c.transformer_layers_per_block = std::vector<int64_t>(4, 1);
  c.attention_head_dim = std::vector<int64_t>(4, 8);
  c.sample_size = 64;
  return c;
}

UNetConfig UNetConfig::sdxl() {
  UNetConfig c;
  c.down_block_types = {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"};
  c.up_block_types = {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"};
  c.block_out_channels = {320, 640, 1280};
  c.only_cross_attention = std::vector<bool>(3, false);
  c.layers_per_block = std::vector<int64_t>(3, 2);
  c.cross_attention_dim = std::vector<int64_t>(3, 2048);
  c.transformer_layers_per_block = {1, 2, 10};
  c.attention_head_dim = {5, 10, 20};
  c.use_linear_projection = true;
  c.addition_embed_type = "text_time";
  c.addition_time_embed_dim = 256;
  c.projection_class_embeddings_input_dim = 2816;
  c.sample_size = 128;
  return c;
}

nlohmann::json UNetConfig::to_json() const {
  nlohmann::json j;
  j["_class_name"] = "UNet2DConditionModel";
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels;
  j["center_input_sample"] = center_input_sample;
  j["flip_sin_to_cos"] = flip_sin_to_cos;
  j["freq_shift"] = freq_shift;
  j["down_block_types"] = down_block_types;
  j["mid_block_type"] = mid_block_type.empty() ? nlohmann::json(nullptr) : nlohmann::json(mid_block_type);
  j["up_block_types"] = up_block_types;
  j["only_cross_attention"] = only_cross_attention;
  j["block_out_channels"] = block_out_channels;
  j["layers_per_block"] = layers_per_block;
  j["downsample_padding"] = downsample_padding;
  j["mid_block_scale_factor"] = mid_block_scale_factor;
  j["dropout"] = dropout;
  j["act_fn"] = act_fn;
  j["norm_num_groups"] = norm_num_groups;
  j["norm_eps"] = norm_eps;
  j["cross_attention_dim"] = cross_attention_dim;
  j["transformer_layers_per_block"] = transformer_layers_per_block;
  j["attention_head_dim"] = attention_head_dim;
  j["use_linear_projection"] = use_linear_projection;
  j["upcast_attention"] = upcast_attention;
  j["resnet_out_scale_factor"] = resnet_out_scale_factor;
  j["resnet_skip_time_act"] = resnet_skip_time_act;
  j["conv_in_kernel"] = conv_in_kernel;
  j["conv_out_kernel"] = conv_out_kernel;
  j["addition_embed_type"] = addition_embed_type ? nlohmann::json(*addition_embed_type) : nlohmann::json(nullptr);
  j["addition_time_embed_dim"] = addition_time_embed_dim ? nlohmann::json(*addition_time_embed_dim) : nlohmann::json(nullptr);
  j["projection_class_embeddings_input_dim"] =
      projection_class_embeddings_input_dim ? nlohmann::json(*projection_class_embeddings_input_dim) : nlohmann::json(nullptr);
  j["sample_size"] = sample_size ? nlohmann::json(*sample_size) : nlohmann::json(nullptr);
  return j;
}

namespace {

// Shapes of the tensors under `prefix`, keyed by the rest of the name.
std::map<std::string, std::vector<int64_t>> shapes_under(const io::SafetensorsFile& file, const std::string& prefix) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& t : file.tensors()) {
    if (t.name.rfind(prefix, 0) == 0) out[t.name.substr(prefix.size())] = t.shape;
  }
  return out;
}

int64_t count_indices(const std::map<std::string, std::vector<int64_t>>& shapes, const std::string& stem) {
  int64_t n = 0;
  while (true) {
    const std::string p = stem + std::to_string(n) + ".";
    auto it = shapes.lower_bound(p);
    if (it == shapes.end() || it->first.rfind(p, 0) != 0) return n;
    ++n;
  }
}

bool has_prefix(const std::map<std::string, std::vector<int64_t>>& shapes, const std::string& p) {
  auto it = shapes.lower_bound(p);
  return it != shapes.end() && it->first.rfind(p, 0) == 0;
}

// Heads are not stored in a checkpoint: SD1 (768-wide text) uses 8 heads, later ones 64-wide heads.
int64_t conventional_heads(int64_t channels, int64_t cross_attention_dim) {
  if (cross_attention_dim == 768 || channels % 64 != 0) return 8;
  return channels / 64;
}

}  // namespace

int64_t conventional_groups(const std::vector<int64_t>& channels) {
  int64_t groups = 32;
  auto divides_all = [&](int64_t g) {
    return std::all_of(channels.begin(), channels.end(), [g](int64_t c) { return c % g == 0; });
  };
  while (groups > 1 && !divides_all(groups)) groups /= 2;
  return groups;
}

UNetConfig UNetConfig::detect_from_weights(const io::SafetensorsFile& file, const std::string& prefix) {
  const auto s = shapes_under(file, prefix);
  auto shape = [&](const std::string& key) -> const std::vector<int64_t>& {
    auto it = s.find(key);
    if (it == s.end()) {
      throw InputError(file.path().string() + ": cannot detect the UNet config: tensor '" + prefix + key + "' is missing");
    }
    return it->second;
  };
  UNetConfig c;
  c.sample_size.reset();
  const bool ldm = s.count("input_blocks.0.0.weight") != 0;
  if (!ldm && !s.count("conv_in.weight")) {
    throw InputError(file.path().string() + ": no UNet found under '" + prefix +
                     "' (neither conv_in.weight nor input_blocks.0.0.weight)");
  }
  std::vector<int64_t> attention_blocks;  // per level: transformer blocks (0 = no attention)
  int64_t cross_dim = 0;
  bool linear_proj = false;
  if (!ldm) {
    const int64_t n = count_indices(s, "down_blocks.");
    for (int64_t i = 0; i < n; ++i) {
      const std::string b = "down_blocks." + std::to_string(i) + ".";
      c.block_out_channels.push_back(shape(b + "resnets.0.conv1.weight")[0]);
      c.layers_per_block.push_back(count_indices(s, b + "resnets."));
      const bool attn = has_prefix(s, b + "attentions.0.");
      attention_blocks.push_back(attn ? count_indices(s, b + "attentions.0.transformer_blocks.") : 0);
      if (attn) {
        cross_dim = shape(b + "attentions.0.transformer_blocks.0.attn2.to_k.weight")[1];
        linear_proj = shape(b + "attentions.0.proj_in.weight").size() == 2;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      c.up_block_types.push_back(has_prefix(s, "up_blocks." + std::to_string(i) + ".attentions.0.") ? "CrossAttnUpBlock2D"
                                                                                                     : "UpBlock2D");
    }
    if (!has_prefix(s, "mid_block.")) c.mid_block_type.clear();
    if (s.count("add_embedding.linear_1.weight")) {
      c.addition_embed_type = "text_time";
      c.projection_class_embeddings_input_dim = shape("add_embedding.linear_1.weight")[1];
    }
  } else {
    // LDM numbering: input_blocks.0 = conv_in, then per level `layers` resnets (each optionally
    // followed by a SpatialTransformer at index .1) and a downsampler (.0.op) except at the end.
    int64_t k = 1, level_layers = 0;
    bool level_attn = false;
    int64_t level_tblocks = 0;
    auto close_level = [&](int64_t channels) {
      c.block_out_channels.push_back(channels);
      c.layers_per_block.push_back(level_layers);
      attention_blocks.push_back(level_attn ? level_tblocks : 0);
      level_layers = 0;
      level_attn = false;
    };
    int64_t last_channels = 0;
    while (has_prefix(s, "input_blocks." + std::to_string(k) + ".")) {
      const std::string b = "input_blocks." + std::to_string(k) + ".";
      if (s.count(b + "0.op.weight")) {
        close_level(last_channels);
      } else {
        last_channels = shape(b + "0.out_layers.3.weight")[0];
        ++level_layers;
        if (has_prefix(s, b + "1.")) {
          level_attn = true;
          level_tblocks = count_indices(s, b + "1.transformer_blocks.");
          cross_dim = shape(b + "1.transformer_blocks.0.attn2.to_k.weight")[1];
          linear_proj = shape(b + "1.proj_in.weight").size() == 2;
        }
      }
      ++k;
    }
    if (level_layers > 0) close_level(last_channels);
    const size_t n = c.block_out_channels.size();
    int64_t out_index = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t layers = c.layers_per_block[n - 1 - i] + 1;
      c.up_block_types.push_back(s.count("output_blocks." + std::to_string(out_index) + ".1.proj_in.weight")
                                     ? "CrossAttnUpBlock2D"
                                     : "UpBlock2D");
      out_index += layers;
    }
    if (!has_prefix(s, "middle_block.")) c.mid_block_type.clear();
    if (s.count("label_emb.0.0.weight")) {
      c.addition_embed_type = "text_time";
      c.projection_class_embeddings_input_dim = shape("label_emb.0.0.weight")[1];
    }
  }
  const size_t n = c.block_out_channels.size();
  if (n == 0) throw InputError(file.path().string() + ": cannot detect the UNet config: no down blocks");
  for (size_t i = 0; i < n; ++i) {
    c.down_block_types.push_back(attention_blocks[i] > 0 ? "CrossAttnDownBlock2D" : "DownBlock2D");
  }
  const std::string conv_in = ldm ? "input_blocks.0.0.weight" : "conv_in.weight";
  const std::string conv_out = ldm ? "out.2.weight" : "conv_out.weight";
  c.in_channels = shape(conv_in)[1];
  c.conv_in_kernel = shape(conv_in)[2];
  c.out_channels = shape(conv_out)[0];
  c.conv_out_kernel = shape(conv_out)[2];
  if (cross_dim == 0) cross_dim = 768;
  c.cross_attention_dim = std::vector<int64_t>(n, cross_dim);
  c.use_linear_projection = linear_proj;
  c.only_cross_attention = std::vector<bool>(n, false);
  c.transformer_layers_per_block.clear();
  for (size_t i = 0; i < n; ++i) {
    c.transformer_layers_per_block.push_back(attention_blocks[i] > 0 ? attention_blocks[i] : 1);
  }
  c.attention_head_dim.clear();
  for (size_t i = 0; i < n; ++i) c.attention_head_dim.push_back(conventional_heads(c.block_out_channels[i], cross_dim));
  if (c.addition_embed_type) c.addition_time_embed_dim = 256;
  c.norm_num_groups = conventional_groups(c.block_out_channels);
  validate(c);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Embeddings

at::Tensor timestep_embedding(const at::Tensor& timesteps, int64_t dim, bool flip_sin_to_cos,
                              double downscale_freq_shift) {
  TORCH_CHECK(timesteps.dim() == 1, "timesteps must be 1-D, got ", timesteps.sizes());
  const int64_t half = dim / 2;
  at::Tensor exponent = torch::arange(0, half, timesteps.options().dtype(torch::kFloat)) * (-std::log(10000.0));
  exponent = exponent / (static_cast<double>(half) - downscale_freq_shift);
  at::Tensor freqs = torch::exp(exponent);                                 // [half]
  at::Tensor args = timesteps.unsqueeze(1).to(torch::kFloat) * freqs.unsqueeze(0);  // [N, half]
  at::Tensor emb = flip_sin_to_cos ? torch::cat({torch::cos(args), torch::sin(args)}, -1)
                                   : torch::cat({torch::sin(args), torch::cos(args)}, -1);
  if (dim % 2 == 1) emb = torch::nn::functional::pad(emb, torch::nn::functional::PadFuncOptions({0, 1, 0, 0}));
  return emb;  // [N, dim]
}

TimestepEmbeddingImpl::TimestepEmbeddingImpl(int64_t in, int64_t time_embed_dim, std::string act)
    : act_fn(std::move(act)) {
  linear_1 = register_module("linear_1", Linear(in, time_embed_dim));
  linear_2 = register_module("linear_2", Linear(time_embed_dim, time_embed_dim));
}

at::Tensor TimestepEmbeddingImpl::forward(const at::Tensor& x) {
  return linear_2(activation(act_fn, linear_1(x)));
}

// ---------------------------------------------------------------------------------------------
// Blocks

namespace {

ResnetBlock2D make_resnet(const UNetConfig& c, int64_t in, int64_t out, double output_scale_factor) {
  ResnetBlock2DOptions o;
  o.in_channels = in;
  o.out_channels = out;
  o.temb_channels = c.block_out_channels[0] * 4;
  o.groups = c.norm_num_groups;
  o.eps = c.norm_eps;
  o.dropout = c.dropout;
  o.act_fn = c.act_fn;
  o.output_scale_factor = output_scale_factor;
  o.skip_time_act = c.resnet_skip_time_act;
  return ResnetBlock2D(o);
}

Transformer2DModel make_transformer(const UNetConfig& c, int64_t channels, int64_t heads, int64_t layers,
                                    int64_t cross_dim, bool only_cross) {
  Transformer2DModelOptions o;
  o.num_attention_heads = heads;
  o.attention_head_dim = channels / heads;
  o.in_channels = channels;
  o.num_layers = layers;
  o.cross_attention_dim = cross_dim;
  o.norm_num_groups = c.norm_num_groups;
  o.use_linear_projection = c.use_linear_projection;
  o.only_cross_attention = only_cross;
  o.upcast_attention = c.upcast_attention;
  o.dropout = c.dropout;
  return Transformer2DModel(o);
}

}  // namespace

UNetDownBlockImpl::UNetDownBlockImpl(const UNetConfig& c, size_t i) : has_cross_attention(c.down_has_attention(i)) {
  const int64_t out = c.block_out_channels[i];
  const int64_t in = i == 0 ? c.block_out_channels[0] : c.block_out_channels[i - 1];
  resnets = register_module("resnets", torch::nn::ModuleList());
  if (has_cross_attention) attentions = register_module("attentions", torch::nn::ModuleList());
  for (int64_t l = 0; l < c.layers_per_block[i]; ++l) {
    resnets->push_back(make_resnet(c, l == 0 ? in : out, out, c.resnet_out_scale_factor));
    if (has_cross_attention) {
      attentions->push_back(make_transformer(c, out, c.attention_head_dim[i], c.transformer_layers_per_block[i],
                                             c.cross_attention_dim[i], c.only_cross_attention[i]));
    }
  }
  if (i + 1 < c.num_blocks()) {
    downsamplers = register_module("downsamplers", torch::nn::ModuleList(Downsample2D(out, out, c.downsample_padding)));
  }
}

at::Tensor UNetDownBlockImpl::forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& context,
                                      std::vector<at::Tensor>& skips) {
  at::Tensor h = x;
  for (size_t l = 0; l < resnets->size(); ++l) {
    h = resnets[l]->as<ResnetBlock2DImpl>()->forward(h, temb);
    if (has_cross_attention) h = attentions[l]->as<Transformer2DModelImpl>()->forward(h, context);
    skips.push_back(h);
  }
  if (downsamplers) {
    h = downsamplers[0]->as<Downsample2DImpl>()->forward(h);
    skips.push_back(h);
  }
  return h;
}

UNetMidBlock2DCrossAttnImpl::UNetMidBlock2DCrossAttnImpl(const UNetConfig& c) {
  const int64_t ch = c.block_out_channels.back();
  resnets = register_module("resnets", torch::nn::ModuleList());
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets->push_back(make_resnet(c, ch, ch, c.mid_block_scale_factor));
  attentions->push_back(make_transformer(c, ch, c.attention_head_dim.back(), c.transformer_layers_per_block.back(),
                                         c.cross_attention_dim.back(), false));
  resnets->push_back(make_resnet(c, ch, ch, c.mid_block_scale_factor));
}

at::Tensor UNetMidBlock2DCrossAttnImpl::forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& context) {
  at::Tensor h = resnets[0]->as<ResnetBlock2DImpl>()->forward(x, temb);
  for (size_t l = 0; l < attentions->size(); ++l) {
    h = attentions[l]->as<Transformer2DModelImpl>()->forward(h, context);
    h = resnets[l + 1]->as<ResnetBlock2DImpl>()->forward(h, temb);
  }
  return h;
}

UNetUpBlockImpl::UNetUpBlockImpl(const UNetConfig& c, size_t i) : has_cross_attention(c.up_has_attention(i)) {
  const size_t n = c.num_blocks();
  auto rev = [&](const auto& v, size_t k) { return v[n - 1 - k]; };
  const int64_t out = rev(c.block_out_channels, i);
  const int64_t prev = rev(c.block_out_channels, i == 0 ? 0 : i - 1);
  const int64_t in = rev(c.block_out_channels, std::min(i + 1, n - 1));
  const int64_t layers = rev(c.layers_per_block, i) + 1;
  resnets = register_module("resnets", torch::nn::ModuleList());
  if (has_cross_attention) attentions = register_module("attentions", torch::nn::ModuleList());
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t skip = l == layers - 1 ? in : out;
    const int64_t res_in = l == 0 ? prev : out;
    resnets->push_back(make_resnet(c, res_in + skip, out, c.resnet_out_scale_factor));
    if (has_cross_attention) {
      attentions->push_back(make_transformer(c, out, rev(c.attention_head_dim, i), rev(c.transformer_layers_per_block, i),
                                             rev(c.cross_attention_dim, i), rev(c.only_cross_attention, i)));
    }
  }
  if (i + 1 < n) upsamplers = register_module("upsamplers", torch::nn::ModuleList(Upsample2D(out, out)));
}

at::Tensor UNetUpBlockImpl::forward(const at::Tensor& x, const at::Tensor& temb, const at::Tensor& context,
                                    std::vector<at::Tensor>& skips, std::optional<std::vector<int64_t>> upsample_size) {
  at::Tensor h = x;
  for (size_t l = 0; l < resnets->size(); ++l) {
    TORCH_CHECK(!skips.empty(), "UNet up block: no skip connection left");
    h = torch::cat({h, skips.back()}, 1);  // [B, C + C_skip, H, W]
    skips.pop_back();
    h = resnets[l]->as<ResnetBlock2DImpl>()->forward(h, temb);
    if (has_cross_attention) h = attentions[l]->as<Transformer2DModelImpl>()->forward(h, context);
  }
  if (upsamplers) h = upsamplers[0]->as<Upsample2DImpl>()->forward(h, upsample_size);
  return h;
}

// ---------------------------------------------------------------------------------------------
// UNet2DConditionModel

UNet2DConditionModelImpl::UNet2DConditionModelImpl(const UNetConfig& c) : config(c) {
  validate(config);
  const int64_t ch0 = config.block_out_channels[0];
  const int64_t time_embed_dim = ch0 * 4;
  conv_in = register_module("conv_in", Conv2d(config.in_channels, ch0, config.conv_in_kernel, 1, (config.conv_in_kernel - 1) / 2));
  time_embedding = register_module("time_embedding", TimestepEmbedding(ch0, time_embed_dim, config.act_fn));
  if (config.addition_embed_type) {
    add_embedding = register_module("add_embedding", TimestepEmbedding(*config.projection_class_embeddings_input_dim,
                                                                       time_embed_dim, config.act_fn));
  }
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < config.num_blocks(); ++i) down_blocks->push_back(UNetDownBlock(config, i));
  if (!config.mid_block_type.empty()) mid_block = register_module("mid_block", UNetMidBlock2DCrossAttn(config));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < config.num_blocks(); ++i) {
    up_blocks->push_back(UNetUpBlock(config, i));
    if (i + 1 < config.num_blocks()) ++num_upsamplers;
  }
  conv_norm_out = register_module(
      "conv_norm_out", torch::nn::GroupNorm(torch::nn::GroupNormOptions(config.norm_num_groups, ch0).eps(config.norm_eps)));
  conv_out = register_module("conv_out", Conv2d(ch0, config.out_channels, config.conv_out_kernel, 1, (config.conv_out_kernel - 1) / 2));
}

void UNet2DConditionModelImpl::set_gradient_checkpointing(bool on) {
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* r = m->as<ResnetBlock2DImpl>()) r->gradient_checkpointing = on;
    if (auto* t = m->as<BasicTransformerBlockImpl>()) t->gradient_checkpointing = on;
  }
}

void UNet2DConditionModelImpl::set_attention_query_chunk(int64_t rows) {
  for (auto& m : modules(false)) {
    if (auto* a = m->as<AttentionImpl>()) a->options.query_chunk = rows;
  }
}

at::Tensor UNet2DConditionModelImpl::forward(const at::Tensor& sample_in, const at::Tensor& timestep,
                                             const at::Tensor& encoder_hidden_states, const UNetAddedCond& added) {
  const int64_t batch = sample_in.size(0);
  // Sizes that are not multiples of the overall up factor need explicit upsample sizes.
  const int64_t up_factor = int64_t{1} << num_upsamplers;
  const bool forward_upsample_size = sample_in.size(2) % up_factor != 0 || sample_in.size(3) % up_factor != 0;

  at::Tensor sample = config.center_input_sample ? sample_in * 2.0 - 1.0 : sample_in;

  at::Tensor t = timestep.dim() == 0 ? timestep.unsqueeze(0) : timestep;
  t = t.to(sample.device()).expand({batch});
  at::Tensor t_emb = timestep_embedding(t, config.block_out_channels[0], config.flip_sin_to_cos, config.freq_shift)
                         .to(sample.scalar_type());  // [B, ch0]
  at::Tensor emb = time_embedding(t_emb);             // [B, 4*ch0]
  if (add_embedding) {
    TORCH_CHECK(added.text_embeds.defined() && added.time_ids.defined(),
                "this UNet (addition_embed_type text_time) needs text_embeds and time_ids");
    at::Tensor time_embeds = timestep_embedding(added.time_ids.flatten(), *config.addition_time_embed_dim,
                                                config.flip_sin_to_cos, config.freq_shift);
    time_embeds = time_embeds.reshape({added.text_embeds.size(0), -1});                        // [B, 6*256]
    at::Tensor add_embeds = torch::cat({added.text_embeds, time_embeds}, -1).to(emb.scalar_type());  // [B, proj_in]
    emb = emb + add_embedding(add_embeds);
  }

  at::Tensor h = conv_in(sample);  // [B, ch0, H, W]
  std::vector<at::Tensor> skips{h};
  for (auto& m : *down_blocks) h = m->as<UNetDownBlockImpl>()->forward(h, emb, encoder_hidden_states, skips);
  if (mid_block) h = mid_block(h, emb, encoder_hidden_states);  // [B, ch_last, H/2^k, W/2^k]
  for (size_t i = 0; i < up_blocks->size(); ++i) {
    auto* up = up_blocks[i]->as<UNetUpBlockImpl>();
    std::optional<std::vector<int64_t>> upsample_size;
    const size_t consumed = up->resnets->size();
    if (i + 1 < up_blocks->size() && forward_upsample_size && skips.size() > consumed) {
      upsample_size = skips[skips.size() - consumed - 1].sizes().slice(2).vec();
    }
    h = up->forward(h, emb, encoder_hidden_states, skips, upsample_size);
  }
  h = activation(config.act_fn, conv_norm_out(h));
  return conv_out(h);  // [B, out_channels, H, W]
}

}  // namespace lt::models::sd
