// The families load_diffusion_model() dispatches to, one file each, and what they share.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "loratrain/models/registry.h"
#include "loratrain/train/diffusion_model.h"

namespace torch::nn {
class Module;
}

namespace lt::train {

// family_sd.cpp: Stable Diffusion 1.x / 2.x (UNet, VAE, CLIP text encoder).
std::unique_ptr<DiffusionModel> load_sd_model(const ModelLoadOptions& options, const models::Detection& detection);

// Shared by the family files.
namespace family {

nlohmann::json read_json(const std::filesystem::path& path);
// The one .safetensors weights file of a diffusers component folder.
std::filesystem::path component_weights(const std::filesystem::path& folder);
// "absolute path:size", for cache keys.
std::string file_identity(const std::filesystem::path& path);
// Device, dtype, eval mode and frozen: base weights never train (adapters live outside them).
void place(torch::nn::Module& module, at::ScalarType dtype, c10::Device device);

}  // namespace family

}  // namespace lt::train
