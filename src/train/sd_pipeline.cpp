#include "loratrain/train/sd_pipeline.h"

#include <torch/torch.h>

#include <fstream>

#include "loratrain/models/key_maps.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/state_dict.h"
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

namespace {

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path.string() + ": cannot read");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path.string() + ": not valid JSON (" + e.what() + ")");
  }
}

// The one .safetensors weights file of a diffusers component folder.
fs::path component_weights(const fs::path& folder) {
  for (const char* name : {"diffusion_pytorch_model.safetensors", "model.safetensors",
                           "diffusion_pytorch_model.fp16.safetensors", "model.fp16.safetensors"}) {
    if (fs::exists(folder / name)) return folder / name;
  }
  throw InputError(folder.string() + ": no .safetensors weights (diffusion_pytorch_model.safetensors or "
                   "model.safetensors); .bin files are not read: convert them to safetensors");
}

std::string file_identity(const fs::path& p) {
  std::error_code ec;
  auto size = fs::file_size(p, ec);
  return fs::absolute(p).string() + ":" + std::to_string(ec ? 0 : size);
}

// Device, dtype, eval mode, and frozen: base weights never train (adapters live outside them).
void place(torch::nn::Module& module, at::ScalarType dtype, c10::Device device) {
  module.to(device, dtype);
  module.eval();
  for (auto& p : module.parameters()) p.set_requires_grad(false);
}

}  // namespace

SDPipeline::SDPipeline(SDLoadOptions options) : options_(std::move(options)) {
  const fs::path& path = options_.name_or_path;
  if (!fs::exists(path)) throw InputError(path.string() + ": model not found (model.name_or_path)");
  single_file_ = !fs::is_directory(path);
  models::Detection detection;
  if (single_file_) {
    single_file_handle_ = io::SafetensorsFile::open(path);
    detection = models::detect_checkpoint(*single_file_handle_);
  } else {
    detection = models::detect_diffusers_folder(path);
  }
  family_ = detection.family;
  if (family_ == models::ModelFamily::kLoRA) {
    throw InputError(path.string() + ": this is a LoRA file, not a base model (model.name_or_path must be the base checkpoint)");
  }
  if (family_ != models::ModelFamily::kSD1 && family_ != models::ModelFamily::kSD2) {
    throw InputError(path.string() + ": a " + models::family_name(family_) + " checkpoint (" + detection.evidence +
                     "); lora-train trains SD 1.x/2.x LoRAs in this version, other families are not supported yet");
  }
  if (single_file_ && detection.format != models::KeyFormat::kLDM) {
    throw InputError(path.string() + ": holds only one component (" + detection.evidence +
                     "); give a full single-file checkpoint or a diffusers folder");
  }
  model_id_ = std::string(models::family_name(family_)) + "|" + file_identity(single_file_ ? path : path / "unet") + "|" +
              c10::toString(options_.dtype);

  // UNet
  if (single_file_) {
    auto config = models::sd::UNetConfig::detect_from_weights(*single_file_handle_, "model.diffusion_model.");
    unet_ = models::sd::UNet2DConditionModel(config);
    models::sd::load_unet(*unet_, *single_file_handle_);
  } else {
    auto config = models::sd::UNetConfig::from_json(read_json(path / "unet" / "config.json"));
    unet_ = models::sd::UNet2DConditionModel(config);
    auto weights = io::SafetensorsFile::open(component_weights(path / "unet"));
    models::sd::load_unet(*unet_, *weights);
  }
  place(*unet_, options_.dtype, options_.device);

  // Tokenizer
  if (options_.tokenizer_path) {
    tokenizer_ = std::make_unique<models::CLIPTokenizer>(models::load_clip_tokenizer(*options_.tokenizer_path));
  } else if (!single_file_ && fs::exists(path / "tokenizer")) {
    tokenizer_ = std::make_unique<models::CLIPTokenizer>(models::load_clip_tokenizer(path / "tokenizer"));
  } else if (single_file_ && fs::exists(path.parent_path() / "tokenizer")) {
    tokenizer_ = std::make_unique<models::CLIPTokenizer>(models::load_clip_tokenizer(path.parent_path() / "tokenizer"));
  } else {
    throw InputError(path.string() + ": a single-file checkpoint carries no tokenizer vocabulary: set "
                     "model.tokenizer_path to a diffusers tokenizer/ folder (vocab.json + merges.txt) or to "
                     "OpenAI's bpe_simple_vocab_16e6.txt.gz");
  }
  if (!options_.defer_encoders) {
    load_text_encoder();
    load_vae();
  }
}

void SDPipeline::load_text_encoder() {
  const fs::path& path = options_.name_or_path;
  if (single_file_) {
    const std::string prefix = "cond_stage_model.transformer.";
    const models::KeyMap key_map = models::clip_ldm_key_map();
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& t : single_file_handle_->tensors()) {
      if (!starts_with(t.name, prefix)) continue;
      const std::string key = key_map.to_diffusers(t.name);
      if (!key.empty()) shapes[key] = t.shape;
    }
    if (shapes.empty()) {
      throw InputError(path.string() + ": no text encoder weights under " + prefix +
                       " (SD2's OpenCLIP single files are not supported yet: use a diffusers folder)");
    }
    auto config = models::CLIPTextConfig::detect_from_weights(shapes);
    text_encoder_ = models::CLIPTextModel(config);
    auto load = models::clip_text_load_options();
    load.prefix = prefix;
    load.rename = [&key_map, &prefix](const std::string& key) { return key_map.to_diffusers(prefix + key); };
    models::load_state_dict(*text_encoder_, *single_file_handle_, load);
  } else {
    auto config = models::CLIPTextConfig::from_file(path / "text_encoder" / "config.json");
    text_encoder_ = models::CLIPTextModel(config);
    auto weights = io::SafetensorsFile::open(component_weights(path / "text_encoder"));
    models::load_state_dict(*text_encoder_, *weights, models::clip_text_load_options());
  }
  place(*text_encoder_, options_.dtype, options_.device);
}

void SDPipeline::load_vae() {
  const fs::path& path = options_.name_or_path;
  if (options_.vae_path) {
    auto file = io::SafetensorsFile::open(*options_.vae_path);
    const std::string prefix = file->contains("first_stage_model.encoder.conv_in.weight") ? "first_stage_model." : "";
    vae_ = models::sd::AutoencoderKL(models::sd::VAEConfig::detect_from_weights(*file, prefix));
    models::sd::load_vae(*vae_, *file);
  } else if (single_file_) {
    auto config = models::sd::VAEConfig::detect_from_weights(*single_file_handle_, "first_stage_model.");
    vae_ = models::sd::AutoencoderKL(config);
    models::sd::load_vae(*vae_, *single_file_handle_);
  } else {
    auto config = models::sd::VAEConfig::from_json(read_json(path / "vae" / "config.json"));
    vae_ = models::sd::AutoencoderKL(config);
    auto weights = io::SafetensorsFile::open(component_weights(path / "vae"));
    models::sd::load_vae(*vae_, *weights);
  }
  // The VAE runs in fp32 whatever the training dtype: SD's VAE overflows in fp16 (AI Toolkit and
  // kohya keep it in fp32 unless told otherwise), and it never trains.
  place(*vae_, at::kFloat, options_.device);
}

bool SDPipeline::has(Component c) const {
  switch (c) {
    case Component::unet: return !unet_.is_empty();
    case Component::vae: return !vae_.is_empty();
    case Component::text_encoder: return !text_encoder_.is_empty();
  }
  return false;
}

void SDPipeline::release(Component c) {
  // On a GPU the module waits in host RAM; on the CPU (where "device" memory is host memory, e.g.
  // under a simulated VRAM budget) it is dropped and read from the checkpoint again when needed.
  if (c == Component::vae && !vae_.is_empty()) {
    if (options_.device.is_cpu()) vae_ = models::sd::AutoencoderKL(nullptr);
    else vae_->to(c10::Device(c10::kCPU));
    vae_offloaded_ = true;
  }
  if (c == Component::text_encoder && !text_encoder_.is_empty()) {
    if (options_.device.is_cpu()) text_encoder_ = models::CLIPTextModel(nullptr);
    else text_encoder_->to(c10::Device(c10::kCPU));
    text_encoder_offloaded_ = true;
  }
}

models::sd::AutoencoderKL& SDPipeline::vae() {
  if (vae_.is_empty()) load_vae();
  else if (vae_offloaded_) vae_->to(options_.device);
  vae_offloaded_ = false;
  return vae_;
}

models::CLIPTextModel& SDPipeline::text_encoder() {
  if (text_encoder_.is_empty()) load_text_encoder();
  else if (text_encoder_offloaded_) text_encoder_->to(options_.device);
  text_encoder_offloaded_ = false;
  return text_encoder_;
}

at::Tensor SDPipeline::encode_text(const std::vector<std::string>& captions) {
  std::vector<int64_t> ids;
  const auto encodings = tokenizer_->encode_batch(captions);
  for (const auto& e : encodings) ids.insert(ids.end(), e.input_ids.begin(), e.input_ids.end());
  const auto length = static_cast<int64_t>(encodings.empty() ? 0 : encodings[0].input_ids.size());
  auto input_ids = torch::tensor(ids, torch::kLong).view({static_cast<int64_t>(captions.size()), length});
  auto& te = text_encoder();
  return te->forward(input_ids.to(options_.device)).last_hidden_state;
}

at::Tensor SDPipeline::encode_images(const at::Tensor& pixels, std::optional<at::Generator> generator) {
  auto& vae_module = vae();
  torch::NoGradGuard no_grad;
  auto dist = vae_module->encode(pixels.to(options_.device, at::kFloat));
  at::Tensor z = generator ? dist.sample(generator) : dist.mode();
  return vae_module->scale_latents(z);
}

at::Tensor SDPipeline::decode_latents(const at::Tensor& latents) {
  auto& vae_module = vae();
  torch::NoGradGuard no_grad;
  return vae_module->decode(vae_module->unscale_latents(latents.to(options_.device, at::kFloat))).to(at::kCPU).clamp(-1, 1);
}

int64_t SDPipeline::vae_scale_factor() { return vae()->downscale_factor(); }

}  // namespace lt::train
