#include "loratrain/models/registry.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <tuple>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models {

const char* format_name(KeyFormat f) {
  switch (f) {
    case KeyFormat::kLDM: return "ldm-single-file";
    case KeyFormat::kDiffusers: return "diffusers";
    case KeyFormat::kBFL: return "bfl";
    case KeyFormat::kWanOriginal: return "wan-original";
    case KeyFormat::kKohyaLoRA: return "kohya-lora";
    case KeyFormat::kPeftLoRA: return "peft-lora";
    default: return "unknown";
  }
}

namespace {

bool any_key(const io::SafetensorsFile& file, const std::string& needle) {
  for (const auto& t : file.tensors()) if (t.name.find(needle) != std::string::npos) return true;
  return false;
}

bool any_prefix(const io::SafetensorsFile& file, const std::string& prefix) {
  for (const auto& t : file.tensors()) if (starts_with(t.name, prefix)) return true;
  return false;
}

// Counts tensors per component; rows are (component name, key prefix) tried in order.
std::vector<Component> split_components(const io::SafetensorsFile& file,
                                        const std::vector<std::pair<std::string, std::string>>& rows) {
  std::vector<Component> out;
  for (const auto& [name, prefix] : rows) out.push_back(Component{name, prefix, 0, 0, {}});
  Component other{"other", "", 0, 0, {}};
  for (const auto& t : file.tensors()) {
    Component* target = &other;
    for (auto& c : out) {
      if (starts_with(t.name, c.prefix)) {
        target = &c;
        break;
      }
    }
    target->parameters += t.numel();
    target->tensors += 1;
    target->dtypes[io::dtype_name(t.dtype)] += 1;
  }
  std::vector<Component> present;
  for (auto& c : out) if (c.tensors > 0) present.push_back(std::move(c));
  if (other.tensors > 0) present.push_back(std::move(other));
  return present;
}

// Cross-attention context width of an SD UNet: 768 = SD1 (CLIP ViT-L), 1024 = SD2 (OpenCLIP ViT-H),
// 2048 = SDXL (ViT-L 768 + ViT-bigG 1280).
int64_t context_dim(const io::SafetensorsFile& file) {
  for (const auto& t : file.tensors()) {
    if (ends_with(t.name, "attn2.to_k.weight") && t.shape.size() == 2) return t.shape[1];
  }
  return 0;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// What a text-encoder root of a single file holds, for evidence ("CLIP ViT-L", "OpenCLIP 1280 wide").
std::string text_encoder_words(const io::SafetensorsFile& file, const std::string& root) {
  for (const char* key : {"text_model.embeddings.token_embedding.weight", "token_embedding.weight"}) {
    if (!file.contains(root + key)) continue;
    const auto& shape = file.info(root + key).shape;
    const int64_t width = shape.size() == 2 ? shape[1] : 0;
    const bool open_clip = std::string(key) == "token_embedding.weight";
    std::string name = width == 768 ? "ViT-L" : width == 1024 ? "ViT-H" : width == 1280 ? "ViT-bigG" : std::to_string(width) + " wide";
    return std::string(open_clip ? "OpenCLIP " : "CLIP ") + name;
  }
  return {};
}

// An LDM/SGM single file: SD1/SD2 (cond_stage_model.*) or SDXL (conditioner.embedders.*, label_emb).
void detect_ldm(const io::SafetensorsFile& file, Detection& d) {
  d.format = KeyFormat::kLDM;
  const std::string unet = "model.diffusion_model.";
  const std::string label = unet + "label_emb.0.0.weight";
  const int64_t ctx = context_dim(file);
  const std::string width = "cross-attention width " + std::to_string(ctx);
  const bool conditioner = any_prefix(file, "conditioner.embedders.");
  if (file.contains(label) || conditioner) {
    d.family = ModelFamily::kSDXL;
    std::string e;
    if (file.contains(label)) {
      e = unet + "label_emb.0.0.weight " + shape_text(file.info(label).shape) + " (the size/pooled-text embedding)";
    } else {
      e = "no " + unet + "label_emb";
      d.missing["unet"] = unet + "label_emb.0.0.weight (SDXL's added size/pooled-text embedding)";
    }
    e += ", " + width;
    const std::string te1 = "conditioner.embedders.0.transformer.";
    const std::string te2 = "conditioner.embedders.1.model.";
    if (any_prefix(file, "conditioner.embedders.0.model.") && !any_prefix(file, te1)) {
      e += ", conditioner.embedders.0 is " + text_encoder_words(file, "conditioner.embedders.0.model.") +
           " alone (the SDXL refiner's layout)";
    }
    const std::vector<std::tuple<std::string, std::string, std::string>> encoders = {
        {"text_encoder", te1, "CLIP ViT-L, transformers names"}, {"text_encoder_2", te2, "OpenCLIP ViT-bigG"}};
    for (const auto& [component, root, what] : encoders) {
      const std::string words = text_encoder_words(file, root);
      if (!words.empty()) {
        e += ", " + root.substr(0, root.size() - 1) + ": " + words;
      } else {
        d.missing[component] = root + "* (" + what + " text encoder)";
      }
    }
    if (any_prefix(file, te2) && !file.contains(te2 + "text_projection")) {
      d.missing["text_encoder_2"] = te2 + "text_projection (the pooled text embedding's projection)";
    }
    d.evidence = e;
    d.components = split_components(file, {{"unet", unet},
                                           {"vae", "first_stage_model."},
                                           {"text_encoder", "conditioner.embedders.0."},
                                           {"text_encoder_2", "conditioner.embedders.1."}});
  } else {
    const bool open_clip = any_prefix(file, "cond_stage_model.model.");
    d.family = ctx == 1024 || open_clip ? ModelFamily::kSD2 : ModelFamily::kSD1;
    std::string e = unet + "input_blocks with " + width + ", no label_emb";
    const std::string root = open_clip ? "cond_stage_model.model." : "cond_stage_model.transformer.";
    const std::string words = text_encoder_words(file, root);
    if (!words.empty()) {
      e += ", " + root.substr(0, root.size() - 1) + ": " + words;
    } else {
      d.missing["text_encoder"] = "cond_stage_model.transformer.* (SD1.x, CLIP ViT-L) or cond_stage_model.model.* (SD2.x, OpenCLIP ViT-H)";
    }
    d.evidence = e;
    d.components = split_components(file, {{"unet", unet},
                                           {"vae", "first_stage_model."},
                                           {"text_encoder", "cond_stage_model."}});
  }
  if (!any_prefix(file, "first_stage_model.")) d.missing["vae"] = "first_stage_model.* (the autoencoder)";
}

// Flux-shaped files and what shares their block names: Flux.1 (BFL names, bare or under ComfyUI's
// model.diffusion_model., or diffusers names), Flux.2 and Chroma (other architectures: told apart
// by their modulation keys), and a T5 encoder given where a transformer belongs. False when none.
bool detect_flux(const io::SafetensorsFile& file, Detection& d) {
  if (any_key(file, "single_stream_modulation.") || any_key(file, "double_stream_modulation_")) {
    d.evidence = "Flux.2 keys (single_stream_modulation / double_stream_modulation_img): a Flux.2 transformer, "
                 "not Flux.1; lora-train does not train Flux.2";
    d.components = split_components(file, {{"transformer", ""}});
    return true;
  }
  if (any_key(file, "distilled_guidance_layer.")) {
    d.family = ModelFamily::kChroma;
    d.evidence = "distilled_guidance_layer.* (Chroma's modulation approximator; Flux.1 has per-block modulation)";
    d.components = split_components(file, {{"transformer", ""}});
    return true;
  }
  for (const std::string root : {"model.diffusion_model.", ""}) {
    if (!file.contains(root + "double_blocks.0.img_attn.norm.key_norm.scale")) continue;
    d.family = ModelFamily::kFlux;
    d.format = KeyFormat::kBFL;
    const bool dev = file.contains(root + "guidance_in.in_layer.weight");
    d.evidence = root + "double_blocks.0.img_attn.norm.key_norm.scale (Flux.1 " + (dev ? "dev: guidance_in" : "schnell: no guidance_in") + ")";
    d.components = split_components(file, {{"transformer", root},
                                           {"text_encoder", "text_encoders.clip_l."},
                                           {"text_encoder_2", "text_encoders.t5xxl."},
                                           {"vae", "vae."}});
    return true;
  }
  if (file.contains("x_embedder.weight") && file.contains("transformer_blocks.0.attn.add_k_proj.weight")) {
    d.family = ModelFamily::kFlux;
    d.format = KeyFormat::kDiffusers;
    d.evidence = std::string("diffusers FluxTransformer2DModel keys (x_embedder, transformer_blocks.0.attn.add_k_proj") +
                 (file.contains("time_text_embed.guidance_embedder.linear_1.weight") ? ", guidance_embedder: dev)" : ": schnell)");
    d.components = split_components(file, {{"transformer", ""}});
    return true;
  }
  // Only the first shard of a sharded diffusers transformer may hold neither marker.
  if (any_prefix(file, "single_transformer_blocks.") || any_prefix(file, "transformer_blocks.0.attn.add_k_proj")) {
    d.family = ModelFamily::kFlux;
    d.format = KeyFormat::kDiffusers;
    d.evidence = "diffusers FluxTransformer2DModel keys (transformer_blocks / single_transformer_blocks)";
    d.components = split_components(file, {{"transformer", ""}});
    return true;
  }
  for (const std::string root : {"", "text_encoders.t5xxl.transformer."}) {
    if (!file.contains(root + "encoder.block.0.layer.0.SelfAttention.q.weight")) continue;
    d.format = KeyFormat::kDiffusers;
    d.evidence = "a T5 text encoder (encoder.block.*.SelfAttention), not a diffusion model";
    d.components = split_components(file, {{"text_encoder", root}});
    return true;
  }
  return false;
}

}  // namespace

Detection detect_checkpoint(const io::SafetensorsFile& file) {
  Detection d;
  if (any_key(file, ".lora_down.weight") || any_key(file, ".lora_up.weight") || any_key(file, ".lokr_w") ||
      any_key(file, ".hada_w")) {
    d.format = KeyFormat::kKohyaLoRA;
    d.evidence = "keys ending in .lora_down.weight / .lora_up.weight (or LyCORIS .lokr_w* / .hada_w*)";
    d.components = split_components(file, {{"unet", "lora_unet_"},
                                           {"text_encoder", "lora_te"},
                                           {"transformer", "lora_transformer_"},
                                           {"transformer", "diffusion_model."}});  // musubi/ComfyUI (Wan)
    return d;
  }
  if (any_key(file, ".lora_A.weight") || any_key(file, ".lora_B.weight")) {
    d.format = KeyFormat::kPeftLoRA;
    d.evidence = "keys ending in .lora_A.weight / .lora_B.weight";
    d.components = split_components(file, {{"unet", "unet."},
                                           {"text_encoder", "text_encoder"},
                                           {"transformer", "transformer."},
                                           {"transformer", "diffusion_model."}});
    return d;
  }
  if (any_prefix(file, "model.diffusion_model.input_blocks.")) {
    detect_ldm(file, d);
    return d;
  }
  if (detect_flux(file, d)) return d;
  if (any_key(file, "patch_embedding.weight") && (any_key(file, "blocks.0.self_attn.q.weight") || any_key(file, "blocks.0.attn1.to_q.weight"))) {
    d.family = ModelFamily::kWan;
    d.format = any_key(file, "blocks.0.self_attn.q.weight") ? KeyFormat::kWanOriginal : KeyFormat::kDiffusers;
    d.evidence = "patch_embedding + blocks.0 attention";
    d.components = split_components(file, {{"transformer", ""}});
    return d;
  }
  if (any_prefix(file, "down_blocks.") && any_prefix(file, "conv_in.")) {
    d.format = KeyFormat::kDiffusers;
    if (any_key(file, "attn2.to_k.weight")) {
      const bool xl = file.contains("add_embedding.linear_1.weight");
      d.family = xl ? ModelFamily::kSDXL : context_dim(file) == 1024 ? ModelFamily::kSD2 : ModelFamily::kSD1;
      d.evidence = "diffusers UNet keys (down_blocks, attn2) with cross-attention width " + std::to_string(context_dim(file)) +
                   (xl ? ", add_embedding.linear_1.weight " + shape_text(file.info("add_embedding.linear_1.weight").shape) +
                             " (the size/pooled-text embedding)"
                       : ", no add_embedding");
      d.components = split_components(file, {{"unet", ""}});
    } else {
      d.evidence = "diffusers autoencoder keys (encoder/decoder)";
      d.components = split_components(file, {{"vae", ""}});
    }
    return d;
  }
  // Wan 2.1's causal video VAE: RMS-norm gammas (native names) or temporal upsamplers (diffusers).
  if (file.contains("decoder.middle.0.residual.0.gamma") ||
      (any_prefix(file, "decoder.up_blocks.") && any_key(file, "upsamplers.0.time_conv.weight"))) {
    d.family = ModelFamily::kWan;
    const bool native = file.contains("decoder.middle.0.residual.0.gamma");
    d.format = native ? KeyFormat::kWanOriginal : KeyFormat::kDiffusers;
    d.evidence = native ? "decoder.middle.0.residual.0.gamma (the Wan video VAE, native names)"
                        : "decoder.up_blocks.*.upsamplers.0.time_conv (the Wan video VAE, diffusers names)";
    d.components = split_components(file, {{"vae", ""}});
    return d;
  }
  if (any_prefix(file, "encoder.down_blocks.") && any_prefix(file, "decoder.up_blocks.")) {
    d.format = KeyFormat::kDiffusers;
    d.evidence = "diffusers AutoencoderKL keys";
    d.components = split_components(file, {{"vae", ""}});
    return d;
  }
  if (any_prefix(file, "text_model.encoder.layers.")) {
    d.format = KeyFormat::kDiffusers;
    d.evidence = "transformers CLIP text model keys";
    d.components = split_components(file, {{"text_encoder", ""}});
    return d;
  }
  d.evidence = "no known key layout";
  d.components = split_components(file, {});
  return d;
}

Detection detect_diffusers_folder(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  if (!fs::exists(folder / "model_index.json") && !fs::exists(folder / "unet")) {
    throw InputError(folder.string() + ": not a diffusers folder (no model_index.json or unet/)");
  }
  Detection d;
  d.format = KeyFormat::kDiffusers;
  std::string unet_evidence;
  bool lookalike = false;  // a shard of another architecture decides for the whole denoiser
  for (const char* component : {"unet", "transformer", "vae", "text_encoder", "text_encoder_2"}) {
    auto dir = folder / component;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".safetensors") continue;
      auto file = io::SafetensorsFile::open(entry.path());
      Detection part = detect_checkpoint(*file);
      if (std::string(component) == "unet" || std::string(component) == "transformer") {
        // A shard of a look-alike (or a T5 in transformer/) decides against the whole folder; a
        // shard holding only the last layers says nothing.
        const bool says_no = part.family == ModelFamily::kChroma || starts_with(part.evidence, "Flux.2") ||
                             (part.family == ModelFamily::kUnknown && part.format != KeyFormat::kUnknown);
        const bool says_nothing = part.family == ModelFamily::kUnknown && !says_no;
        if (!lookalike && (says_no || !says_nothing || unet_evidence.empty())) {
          d.family = part.family;
          unet_evidence = part.evidence;
          lookalike = says_no;
        }
      }
      for (auto c : part.components) {
        c.name = component;
        d.components.push_back(std::move(c));
      }
    }
  }
  // model_index.json names the pipeline; it decides only when the weights cannot.
  std::string pipeline;
  if (fs::exists(folder / "model_index.json")) {
    std::ifstream in(folder / "model_index.json");
    const auto index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_object() && index.contains("_class_name") && index["_class_name"].is_string()) {
      pipeline = index["_class_name"].get<std::string>();
    }
  }
  if (d.family == ModelFamily::kUnknown) {
    if (pipeline.find("StableDiffusionXL") != std::string::npos || fs::exists(folder / "text_encoder_2")) {
      d.family = ModelFamily::kSDXL;
    }
  }
  d.evidence = "diffusers folder" + (pipeline.empty() ? std::string() : " (" + pipeline + ")") +
               (unet_evidence.empty() ? std::string()
                                      : (fs::is_directory(folder / "transformer") ? ", transformer: " : ", unet: ") + unet_evidence);
  std::vector<std::string> expected;
  if (d.family == ModelFamily::kSD1 || d.family == ModelFamily::kSD2) {
    expected = {"unet", "vae", "text_encoder", "tokenizer"};
  } else if (d.family == ModelFamily::kSDXL) {
    expected = {"unet", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"};
    if (fs::is_directory(folder / "text_encoder_2")) d.evidence += ", text_encoder_2/";
  } else if (d.family == ModelFamily::kFlux) {
    expected = {"transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"};
  } else if (d.family == ModelFamily::kWan) {
    expected = {"transformer", "vae", "text_encoder", "tokenizer"};  // WanPipeline: umT5 alone
  }
  for (const auto& component : expected) {
    if (!fs::is_directory(folder / component)) d.missing[component] = component + "/";
  }
  return d;
}

void require_complete(const Detection& d, const std::string& source, const std::vector<std::string>& optional) {
  std::string parts;
  for (const auto& [component, keys] : d.missing) {
    if (std::find(optional.begin(), optional.end(), component) != optional.end()) continue;
    parts += "\n  " + component + ": " + keys;
  }
  if (parts.empty()) return;
  throw InputError(source + ": incomplete " + playbook::to_string(d.family) + " checkpoint (" + d.evidence + "); missing:" + parts);
}

}  // namespace lt::models
