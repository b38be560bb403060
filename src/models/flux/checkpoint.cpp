#include "loratrain/models/flux/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "loratrain/models/registry.h"
#include "loratrain/models/scaled_fp8.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/models/text/clip_checkpoint.h"
#include "loratrain/models/text/t5_checkpoint.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models::flux {

namespace fs = std::filesystem;

namespace {

// One BFL tensor and the diffusers tensors it holds, stacked on rows in this order.
struct BflTensor {
  std::string key;                  // BFL name without the root
  std::vector<std::string> parts;   // diffusers names
  bool swap_halves = false;         // BFL [shift; scale] vs diffusers [scale; shift]
};

}  // namespace

const std::vector<BflBlockLinear>& bfl_double_block_linears() {
  static const std::vector<BflBlockLinear> table = {
      {"img_mod.lin", {"norm1.linear"}},
      {"txt_mod.lin", {"norm1_context.linear"}},
      {"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"img_attn.proj", {"attn.to_out.0"}},
      {"txt_attn.proj", {"attn.to_add_out"}},
      {"img_mlp.0", {"ff.net.0.proj"}},
      {"img_mlp.2", {"ff.net.2"}},
      {"txt_mlp.0", {"ff_context.net.0.proj"}},
      {"txt_mlp.2", {"ff_context.net.2"}},
  };
  return table;
}

const std::vector<BflBlockLinear>& bfl_single_block_linears() {
  static const std::vector<BflBlockLinear> table = {
      {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
      {"linear2", {"proj_out"}},
      {"modulation.lin", {"norm.linear"}},
  };
  return table;
}

namespace {

// Every BFL tensor of a model of `config`.
std::vector<BflTensor> bfl_layout(const FluxConfig& config) {
  std::vector<BflTensor> t;
  auto linear = [&t](const std::string& bfl, std::vector<std::string> parts, bool swap = false) {
    for (const char* leaf : {".weight", ".bias"}) {
      std::vector<std::string> named;
      for (const auto& p : parts) named.push_back(p + leaf);
      t.push_back({bfl + leaf, named, swap});
    }
  };
  auto scale = [&t](const std::string& bfl, const std::string& diffusers) { t.push_back({bfl, {diffusers}, false}); };
  linear("img_in", {"x_embedder"});
  linear("txt_in", {"context_embedder"});
  linear("time_in.in_layer", {"time_text_embed.timestep_embedder.linear_1"});
  linear("time_in.out_layer", {"time_text_embed.timestep_embedder.linear_2"});
  linear("vector_in.in_layer", {"time_text_embed.text_embedder.linear_1"});
  linear("vector_in.out_layer", {"time_text_embed.text_embedder.linear_2"});
  if (config.guidance_embeds) {
    linear("guidance_in.in_layer", {"time_text_embed.guidance_embedder.linear_1"});
    linear("guidance_in.out_layer", {"time_text_embed.guidance_embedder.linear_2"});
  }
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string b = "double_blocks." + std::to_string(i) + ".", d = "transformer_blocks." + std::to_string(i) + ".";
    for (const auto& l : bfl_double_block_linears()) {
      std::vector<std::string> parts;
      for (const auto& p : l.diffusers) parts.push_back(d + p);
      linear(b + l.bfl, parts);
    }
    scale(b + "img_attn.norm.query_norm.scale", d + "attn.norm_q.weight");
    scale(b + "img_attn.norm.key_norm.scale", d + "attn.norm_k.weight");
    scale(b + "txt_attn.norm.query_norm.scale", d + "attn.norm_added_q.weight");
    scale(b + "txt_attn.norm.key_norm.scale", d + "attn.norm_added_k.weight");
  }
  for (int64_t i = 0; i < config.num_single_layers; ++i) {
    const std::string b = "single_blocks." + std::to_string(i) + ".", d = "single_transformer_blocks." + std::to_string(i) + ".";
    for (const auto& l : bfl_single_block_linears()) {
      std::vector<std::string> parts;
      for (const auto& p : l.diffusers) parts.push_back(d + p);
      linear(b + l.bfl, parts);
    }
    scale(b + "norm.query_norm.scale", d + "attn.norm_q.weight");
    scale(b + "norm.key_norm.scale", d + "attn.norm_k.weight");
  }
  linear("final_layer.linear", {"proj_out"});
  linear("final_layer.adaLN_modulation.1", {"norm_out.linear"}, /*swap=*/true);
  return t;
}

// The name a fused or reordered BFL tensor goes by between rename and derive.
const std::string kMarker = "<bfl>";

at::Tensor swap_halves(const at::Tensor& t) {
  auto halves = t.chunk(2, 0);
  return torch::cat({halves[1], halves[0]}, 0);
}

int64_t count_blocks(const io::SafetensorsFile& file, const std::string& stem) {
  int64_t n = 0;
  while (true) {
    const std::string prefix = stem + std::to_string(n) + ".";
    bool found = false;
    for (const auto& t : file.tensors()) {
      if (starts_with(t.name, prefix)) {
        found = true;
        break;
      }
    }
    if (!found) return n;
    ++n;
  }
}

const std::vector<int64_t>& shape_of(const io::SafetensorsFile& file, const std::string& key) {
  if (!file.contains(key)) throw InputError(file.path().string() + ": not a complete Flux.1 transformer: '" + key + "' is missing");
  return file.info(key).shape;
}

template <typename Module>
Module frozen(Module module) {
  module->eval();
  for (auto& p : module->parameters()) p.set_requires_grad(false);
  return module;
}

}  // namespace

FluxConfig detect_bfl_config(const io::SafetensorsFile& file, const std::string& root) {
  FluxConfig c;
  const auto& img_in = shape_of(file, root + "img_in.weight");
  const int64_t dim = img_in.at(0);
  c.in_channels = img_in.at(1);
  c.joint_attention_dim = shape_of(file, root + "txt_in.weight").at(1);
  c.pooled_projection_dim = shape_of(file, root + "vector_in.in_layer.weight").at(1);
  c.guidance_embeds = file.contains(root + "guidance_in.in_layer.weight");
  c.attention_head_dim = shape_of(file, root + "double_blocks.0.img_attn.norm.query_norm.scale").at(0);
  if (c.attention_head_dim <= 0 || dim % c.attention_head_dim != 0) {
    throw InputError(file.path().string() + ": the Flux transformer's width " + std::to_string(dim) +
                     " is not a multiple of its head width " + std::to_string(c.attention_head_dim));
  }
  c.num_attention_heads = dim / c.attention_head_dim;
  c.num_layers = count_blocks(file, root + "double_blocks.");
  c.num_single_layers = count_blocks(file, root + "single_blocks.");
  const int64_t out = shape_of(file, root + "final_layer.linear.weight").at(0);
  if (out != c.in_channels) c.out_channels = out;
  // The rope axes are not stored: Flux.1's split of its 128-wide heads is (16, 56, 56); other head
  // widths (the tiny test models) keep its proportions, 7/16 of the head per spatial axis.
  const int64_t spatial = (c.attention_head_dim * 7 / 16) / 2 * 2;
  c.axes_dims_rope = {c.attention_head_dim - 2 * spatial, spatial, spatial};
  if (c.in_channels != 64 && c.attention_head_dim == 128) {
    throw InputError(file.path().string() + ": a Flux.1 transformer with " + std::to_string(c.in_channels) +
                     " input channels (img_in.weight " + std::to_string(dim) + "x" + std::to_string(c.in_channels) +
                     "): Fill (384) and Canny/Depth (128) take control images lora-train does not provide; "
                     "give a text-to-image Flux.1 dev or schnell (64)");
  }
  c.validate(file.path().string());
  return c;
}

void load_bfl_transformer(FluxTransformer2DModelImpl& model, const io::SafetensorsFile& file, const std::string& root,
                          std::optional<at::ScalarType> dtype, bool keep_fp8) {
  const auto layout = std::make_shared<std::vector<BflTensor>>(bfl_layout(model.config));
  auto by_key = std::make_shared<std::map<std::string, size_t>>();
  for (size_t i = 0; i < layout->size(); ++i) (*by_key)[(*layout)[i].key] = i;
  auto shapes = std::make_shared<std::map<std::string, std::vector<int64_t>>>();
  for (const auto& [key, tensor] : module_tensors(model)) (*shapes)[key] = tensor.sizes().vec();

  LoadOptions options;
  options.prefix = root;
  options.dtype = dtype;
  options.keep_fp8_linear_weights = keep_fp8;
  // Fused and reordered BFL tensors go through derive under a marker name; plain ones are renamed.
  options.rename = [by_key, layout, root](const std::string& key) -> std::string {
    auto it = by_key->find(key);
    if (it == by_key->end()) return "<no diffusers name for " + root + key + ">";
    const BflTensor& t = (*layout)[it->second];
    if (t.parts.size() == 1 && !t.swap_halves) return t.parts[0];
    return kMarker + key;
  };
  options.derive = [by_key, layout, shapes](const std::string& key, const std::vector<int64_t>& shape) {
    std::vector<DerivedTensor> out;
    if (!starts_with(key, kMarker)) return out;
    const BflTensor& t = (*layout)[by_key->at(key.substr(kMarker.size()))];
    if (t.swap_halves) {
      out.push_back({t.parts[0], shape, swap_halves});
      return out;
    }
    int64_t rows = 0;
    for (const auto& p : t.parts) rows += shapes->at(p).at(0);
    std::vector<int64_t> rest(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
    const auto& first = shapes->at(t.parts[0]);
    if (shape.empty() || shape[0] != rows || rest != std::vector<int64_t>(first.begin() + 1, first.end())) {
      out.push_back({t.parts[0], shape, nullptr});  // reported as mis-shaped against the first part
      return out;
    }
    int64_t offset = 0;
    for (const auto& p : t.parts) {
      const int64_t n = shapes->at(p).at(0);
      out.push_back({p, shapes->at(p), [offset, n](const at::Tensor& fused) { return fused.narrow(0, offset, n); }});
      offset += n;
    }
    return out;
  };
  apply_scaled_fp8(options, read_scaled_fp8(file, root));
  load_state_dict(model, file, options);
}

std::vector<std::pair<std::string, at::Tensor>> bfl_tensors(FluxTransformer2DModelImpl& model, const std::string& root) {
  const auto tensors = module_tensors(model);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& t : bfl_layout(model.config)) {
    std::vector<at::Tensor> parts;
    for (const auto& p : t.parts) parts.push_back(tensors.at(p).detach());
    at::Tensor value = parts.size() == 1 ? parts[0] : torch::cat(parts, 0);
    if (t.swap_halves) value = swap_halves(value);
    out.emplace_back(root + t.key, value.contiguous());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// FluxCheckpoint

FluxCheckpoint FluxCheckpoint::open(const fs::path& path, const std::optional<fs::path>& vae_path) {
  if (!fs::exists(path)) throw InputError(path.string() + ": model not found (model.name_or_path)");
  FluxCheckpoint c;
  c.path_ = path;
  c.vae_path_ = vae_path;
  if (vae_path && !fs::exists(*vae_path)) throw InputError(vae_path->string() + ": VAE not found (model.vae_path)");
  Detection d;
  if (fs::is_directory(path)) {
    d = detect_diffusers_folder(path);
  } else {
    c.file_ = io::SafetensorsFile::open(path);
    d = detect_checkpoint(*c.file_);
  }
  if (d.family != ModelFamily::kFlux) {
    throw InputError(path.string() + ": not a Flux.1 checkpoint (" + d.evidence + ")");
  }
  if (!c.file_) {
    std::vector<std::string> optional;
    if (vae_path) optional.push_back("vae");
    require_complete(d, path.string(), optional);
    c.config_ = FluxConfig::from_json(sd::read_component_config(path / "transformer"), (path / "transformer" / "config.json").string());
    return c;
  }
  if (d.format != KeyFormat::kBFL) {
    throw InputError(path.string() + ": a Flux transformer in diffusers names alone (" + d.evidence +
                     "); give the diffusers folder it belongs to, a BFL file (flux1-dev.safetensors) or a ComfyUI "
                     "all-in-one checkpoint");
  }
  c.root_ = c.file_->contains(std::string(kComfyTransformerRoot) + "img_in.weight") ? kComfyTransformerRoot : "";
  c.config_ = detect_bfl_config(*c.file_, c.root_);
  auto has = [&c](const std::string& prefix) {
    for (const auto& t : c.file_->tensors()) {
      if (starts_with(t.name, prefix)) return true;
    }
    return false;
  };
  std::string missing;
  if (has(kComfyClipLRoot) || has(kComfyT5Root) || has(kComfyVAERoot)) {
    c.all_in_one_ = true;
    if (!has(kComfyClipLRoot)) missing += "\n  text_encoder: text_encoders.clip_l.transformer.* (CLIP-L)";
    if (!has(kComfyT5Root)) missing += "\n  text_encoder_2: text_encoders.t5xxl.transformer.* (T5-XXL)";
    if (!has(kComfyVAERoot) && !vae_path) missing += "\n  vae: vae.* (the 16-channel autoencoder) or model.vae_path";
  } else {
    // A bare transformer (flux1-dev.safetensors): the rest as ComfyUI users keep it, beside it.
    const fs::path dir = path.parent_path();
    auto clip = find_companion(dir, {"clip_l.safetensors"});
    auto t5 = find_companion(dir, {"t5xxl_fp16.safetensors", "t5xxl*"});
    auto ae = find_companion(dir, {"ae.safetensors"});
    if (clip) c.clip_path_ = *clip;
    else missing += "\n  text_encoder: clip_l.safetensors beside the transformer";
    if (t5) c.t5_path_ = *t5;
    else missing += "\n  text_encoder_2: t5xxl_fp16.safetensors (or another t5xxl*.safetensors) beside the transformer";
    if (!vae_path) {
      if (ae) c.vae_path_ = *ae;
      else missing += "\n  vae: ae.safetensors beside the transformer, or model.vae_path";
    }
  }
  if (!missing.empty()) {
    throw InputError(path.string() + ": incomplete Flux.1 checkpoint (" + d.evidence + "); missing:" + missing);
  }
  return c;
}

FluxTransformer2DModel FluxCheckpoint::load_transformer(std::optional<at::ScalarType> dtype, bool keep_fp8) const {
  FluxTransformer2DModel model(config_);
  if (dtype) model->to(*dtype);
  if (file_) {
    load_bfl_transformer(*model, *file_, root_, dtype, keep_fp8);
  } else {
    LoadOptions options;
    options.dtype = dtype;
    options.keep_fp8_linear_weights = keep_fp8;
    const auto files = open_component_weights(path_ / "transformer");
    load_state_dict_sharded(*model, files, options);
  }
  return frozen(model);
}

CLIPTextModel FluxCheckpoint::load_text_encoder(std::optional<at::ScalarType> dtype) const {
  if (all_in_one_) return frozen(load_clip_text_model(*file_, kComfyClipLRoot, dtype));
  if (file_) {
    auto file = io::SafetensorsFile::open(clip_path_);
    const std::string root = file->contains("text_model.encoder.layers.0.mlp.fc1.weight") ? "" : kComfyClipLRoot;
    return frozen(load_clip_text_model(*file, root, dtype));
  }
  CLIPTextModel model(CLIPTextConfig::from_file(path_ / "text_encoder" / "config.json"));
  if (dtype) model->to(*dtype);
  LoadOptions options = clip_text_load_options();
  options.dtype = dtype;
  load_state_dict_sharded(*model, open_component_weights(path_ / "text_encoder"), options);
  return frozen(model);
}

T5EncoderModel FluxCheckpoint::load_text_encoder_2(std::optional<at::ScalarType> dtype, bool keep_fp8) const {
  if (all_in_one_) return frozen(load_t5_encoder(*file_, kComfyT5Root, dtype, std::nullopt, keep_fp8));
  if (file_) return frozen(load_t5_encoder(t5_path_, dtype, keep_fp8));
  return frozen(load_t5_encoder(path_ / "text_encoder_2", dtype, keep_fp8));
}

sd::AutoencoderKL FluxCheckpoint::load_vae() const {
  auto from_file = [](const io::SafetensorsFile& file, const std::string& prefix) {
    sd::AutoencoderKL vae(sd::VAEConfig::detect_from_weights(file, prefix));
    LoadOptions options;
    options.prefix = prefix;
    sd::load_vae(*vae, file, options);
    return vae;
  };
  sd::AutoencoderKL vae{nullptr};
  std::optional<fs::path> folder;
  if (vae_path_ && fs::is_directory(*vae_path_)) {
    folder = *vae_path_;
  } else if (vae_path_) {
    vae = from_file(*io::SafetensorsFile::open(*vae_path_), "");
  } else if (all_in_one_) {
    vae = from_file(*file_, kComfyVAERoot);
  } else {
    folder = path_ / "vae";
  }
  if (folder) {
    vae = sd::AutoencoderKL(sd::VAEConfig::from_json(sd::read_component_config(*folder)));
    sd::load_vae(*vae, *io::SafetensorsFile::open(sd::diffusers_component_weights(*folder)));
  }
  if (vae->config.latent_channels * 4 != config_.in_channels) {
    throw InputError(path_.string() + ": the VAE has " + std::to_string(vae->config.latent_channels) +
                     " latent channels, but the transformer takes " + std::to_string(config_.in_channels) +
                     " packed channels (4 per latent channel)");
  }
  return frozen(vae);
}

CLIPTokenizer FluxCheckpoint::load_tokenizer(const std::optional<fs::path>& tokenizer_path) const {
  if (tokenizer_path) return load_clip_tokenizer(*tokenizer_path);
  if (!file_) return load_clip_tokenizer(path_ / "tokenizer");
  const fs::path beside = path_.parent_path() / "tokenizer";
  if (fs::exists(beside)) return load_clip_tokenizer(beside);
  throw InputError(path_.string() + ": a single-file checkpoint carries no CLIP vocabulary: set model.tokenizer_path to "
                   "a diffusers tokenizer/ folder (vocab.json + merges.txt) or OpenAI's bpe_simple_vocab_16e6.txt.gz");
}

T5Tokenizer FluxCheckpoint::load_tokenizer_2(const std::optional<fs::path>& tokenizer_path) const {
  std::vector<fs::path> candidates;
  if (!file_) {
    candidates.push_back(path_ / "tokenizer_2");
  } else {
    if (tokenizer_path) {
      candidates.push_back(*tokenizer_path / "tokenizer_2");
      candidates.push_back(tokenizer_path->parent_path() / "tokenizer_2");
    }
    candidates.push_back(path_.parent_path() / "tokenizer_2");
    candidates.push_back(path_.parent_path() / "spiece.model");
  }
  for (const auto& c : candidates) {
    if (fs::is_regular_file(c) || fs::exists(c / "spiece.model")) return load_t5_tokenizer(c);
  }
  std::string looked;
  for (const auto& c : candidates) looked += "\n  " + (fs::is_directory(c) || c.filename() == "tokenizer_2" ? (c / "spiece.model").string() : c.string());
  throw InputError(path_.string() + ": no T5 tokenizer (SentencePiece spiece.model) found; looked for:" + looked);
}

}  // namespace lt::models::flux
