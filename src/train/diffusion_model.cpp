// load_diffusion_model(): detection, the family check, and dispatch to the family's file.
#include "loratrain/train/diffusion_model.h"

#include <torch/torch.h>

#include <fstream>

#include "families.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/sd/blocks.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/models/wan/vae.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::train {

namespace fs = std::filesystem;

at::ScalarType dtype_from_name(const std::string& name) {
  const std::string n = to_lower(name);
  if (n == "fp32" || n == "float32" || n == "float") return at::kFloat;
  if (n == "fp16" || n == "float16" || n == "half") return at::kHalf;
  if (n == "bf16" || n == "bfloat16") return at::kBFloat16;
  throw InputError("unknown dtype '" + name + "' (fp32, fp16 or bf16)");
}

namespace family {

std::string file_identity(const fs::path& path) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  return fs::absolute(path).string() + ":" + std::to_string(ec ? 0 : size);
}

void quantize_and_place(torch::nn::Module& module, std::optional<models::WeightQuantization> quantization,
                        std::optional<at::ScalarType> dtype, c10::Device device) {
  module.eval();
  for (auto& p : module.parameters()) p.set_requires_grad(false);
  if (quantization) models::quantize_linear_layers(module, *quantization);
  if (dtype) module.to(device, *dtype);
  else module.to(device);
}

int64_t quantize(torch::nn::Module& module, models::WeightQuantization format) {
  return models::quantize_linear_layers(module, format);
}

at::Tensor encode_kl(models::sd::AutoencoderKLImpl& vae, const ComputeMode& mode, c10::Device device, const at::Tensor& pixels,
                     std::optional<at::Generator> generator) {
  apply_compute_mode(vae, mode);
  torch::NoGradGuard no_grad;
  auto dist = vae.encode(pixels.to(device, at::kFloat));
  return vae.scale_latents(generator ? dist.sample(generator) : dist.mode());
}

at::Tensor decode_kl(models::sd::AutoencoderKLImpl& vae, const ComputeMode& mode, c10::Device device, const at::Tensor& latents) {
  apply_compute_mode(vae, mode);
  torch::NoGradGuard no_grad;
  return vae.decode(vae.unscale_latents(latents.to(device, at::kFloat))).to(at::kCPU).clamp(-1, 1);
}

void apply_compute_mode(torch::nn::Module& module, const ComputeMode& mode) {
  for (auto& m : module.modules(true)) {
    if (auto* a = m->as<models::sd::AttentionImpl>()) {
      a->options.query_chunk = mode.attention_chunk;
      a->options.cpu_speed_rule = !mode.simulated_device;
    }
    // The same for the text encoders' and the Wan VAE's attention, and the CPU's faster convolutions
    // (models/packed_conv.h: a GPU keeps no packed weights).
    if (auto* a = m->as<models::CLIPAttentionImpl>()) a->cpu_speed_rule = !mode.simulated_device;
    if (auto* a = m->as<models::T5AttentionImpl>()) a->cpu_speed_rule = !mode.simulated_device;
    if (auto* a = m->as<models::wan::WanVaeAttentionImpl>()) a->cpu_speed_rule = !mode.simulated_device;
    if (auto* conv = m->as<models::Conv2dImpl>()) conv->cpu_speed_rule = !mode.simulated_device;
    if (auto* vae = m->as<models::sd::AutoencoderKLImpl>()) vae->use_tiling = mode.vae_tiling;
  }
}

const at::Tensor& text_tensor(const TextEmbedding& text, const std::string& name) {
  std::string present;
  for (const auto& [key, tensor] : text) {
    if (key == name) return tensor;
    present += (present.empty() ? "" : ", ") + key;
  }
  throw Error(ExitCode::kRuntime, "text conditioning has no '" + name + "' (has: " + present + ")");
}

}  // namespace family

namespace {

using Loader = std::unique_ptr<DiffusionModel> (*)(const ModelLoadOptions&, const models::Detection&);

// The families `run` trains, and the function that loads each.
struct Trained {
  ModelFamily family;
  Loader load;
};
constexpr Trained kTrained[] = {
    {ModelFamily::kSD1, load_sd_model},
    {ModelFamily::kSD2, load_sd_model},
    {ModelFamily::kSDXL, load_sdxl_model},
    {ModelFamily::kFlux, load_flux_model},
    {ModelFamily::kWan, load_wan_model},
};

std::string family_list() {
  std::string out;
  for (const auto& t : kTrained) out += (out.empty() ? "" : ", ") + std::string(playbook::to_string(t.family));
  return out;
}

models::Detection detect(const fs::path& path) {
  if (!fs::exists(path)) throw InputError(path.string() + ": model not found (model.name_or_path)");
  if (fs::is_directory(path)) return models::detect_diffusers_folder(path);
  return models::detect_checkpoint(*io::SafetensorsFile::open(path));
}

// The detection of a checkpoint `run` can train, or one clear error.
std::pair<models::Detection, Loader> trainable(const ModelLoadOptions& options) {
  const fs::path& path = options.name_or_path;
  models::Detection detection = detect(path);
  if (detection.is_lora()) {
    throw InputError(path.string() + ": this is a LoRA file, not a base model (model.name_or_path must be the base checkpoint)");
  }
  const std::string found = playbook::to_string(detection.family);
  if (options.expected && *options.expected != detection.family) {
    throw InputError(path.string() + ": the config says model.arch " + playbook::to_string(*options.expected) +
                     ", but this is " + (detection.family == ModelFamily::kUnknown ? "not a known" : "a " + found) +
                     " checkpoint (" + detection.evidence + "); fix model.arch or model.name_or_path");
  }
  for (const auto& t : kTrained) {
    if (t.family == detection.family) return {detection, t.load};
  }
  if (detection.family == ModelFamily::kUnknown) {
    throw InputError(path.string() + ": not a checkpoint of a family lora-train knows (" + detection.evidence + ")");
  }
  throw InputError(path.string() + ": a " + found + " checkpoint (" + detection.evidence + "); lora-train trains " +
                   family_list() + " LoRAs in this version, " + found + " is not supported yet");
}

}  // namespace

ModelFamily identify_model(const ModelLoadOptions& options) { return trainable(options).first.family; }

std::unique_ptr<DiffusionModel> load_diffusion_model(const ModelLoadOptions& options) {
  auto [detection, load] = trainable(options);
  return load(options, detection);
}

}  // namespace lt::train
