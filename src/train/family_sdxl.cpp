// Stable Diffusion XL (base 1.0 and its fine-tunes: the same keys): UNet2DConditionModel with
// text-time added conditioning, AutoencoderKL (scaling 0.13025, fp32: it overflows in fp16), two
// text encoders (CLIP ViT-L and OpenCLIP ViT-bigG) whose penultimate hidden states, concatenated,
// condition the UNet, with bigG's projected pooled output and each image's size micro-conditioning
// (add_time_ids) added to the time embedding. DDPM noise, epsilon prediction (`model.is_v_pred`
// for v-prediction fine-tunes).
#include <torch/torch.h>

#include "families.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/sd/sdxl.h"
#include "loratrain/util/error.h"

namespace lt::train {

namespace fs = std::filesystem;

namespace {

class SDXLModel final : public DiffusionModel {
 public:
  explicit SDXLModel(ModelLoadOptions options);

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
  ModelLoadOptions options_;
  models::sd::SDXLCheckpoint checkpoint_;
  ModelTraits traits_;
  std::string model_id_;
  models::sd::UNet2DConditionModel unet_{nullptr};
  models::CLIPTokenizer tokenizer_;
  models::CLIPTokenizer tokenizer_2_;
  family::Releasable<models::sd::AutoencoderKL> vae_{[this] { return checkpoint_.load_vae(options_.vae_path); }, at::kFloat,
                                                    options_};
  family::Releasable<models::CLIPTextModel> text_encoder_{[this] { return checkpoint_.load_text_encoder(); }, options_.dtype,
                                                         options_, options_.text_quantization};
  family::Releasable<models::CLIPTextModelWithProjection> text_encoder_2_{
      [this] { return checkpoint_.load_text_encoder_2(); }, options_.dtype, options_, options_.text_quantization};
  std::unique_ptr<lora::ComponentSpec> unet_spec_;
  const lora::ComponentSpec text_spec_ = lora::ComponentSpec::text_encoder(1);
  const lora::ComponentSpec text_spec_2_ = lora::ComponentSpec::text_encoder(2);
};

SDXLModel::SDXLModel(ModelLoadOptions options)
    : options_(std::move(options)),
      checkpoint_(models::sd::SDXLCheckpoint::open(options_.name_or_path, options_.vae_path.has_value())),
      tokenizer_(checkpoint_.load_tokenizer(options_.tokenizer_path)),
      tokenizer_2_(checkpoint_.load_tokenizer_2(options_.tokenizer_path)) {
  if (options_.assistant_lora) throw InputError("model.assistant_lora_path: assistant adapters are for Flux models only");
  traits_.family = ModelFamily::kSDXL;
  traits_.prediction = options_.v_prediction ? sample::PredictionType::kVPrediction : sample::PredictionType::kEpsilon;
  traits_.scheduler_config = options_.v_prediction ? "sd2_v" : "sdxl";
  // Three UNet levels halve the latent twice: buckets in multiples of 8 (VAE) x 4.
  traits_.bucket_divisibility = 32;
  const fs::path& path = options_.name_or_path;
  model_id_ = std::string("sdxl|") + family::file_identity(checkpoint_.is_single_file() ? path : path / "unet") + "|" +
              c10::toString(options_.dtype);
  unet_ = checkpoint_.load_unet(options_.dtype);
  family::quantize_and_place(*unet_, options_.denoiser_quantization, options_.dtype, options_.device);
  family::apply_compute_mode(*unet_, options_.compute);
  traits_.latent_channels = unet_->config.in_channels;
  unet_spec_ = std::make_unique<lora::ComponentSpec>(lora::ComponentSpec::sdxl_unet(unet_->config));
  if (!options_.defer_encoders || options_.train_text_encoder) {
    text_encoder_.get();
    text_encoder_2_.get();
  }
  if (!options_.defer_encoders) vae_.get();
}

TextEmbedding SDXLModel::encode_text(const std::vector<std::string>& captions) {
  const at::Tensor ids = models::sd::clip_input_ids(tokenizer_, captions).to(options_.device);
  const at::Tensor ids_2 = models::sd::clip_input_ids(tokenizer_2_, captions).to(options_.device);
  auto text = models::sd::encode_sdxl_text(*text_encoder_.get(), *text_encoder_2_.get(), ids, ids_2);
  return {{"hidden_states", text.context}, {"pooled", text.pooled}};  // [B, 77, 2048], [B, 1280]
}

at::Tensor SDXLModel::encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) {
  return family::encode_kl(*vae_.get(), options_.compute, options_.device, pixels, generator);
}

at::Tensor SDXLModel::decode_latents(const at::Tensor& latents) {
  return family::decode_kl(*vae_.get(), options_.compute, options_.device, latents);
}

at::Tensor SDXLModel::predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) {
  std::vector<models::sd::SDXLSizeConditioning> sizes;
  for (const auto& g : c.images) {
    sizes.push_back({g.original_height, g.original_width, g.crop_top, g.crop_left, g.target_height, g.target_width});
  }
  models::sd::UNetAddedCond added;
  added.text_embeds = family::text_tensor(c.text, "pooled").to(options_.dtype);
  added.time_ids = models::sd::sdxl_add_time_ids(sizes).to(options_.device);
  const at::Tensor& context = family::text_tensor(c.text, "hidden_states");
  return unet_->forward(noisy.to(options_.dtype), timesteps.to(options_.device), context.to(options_.dtype), added);
}

std::vector<LoRATarget> SDXLModel::lora_targets() {
  std::vector<LoRATarget> targets = {{unet_spec_.get(), unet_.ptr().get()}};
  if (options_.train_text_encoder) {
    targets.push_back({&text_spec_, text_encoder_.get().ptr().get()});
    targets.push_back({&text_spec_2_, text_encoder_2_.get().ptr().get()});
  }
  return targets;
}

std::map<std::string, std::string> SDXLModel::lora_metadata() const {
  return lora::kohya_base_model_metadata("sdxl", options_.v_prediction);
}

int64_t SDXLModel::quantize_base(bool text_encoders, models::WeightQuantization format) {
  int64_t released = family::quantize(*unet_, format);
  if (text_encoders) released += text_encoder_.quantize(format) + text_encoder_2_.quantize(format);
  return released;
}

void SDXLModel::set_compute_mode(const ComputeMode& mode) {
  options_.compute = mode;
  family::apply_compute_mode(*unet_, mode);
}

void SDXLModel::release(Encoder which) {
  if (which == Encoder::vae) vae_.release();
  // Trained text encoders carry adapters: they stay.
  if (which == Encoder::text && !options_.train_text_encoder) {
    text_encoder_.release();
    text_encoder_2_.release();
  }
}

}  // namespace

std::unique_ptr<DiffusionModel> load_sdxl_model(const ModelLoadOptions& options, const models::Detection&) {
  return std::make_unique<SDXLModel>(options);
}

}  // namespace lt::train
