#include "loratrain/models/text/clip_checkpoint.h"

#include <torch/torch.h>

#include <cmath>
#include <map>

#include "loratrain/models/key_maps.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models {

namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

// Number of OpenCLIP resblocks under root.
int64_t open_clip_layers(const io::SafetensorsFile& file, const std::string& root) {
  int64_t n = 0;
  while (file.contains(root + "transformer.resblocks." + std::to_string(n) + ".ln_1.weight")) ++n;
  return n;
}

bool is_text_projection(const std::string& key) { return key == "text_projection.weight"; }

// The module tensors one OpenCLIP tensor (in transformers naming) becomes: the fused in_proj's three
// row blocks, or the transposed text_projection; empty for plain renames.
std::vector<DerivedTensor> derive_open_clip(const std::string& key, const std::vector<int64_t>& shape) {
  std::vector<DerivedTensor> out;
  const auto parts = fused_qkv_parts(key);
  if (!parts.empty()) {
    // Rows not divisible by 3 keep the file's shape, so the strict loader reports them mis-shaped.
    const bool even = !shape.empty() && shape[0] % 3 == 0;
    const int64_t rows = even ? shape[0] / 3 : shape[0];
    std::vector<int64_t> part_shape = shape;
    if (!part_shape.empty()) part_shape[0] = rows;
    for (int64_t i = 0; i < 3; ++i) {
      out.push_back({parts[static_cast<size_t>(i)], part_shape,
                     [i, rows](const at::Tensor& t) { return t.narrow(0, i * rows, rows); }});
    }
  } else if (is_text_projection(key) && shape.size() == 2) {
    out.push_back({key, {shape[1], shape[0]}, [](const at::Tensor& t) { return t.t(); }});
  }
  return out;
}

// Load options for an OpenCLIP tower under root with `layers` resblocks mapped; keys that are not
// part of the model (`skip`) are left unread, keys no row covers are reported as unexpected.
LoadOptions open_clip_load_options(const std::string& root, int64_t layers, std::vector<std::string> skip,
                                   std::optional<at::ScalarType> dtype) {
  const KeyMap map = open_clip_key_map(root, layers);
  LoadOptions options = clip_text_load_options();
  options.prefix = root;
  options.dtype = dtype;
  options.rename = [map, root, skip](const std::string& key) -> std::string {
    for (const auto& s : skip) {
      if (starts_with(key, s)) return {};
    }
    std::string mapped = map.to_diffusers(root + key);
    return mapped.empty() ? "<no transformers name for " + root + key + ">" : mapped;
  };
  options.derive = derive_open_clip;
  return options;
}

// Shapes of the OpenCLIP tower in transformers naming, as the module will see them.
Shapes open_clip_shapes(const io::SafetensorsFile& file, const std::string& root, int64_t layers) {
  const KeyMap map = open_clip_key_map(root, layers);
  Shapes shapes;
  for (const auto& t : file.tensors()) {
    if (!starts_with(t.name, root)) continue;
    const std::string key = map.to_diffusers(t.name);
    if (key.empty()) continue;
    const auto derived = derive_open_clip(key, t.shape);
    if (derived.empty()) shapes[key] = t.shape;
    for (const auto& d : derived) shapes[d.module_key] = d.shape;
  }
  return shapes;
}

void require_root(const io::SafetensorsFile& file, const std::string& root, bool open_clip) {
  const bool present = open_clip ? has_open_clip_text_encoder(file, root) : has_clip_text_encoder(file, root);
  if (!present) {
    throw InputError(file.path().string() + ": no " + (open_clip ? "OpenCLIP" : "CLIP") + " text encoder under " +
                     root + (open_clip ? " (expected " + root + "token_embedding.weight, " + root +
                                             "transformer.resblocks.N...)"
                                       : " (expected " + root + "text_model.embeddings.token_embedding.weight)"));
  }
}

}  // namespace

bool has_open_clip_text_encoder(const io::SafetensorsFile& file, const std::string& root) {
  return file.contains(root + "token_embedding.weight");
}

bool has_clip_text_encoder(const io::SafetensorsFile& file, const std::string& root) {
  return file.contains(root + "text_model.embeddings.token_embedding.weight") ||
         file.contains(root + "embeddings.token_embedding.weight");
}

CLIPTextConfig detect_open_clip_config(const io::SafetensorsFile& file, const std::string& root) {
  require_root(file, root, /*open_clip=*/true);
  const int64_t layers = open_clip_layers(file, root);
  CLIPTextConfig c = CLIPTextConfig::detect_from_weights(open_clip_shapes(file, root, layers));
  // OpenCLIP towers are gelu whatever their width (ViT-H 1024, ViT-bigG 1280).
  c.hidden_act = "gelu";
  return c;
}

CLIPTextConfig detect_clip_config(const io::SafetensorsFile& file, const std::string& root) {
  require_root(file, root, /*open_clip=*/false);
  const KeyMap map = clip_ldm_key_map(root);
  Shapes shapes;
  for (const auto& t : file.tensors()) {
    if (!starts_with(t.name, root)) continue;
    const std::string key = map.to_diffusers(t.name);
    if (!key.empty()) shapes[key] = t.shape;
  }
  return CLIPTextConfig::detect_from_weights(shapes);
}

CLIPTextModel load_clip_text_model(const io::SafetensorsFile& file, const std::string& root,
                                   std::optional<at::ScalarType> dtype, std::optional<CLIPTextConfig> config) {
  CLIPTextModel model(config ? *config : detect_clip_config(file, root));
  const KeyMap map = clip_ldm_key_map(root);
  LoadOptions options = clip_text_load_options();
  options.prefix = root;
  options.dtype = dtype;
  options.rename = [map, root](const std::string& key) -> std::string {
    std::string mapped = map.to_diffusers(root + key);
    if (mapped == "text_model.embeddings.position_ids") return {};  // see clip_text_load_options
    return mapped.empty() ? "<no transformers name for " + root + key + ">" : mapped;
  };
  load_state_dict(*model, file, options);
  model->eval();
  return model;
}

CLIPTextModelWithProjection load_open_clip_text_model_with_projection(const io::SafetensorsFile& file,
                                                                      const std::string& root,
                                                                      std::optional<at::ScalarType> dtype,
                                                                      std::optional<CLIPTextConfig> known) {
  const CLIPTextConfig config = known ? *known : detect_open_clip_config(file, root);
  if (!file.contains(root + "text_projection")) {
    throw InputError(file.path().string() + ": the OpenCLIP text encoder under " + root + " has no " + root +
                     "text_projection (SDXL's second encoder needs it for the pooled embedding)");
  }
  CLIPTextModelWithProjection model(config);
  load_state_dict(*model, file, open_clip_load_options(root, config.num_hidden_layers, {"logit_scale"}, dtype));
  model->eval();
  return model;
}

CLIPTextModel load_open_clip_text_model_penultimate(const io::SafetensorsFile& file, const std::string& root,
                                                    std::optional<at::ScalarType> dtype,
                                                    std::optional<CLIPTextConfig> known) {
  require_root(file, root, /*open_clip=*/true);
  const int64_t file_layers = open_clip_layers(file, root);
  if (file_layers < 2) {
    throw InputError(file.path().string() + ": the OpenCLIP text encoder under " + root + " has " +
                     std::to_string(file_layers) + " resblock(s); SD2 conditions on the penultimate one");
  }
  CLIPTextConfig config = known ? *known : detect_open_clip_config(file, root);
  if (!known) config.num_hidden_layers = file_layers - 1;
  if (config.num_hidden_layers != file_layers - 1) {
    throw InputError(file.path().string() + ": the text encoder config has " + std::to_string(config.num_hidden_layers) +
                     " layers; SD2's OpenCLIP tower under " + root + " has " + std::to_string(file_layers) +
                     " resblocks, of which the model uses all but the last");
  }
  CLIPTextModel model(config);
  const std::string last = "transformer.resblocks." + std::to_string(file_layers - 1) + ".";
  load_state_dict(*model, file,
                  open_clip_load_options(root, config.num_hidden_layers, {last, "text_projection", "logit_scale"}, dtype));
  model->eval();
  return model;
}

CLIPTextModel load_sd_single_file_text_encoder(const io::SafetensorsFile& file, std::optional<at::ScalarType> dtype) {
  if (has_clip_text_encoder(file, kSD1TextEncoderRoot)) return load_clip_text_model(file, kSD1TextEncoderRoot, dtype);
  if (has_open_clip_text_encoder(file, kSD2TextEncoderRoot)) {
    return load_open_clip_text_model_penultimate(file, kSD2TextEncoderRoot, dtype);
  }
  throw InputError(file.path().string() + ": no text encoder weights: neither " + std::string(kSD1TextEncoderRoot) +
                   "* (SD1.x, CLIP ViT-L) nor " + kSD2TextEncoderRoot + "* (SD2.x, OpenCLIP ViT-H)");
}

std::vector<std::pair<std::string, at::Tensor>> open_clip_tensors(CLIPTextModelWithProjectionImpl& model,
                                                                  const std::string& root) {
  torch::NoGradGuard no_grad;
  const KeyMap map = open_clip_key_map(root, model.config.num_hidden_layers);
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters(true)) params[p.key()] = p.value().detach();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [key, value] : params) {
    // q/k/v are written once, fused, when their q_proj is met.
    const std::string dot = key.substr(0, key.rfind('.'));
    const std::string kind = key.substr(key.rfind('.') + 1);
    const std::string attn = "self_attn.";
    if (ends_with(dot, attn + "k_proj") || ends_with(dot, attn + "v_proj")) continue;
    if (ends_with(dot, attn + "q_proj")) {
      const std::string stem = dot.substr(0, dot.size() - std::string("q_proj").size());
      const std::string fused = stem + "in_proj_" + kind;
      const auto parts = fused_qkv_parts(fused);
      out.emplace_back(map.to_ldm(fused),
                       torch::cat({params.at(parts[0]), params.at(parts[1]), params.at(parts[2])}, 0).clone());
      continue;
    }
    const std::string ldm = map.to_ldm(key);
    if (ldm.empty()) throw Error(ExitCode::kRuntime, "no OpenCLIP name for " + key);
    out.emplace_back(ldm, is_text_projection(key) ? value.t().contiguous() : value.clone());
  }
  // OpenCLIP's contrastive temperature; trained ViT-bigG has exp(logit_scale) = 100.
  out.emplace_back(root + "logit_scale", torch::full({}, std::log(100.0), params.begin()->second.options()));
  return out;
}

}  // namespace lt::models
