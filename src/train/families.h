// The families load_diffusion_model() dispatches to, one file each, and what they share.
#pragma once
#include <c10/core/Device.h>

#include <filesystem>
#include <functional>
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
// family_sdxl.cpp: SDXL (UNet with text-time conditioning, VAE, CLIP ViT-L + OpenCLIP ViT-bigG).
std::unique_ptr<DiffusionModel> load_sdxl_model(const ModelLoadOptions& options, const models::Detection& detection);
// family_flux.cpp: Flux.1 dev / schnell (FluxTransformer2DModel, 16-channel VAE, CLIP-L + T5-XXL).
std::unique_ptr<DiffusionModel> load_flux_model(const ModelLoadOptions& options, const models::Detection& detection);
// family_wan.cpp: Wan 2.1 text-to-video 1.3B / 14B (WanTransformer3DModel, causal video VAE, umT5).
std::unique_ptr<DiffusionModel> load_wan_model(const ModelLoadOptions& options, const models::Detection& detection);

// Shared by the family files.
namespace family {

// "absolute path:size", for cache keys.
std::string file_identity(const std::filesystem::path& path);
// Device, dtype, eval mode and frozen: base weights never train (adapters live outside them).
void place(torch::nn::Module& module, at::ScalarType dtype, c10::Device device);
// `mode` on every attention layer and VAE inside `module`.
void apply_compute_mode(torch::nn::Module& module, const ComputeMode& mode);
// The named text tensor of a conditioning (lt::Error naming what is there when it is absent).
const at::Tensor& text_tensor(const TextEmbedding& text, const std::string& name);

// A frozen component the low-VRAM path may take off the device until it is used again: on a GPU
// it waits in host RAM; on the CPU, where device memory is host memory (e.g. under a simulated
// VRAM budget), it is dropped and loaded again from the checkpoint.
template <class Holder>  // a TORCH_MODULE holder
class Releasable {
 public:
  // `load` builds, loads and places the module on `device`.
  Releasable(std::function<Holder()> load, c10::Device device) : load_(std::move(load)), device_(device) {}
  Holder& get() {
    if (module_.is_empty()) module_ = load_();
    else if (offloaded_) module_->to(device_);
    offloaded_ = false;
    return module_;
  }
  void release() {
    if (module_.is_empty() || offloaded_) return;
    if (device_.is_cpu()) module_ = Holder(nullptr);
    else module_->to(c10::Device(c10::kCPU));
    offloaded_ = !module_.is_empty();
  }

 private:
  std::function<Holder()> load_;
  c10::Device device_;
  Holder module_{nullptr};
  bool offloaded_ = false;
};

}  // namespace family

}  // namespace lt::train
