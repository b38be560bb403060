#include "loratrain/models/registry.h"

#include <nlohmann/json.hpp>

#include <fstream>

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
  for (const auto& [name, prefix] : rows) out.push_back(Component{name, prefix});
  Component other{"other", ""};
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

// Cross-attention context width of an SD UNet: 768 = SD1 (CLIP ViT-L), 1024 = SD2 (OpenCLIP ViT-H).
int64_t context_dim(const io::SafetensorsFile& file) {
  for (const auto& t : file.tensors()) {
    if (ends_with(t.name, "attn2.to_k.weight") && t.shape.size() == 2) return t.shape[1];
  }
  return 0;
}

}  // namespace

Detection detect_checkpoint(const io::SafetensorsFile& file) {
  Detection d;
  if (any_key(file, ".lora_down.weight") || any_key(file, ".lora_up.weight")) {
    d.format = KeyFormat::kKohyaLoRA;
    d.evidence = "keys ending in .lora_down.weight / .lora_up.weight";
    d.components = split_components(file, {{"unet", "lora_unet_"}, {"text_encoder", "lora_te"}, {"transformer", "lora_transformer_"}});
    return d;
  }
  if (any_key(file, ".lora_A.weight") || any_key(file, ".lora_B.weight")) {
    d.format = KeyFormat::kPeftLoRA;
    d.evidence = "keys ending in .lora_A.weight / .lora_B.weight";
    d.components = split_components(file, {{"unet", "unet."}, {"text_encoder", "text_encoder"}, {"transformer", "transformer."}});
    return d;
  }
  if (any_prefix(file, "model.diffusion_model.input_blocks.")) {
    d.format = KeyFormat::kLDM;
    if (any_prefix(file, "conditioner.embedders.") || any_prefix(file, "model.diffusion_model.label_emb.")) {
      d.family = ModelFamily::kSDXL;
      d.evidence = "model.diffusion_model.label_emb / conditioner.embedders";
      d.components = split_components(file, {{"unet", "model.diffusion_model."},
                                             {"vae", "first_stage_model."},
                                             {"text_encoders", "conditioner.embedders."}});
    } else {
      int64_t ctx = context_dim(file);
      d.family = ctx == 1024 || any_prefix(file, "cond_stage_model.model.") ? ModelFamily::kSD2 : ModelFamily::kSD1;
      d.evidence = "model.diffusion_model.input_blocks with cross-attention width " + std::to_string(ctx);
      d.components = split_components(file, {{"unet", "model.diffusion_model."},
                                             {"vae", "first_stage_model."},
                                             {"text_encoder", "cond_stage_model."}});
    }
    return d;
  }
  if (any_key(file, "double_blocks.0.img_attn.qkv.weight")) {
    d.family = ModelFamily::kFlux;
    d.format = KeyFormat::kBFL;
    d.evidence = "double_blocks.0.img_attn.qkv.weight";
    d.components = split_components(file, {{"transformer", ""}});
    return d;
  }
  if (any_prefix(file, "single_transformer_blocks.") && any_prefix(file, "transformer_blocks.")) {
    d.family = ModelFamily::kFlux;
    d.format = KeyFormat::kDiffusers;
    d.evidence = "transformer_blocks + single_transformer_blocks";
    d.components = split_components(file, {{"transformer", ""}});
    return d;
  }
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
      d.family = any_prefix(file, "add_embedding.") ? ModelFamily::kSDXL
                 : context_dim(file) == 1024           ? ModelFamily::kSD2
                                                       : ModelFamily::kSD1;
      d.evidence = "diffusers UNet keys (down_blocks, attn2)";
      d.components = split_components(file, {{"unet", ""}});
    } else {
      d.evidence = "diffusers autoencoder keys (encoder/decoder)";
      d.components = split_components(file, {{"vae", ""}});
    }
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
  if (!std::filesystem::exists(folder / "model_index.json") && !std::filesystem::exists(folder / "unet")) {
    throw InputError(folder.string() + ": not a diffusers folder (no model_index.json or unet/)");
  }
  Detection d;
  d.format = KeyFormat::kDiffusers;
  d.evidence = "diffusers folder";
  for (const char* component : {"unet", "transformer", "vae", "text_encoder", "text_encoder_2"}) {
    auto dir = folder / component;
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() != ".safetensors") continue;
      auto file = io::SafetensorsFile::open(entry.path());
      Detection part = detect_checkpoint(*file);
      if (std::string(component) == "unet" || std::string(component) == "transformer") d.family = part.family;
      for (auto c : part.components) {
        c.name = component;
        d.components.push_back(std::move(c));
      }
    }
  }
  if (d.family == ModelFamily::kUnknown && std::filesystem::exists(folder / "text_encoder_2")) d.family = ModelFamily::kSDXL;
  return d;
}

}  // namespace lt::models
