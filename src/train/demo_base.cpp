// The embedded demo's base models: tiny Stable Diffusion 1.x and XL architectures (the real UNet,
// VAE and CLIP text encoder classes at small widths) with seeded random weights, written as a
// single-file checkpoint with the original key names, exactly as a downloaded checkpoint is laid out,
// or as a diffusers folder, plus a small BPE vocabulary of the project's own. The weights are random
// (the end-to-end tests exercise the machinery, not image quality), or, for the tiny SD1 base with
// `pretrain`, trained on generated shapes (demo_pretrain.cpp) so that the demo's previews show them.
#include "loratrain/train/demo_base.h"

#include <torch/torch.h>

#include "demo_pretrain.h"

#include <nlohmann/json.hpp>

#include "loratrain/io/safetensors.h"
#include "loratrain/sample/scheduler.h"
#include "loratrain/models/flux/checkpoint.h"
#include "loratrain/models/wan/checkpoint.h"
#include "loratrain/models/key_maps.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_checkpoint.h"
#include "loratrain/models/text/clip_tokenizer.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/models/text/t5_tokenizer.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <fstream>

namespace lt::train {

namespace {

namespace fs = std::filesystem;
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

// Words of the demo captions and prompts (lt-make-demo-data's vocabulary) plus the trigger word.
const std::vector<std::string> kWords = {
    "a", "an", "the", "on", "of", "with", "and", "background", "ltdemo", "photo", "picture",
    "red", "green", "blue", "yellow", "purple", "orange", "white", "black", "gray", "pink", "cyan",
    "circle", "square", "triangle", "ring", "cross", "stripe", "stripes", "shape", "small", "large", "big"};

// The demo's models, built in a fixed order from the seed (the order fixes the weights).
struct DemoModels {
  models::sd::UNet2DConditionModel unet{nullptr};
  models::sd::AutoencoderKL vae{nullptr};
  models::CLIPTextModel text_encoder{nullptr};
  models::CLIPTextModelWithProjection text_encoder_2{nullptr};  // SDXL only
};

// VAE: four levels (downscale factor 8, as SD's) at small widths, or three (factor 4, what the
// pretrained demo base uses); `base` gives the family's latent scale and tile size.
nlohmann::json tiny_vae_json(const models::sd::VAEConfig& base, int levels = 4) {
  const std::vector<int64_t> widths = levels == 3 ? std::vector<int64_t>{32, 64, 64} : std::vector<int64_t>{32, 32, 64, 64};
  return {
      {"in_channels", 3},
      {"out_channels", 3},
      {"latent_channels", 4},
      {"down_block_types", std::vector<std::string>(widths.size(), "DownEncoderBlock2D")},
      {"up_block_types", std::vector<std::string>(widths.size(), "UpDecoderBlock2D")},
      {"block_out_channels", widths},
      {"layers_per_block", 1},
      {"norm_num_groups", 32},
      {"scaling_factor", base.scaling_factor},
      {"sample_size", base.sample_size},
  };
}

// CLIP text encoder: 64 wide (one 64-wide head per layer, gelu, as detect_from_weights assumes for
// widths other than OpenAI's 768), 2 layers, the demo vocabulary.
nlohmann::json tiny_clip_json(const models::CLIPTokenizer& tokenizer) {
  return {
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
}

// CLIP ViT-L/14's text tower, as SD1.5 and SDXL ship it (quick_gelu, 12 heads of 64, 49408 tokens).
nlohmann::json clip_vit_l_json(const models::CLIPTokenizer& tokenizer) {
  return {{"vocab_size", 49408},           {"hidden_size", 768},       {"intermediate_size", 3072},
          {"num_hidden_layers", 12},       {"num_attention_heads", 12}, {"max_position_embeddings", 77},
          {"hidden_act", "quick_gelu"},    {"bos_token_id", tokenizer.bos_token_id()},
          {"eos_token_id", 2},             {"pad_token_id", 1}};
}

// `norm_groups`: GroupNorm groups of the tiny UNet and VAE (32, what single-file loaders assume; the
// pretrained base uses fewer, see DemoPretrainOptions); `vae_levels`: 4 (SD's) or 3; `latent_size`: the
// UNet's sample_size (latent cells of its native images); `unet_width`: the UNet's first level
// (64 for the random base; the pretrained base is narrower, see DemoPretrainOptions).
DemoModels build_sd1(const models::CLIPTokenizer& tokenizer, bool full_size, int64_t norm_groups = 32, int vae_levels = 4,
                     int64_t latent_size = 8, int64_t unet_width = 64) {
  // UNet: SD1's block structure at 64/128 channels (unet_width and twice it), heads of unet_width
  // channels: at 64 that is heads = channels / 64, the convention that
  // UNetConfig::detect_from_weights reads back for non-768 context widths.
  nlohmann::json unet_json = {
      {"sample_size", latent_size},
      {"in_channels", 4},
      {"out_channels", 4},
      {"down_block_types", {"CrossAttnDownBlock2D", "CrossAttnDownBlock2D"}},
      {"up_block_types", {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D"}},
      {"block_out_channels", {unet_width, 2 * unet_width}},
      {"layers_per_block", 1},
      {"attention_head_dim", {1, 2}},
      {"cross_attention_dim", 64},
      {"norm_num_groups", norm_groups},
  };
  nlohmann::json vae_json = tiny_vae_json(models::sd::VAEConfig::sd(), vae_levels);
  vae_json["norm_num_groups"] = norm_groups;
  DemoModels m;
  // Full size: the real SD1.5 shapes (diffusers defaults), for GPU smoke runs and benchmarks.
  m.unet = models::sd::UNet2DConditionModel(full_size ? models::sd::UNetConfig::sd15()
                                                      : models::sd::UNetConfig::from_json(unet_json));
  m.vae = models::sd::AutoencoderKL(full_size ? models::sd::VAEConfig::sd() : models::sd::VAEConfig::from_json(vae_json));
  m.text_encoder = models::CLIPTextModel(
      models::CLIPTextConfig::from_json(full_size ? clip_vit_l_json(tokenizer) : tiny_clip_json(tokenizer)));
  return m;
}

DemoModels build_sdxl(const models::CLIPTokenizer& tokenizer, bool full_size) {
  // The second encoder is wider than the first (96 vs 64), so a mix-up of the two cannot pass:
  // context 64 + 96 = 160, pooled (projection) 32 -> added embedding input 32 + 6 x 256.
  nlohmann::json te2_json = tiny_clip_json(tokenizer);
  te2_json["hidden_size"] = 96;
  te2_json["intermediate_size"] = 384;
  te2_json["projection_dim"] = 32;
  // SDXL's block structure (no attention at the first level, 2 resnets per level, deeper
  // transformers further down) at 32/64/128 channels; heads by UNetConfig's detection convention.
  nlohmann::json unet_json = {
      {"sample_size", 8},
      {"in_channels", 4},
      {"out_channels", 4},
      {"down_block_types", {"DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"}},
      {"up_block_types", {"CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"}},
      {"block_out_channels", {32, 64, 128}},
      {"layers_per_block", 2},
      {"transformer_layers_per_block", {1, 1, 2}},
      {"attention_head_dim", {8, 1, 2}},
      {"cross_attention_dim", 64 + 96},
      {"use_linear_projection", true},
      {"addition_embed_type", "text_time"},
      {"addition_time_embed_dim", 256},
      {"projection_class_embeddings_input_dim", 32 + 6 * 256},
      {"norm_num_groups", 32},
  };
  DemoModels m;
  m.unet = models::sd::UNet2DConditionModel(full_size ? models::sd::UNetConfig::sdxl()
                                                      : models::sd::UNetConfig::from_json(unet_json));
  m.vae = models::sd::AutoencoderKL(full_size ? models::sd::VAEConfig::sdxl()
                                              : models::sd::VAEConfig::from_json(tiny_vae_json(models::sd::VAEConfig::sdxl())));
  m.text_encoder = models::CLIPTextModel(
      models::CLIPTextConfig::from_json(full_size ? clip_vit_l_json(tokenizer) : tiny_clip_json(tokenizer)));
  if (full_size) {
    // OpenCLIP ViT-bigG/14's text tower: 32 layers, 1280 wide, 20 heads, exact gelu, 1280 projection.
    te2_json = {{"vocab_size", 49408},       {"hidden_size", 1280},       {"intermediate_size", 5120},
                {"num_hidden_layers", 32},   {"num_attention_heads", 20}, {"max_position_embeddings", 77},
                {"hidden_act", "gelu"},      {"projection_dim", 1280},    {"bos_token_id", tokenizer.bos_token_id()},
                {"eos_token_id", 2},         {"pad_token_id", 1}};
  }
  m.text_encoder_2 = models::CLIPTextModelWithProjection(models::CLIPTextConfig::from_json(te2_json));
  return m;
}

at::Tensor stored(const at::Tensor& t, at::ScalarType dtype) { return t.detach().to(dtype).contiguous(); }

// Every parameter of `module` under its name in `map`'s layout.
void add_mapped(Tensors& out, torch::nn::Module& module, const models::KeyMap& map, at::ScalarType dtype,
                bool conv_vae_attention = false) {
  for (const auto& p : module.named_parameters(true)) {
    const std::string key = map.to_ldm(p.key());
    if (key.empty()) throw Error(ExitCode::kRuntime, "no single-file name for " + p.key());
    at::Tensor value = stored(p.value(), dtype);
    // SD's original VAE stores its mid attention projections as 1x1 convs.
    if (conv_vae_attention && models::is_vae_attention_weight(p.key())) value = value.unsqueeze(-1).unsqueeze(-1);
    out.emplace_back(key, value);
  }
}

void write_single_file(const fs::path& out_dir, DemoModels& m, bool sdxl, const DemoBaseOptions& o) {
  Tensors tensors;
  add_mapped(tensors, *m.unet, models::unet_ldm_key_map(m.unet->config), o.dtype);
  add_mapped(tensors, *m.vae, models::vae_ldm_key_map(m.vae->config), o.dtype, /*conv_vae_attention=*/sdxl);
  if (sdxl) {
    add_mapped(tensors, *m.text_encoder, models::clip_ldm_key_map(models::kSDXLTextEncoderRoot), o.dtype);
    for (auto& [key, value] : models::open_clip_tensors(*m.text_encoder_2, models::kSDXLTextEncoder2Root)) {
      tensors.emplace_back(key, stored(value, o.dtype));
    }
  } else {
    add_mapped(tensors, *m.text_encoder, models::clip_ldm_key_map(), o.dtype);
  }
  const std::string what = sdxl ? "SDXL" : "SD1";
  io::save_safetensors(out_dir / "model.safetensors", tensors,
                       {{"format", "pt"},
                        {"lora_train_demo", "tiny " + what + "-architecture base with seeded random weights"},
                        {"seed", std::to_string(o.seed)}});
  spdlog::info("demo base: {} tensors in {}", tensors.size(), (out_dir / "model.safetensors").string());
}

void write_json(const fs::path& path, const nlohmann::json& j) { write_file_atomic(path, j.dump(2) + "\n"); }

void write_component(const fs::path& dir, nlohmann::json config, torch::nn::Module& module, const std::string& weights,
                     at::ScalarType dtype) {
  fs::create_directories(dir);
  write_json(dir / "config.json", config);
  Tensors tensors;
  for (const auto& p : module.named_parameters(true)) tensors.emplace_back(p.key(), stored(p.value(), dtype));
  io::save_safetensors(dir / weights, tensors, {{"format", "pt"}});
}

nlohmann::json diffusers_config(nlohmann::json j) {
  j["_diffusers_version"] = "0.38.0";
  return j;
}

nlohmann::json transformers_config(nlohmann::json j, const char* architecture, at::ScalarType dtype) {
  j["architectures"] = {architecture};
  j["model_type"] = "clip_text_model";
  j["torch_dtype"] = dtype == at::kHalf ? "float16" : dtype == at::kBFloat16 ? "bfloat16" : "float32";
  return j;
}

// A diffusers tokenizer folder: the demo vocabulary and its special tokens.
void write_tokenizer(const fs::path& dir, const std::string& pad_token) {
  models::write_demo_vocabulary(dir, kWords);
  const nlohmann::json special = {{"bos_token", "<|startoftext|>"},
                                  {"eos_token", "<|endoftext|>"},
                                  {"unk_token", "<|endoftext|>"},
                                  {"pad_token", pad_token}};
  write_json(dir / "special_tokens_map.json", special);
  nlohmann::json config = special;
  config["model_max_length"] = 77;
  config["do_lower_case"] = true;
  config["tokenizer_class"] = "CLIPTokenizer";
  write_json(dir / "tokenizer_config.json", config);
}

void write_diffusers_folder(const fs::path& out_dir, DemoModels& m, bool sdxl, const DemoBaseOptions& o) {
  const auto dtype = o.dtype;
  write_component(out_dir / "unet", diffusers_config(m.unet->config.to_json()), *m.unet,
                  "diffusion_pytorch_model.safetensors", dtype);
  write_component(out_dir / "vae", diffusers_config(m.vae->config.to_json()), *m.vae,
                  "diffusion_pytorch_model.safetensors", dtype);
  write_component(out_dir / "text_encoder",
                  transformers_config(m.text_encoder->config.to_json(), "CLIPTextModel", dtype), *m.text_encoder,
                  "model.safetensors", dtype);
  write_tokenizer(out_dir / "tokenizer", "<|endoftext|>");
  nlohmann::json scheduler = {{"beta_start", 0.00085}, {"beta_end", 0.012},        {"beta_schedule", "scaled_linear"},
                              {"num_train_timesteps", 1000}, {"set_alpha_to_one", false}, {"skip_prk_steps", true},
                              {"steps_offset", 1},       {"clip_sample", false},    {"trained_betas", nullptr},
                              {"prediction_type", "epsilon"}};
  nlohmann::json index = {{"_class_name", sdxl ? "StableDiffusionXLPipeline" : "StableDiffusionPipeline"},
                          {"_diffusers_version", "0.38.0"},
                          {"unet", {"diffusers", "UNet2DConditionModel"}},
                          {"vae", {"diffusers", "AutoencoderKL"}},
                          {"text_encoder", {"transformers", "CLIPTextModel"}},
                          {"tokenizer", {"transformers", "CLIPTokenizer"}}};
  if (sdxl) {
    write_component(out_dir / "text_encoder_2",
                    transformers_config(m.text_encoder_2->config.to_json(), "CLIPTextModelWithProjection", dtype),
                    *m.text_encoder_2, "model.safetensors", dtype);
    write_tokenizer(out_dir / "tokenizer_2", "!");
    index["text_encoder_2"] = {"transformers", "CLIPTextModelWithProjection"};
    index["tokenizer_2"] = {"transformers", "CLIPTokenizer"};
    index["force_zeros_for_empty_prompt"] = true;
    index["scheduler"] = {"diffusers", "EulerDiscreteScheduler"};
    scheduler["_class_name"] = "EulerDiscreteScheduler";
    scheduler["interpolation_type"] = "linear";
    scheduler["timestep_spacing"] = "leading";
    scheduler["use_karras_sigmas"] = false;
    scheduler["sample_max_value"] = 1.0;
  } else {
    index["scheduler"] = {"diffusers", "PNDMScheduler"};
    scheduler["_class_name"] = "PNDMScheduler";
  }
  fs::create_directories(out_dir / "scheduler");
  write_json(out_dir / "scheduler" / "scheduler_config.json", diffusers_config(scheduler));
  // Written last: a folder with model_index.json is complete.
  write_json(out_dir / "model_index.json", index);
  spdlog::info("demo base: diffusers folder {}", out_dir.string());
}


// ---------------------------------------------------------------------------------------------
// Flux.1

struct FluxDemoModels {
  models::flux::FluxTransformer2DModel transformer{nullptr};
  models::sd::AutoencoderKL vae{nullptr};
  models::CLIPTextModel text_encoder{nullptr};
  models::T5EncoderModel text_encoder_2{nullptr};
};

// A SentencePiece model of the demo words (T5's ids: pad 0, eos 1, unk 2, no BOS), trained by
// Debian's spm_train on sentences of those words in a fixed pseudo-random order.
void write_spiece_model(const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path corpus = dir / "corpus.txt.tmp";
  {
    std::ofstream out(corpus);
    uint64_t state = 2024;
    auto next = [&state] {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<size_t>(state >> 33);
    };
    for (int line = 0; line < 2000; ++line) {
      const size_t words = 3 + next() % 8;
      for (size_t w = 0; w < words; ++w) out << kWords[next() % kWords.size()] << (w + 1 < words ? " " : "\n");
    }
  }
  const fs::path prefix = dir / "spiece";
  const std::string cmd = "spm_train --input='" + corpus.string() + "' --model_prefix='" + prefix.string() +
                          "' --vocab_size=120 --model_type=unigram --character_coverage=1.0 --hard_vocab_limit=false"
                          " --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1 --num_threads=1 --minloglevel=2 > '" +
                          (dir / "spm_train.log.tmp").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  fs::remove(corpus);
  fs::remove(dir / "spm_train.log.tmp");
  fs::remove(dir / "spiece.vocab");
  if (rc != 0 || !fs::exists(prefix.string() + ".model")) {
    throw Error(ExitCode::kRuntime, "demo base: spm_train failed (Debian's sentencepiece package; scripts/install-deps "
                                    "installs it): " + cmd);
  }
  write_file_atomic(dir / "tokenizer_config.json",
                    nlohmann::json{{"model_max_length", 512}, {"extra_ids", 100}, {"tokenizer_class", "T5Tokenizer"},
                                   {"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}}
                            .dump(2) + "\n");
}

FluxDemoModels build_flux(const models::CLIPTokenizer& clip_tokenizer, const models::T5Tokenizer& t5_tokenizer,
                          bool dev, bool full_size) {
  FluxDemoModels m;
  models::flux::FluxConfig config;  // FLUX.1's sizes
  models::T5Config t5 = models::T5Config::t5_v1_1_xxl();
  nlohmann::json clip = clip_vit_l_json(clip_tokenizer);
  if (!full_size) {
    // 2 heads of 32 (rope axes 4, 14, 14), 2 double + 2 single blocks; T5 and CLIP 64 wide.
    config.num_layers = 2;
    config.num_single_layers = 2;
    config.num_attention_heads = 2;
    config.attention_head_dim = 32;
    config.axes_dims_rope = {4, 14, 14};
    config.joint_attention_dim = 64;
    config.pooled_projection_dim = 64;
    t5.vocab_size = t5_tokenizer.vocab_size();
    t5.d_model = 64;
    t5.d_kv = 16;
    t5.num_heads = 4;
    t5.d_ff = 128;
    t5.num_layers = 2;
    clip = tiny_clip_json(clip_tokenizer);
  }
  config.guidance_embeds = dev;
  m.transformer = models::flux::FluxTransformer2DModel(config);
  // The Flux VAE: 16 latent channels, no quant convs, latents (z - 0.1159) * 0.3611.
  nlohmann::json vae = tiny_vae_json(models::sd::VAEConfig::sd());
  if (full_size) vae = models::sd::VAEConfig::sd().to_json();
  vae["latent_channels"] = 16;
  vae["scaling_factor"] = 0.3611;
  vae["shift_factor"] = 0.1159;
  vae["use_quant_conv"] = false;
  vae["use_post_quant_conv"] = false;
  vae["sample_size"] = 1024;
  m.vae = models::sd::AutoencoderKL(models::sd::VAEConfig::from_json(vae));
  m.text_encoder = models::CLIPTextModel(models::CLIPTextConfig::from_json(clip));
  m.text_encoder_2 = models::T5EncoderModel(t5);
  return m;
}

void write_flux_single_file(const fs::path& out_dir, FluxDemoModels& m, bool dev, const DemoBaseOptions& o) {
  Tensors tensors;
  for (auto& [key, value] : models::flux::bfl_tensors(*m.transformer, models::flux::kComfyTransformerRoot)) {
    tensors.emplace_back(key, stored(value, o.dtype));
  }
  add_mapped(tensors, *m.text_encoder, models::clip_ldm_key_map(models::flux::kComfyClipLRoot), o.dtype);
  for (const auto& p : m.text_encoder_2->named_parameters(true)) {
    tensors.emplace_back(models::flux::kComfyT5Root + p.key(), stored(p.value(), o.dtype));
    // t5xxl_fp16 stores the tied embedding twice.
    if (p.key() == models::kT5SharedEmbeddingKey) {
      tensors.emplace_back(std::string(models::flux::kComfyT5Root) + models::kT5TiedEmbeddingKey, stored(p.value(), o.dtype));
    }
  }
  // BFL's ae.safetensors layout: LDM names, mid attention as 1x1 convs.
  add_mapped(tensors, *m.vae, models::vae_ldm_key_map(m.vae->config, models::flux::kComfyVAERoot), o.dtype,
             /*conv_vae_attention=*/true);
  const std::string what = dev ? "Flux.1-dev" : "Flux.1-schnell";
  io::save_safetensors(out_dir / "model.safetensors", tensors,
                       {{"format", "pt"},
                        {"lora_train_demo", "tiny " + what + "-architecture ComfyUI all-in-one checkpoint with seeded random weights"},
                        {"seed", std::to_string(o.seed)}});
  spdlog::info("demo base: {} tensors in {}", tensors.size(), (out_dir / "model.safetensors").string());
}

// `module` as `stem`-0000N-of-00002.safetensors (the parameters in order, halved) and
// `stem`.safetensors.index.json, with its config.json.
void write_sharded(const fs::path& dir, const nlohmann::json& config, torch::nn::Module& module, const std::string& stem,
                   at::ScalarType dtype) {
  fs::create_directories(dir);
  write_json(dir / "config.json", config);
  const auto params = module.named_parameters(true);
  const size_t half = params.size() / 2;
  nlohmann::json weight_map = nlohmann::json::object();
  Tensors shards[2];
  int64_t bytes = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t shard = i < half ? 0 : 1;
    shards[shard].emplace_back(params[i].key(), stored(params[i].value(), dtype));
    bytes += params[i].value().numel() * static_cast<int64_t>(c10::elementSize(dtype));
    weight_map[params[i].key()] = stem + "-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
  }
  for (size_t k = 0; k < 2; ++k) {
    io::save_safetensors(dir / (stem + "-0000" + std::to_string(k + 1) + "-of-00002.safetensors"), shards[k],
                         {{"format", "pt"}});
  }
  write_json(dir / (stem + ".safetensors.index.json"), {{"metadata", {{"total_size", bytes}}}, {"weight_map", weight_map}});
}

void write_flux_diffusers_folder(const fs::path& out_dir, FluxDemoModels& m, bool dev, const DemoBaseOptions& o) {
  const auto dtype = o.dtype;
  // transformer/ and text_encoder_2/ in two shards with their index, as the FLUX.1 repositories
  // ship them (there in three and two).
  write_sharded(out_dir / "transformer", diffusers_config(m.transformer->config.to_json()), *m.transformer,
                "diffusion_pytorch_model", dtype);
  write_component(out_dir / "vae", diffusers_config(m.vae->config.to_json()), *m.vae, "diffusion_pytorch_model.safetensors",
                  dtype);
  write_component(out_dir / "text_encoder", transformers_config(m.text_encoder->config.to_json(), "CLIPTextModel", dtype),
                  *m.text_encoder, "model.safetensors", dtype);
  nlohmann::json t5 = m.text_encoder_2->config.to_json();
  t5["architectures"] = {"T5EncoderModel"};
  write_sharded(out_dir / "text_encoder_2", t5, *m.text_encoder_2, "model", dtype);
  write_tokenizer(out_dir / "tokenizer", "<|endoftext|>");
  nlohmann::json scheduler = sample::default_scheduler_config(dev ? "flux" : "flux_schnell");
  fs::create_directories(out_dir / "scheduler");
  write_json(out_dir / "scheduler" / "scheduler_config.json", diffusers_config(scheduler));
  const nlohmann::json index = {{"_class_name", "FluxPipeline"},
                                {"_diffusers_version", "0.38.0"},
                                {"transformer", {"diffusers", "FluxTransformer2DModel"}},
                                {"vae", {"diffusers", "AutoencoderKL"}},
                                {"text_encoder", {"transformers", "CLIPTextModel"}},
                                {"text_encoder_2", {"transformers", "T5EncoderModel"}},
                                {"tokenizer", {"transformers", "CLIPTokenizer"}},
                                {"tokenizer_2", {"transformers", "T5TokenizerFast"}},
                                {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}}};
  write_json(out_dir / "model_index.json", index);
  spdlog::info("demo base: diffusers folder {}", out_dir.string());
}

// ---------------------------------------------------------------------------------------------
// Wan 2.1

// The three files of a ComfyUI Wan 2.1 setup, tiny: one 128-wide head (native files carry no config;
// the loader reads Wan's 128-wide heads from the shapes), 2 blocks, a 64-wide umT5 and a VAE of
// base width 8 with Wan's levels and temporal downsampling.
void write_wan(const fs::path& out_dir, const DemoBaseOptions& o) {
  write_spiece_model(out_dir / "tokenizer");
  const auto tokenizer = models::load_t5_tokenizer(out_dir / "tokenizer");
  models::T5Config t5 = models::T5Config::umt5_xxl();
  t5.vocab_size = tokenizer.vocab_size();
  t5.d_model = 64;
  t5.d_kv = 16;
  t5.num_heads = 4;
  t5.d_ff = 128;
  t5.num_layers = 2;
  models::wan::WanTransformerConfig config;
  config.num_attention_heads = 1;
  config.attention_head_dim = 128;
  config.ffn_dim = 256;
  config.num_layers = 2;
  config.text_dim = t5.d_model;
  config.freq_dim = 64;
  models::wan::WanVaeConfig vae_config;
  vae_config.base_dim = 8;
  models::wan::WanTransformer3DModel transformer(config);
  models::T5EncoderModel text_encoder(t5);
  models::wan::AutoencoderKLWan vae(vae_config);

  if (o.diffusers) {
    // A WanPipeline folder (Wan-AI/Wan2.1-T2V-*-Diffusers): diffusers and transformers names.
    write_component(out_dir / "transformer", diffusers_config(config.to_json()), *transformer,
                    "diffusion_pytorch_model.safetensors", o.dtype);
    write_component(out_dir / "vae", diffusers_config(vae_config.to_json()), *vae, "diffusion_pytorch_model.safetensors",
                    o.dtype);
    nlohmann::json umt5 = t5.to_json();
    umt5["architectures"] = {"UMT5EncoderModel"};
    write_component(out_dir / "text_encoder", umt5, *text_encoder, "model.safetensors", o.dtype);
    nlohmann::json scheduler = sample::default_scheduler_config("wan");
    scheduler["_class_name"] = "UniPCMultistepScheduler";
    fs::create_directories(out_dir / "scheduler");
    write_json(out_dir / "scheduler" / "scheduler_config.json", diffusers_config(scheduler));
    write_json(out_dir / "model_index.json", {{"_class_name", "WanPipeline"},
                                              {"_diffusers_version", "0.38.0"},
                                              {"transformer", {"diffusers", "WanTransformer3DModel"}},
                                              {"vae", {"diffusers", "AutoencoderKLWan"}},
                                              {"text_encoder", {"transformers", "UMT5EncoderModel"}},
                                              {"tokenizer", {"transformers", "T5TokenizerFast"}},
                                              {"scheduler", {"diffusers", "UniPCMultistepScheduler"}}});
    spdlog::info("demo base: WanPipeline diffusers folder {}", out_dir.string());
    return;
  }
  Tensors tensors;
  for (auto& [key, value] : models::wan::native_transformer_tensors(*transformer)) tensors.emplace_back(key, stored(value, o.dtype));
  io::save_safetensors(out_dir / "wan2.1_t2v_tiny.safetensors", tensors,
                       {{"lora_train_demo", "tiny Wan 2.1 T2V-architecture transformer (native names) with seeded random weights"},
                        {"seed", std::to_string(o.seed)}});
  tensors.clear();
  for (const auto& p : text_encoder->named_parameters(true)) tensors.emplace_back(p.key(), stored(p.value(), o.dtype));
  std::ifstream spiece(out_dir / "tokenizer" / "spiece.model", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(spiece)), std::istreambuf_iterator<char>());
  tensors.emplace_back("spiece_model", torch::tensor(std::vector<uint8_t>(bytes.begin(), bytes.end()), torch::kByte));
  io::save_safetensors(out_dir / "umt5_xxl_fp16.safetensors", tensors, {{"format", "pt"}});
  tensors.clear();
  for (auto& [key, value] : models::wan::native_vae_tensors(*vae)) tensors.emplace_back(key, stored(value, o.dtype));
  io::save_safetensors(out_dir / "wan_2.1_vae.safetensors", tensors, {{"format", "pt"}});
  spdlog::info("demo base: Wan 2.1 transformer, umT5 and VAE in {}", out_dir.string());
}

}  // namespace

void write_demo_base(const fs::path& out_dir, const DemoBaseOptions& options) {
  if (options.dtype != at::kFloat && options.dtype != at::kHalf && options.dtype != at::kBFloat16) {
    throw InputError("demo base: weights dtype must be fp32, fp16 or bf16");
  }
  if (options.pretrain.enabled && (options.arch != DemoArch::kSD1 || options.full_size)) {
    throw InputError("demo base: pretraining is for the tiny SD1 base only (no --arch, --full-size)");
  }
  const auto& pre = options.pretrain;
  if (pre.enabled && (pre.images < 1 || pre.vae_steps < 1 || pre.vae_batch < 1 || pre.unet_steps < 1 || pre.unet_batch < 1 ||
                      !(pre.vae_lr > 0 && pre.vae_lr < 1) || !(pre.unet_lr > 0 && pre.unet_lr < 1))) {
    throw InputError("demo base: pretraining images, steps and batch sizes must be at least 1, the learning rates in (0, 1)");
  }
  if (pre.enabled && !(pre.other_words_share >= 0 && pre.other_words_share <= 1)) {
    throw InputError("demo base: the share of other words in the colour's place must be in [0, 1]");
  }
  if (pre.enabled && (pre.vae_image_size < 8 || pre.vae_image_size > 512 || pre.vae_image_size % 8 != 0)) {
    throw InputError("demo base: the autoencoder's training image size must be a multiple of 8 in 8..512");
  }
  // A crop the VAE can halve down to one latent cell: a multiple of 8 up to its images' size.
  if (pre.enabled && (pre.vae_crop < 0 || pre.vae_crop % 8 != 0 || pre.vae_crop > pre.vae_image_size)) {
    throw InputError("demo base: the autoencoder's crop must be 0 (whole images) or a multiple of 8 up to its image size");
  }
  if (pre.enabled && (pre.unet_width < 8 || pre.unet_width > 512 || pre.unet_width % pre.norm_groups != 0)) {
    throw InputError("demo base: the UNet's width must be in 8..512 and a multiple of the norm groups");
  }
  if (pre.enabled && pre.vae_levels != 3 && pre.vae_levels != 4) {
    throw InputError("demo base: the pretrained VAE has 3 or 4 levels (4 or 8 pixels per latent cell)");
  }
  // Latents of an even size, which the UNet halves once: a multiple of twice the VAE's cell.
  if (pre.enabled && (pre.image_size < 16 || pre.image_size > 512 || pre.image_size % (1 << pre.vae_levels) != 0)) {
    throw InputError("demo base: the pretraining image size must be a multiple of " + std::to_string(1 << pre.vae_levels) +
                     " in 16..512 (twice the latent cell of a " + std::to_string(pre.vae_levels) + "-level VAE)");
  }
  if (pre.enabled && (pre.norm_groups < 1 || 32 % pre.norm_groups != 0)) {
    throw InputError("demo base: pretraining norm groups must divide 32 (the tiny VAE's narrowest level)");
  }
  torch::manual_seed(options.seed);
  if (options.arch == DemoArch::kWan21) {
    if (options.full_size) throw InputError("demo base: wan21 is written tiny only");
    write_wan(out_dir, options);
    return;
  }
  // The vocabulary comes first: its size is the text encoders' vocab_size.
  fs::create_directories(out_dir / "tokenizer");
  models::write_demo_vocabulary(out_dir / "tokenizer", kWords);
  auto tokenizer = models::load_clip_tokenizer(out_dir / "tokenizer");
  if (options.arch == DemoArch::kFluxDev || options.arch == DemoArch::kFluxSchnell) {
    const bool dev = options.arch == DemoArch::kFluxDev;
    write_spiece_model(out_dir / "tokenizer_2");
    const auto t5_tokenizer = models::load_t5_tokenizer(out_dir / "tokenizer_2");
    FluxDemoModels models = build_flux(tokenizer, t5_tokenizer, dev, options.full_size);
    if (options.diffusers) {
      write_flux_diffusers_folder(out_dir, models, dev, options);
    } else {
      write_flux_single_file(out_dir, models, dev, options);
    }
    return;
  }
  const bool sdxl = options.arch == DemoArch::kSDXL;
  DemoModels models = sdxl ? build_sdxl(tokenizer, options.full_size)
                     : pre.enabled ? build_sd1(tokenizer, false, pre.norm_groups, pre.vae_levels,
                                               pre.image_size >> (pre.vae_levels - 1), pre.unet_width)
                                   : build_sd1(tokenizer, options.full_size);
  if (pre.enabled) pretrain_sd_demo(models.unet, models.vae, models.text_encoder, tokenizer, pre, options.seed);
  // The pretrained base is a diffusers folder, whose configs carry its group count.
  if (options.diffusers || pre.enabled) {
    write_diffusers_folder(out_dir, models, sdxl, options);
  } else {
    write_single_file(out_dir, models, sdxl, options);
  }
}

}  // namespace lt::train
