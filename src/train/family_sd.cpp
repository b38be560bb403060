// Stable Diffusion 1.x / 2.x: UNet2DConditionModel, AutoencoderKL (4 latent channels; SD's 8 pixels per latent cell, or what the VAE config gives),
// one CLIP text encoder whose final hidden states condition the UNet; DDPM noise with epsilon
// (SD1, SD2-base) or v-prediction (SD2 768-v, `model.is_v_pred`). Loaded from a single-file
// checkpoint (LDM keys, as downloaded from model sites) or a diffusers folder (unet/, vae/,
// text_encoder/, tokenizer/).
#include <torch/torch.h>

#include "families.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_checkpoint.h"
#include "loratrain/models/text/clip_tokenizer.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::train {

namespace fs = std::filesystem;

namespace {

// A separate VAE file (model.vae_path) in diffusers names, or in LDM names as extracted from a checkpoint.
std::string vae_file_prefix(const io::SafetensorsFile& file) {
  return file.contains("first_stage_model.encoder.conv_in.weight") ? "first_stage_model." : "";
}

class SDModel final : public DiffusionModel {
 public:
  SDModel(ModelLoadOptions options, const models::Detection& detection);

  const ModelTraits& traits() const override { return traits_; }
  const std::string& model_id() const override { return model_id_; }
  TextEmbedding encode_text(const std::vector<std::string>& captions) override;
  at::Tensor encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) override;
  at::Tensor decode_latents(const at::Tensor& latents) override;
  at::Tensor predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) override;
  std::vector<LoRATarget> lora_targets() override;
  std::map<std::string, std::string> lora_metadata() const override;
  void set_gradient_checkpointing(bool enabled) override { unet_->set_gradient_checkpointing(enabled); }
  void set_compute_mode(const ComputeMode& mode) override;
  void set_training(bool training) override { training ? unet_->train() : unet_->eval(); }
  int64_t quantize_base(bool text_encoders, models::WeightQuantization format) override;
  void release(Encoder which) override;

 private:
  models::sd::VAEConfig vae_config() const;
  models::sd::AutoencoderKL load_vae() const;
  models::CLIPTextModel load_text_encoder() const;

  ModelLoadOptions options_;
  ModelTraits traits_;
  bool single_file_ = false;
  std::string model_id_;
  std::shared_ptr<io::SafetensorsFile> single_file_handle_;
  models::sd::UNet2DConditionModel unet_{nullptr};
  // The VAE runs in fp32 whatever the training dtype: SD's VAE overflows in fp16 (AI Toolkit and
  // kohya keep it in fp32 unless told otherwise), and it never trains.
  family::Releasable<models::sd::AutoencoderKL> vae_{[this] { return load_vae(); }, at::kFloat, options_};
  family::Releasable<models::CLIPTextModel> text_encoder_{[this] { return load_text_encoder(); }, options_.dtype,
                                                         options_, options_.text_quantization};
  std::unique_ptr<models::CLIPTokenizer> tokenizer_;
  const lora::ComponentSpec unet_spec_ = lora::ComponentSpec::sd_unet();
  const lora::ComponentSpec text_spec_ = lora::ComponentSpec::text_encoder(0);
};

SDModel::SDModel(ModelLoadOptions options, const models::Detection& detection) : options_(std::move(options)) {
  if (options_.assistant_lora) throw InputError("model.assistant_lora_path: assistant adapters are for Flux models only");
  const fs::path& path = options_.name_or_path;
  single_file_ = !fs::is_directory(path);
  if (single_file_) {
    if (detection.format != models::KeyFormat::kLDM) {
      throw InputError(path.string() + ": holds only one component (" + detection.evidence +
                       "); give a full single-file checkpoint or a diffusers folder");
    }
    single_file_handle_ = io::SafetensorsFile::open(path);
  }
  traits_.family = detection.family;
  traits_.prediction = options_.v_prediction ? sample::PredictionType::kVPrediction : sample::PredictionType::kEpsilon;
  // SD1.x and SD2.x share SD1.5's scheduler config; v-prediction models (SD2.x 768) their own.
  traits_.scheduler_config = options_.v_prediction ? "sd2_v" : "sd15";
  model_id_ = std::string(playbook::to_string(traits_.family)) + "|" +
              family::file_identity(single_file_ ? path : path / "unet") + "|" + c10::toString(options_.dtype);

  if (single_file_) {
    auto config = models::sd::UNetConfig::detect_from_weights(*single_file_handle_, "model.diffusion_model.");
    unet_ = models::sd::UNet2DConditionModel(config);
    models::sd::load_unet(*unet_, *single_file_handle_);
  } else {
    auto config = models::sd::UNetConfig::from_json(models::sd::read_component_config(path / "unet"));
    unet_ = models::sd::UNet2DConditionModel(config);
    auto weights = io::SafetensorsFile::open(models::sd::diffusers_component_weights(path / "unet"));
    models::sd::load_unet(*unet_, *weights);
  }
  family::quantize_and_place(*unet_, options_.denoiser_quantization, options_.dtype, options_.device);
  family::apply_compute_mode(*unet_, options_.compute);
  traits_.latent_channels = unet_->config.in_channels;

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
  // A trained text encoder is needed at once (its adapters attach at load).
  if (!options_.defer_encoders || options_.train_text_encoder) text_encoder_.get();
  if (!options_.defer_encoders) vae_.get();
  // Pixels per latent cell from the VAE's levels (SD's VAE: 8; a three-level VAE: 4), read from its
  // config or weight shapes without loading it; buckets are multiples of that x 2.
  traits_.latent_downscale = vae_config().downscale_factor();
  traits_.bucket_divisibility = 2 * traits_.latent_downscale;
}

models::CLIPTextModel SDModel::load_text_encoder() const {
  const fs::path& path = options_.name_or_path;
  models::CLIPTextModel text_encoder(nullptr);
  if (single_file_) {
    text_encoder = models::load_sd_single_file_text_encoder(*single_file_handle_);  // SD1 CLIP or SD2 OpenCLIP
  } else {
    auto config = models::CLIPTextConfig::from_file(path / "text_encoder" / "config.json");
    text_encoder = models::CLIPTextModel(config);
    auto weights = io::SafetensorsFile::open(models::sd::diffusers_component_weights(path / "text_encoder"));
    models::load_state_dict(*text_encoder, *weights, models::clip_text_load_options());
  }
  return text_encoder;
}

models::sd::VAEConfig SDModel::vae_config() const {
  if (options_.vae_path) {
    auto file = io::SafetensorsFile::open(*options_.vae_path);
    return models::sd::VAEConfig::detect_from_weights(*file, vae_file_prefix(*file));
  }
  if (single_file_) return models::sd::VAEConfig::detect_from_weights(*single_file_handle_, "first_stage_model.");
  return models::sd::VAEConfig::from_json(models::sd::read_component_config(options_.name_or_path / "vae"));
}

models::sd::AutoencoderKL SDModel::load_vae() const {
  models::sd::AutoencoderKL vae(vae_config());
  if (options_.vae_path) {
    models::sd::load_vae(*vae, *io::SafetensorsFile::open(*options_.vae_path));
  } else if (single_file_) {
    models::sd::load_vae(*vae, *single_file_handle_);
  } else {
    models::sd::load_vae(*vae, *io::SafetensorsFile::open(models::sd::diffusers_component_weights(options_.name_or_path / "vae")));
  }
  return vae;
}

void SDModel::set_compute_mode(const ComputeMode& mode) {
  options_.compute = mode;
  family::apply_compute_mode(*unet_, mode);
}

void SDModel::release(Encoder which) {
  if (which == Encoder::vae) vae_.release();
  // A trained text encoder carries adapters: it stays.
  if (which == Encoder::text && !options_.train_text_encoder) text_encoder_.release();
}

TextEmbedding SDModel::encode_text(const std::vector<std::string>& captions) {
  std::vector<int64_t> ids;
  const auto encodings = tokenizer_->encode_batch(captions);
  for (const auto& e : encodings) ids.insert(ids.end(), e.input_ids.begin(), e.input_ids.end());
  const auto length = static_cast<int64_t>(encodings.empty() ? 0 : encodings[0].input_ids.size());
  auto input_ids = torch::tensor(ids, torch::kLong).view({static_cast<int64_t>(captions.size()), length});
  // [B, 77, D]: the final layer's normalised output conditions the UNet.
  return {{"hidden_states", text_encoder_.get()->forward(input_ids.to(options_.device)).last_hidden_state}};
}

at::Tensor SDModel::encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) {
  return family::encode_kl(*vae_.get(), options_.compute, options_.device, pixels, generator);
}

at::Tensor SDModel::decode_latents(const at::Tensor& latents) {
  return family::decode_kl(*vae_.get(), options_.compute, options_.device, latents);
}

at::Tensor SDModel::predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) {
  const at::Tensor& context = family::text_tensor(c.text, "hidden_states");  // [B, 77, D]
  return unet_->forward(noisy.to(options_.dtype), timesteps.to(options_.device), context.to(options_.dtype));
}

std::vector<LoRATarget> SDModel::lora_targets() {
  std::vector<LoRATarget> targets = {{&unet_spec_, unet_.ptr().get()}};
  if (options_.train_text_encoder) targets.push_back({&text_spec_, text_encoder_.get().ptr().get()});
  return targets;
}

std::map<std::string, std::string> SDModel::lora_metadata() const {
  return lora::kohya_base_model_metadata(playbook::to_string(traits_.family), options_.v_prediction);
}

int64_t SDModel::quantize_base(bool text_encoders, models::WeightQuantization format) {
  int64_t released = family::quantize(*unet_, format);
  if (text_encoders) released += text_encoder_.quantize(format);
  return released;
}

}  // namespace

std::unique_ptr<DiffusionModel> load_sd_model(const ModelLoadOptions& options, const models::Detection& detection) {
  return std::make_unique<SDModel>(options, detection);
}

}  // namespace lt::train
