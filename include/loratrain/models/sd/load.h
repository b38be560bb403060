// Loading SD weights from either layout users have: diffusers folders (unet/, vae/ with
// diffusion_pytorch_model.safetensors) and LDM single files (model.diffusion_model.*,
// first_stage_model.*). The module is always diffusers-named; LDM files go through key_maps.h.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/state_dict.h"

namespace lt::models::sd {

enum class WeightLayout { kDiffusers, kLdm };

// Which layout holds the UNet / VAE in `file` (nullopt: none). Diffusers keys are looked for under
// `diffusers_prefix` (empty for a component file; e.g. "unet." for some merged files).
std::optional<WeightLayout> detect_unet_layout(const io::SafetensorsFile& file, const std::string& diffusers_prefix = "");
std::optional<WeightLayout> detect_vae_layout(const io::SafetensorsFile& file, const std::string& diffusers_prefix = "");

// Loads every UNet tensor strictly (all missing, unexpected and mis-shaped names in one error).
// `options.prefix` applies to the diffusers layout; the LDM layout uses model.diffusion_model.
// and its key map (options.rename must be empty). Returns the number of tensors loaded.
size_t load_unet(UNet2DConditionModelImpl& unet, const io::SafetensorsFile& file, LoadOptions options = {});

// As load_unet for the VAE (LDM: first_stage_model.*, or LDM names under `options.prefix` as in
// BFL's ae.safetensors and ComfyUI's Flux files' vae.*, with the mid attention's 1x1-conv weights
// reshaped to Linear weights at load time).
size_t load_vae(AutoencoderKLImpl& vae, const io::SafetensorsFile& file, LoadOptions options = {});

// The weights of a diffusers component folder (unet/, vae/, text_encoder/, ...): the first of
// diffusion_pytorch_model.safetensors, model.safetensors and their .fp16 variants. Throws
// lt::InputError naming them (.bin files are not read).
std::filesystem::path diffusers_component_weights(const std::filesystem::path& folder);

// A diffusers component's config.json, parsed; lt::InputError when it is missing or not JSON.
nlohmann::json read_component_config(const std::filesystem::path& folder);

}  // namespace lt::models::sd
