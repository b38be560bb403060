// Flux.1 dev and schnell: FluxTransformer2DModel over 2x2-packed latent tokens of a 16-channel VAE
// (latents (z - 0.1159) * 0.3611), conditioned on T5-XXL's hidden states (all max_length positions,
// pads included, no mask: 512 tokens for dev, 256 for schnell) and CLIP-L's pooled output, with the
// timestep and, for dev, the guidance value embedded. Rectified-flow training (target noise - x0);
// dev trains with train.cfg_scale as its guidance (AI Toolkit's default 1.0) unless
// train.bypass_guidance_embedding leaves the guidance embedder out. Previews: flow-match Euler,
// shifted by the image's token count for dev, unshifted for schnell.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "families.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/flux/checkpoint.h"
#include "loratrain/models/layers.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/models/sd/sdxl.h"
#include "loratrain/util/error.h"

namespace lt::train {

namespace fs = std::filesystem;
namespace flux = models::flux;

namespace {

class FluxModel final : public DiffusionModel {
 public:
  explicit FluxModel(ModelLoadOptions options);

  const ModelTraits& traits() const override { return traits_; }
  const std::string& model_id() const override { return model_id_; }
  TextEmbedding encode_text(const std::vector<std::string>& captions) override;
  at::Tensor encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) override;
  at::Tensor decode_latents(const at::Tensor& latents) override;
  at::Tensor predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) override;
  std::vector<LoRATarget> lora_targets() override { return {{&spec_, transformer_.ptr().get()}}; }
  std::map<std::string, std::string> lora_metadata() const override {
    return lora::kohya_base_model_metadata(checkpoint_.guidance_embeds() ? "flux" : "flux_schnell", false);
  }
  void set_gradient_checkpointing(bool enabled) override { transformer_->set_gradient_checkpointing(enabled); }
  void set_compute_mode(const ComputeMode& mode) override;
  void set_training(bool training) override;
  int64_t quantize_base(bool text_encoders, models::WeightQuantization format) override;
  void release(Encoder which) override;

 private:
  void load_assistant(const fs::path& path);

  ModelLoadOptions options_;
  flux::FluxCheckpoint checkpoint_;
  ModelTraits traits_;
  std::string model_id_;
  flux::FluxTransformer2DModel transformer_{nullptr};
  models::CLIPTokenizer tokenizer_;
  models::T5Tokenizer tokenizer_2_;
  int64_t t5_max_length_;
  family::Releasable<models::sd::AutoencoderKL> vae_{[this] { return checkpoint_.load_vae(); }, at::kFloat, options_};
  family::Releasable<models::CLIPTextModel> text_encoder_{[this] { return checkpoint_.load_text_encoder(options_.dtype); },
                                                         options_.dtype, options_, options_.text_quantization};
  // T5 keeps the dtypes it was loaded in (in fp16 its `wo` stays fp32, as transformers keeps it),
  // and an fp8 file's codes when it ends in fp8.
  family::Releasable<models::T5EncoderModel> text_encoder_2_{
      [this] {
        const bool fp8 = text_encoder_2_.quantization() == models::WeightQuantization::fp8_e4m3;
        return checkpoint_.load_text_encoder_2(options_.dtype, fp8);
      },
      std::nullopt, options_, options_.text_quantization};
  const lora::ComponentSpec spec_ = lora::ComponentSpec::flux_transformer();
  lora::LoRANetwork assistant_{nullptr};
};

FluxModel::FluxModel(ModelLoadOptions options)
    : options_(std::move(options)),
      checkpoint_(flux::FluxCheckpoint::open(options_.name_or_path, options_.vae_path)),
      tokenizer_(checkpoint_.load_tokenizer(options_.tokenizer_path)),
      tokenizer_2_(checkpoint_.load_tokenizer_2(options_.tokenizer_path)),
      t5_max_length_(checkpoint_.guidance_embeds() ? 512 : 256) {
  if (options_.train_text_encoder) {
    throw InputError("train.train_text_encoder: Flux LoRAs train the transformer only (as AI Toolkit and kohya's "
                     "flux_train_network do); set it to false");
  }
  const bool dev = checkpoint_.guidance_embeds();
  traits_.family = ModelFamily::kFlux;
  traits_.objective = Objective::flow_matching;
  traits_.prediction = sample::PredictionType::kFlow;
  traits_.flow_schedule = sample::FlowMatchEulerDiscreteSchedulerConfig::from_json(sample::default_scheduler_config("flux"));
  traits_.scheduler_config = dev ? "flux" : "flux_schnell";
  traits_.embedded_guidance = dev;
  traits_.latent_patch_size = 2;
  traits_.latent_downscale = 8;
  traits_.latent_channels = checkpoint_.config().in_channels / 4;
  // 8 pixels per latent cell, 2x2 cells per token.
  traits_.bucket_divisibility = 16;
  const fs::path& path = options_.name_or_path;
  model_id_ = std::string(dev ? "flux-dev|" : "flux-schnell|") +
              family::file_identity(checkpoint_.is_single_file() ? path : path / "transformer") + "|" +
              c10::toString(options_.dtype);
  transformer_ = checkpoint_.load_transformer(options_.dtype, options_.denoiser_quantization == models::WeightQuantization::fp8_e4m3);
  family::quantize_and_place(*transformer_, options_.denoiser_quantization, options_.dtype, options_.device);
  set_compute_mode(options_.compute);
  if (options_.assistant_lora) load_assistant(*options_.assistant_lora);
  if (!options_.defer_encoders) {
    text_encoder_.get();
    text_encoder_2_.get();
    vae_.get();
  }
}

TextEmbedding FluxModel::encode_text(const std::vector<std::string>& captions) {
  std::vector<int64_t> ids;
  for (const auto& e : tokenizer_2_.encode_batch(captions, t5_max_length_)) {
    ids.insert(ids.end(), e.input_ids.begin(), e.input_ids.end());
  }
  const auto batch = static_cast<int64_t>(captions.size());
  const at::Tensor t5_ids = torch::tensor(ids, torch::kLong).view({batch, t5_max_length_}).to(options_.device);
  // Every position, pads included, unmasked: as the Flux pipelines and BFL's conditioner run T5.
  const at::Tensor hidden = text_encoder_2_.get()->forward(t5_ids).to(options_.dtype);  // [B, T, 4096]
  const at::Tensor clip_ids = models::sd::clip_input_ids(tokenizer_, captions).to(options_.device);
  const at::Tensor pooled = text_encoder_.get()->forward(clip_ids).pooler_output;       // [B, 768]
  return {{"hidden_states", hidden}, {"pooled", pooled}};
}

at::Tensor FluxModel::encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) {
  return family::encode_kl(*vae_.get(), options_.compute, options_.device, pixels, generator);
}

at::Tensor FluxModel::decode_latents(const at::Tensor& latents) {
  return family::decode_kl(*vae_.get(), options_.compute, options_.device, latents);
}

at::Tensor FluxModel::predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) {
  const int64_t batch = noisy.size(0), channels = noisy.size(1), h = noisy.size(2), w = noisy.size(3);
  const at::Tensor& text = family::text_tensor(c.text, "hidden_states");
  flux::FluxInputs in;
  in.hidden_states = flux::pack_latents(noisy);
  in.encoder_hidden_states = text;
  in.pooled_projections = family::text_tensor(c.text, "pooled");
  // The trainer and samplers count timesteps 0..1000; the model takes sigma.
  in.timestep = timesteps.to(options_.device, at::kFloat).expand({batch}) / 1000.0;
  in.img_ids = flux::latent_image_ids(h / 2, w / 2);
  in.txt_ids = torch::zeros({text.size(1), 3}, torch::kFloat);
  if (checkpoint_.guidance_embeds()) in.guidance = torch::full({batch}, c.guidance, torch::kFloat);
  return flux::unpack_latents(transformer_->forward(in), channels, h, w);
}

// AI Toolkit's assistant adapter (FLUX.1-schnell's training adapter keeps the distilled model from
// drifting while a LoRA trains on it): a frozen LoRA in the leaves' base slot, on while training,
// off in previews, never saved.
void FluxModel::load_assistant(const fs::path& path) {
  auto file = io::SafetensorsFile::open(path);
  const auto dims = lora::module_dims_from_file(*file, {spec_});
  if (dims.empty()) {
    throw InputError(path.string() + ": no Flux transformer modules in this LoRA (model.assistant_lora_path)");
  }
  assistant_ = lora::LoRANetwork(lora::NetworkConfig{});
  assistant_->add_component(spec_, *transformer_, &dims);
  assistant_->load_weights(*file);
  for (auto& p : assistant_->parameters()) p.set_requires_grad(false);
  assistant_->apply_to();
  for (const auto& m : transformer_->modules(false)) {
    if (auto* linear = m->as<models::LinearImpl>(); linear && linear->adapter) {
      linear->base_adapter = std::move(linear->adapter);
      linear->adapter = nullptr;
    }
  }
  spdlog::info("assistant adapter: {} modules from {} (on while training, off in previews, not saved)",
               assistant_->modules().size(), path.string());
}

void FluxModel::set_training(bool training) {
  training ? transformer_->train() : transformer_->eval();
  if (assistant_) assistant_->set_multiplier(training ? 1.0 : 0.0);
  // AI Toolkit bypasses the guidance embedder in training steps only; previews use it.
  transformer_->set_bypass_guidance(training && options_.bypass_guidance_embedding);
}

int64_t FluxModel::quantize_base(bool text_encoders, models::WeightQuantization format) {
  int64_t released = family::quantize(*transformer_, format);
  if (text_encoders) released += text_encoder_.quantize(format) + text_encoder_2_.quantize(format);
  return released;
}

void FluxModel::set_compute_mode(const ComputeMode& mode) {
  options_.compute = mode;
  transformer_->set_attention_query_chunk(mode.attention_chunk, !mode.simulated_device);
}

void FluxModel::release(Encoder which) {
  if (which == Encoder::vae) vae_.release();
  if (which == Encoder::text) {
    text_encoder_.release();
    text_encoder_2_.release();
  }
}

}  // namespace

std::unique_ptr<DiffusionModel> load_flux_model(const ModelLoadOptions& options, const models::Detection&) {
  return std::make_unique<FluxModel>(options);
}

}  // namespace lt::train
