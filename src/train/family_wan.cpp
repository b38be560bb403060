// Wan 2.1 text-to-video (1.3B, 14B): WanTransformer3DModel over 1x2x2 patches of the causal video
// VAE's 16-channel latents [B, 16, 1 + (F-1)/4, H/8, W/8], normalised per channel with the VAE's
// latents_mean/std, conditioned on umT5's hidden states (512 tokens as Wan's pipeline pads and
// truncates them; the rows past the prompt zeroed, as the pipeline trims and zero-pads them) and the
// raw timestep. Images are 1-frame clips. Rectified-flow training (target noise - x0) with AI
// Toolkit's Wan shift 3.0; previews: flow-match Euler with the same shift (as AI Toolkit samples
// Wan 2.1) on the explicit sigmas linspace(1, 1/N, N) that every flow family's Euler previews take
// (render_preview), or with `sample.sampler: unipc` the diffusers WanPipeline's UniPC (flow_shift 3.0).
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <regex>

#include "families.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/wan/checkpoint.h"
#include "loratrain/util/error.h"

namespace lt::train {

namespace wan = models::wan;

namespace {

// Wan's prompt_clean with clean='whitespace': runs of whitespace become one space, ends trimmed.
std::string clean_prompt(const std::string& text) {
  static const std::regex kSpaces("\\s+");
  std::string out = std::regex_replace(text, kSpaces, " ");
  const size_t first = out.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return out.substr(first, out.find_last_not_of(' ') - first + 1);
}

class WanModel final : public DiffusionModel {
 public:
  explicit WanModel(ModelLoadOptions options);

  const ModelTraits& traits() const override { return traits_; }
  const std::string& model_id() const override { return model_id_; }
  TextEmbedding encode_text(const std::vector<std::string>& captions) override;
  at::Tensor encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) override;
  at::Tensor decode_latents(const at::Tensor& latents) override;
  at::Tensor predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) override;
  std::vector<LoRATarget> lora_targets() override { return {{&spec_, transformer_.ptr().get()}}; }
  std::map<std::string, std::string> lora_metadata() const override {
    return lora::kohya_base_model_metadata(checkpoint_.config().inner_dim() >= 5120 ? "wan21_14b" : "wan21_1.3b", false);
  }
  void set_gradient_checkpointing(bool enabled) override { transformer_->set_gradient_checkpointing(enabled); }
  void set_compute_mode(const ComputeMode& mode) override;
  void set_training(bool training) override { training ? transformer_->train() : transformer_->eval(); }
  int64_t quantize_base(bool text_encoders, models::WeightQuantization format) override;
  void release(Encoder which) override;

 private:
  static constexpr int64_t kTextLength = 512;  // Wan's text_len / max_sequence_length

  ModelLoadOptions options_;
  wan::WanCheckpoint checkpoint_;
  ModelTraits traits_;
  std::string model_id_;
  wan::WanTransformer3DModel transformer_{nullptr};
  models::T5Tokenizer tokenizer_;
  // The VAE runs in fp32 (the pipelines upcast it); umT5 in the compute dtype, an fp8 file's codes
  // kept when it ends in fp8.
  family::Releasable<wan::AutoencoderKLWan> vae_{[this] { return checkpoint_.load_vae(); }, at::kFloat, options_};
  family::Releasable<models::T5EncoderModel> text_encoder_{
      [this] {
        const bool fp8 = text_encoder_.quantization() == models::WeightQuantization::fp8_e4m3;
        return checkpoint_.load_text_encoder(options_.dtype, fp8);
      },
      std::nullopt, options_, options_.text_quantization};
  const lora::ComponentSpec spec_ = lora::ComponentSpec::wan_transformer();
};

WanModel::WanModel(ModelLoadOptions options)
    : options_(std::move(options)),
      checkpoint_(wan::WanCheckpoint::open(options_.name_or_path, options_.vae_path, options_.tokenizer_path)),
      tokenizer_(checkpoint_.load_tokenizer()) {
  if (options_.train_text_encoder) {
    throw InputError("train.train_text_encoder: Wan LoRAs train the transformer only (as AI Toolkit and musubi-tuner "
                     "do); set it to false");
  }
  if (options_.assistant_lora) throw InputError("model.assistant_lora_path: Wan takes no assistant adapter");
  traits_.family = ModelFamily::kWan;
  traits_.is_video = true;
  traits_.objective = Objective::flow_matching;
  traits_.prediction = sample::PredictionType::kFlow;
  // AI Toolkit trains Wan 2.1 on a flow-match schedule shifted by 3.0, without dynamic shifting.
  traits_.flow_schedule = sample::FlowMatchEulerDiscreteSchedulerConfig::from_json(sample::default_scheduler_config("wan"));
  traits_.scheduler_config = "wan";
  traits_.latent_channels = checkpoint_.config().in_channels;
  traits_.latent_downscale = 8;
  traits_.latent_frame_stride = 4;
  traits_.latent_patch_size = checkpoint_.config().patch_size[1];
  // 8 pixels per latent cell, 2x2 cells per patch.
  traits_.bucket_divisibility = 8 * traits_.latent_patch_size;
  model_id_ = "wan21|" + family::file_identity(checkpoint_.transformer_path()) + "|" + c10::toString(options_.dtype);
  // Under qfloat8 an fp8 file's codes are kept and the rest quantized on the host: the device never
  // holds the widened transformer.
  transformer_ = checkpoint_.load_transformer(options_.dtype, options_.denoiser_quantization == models::WeightQuantization::fp8_e4m3);
  family::quantize_and_place(*transformer_, options_.denoiser_quantization, options_.dtype, options_.device);
  set_compute_mode(options_.compute);
  if (!options_.defer_encoders) {
    text_encoder_.get();
    vae_.get();
  }
}

TextEmbedding WanModel::encode_text(const std::vector<std::string>& captions) {
  std::vector<int64_t> ids, mask;
  for (const auto& caption : captions) {
    const auto e = tokenizer_.encode_padded(clean_prompt(caption), kTextLength);
    ids.insert(ids.end(), e.input_ids.begin(), e.input_ids.end());
    mask.insert(mask.end(), e.attention_mask.begin(), e.attention_mask.end());
  }
  const auto batch = static_cast<int64_t>(captions.size());
  const at::Tensor input_ids = torch::tensor(ids, torch::kLong).view({batch, kTextLength}).to(options_.device);
  const at::Tensor attention = torch::tensor(mask, torch::kLong).view({batch, kTextLength}).to(options_.device);
  // Masked attention, then the rows past each prompt zeroed (the pipeline trims to the prompt's
  // length and pads with zeros to 512).
  const at::Tensor hidden = text_encoder_.get()->forward(input_ids, attention);  // [B, 512, d_model]
  return {{"hidden_states", (hidden * attention.unsqueeze(-1).to(hidden.scalar_type())).to(options_.dtype)}};
}

at::Tensor WanModel::encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> generator) {
  // [B, 3, H, W] is a batch of 1-frame clips.
  const at::Tensor video = pixels.dim() == 4 ? pixels.unsqueeze(2) : pixels;
  TORCH_CHECK(video.dim() == 5, "Wan encodes pixels [B, 3, F, H, W] or [B, 3, H, W], got ", pixels.sizes());
  auto& vae = vae_.get();
  torch::NoGradGuard no_grad;
  auto [mean, logvar] = vae->encode(video.to(options_.device, at::kFloat));
  at::Tensor z = mean;
  if (generator) z = mean + torch::exp(0.5 * logvar) * sample::randn(mean.sizes(), *generator, at::kFloat, mean.device());
  return vae->normalize(z);  // [B, 16, 1 + (F-1)/4, H/8, W/8]
}

at::Tensor WanModel::decode_latents(const at::Tensor& latents) {
  auto& vae = vae_.get();
  torch::NoGradGuard no_grad;
  // -> [B, 3, F, H, W] in [-1, 1]
  return vae->decode(vae->denormalize(latents.to(options_.device, at::kFloat))).to(at::kCPU).clamp(-1, 1);
}

at::Tensor WanModel::predict(const at::Tensor& noisy, const at::Tensor& timesteps, const Conditioning& c) {
  TORCH_CHECK(noisy.dim() == 5, "Wan predicts on latents [B, 16, F, h, w], got ", noisy.sizes());
  const int64_t batch = noisy.size(0);
  // The trainer and samplers count timesteps 0..1000, as the Wan transformer takes them.
  const at::Tensor t = timesteps.to(options_.device, at::kFloat).reshape({-1}).expand({batch});
  return transformer_->forward(noisy.to(options_.dtype), t, family::text_tensor(c.text, "hidden_states"));
}

int64_t WanModel::quantize_base(bool text_encoders, models::WeightQuantization format) {
  int64_t released = family::quantize(*transformer_, format);
  if (text_encoders) released += text_encoder_.quantize(format);
  return released;
}

void WanModel::set_compute_mode(const ComputeMode& mode) {
  options_.compute = mode;
  transformer_->set_attention_query_chunk(mode.attention_chunk, !mode.simulated_device);
}

void WanModel::release(Encoder which) {
  if (which == Encoder::vae) vae_.release();
  if (which == Encoder::text) text_encoder_.release();
}

}  // namespace

std::unique_ptr<DiffusionModel> load_wan_model(const ModelLoadOptions& options, const models::Detection&) {
  return std::make_unique<WanModel>(options);
}

}  // namespace lt::train
