// The embedded demo's base model: a tiny Stable Diffusion 1.x architecture (the real UNet, VAE and
// CLIP text encoder classes at small widths) with seeded random weights, written as a single-file
// checkpoint with the original LDM key names, exactly as a downloaded checkpoint is laid out, plus a
// small BPE vocabulary of the project's own in tokenizer/. The weights are random: the demo and the
// end-to-end tests exercise the machinery, not image quality.
#include "loratrain/train/demo_base.h"

#include <torch/torch.h>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/key_maps.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_tokenizer.h"
#include "loratrain/util/error.h"

#include <spdlog/spdlog.h>

namespace lt::train {

namespace {

// Words of the demo captions and prompts (lt-make-demo-data's vocabulary) plus the trigger word.
const std::vector<std::string> kWords = {
    "a", "an", "the", "on", "of", "with", "and", "background", "ltdemo", "photo", "picture",
    "red", "green", "blue", "yellow", "purple", "orange", "white", "black", "gray", "pink", "cyan",
    "circle", "square", "triangle", "ring", "cross", "stripe", "stripes", "shape", "small", "large", "big"};

// Every tensor of `module` under its LDM single-file name.
void add(std::vector<std::pair<std::string, at::Tensor>>& out, torch::nn::Module& module, const models::KeyMap& map) {
  for (const auto& p : module.named_parameters(true)) {
    const std::string key = map.to_ldm(p.key());
    if (key.empty()) throw Error(ExitCode::kRuntime, "no LDM name for " + p.key());
    out.emplace_back(key, p.value().detach().clone());
  }
}

}  // namespace

void write_demo_base(const std::filesystem::path& out_dir, uint64_t seed, bool full_size) {
  torch::manual_seed(seed);
  std::filesystem::create_directories(out_dir / "tokenizer");
  models::write_demo_vocabulary(out_dir / "tokenizer", kWords);
  auto tokenizer = models::load_clip_tokenizer(out_dir / "tokenizer");

  // UNet: SD1's block structure at 64/128 channels; heads = channels / 64 (the convention that
  // UNetConfig::detect_from_weights reads back for non-768 context widths).
  nlohmann::json unet_json = {
      {"sample_size", 8},
      {"in_channels", 4},
      {"out_channels", 4},
      {"down_block_types", {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D"}},
      {"up_block_types", {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}},
      {"block_out_channels", {64, 128}},
      {"layers_per_block", 1},
      {"attention_head_dim", {1, 2}},
      {"cross_attention_dim", 64},
      {"norm_num_groups", 32},
  };
  // Full size: the real SD1.5 shapes (diffusers defaults), for GPU smoke runs and benchmarks.
  models::sd::UNet2DConditionModel unet(full_size ? models::sd::UNetConfig::sd15()
                                                  : models::sd::UNetConfig::from_json(unet_json));

  // VAE: four levels (downscale factor 8, as SD's) at small widths.
  nlohmann::json vae_json = {
      {"in_channels", 3},
      {"out_channels", 3},
      {"latent_channels", 4},
      {"down_block_types", {"DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"}},
      {"up_block_types", {"UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"}},
      {"block_out_channels", {32, 32, 64, 64}},
      {"layers_per_block", 1},
      {"norm_num_groups", 32},
      {"scaling_factor", 0.18215},
  };
  models::sd::AutoencoderKL vae(full_size ? models::sd::VAEConfig::sd() : models::sd::VAEConfig::from_json(vae_json));

  // CLIP text encoder: 64 wide (one 64-wide head per layer, gelu, as detect_from_weights assumes
  // for widths other than OpenAI's 768), 2 layers, the demo vocabulary.
  nlohmann::json clip_json = {  // (replaced below for full size)
      {"vocab_size", tokenizer.vocab_size()},
      {"hidden_size", 64},
      {"intermediate_size", 256},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 1},
      {"max_position_embeddings", 77},
      {"hidden_act", "gelu"},
      {"bos_token_id", tokenizer.bos_token_id()},
      {"eos_token_id", 2},
      {"pad_token_id", 1},
  };
  if (full_size) {
    // CLIP ViT-L/14's text tower, as SD1.5 ships it (quick_gelu, 12 heads of 64, 49408 tokens).
    clip_json = {{"vocab_size", 49408},           {"hidden_size", 768},       {"intermediate_size", 3072},
                 {"num_hidden_layers", 12},       {"num_attention_heads", 12}, {"max_position_embeddings", 77},
                 {"hidden_act", "quick_gelu"},    {"bos_token_id", tokenizer.bos_token_id()},
                 {"eos_token_id", 2},             {"pad_token_id", 1}};
  }
  models::CLIPTextModel text_encoder(models::CLIPTextConfig::from_json(clip_json));

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const auto unet_map = models::unet_ldm_key_map(unet->config);
  const auto vae_map = models::vae_ldm_key_map(vae->config);
  const auto clip_map = models::clip_ldm_key_map();
  add(tensors, *unet, unet_map);
  add(tensors, *vae, vae_map);
  add(tensors, *text_encoder, clip_map);
  io::save_safetensors(out_dir / "model.safetensors", tensors,
                       {{"format", "pt"}, {"lora_train_demo", "tiny SD1-architecture base with seeded random weights"},
                        {"seed", std::to_string(seed)}});
  spdlog::info("demo base: {} tensors in {}", tensors.size(), (out_dir / "model.safetensors").string());
}

}  // namespace lt::train
