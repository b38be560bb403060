#include "loratrain/models/sd/load.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "loratrain/models/key_maps.h"
#include "loratrain/models/json_fields.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models::sd {

std::optional<WeightLayout> detect_unet_layout(const io::SafetensorsFile& file, const std::string& prefix) {
  if (file.contains("model.diffusion_model.input_blocks.0.0.weight")) return WeightLayout::kLdm;
  if (file.contains(prefix + "conv_in.weight") && file.contains(prefix + "time_embedding.linear_1.weight")) {
    return WeightLayout::kDiffusers;
  }
  return std::nullopt;
}

std::optional<WeightLayout> detect_vae_layout(const io::SafetensorsFile& file, const std::string& prefix) {
  if (file.contains("first_stage_model.encoder.conv_in.weight") || file.contains("first_stage_model.decoder.conv_in.weight")) {
    return WeightLayout::kLdm;
  }
  // The LDM names under another root (BFL's ae.safetensors: none; ComfyUI's Flux files: vae.).
  if (file.contains(prefix + "encoder.down.0.block.0.conv1.weight")) return WeightLayout::kLdm;
  if (file.contains(prefix + "encoder.conv_in.weight") || file.contains(prefix + "decoder.conv_in.weight")) {
    return WeightLayout::kDiffusers;
  }
  return std::nullopt;
}

namespace {

// A rename through `map` for keys under its LDM root; keys no row covers are kept under a marker
// name so the strict loader reports them as unexpected instead of dropping them silently.
std::function<std::string(const std::string&)> ldm_rename(const KeyMap& map,
                                                          std::function<bool(const std::string&, const std::string&)> skip = {}) {
  return [map, skip](const std::string& key) -> std::string {
    const std::string full = map.ldm_root() + key;
    std::string mapped = map.to_diffusers(full);
    if (mapped.empty()) return "<no diffusers name for " + full + ">";
    if (skip && skip(full, mapped)) return {};
    return mapped;
  };
}

}  // namespace

size_t load_unet(UNet2DConditionModelImpl& unet, const io::SafetensorsFile& file, LoadOptions options) {
  auto layout = detect_unet_layout(file, options.prefix);
  if (!layout) {
    throw InputError(file.path().string() + ": no Stable Diffusion UNet found (neither model.diffusion_model.* nor " +
                     options.prefix + "conv_in.weight)");
  }
  if (*layout == WeightLayout::kLdm) {
    TORCH_CHECK(!options.rename, "load_unet: the LDM layout brings its own key map");
    const KeyMap map = unet_ldm_key_map(unet.config);
    options.prefix = map.ldm_root();
    options.rename = ldm_rename(map);
  }
  return load_state_dict(unet, file, options);
}

size_t load_vae(AutoencoderKLImpl& vae, const io::SafetensorsFile& file, LoadOptions options) {
  auto layout = detect_vae_layout(file, options.prefix);
  if (!layout) {
    throw InputError(file.path().string() + ": no VAE found (neither first_stage_model.* nor " + options.prefix +
                     "encoder.conv_in.weight)");
  }
  if (*layout == WeightLayout::kDiffusers) return load_state_dict(vae, file, options);

  TORCH_CHECK(!options.rename, "load_vae: the LDM layout brings its own key map");
  const bool sd_root = file.contains("first_stage_model.encoder.conv_in.weight") ||
                       file.contains("first_stage_model.decoder.conv_in.weight");
  const KeyMap map = vae_ldm_key_map(vae.config, sd_root ? "first_stage_model." : options.prefix);
  // Older LDM files store the mid attention projections as 1x1 convs [C, C, 1, 1]: those are
  // loaded below, reshaped, after the strict pass has checked everything else.
  std::vector<std::pair<std::string, std::string>> conv_shaped;  // (file key, module key)
  auto skip = [&file, &conv_shaped](const std::string& full, const std::string& mapped) {
    if (is_vae_attention_weight(mapped) && file.info(full).shape.size() == 4) {
      conv_shaped.emplace_back(full, mapped);
      return true;
    }
    return false;
  };
  auto targets = module_tensors(vae);
  for (const auto& [key, tensor] : targets) {
    if (is_vae_attention_weight(key)) options.optional_keys.insert(key);
  }
  options.prefix = map.ldm_root();
  options.rename = ldm_rename(map, skip);
  size_t loaded = load_state_dict(vae, file, options);

  // Every attention weight must have come from one of the two passes.
  std::set<std::string> reshaped;
  torch::NoGradGuard no_grad;
  for (const auto& [file_key, module_key] : conv_shaped) {
    at::Tensor& target = targets.at(module_key);
    const auto& shape = file.info(file_key).shape;
    if (shape.size() != 4 || shape[2] != 1 || shape[3] != 1 || shape[0] != target.size(0) || shape[1] != target.size(1)) {
      throw InputError(file.path().string() + ": " + file_key + " has shape " + c10::str(at::IntArrayRef(shape)) +
                       ", expected " + c10::str(target.sizes()) + " or a 1x1 conv of it");
    }
    target.copy_(file.load(file_key, options.dtype.value_or(target.scalar_type())).view(target.sizes()));
    reshaped.insert(module_key);
    ++loaded;
  }
  std::vector<std::string> missing;
  for (const auto& [key, tensor] : targets) {
    if (is_vae_attention_weight(key) && !reshaped.count(key) &&
        !file.contains(map.to_ldm(key))) {
      missing.push_back(map.to_ldm(key));
    }
  }
  if (!missing.empty()) {
    std::string m = file.path().string() + ": checkpoint does not match the model\n  " + std::to_string(missing.size()) + " missing:";
    for (const auto& k : missing) m += "\n    " + k;
    throw InputError(m);
  }
  return loaded;
}

std::filesystem::path diffusers_component_weights(const std::filesystem::path& folder) {
  for (const char* name : {"diffusion_pytorch_model.safetensors", "model.safetensors",
                           "diffusion_pytorch_model.fp16.safetensors", "model.fp16.safetensors"}) {
    if (std::filesystem::exists(folder / name)) return folder / name;
  }
  throw InputError(folder.string() + ": no .safetensors weights (diffusion_pytorch_model.safetensors or "
                   "model.safetensors); .bin files are not read: convert them to safetensors");
}

nlohmann::json read_component_config(const std::filesystem::path& folder) {
  return read_json_file(folder / "config.json", "component config (a diffusers component folder needs its config.json)");
}

}  // namespace lt::models::sd
