// The families load_diffusion_model() dispatches to, one file each, and what they share.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "loratrain/models/registry.h"
#include "loratrain/train/diffusion_model.h"

namespace torch::nn {
class Module;
}
namespace lt::models::sd {
class AutoencoderKLImpl;
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
// `mode` on every attention layer, convolution and VAE inside `module`.
void apply_compute_mode(torch::nn::Module& module, const ComputeMode& mode);
// The named text tensor of a conditioning (lt::Error naming what is there when it is absent).
const at::Tensor& text_tensor(const TextEmbedding& text, const std::string& name);

// A frozen module built and loaded on the host, then made ready on `device`: its Linear weights
// quantized there first when `quantization` is set (the device never holds their widened copies),
// then moved, in `dtype` (nullopt: the dtypes it was loaded in), eval mode and frozen: base weights
// never train (adapters live outside them).
void quantize_and_place(torch::nn::Module& module, std::optional<models::WeightQuantization> quantization,
                        std::optional<at::ScalarType> dtype, c10::Device device);
// models::quantize_linear_layers: the bytes it released.
int64_t quantize(torch::nn::Module& module, models::WeightQuantization format);

// SD, SDXL and Flux's AutoencoderKL (fp32, on `device`, in compute mode `mode`): pixels [B, 3, H, W]
// in [-1, 1] -> scaled latents (sampled with `generator`, else the mode), and scaled latents ->
// pixels in [-1, 1] on the CPU.
at::Tensor encode_kl(models::sd::AutoencoderKLImpl& vae, const ComputeMode& mode, c10::Device device, const at::Tensor& pixels,
                     std::optional<at::Generator> generator);
at::Tensor decode_kl(models::sd::AutoencoderKLImpl& vae, const ComputeMode& mode, c10::Device device, const at::Tensor& latents);

// A frozen component (a text encoder, the VAE) loaded when first needed, which the low-VRAM path
// may take off the device until it is used again: on a GPU it waits in host RAM; on the CPU, where
// device memory is host memory (e.g. under a simulated VRAM budget), it is dropped and loaded again
// from the checkpoint. Every load is quantized on the host before it is placed once quantize() has
// been called (or from the start, model.quantize_te).
template <class Holder>  // a TORCH_MODULE holder
class Releasable {
 public:
  // `load` builds and loads the module on the host; it is placed on the device in `dtype` (nullopt:
  // the dtypes it was loaded in); the model's options give the device and the compute mode, which
  // every use applies (apply_compute_mode).
  Releasable(std::function<Holder()> load, std::optional<at::ScalarType> dtype, const ModelLoadOptions& options,
             std::optional<models::WeightQuantization> quantization = std::nullopt)
      : load_(std::move(load)), dtype_(dtype), device_(options.device), compute_(options.compute), quantization_(quantization) {}
  Holder& get() {
    if (module_.is_empty()) {
      module_ = load_();
      quantize_and_place(*module_, quantization_, dtype_, device_);
    } else if (offloaded_) {
      module_->to(device_);
    }
    offloaded_ = false;
    apply_compute_mode(*module_, compute_);
    return module_;
  }
  void release() {
    if (module_.is_empty() || offloaded_) return;
    if (device_.is_cpu()) module_ = Holder(nullptr);
    else module_->to(c10::Device(c10::kCPU));
    offloaded_ = !module_.is_empty();
  }
  // Quantizes the module where it is, if it is loaded, and every later load: the bytes released.
  int64_t quantize(models::WeightQuantization format) {
    quantization_ = format;
    return module_.is_empty() ? 0 : family::quantize(*module_, format);
  }
  // What a load quantizes to (the T5 loaders keep an fp8 file's codes when it is fp8).
  std::optional<models::WeightQuantization> quantization() const { return quantization_; }

 private:
  std::function<Holder()> load_;
  std::optional<at::ScalarType> dtype_;
  c10::Device device_;
  const ComputeMode& compute_;
  std::optional<models::WeightQuantization> quantization_;
  Holder module_{nullptr};
  bool offloaded_ = false;
};

}  // namespace family

}  // namespace lt::train
