#include "loratrain/models/wan/checkpoint.h"

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "loratrain/models/scaled_fp8.h"
#include "loratrain/models/text/t5_checkpoint.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models::wan {

namespace {

// Replaces the first matching prefix of `key` (pairs: from, to); `key` unchanged when none matches.
std::string replace_prefix(const std::string& key, const std::vector<std::pair<std::string, std::string>>& pairs) {
  for (const auto& [from, to] : pairs) {
    if (starts_with(key, from)) return to + key.substr(from.size());
  }
  return key;
}

// Within a VAE residual block: norm1/conv1/norm2/conv2/conv_shortcut -> residual.0/2/3/6, shortcut.
std::string native_residual(const std::string& rest) {
  return replace_prefix(rest, {{"norm1.", "residual.0."},
                               {"conv1.", "residual.2."},
                               {"norm2.", "residual.3."},
                               {"conv2.", "residual.6."},
                               {"conv_shortcut.", "shortcut."}});
}

std::string native_mid(const std::string& rest) {
  if (starts_with(rest, "resnets.0.")) return "middle.0." + native_residual(rest.substr(10));
  if (starts_with(rest, "resnets.1.")) return "middle.2." + native_residual(rest.substr(10));
  if (starts_with(rest, "attentions.0.")) return "middle.1." + rest.substr(13);
  return "mid_block." + rest;
}

// "blocks.N.rest" -> {N as text, rest}; nullopt for other keys.
std::optional<std::pair<std::string, std::string>> split_index(const std::string& key, const std::string& head) {
  if (!starts_with(key, head)) return std::nullopt;
  const size_t dot = key.find('.', head.size());
  if (dot == std::string::npos) return std::nullopt;
  return std::make_pair(key.substr(head.size(), dot - head.size()), key.substr(dot + 1));
}

std::map<std::string, std::string> invert(const std::map<std::string, at::Tensor>& tensors,
                                          const std::function<std::string(const std::string&)>& native) {
  std::map<std::string, std::string> out;
  for (const auto& [key, t] : tensors) out[native(key)] = key;
  return out;
}

bool has_prefix(const io::SafetensorsFile& file, const std::string& prefix) {
  for (const auto& t : file.tensors()) {
    if (starts_with(t.name, prefix)) return true;
  }
  return false;
}

}  // namespace

std::string native_transformer_key(const std::string& key) {
  if (auto b = split_index(key, "blocks.")) {
    const std::string& rest = b->second;
    std::string native = replace_prefix(rest, {{"scale_shift_table", "modulation"},
                                               {"attn1.", "self_attn."},
                                               {"attn2.", "cross_attn."},
                                               {"norm2.", "norm3."},
                                               {"ffn.net.0.proj.", "ffn.0."},
                                               {"ffn.net.2.", "ffn.2."}});
    if (starts_with(native, "self_attn.") || starts_with(native, "cross_attn.")) {
      const size_t dot = native.find('.');
      native = native.substr(0, dot + 1) + replace_prefix(native.substr(dot + 1), {{"to_q.", "q."},
                                                                                  {"to_k.", "k."},
                                                                                  {"to_v.", "v."},
                                                                                  {"to_out.0.", "o."}});
    }
    return "blocks." + b->first + "." + native;
  }
  return replace_prefix(key, {{"scale_shift_table", "head.modulation"},
                              {"proj_out.", "head.head."},
                              {"condition_embedder.time_embedder.linear_1.", "time_embedding.0."},
                              {"condition_embedder.time_embedder.linear_2.", "time_embedding.2."},
                              {"condition_embedder.text_embedder.linear_1.", "text_embedding.0."},
                              {"condition_embedder.text_embedder.linear_2.", "text_embedding.2."},
                              {"condition_embedder.time_proj.", "time_projection.1."}});
}

std::string native_vae_key(const std::string& key, const WanVaeConfig& config) {
  if (key == "quant_conv.weight" || key == "quant_conv.bias") return "conv1." + key.substr(11);
  if (starts_with(key, "post_quant_conv.")) return "conv2." + key.substr(16);
  for (const std::string side : {"encoder.", "decoder."}) {
    if (!starts_with(key, side)) continue;
    const std::string rest = key.substr(side.size());
    if (starts_with(rest, "conv_in.")) return side + "conv1." + rest.substr(8);
    if (starts_with(rest, "norm_out.")) return side + "head.0." + rest.substr(9);
    if (starts_with(rest, "conv_out.")) return side + "head.2." + rest.substr(9);
    if (starts_with(rest, "mid_block.")) return side + native_mid(rest.substr(10));
    if (auto d = split_index(rest, "down_blocks.")) return side + "downsamples." + d->first + "." + native_residual(d->second);
    if (auto u = split_index(rest, "up_blocks.")) {
      // The native decoder lists each level's res blocks then its upsampler in one flat sequence.
      const int64_t per_level = config.num_res_blocks + 2;
      const int64_t base = std::stoll(u->first) * per_level;
      if (auto r = split_index(u->second, "resnets.")) {
        return side + "upsamples." + std::to_string(base + std::stoll(r->first)) + "." + native_residual(r->second);
      }
      if (auto s = split_index(u->second, "upsamplers.")) {
        return side + "upsamples." + std::to_string(base + config.num_res_blocks + 1) + "." + s->second;
      }
    }
  }
  return key;
}

TransformerLayout detect_transformer_layout(const io::SafetensorsFile& file) {
  const std::string where = file.path().string();
  for (const std::string root : {"", kComfyTransformerRoot}) {
    TransformerLayout layout;
    layout.root = root;
    if (file.contains(root + "head.modulation")) layout.native = true;
    else if (file.contains(root + "condition_embedder.time_proj.weight")) layout.native = false;
    else continue;
    auto reject = [&](const std::string& what) {
      throw InputError(where + ": a Wan transformer with " + what + ": only Wan 2.1 text-to-video is supported");
    };
    if (has_prefix(file, root + "img_emb.") || has_prefix(file, root + "condition_embedder.image_embedder.")) {
      reject("an image embedder (image-to-video)");
    }
    if (has_prefix(file, root + "vace_blocks.")) reject("VACE blocks");
    const std::string patch = root + "patch_embedding.weight";
    if (file.contains(patch) && file.info(patch).shape.size() == 5 && file.info(patch).shape[1] != 16) {
      reject(std::to_string(file.info(patch).shape[1]) + " input channels (I2V 36, Wan 2.2 TI2V 48)");
    }
    return layout;
  }
  std::string what = "no head.modulation / condition_embedder.time_proj.weight";
  if (has_prefix(file, "double_blocks.") || has_prefix(file, "model.diffusion_model.double_blocks.")) what = "a Flux transformer";
  else if (has_prefix(file, "model.diffusion_model.input_blocks.")) what = "a Stable Diffusion checkpoint";
  else if (has_prefix(file, "encoder.") && has_prefix(file, "decoder.")) what = "an autoencoder";
  else if (has_prefix(file, "encoder.block.") || has_prefix(file, "shared.")) what = "a T5 text encoder";
  throw InputError(where + ": not a Wan 2.1 transformer (" + what + ")");
}

WanTransformerConfig detect_transformer_config(const io::SafetensorsFile& file, const TransformerLayout& layout) {
  const std::string where = file.path().string();
  auto shape = [&](const std::string& name) {
    const std::string key = layout.root + name;
    if (!file.contains(key)) throw InputError(where + ": not a complete Wan transformer: '" + key + "' is missing");
    return file.info(key).shape;
  };
  // Diffusers-named files are read through the same native questions, translated.
  auto key_of = [&](const std::string& diffusers) { return layout.native ? native_transformer_key(diffusers) : diffusers; };
  WanTransformerConfig c;
  const auto patch = shape(key_of("patch_embedding.weight"));
  if (patch.size() != 5) throw InputError(where + ": patch_embedding.weight is not a Conv3d weight");
  const int64_t dim = patch[0];
  if (dim % 128 != 0) {
    throw InputError(where + ": a Wan transformer of width " + std::to_string(dim) +
                     " is not a multiple of the 128-wide heads of Wan 2.1 (use a diffusers folder with its config.json)");
  }
  c.num_attention_heads = dim / 128;
  c.attention_head_dim = 128;
  c.in_channels = patch[1];
  c.patch_size = {patch[2], patch[3], patch[4]};
  c.text_dim = shape(key_of("condition_embedder.text_embedder.linear_1.weight"))[1];
  c.freq_dim = shape(key_of("condition_embedder.time_embedder.linear_1.weight"))[1];
  c.ffn_dim = shape(key_of("blocks.0.ffn.net.0.proj.weight"))[0];
  c.out_channels = shape(key_of("proj_out.weight"))[0] / (patch[2] * patch[3] * patch[4]);
  c.cross_attn_norm = file.contains(layout.root + key_of("blocks.0.norm2.weight"));
  int64_t layers = 0;
  while (file.contains(layout.root + key_of("blocks." + std::to_string(layers) + ".scale_shift_table"))) ++layers;
  c.num_layers = layers;
  c.validate(where);
  return c;
}

void load_transformer(WanTransformer3DModelImpl& model, const io::SafetensorsFile& file, const TransformerLayout& layout,
                      std::optional<at::ScalarType> dtype, bool keep_fp8) {
  LoadOptions options;
  options.prefix = layout.root;
  options.dtype = dtype;
  options.keep_fp8_linear_weights = keep_fp8;
  if (layout.native) {
    auto names = std::make_shared<std::map<std::string, std::string>>(invert(module_tensors(model), native_transformer_key));
    options.rename = [names](const std::string& key) {
      auto it = names->find(key);
      return it == names->end() ? key : it->second;
    };
  }
  apply_scaled_fp8(options, read_scaled_fp8(file, layout.root));
  load_state_dict(model, file, options);
}

WanTransformer3DModel load_transformer_file(const std::filesystem::path& path, std::optional<at::ScalarType> dtype,
                                            bool keep_fp8) {
  if (!std::filesystem::exists(path)) throw InputError(path.string() + ": Wan transformer not found");
  if (std::filesystem::is_directory(path)) {
    // A diffusers component folder (transformer/): its config.json decides the sizes.
    WanTransformer3DModel model(WanTransformerConfig::from_json(sd::read_component_config(path), (path / "config.json").string()));
    if (dtype) model->to(*dtype);
    const auto file = io::SafetensorsFile::open(sd::diffusers_component_weights(path));
    load_transformer(*model, *file, detect_transformer_layout(*file), dtype, keep_fp8);
    return model;
  }
  const auto file = io::SafetensorsFile::open(path);
  const TransformerLayout layout = detect_transformer_layout(*file);
  WanTransformer3DModel model(detect_transformer_config(*file, layout));
  if (dtype) model->to(*dtype);
  load_transformer(*model, *file, layout, dtype, keep_fp8);
  return model;
}

void load_vae(AutoencoderKLWanImpl& vae, const io::SafetensorsFile& file) {
  LoadOptions options;
  if (file.contains("decoder.middle.0.residual.0.gamma")) {
    const WanVaeConfig config = vae.config;
    auto names = std::make_shared<std::map<std::string, std::string>>(
        invert(module_tensors(vae), [config](const std::string& k) { return native_vae_key(k, config); }));
    options.rename = [names](const std::string& key) {
      auto it = names->find(key);
      return it == names->end() ? key : it->second;
    };
  } else if (!file.contains("decoder.mid_block.resnets.0.norm1.gamma")) {
    throw InputError(file.path().string() +
                     ": not a Wan 2.1 VAE (no decoder.middle.0.residual.0.gamma / decoder.mid_block.resnets.0.norm1.gamma)");
  }
  load_state_dict(vae, file, options);
}

WanVaeConfig detect_vae_config(const io::SafetensorsFile& file) {
  const bool native = file.contains("decoder.middle.0.residual.0.gamma");
  const std::string conv_in = native ? "encoder.conv1.weight" : "encoder.conv_in.weight";
  const std::string quant = native ? "conv1.weight" : "quant_conv.weight";
  for (const auto& key : {conv_in, quant}) {
    if (!file.contains(key)) throw InputError(file.path().string() + ": not a Wan 2.1 VAE ('" + key + "' is missing)");
  }
  WanVaeConfig c;
  c.base_dim = file.info(conv_in).shape[0];
  c.z_dim = file.info(quant).shape[0] / 2;
  if (c.z_dim != 16) {
    throw InputError(file.path().string() + ": a video VAE with " + std::to_string(c.z_dim) +
                     " latent channels; Wan 2.1's has 16 (the 48-channel one is Wan 2.2's)");
  }
  return c;
}

AutoencoderKLWan load_vae_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw InputError(path.string() + ": Wan VAE not found");
  if (fs::is_directory(path)) {
    AutoencoderKLWan vae(WanVaeConfig::from_json(sd::read_component_config(path), (path / "config.json").string()));
    load_vae(*vae, *io::SafetensorsFile::open(sd::diffusers_component_weights(path)));
    return vae;
  }
  const auto file = io::SafetensorsFile::open(path);
  AutoencoderKLWan vae(detect_vae_config(*file));
  load_vae(*vae, *file);
  return vae;
}

namespace {

template <typename Module>
Module frozen(Module module) {
  module->eval();
  for (auto& p : module->parameters()) p.set_requires_grad(false);
  return module;
}

}  // namespace

WanCheckpoint WanCheckpoint::open(const std::filesystem::path& path, const std::optional<std::filesystem::path>& vae_path,
                                  const std::optional<std::filesystem::path>& tokenizer_path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw InputError(path.string() + ": Wan checkpoint not found");
  WanCheckpoint c;
  c.path_ = path;
  c.tokenizer_path_ = tokenizer_path;
  std::string missing;
  if (fs::is_directory(path)) {
    const fs::path transformer = path / "transformer";
    if (!fs::exists(transformer / "config.json")) missing += "\n  transformer: transformer/config.json";
    else c.config_ = WanTransformerConfig::from_json(sd::read_component_config(transformer), (transformer / "config.json").string());
    c.text_encoder_path_ = path / "text_encoder";
    if (!fs::is_directory(c.text_encoder_path_)) missing += "\n  text_encoder: text_encoder/ (UMT5EncoderModel)";
    c.vae_path_ = vae_path.value_or(path / "vae");
    if (!fs::exists(c.vae_path_)) missing += "\n  vae: vae/ or model.vae_path";
    if (!tokenizer_path && !fs::is_directory(path / "tokenizer")) missing += "\n  tokenizer: tokenizer/ (spiece.model)";
  } else {
    const auto file = io::SafetensorsFile::open(path);
    c.config_ = detect_transformer_config(*file, detect_transformer_layout(*file));
    // A bare transformer (wan2.1_t2v_1.3B_fp16.safetensors): the rest as ComfyUI users keep it, beside it.
    const fs::path dir = path.parent_path();
    if (auto umt5 = find_companion(dir, {"umt5_xxl_fp16.safetensors", "umt5_xxl*", "umt5-xxl*", "umt5*"})) {
      c.text_encoder_path_ = *umt5;
    } else {
      missing += "\n  text_encoder: umt5_xxl_fp16.safetensors (or another umt5*.safetensors) beside the transformer";
    }
    if (vae_path) {
      c.vae_path_ = *vae_path;
    } else if (auto vae = find_companion(dir, {"wan_2.1_vae.safetensors", "wan_2.1_vae*", "Wan2_1_VAE*", "wan2.1_vae*"})) {
      c.vae_path_ = *vae;
    } else {
      missing += "\n  vae: wan_2.1_vae.safetensors beside the transformer, or model.vae_path";
    }
  }
  if (!missing.empty()) throw InputError(path.string() + ": incomplete Wan 2.1 checkpoint; missing:" + missing);
  return c;
}

WanTransformer3DModel WanCheckpoint::load_transformer(std::optional<at::ScalarType> dtype, bool keep_fp8) const {
  if (is_single_file()) return frozen(load_transformer_file(path_, dtype, keep_fp8));
  WanTransformer3DModel model(config_);
  if (dtype) model->to(*dtype);
  LoadOptions options;
  options.dtype = dtype;
  options.keep_fp8_linear_weights = keep_fp8;
  load_state_dict_sharded(*model, open_component_weights(path_ / "transformer"), options);
  return frozen(model);
}

AutoencoderKLWan WanCheckpoint::load_vae() const { return frozen(load_vae_file(vae_path_)); }

T5EncoderModel WanCheckpoint::load_text_encoder(std::optional<at::ScalarType> dtype, bool keep_fp8) const {
  T5EncoderModel model = load_t5_encoder(text_encoder_path_, dtype, keep_fp8);
  if (!model->config.bias_in_every_layer()) {
    throw InputError(text_encoder_path_.string() + ": a T5 encoder with one shared position bias; Wan's text encoder is "
                     "umT5 (a position bias in every layer): give umt5_xxl*.safetensors");
  }
  return frozen(model);
}

T5Tokenizer WanCheckpoint::load_tokenizer() const {
  namespace fs = std::filesystem;
  if (tokenizer_path_) return load_t5_tokenizer(*tokenizer_path_);
  if (!is_single_file()) return load_t5_tokenizer(path_ / "tokenizer");
  const auto file = io::SafetensorsFile::open(text_encoder_path_);
  if (auto embedded = embedded_t5_tokenizer(*file, find_t5_encoder_root(*file))) return *embedded;
  const fs::path beside = path_.parent_path() / "tokenizer";
  if (fs::exists(beside)) return load_t5_tokenizer(beside);
  throw InputError(text_encoder_path_.string() + ": no spiece_model in this umT5 file and no tokenizer/ beside the "
                   "transformer; set model.tokenizer_path to the umT5 spiece.model");
}

std::vector<std::pair<std::string, at::Tensor>> native_transformer_tensors(WanTransformer3DModelImpl& model,
                                                                           const std::string& root) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [key, t] : module_tensors(model)) out.emplace_back(root + native_transformer_key(key), t.detach().contiguous());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> native_vae_tensors(AutoencoderKLWanImpl& vae) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [key, t] : module_tensors(vae)) out.emplace_back(native_vae_key(key, vae.config), t.detach().contiguous());
  return out;
}

}  // namespace lt::models::wan
