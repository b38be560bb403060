// The embedded demo's tiny base models with seeded random weights: SD1 (the default), SDXL and
// Flux.1 (dev, schnell).
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>

namespace lt::train {

enum class DemoArch { kSD1, kSDXL, kFluxDev, kFluxSchnell };

// Pretraining of the tiny SD1 base on generated shapes (lt-make-demo-base --pretrain), so that its
// images show shapes and colours instead of noise: first the VAE as an autoencoder of shapes in random
// colours, then the UNet on the diffusion loss over captioned shapes in the caption palette (never the
// demo's concept colour, data::kDemoConceptColour), conditioned by the seeded random CLIP text encoder,
// which is not trained (its features already tell the words apart).
struct DemoPretrainOptions {
  bool enabled = false;
  int images = 512;      // captioned 64x64 shape images (the autoencoder gets as many of its own)
  int vae_steps = 200;   // batches of vae_batch
  int vae_batch = 8;
  int unet_steps = 500;  // batches of unet_batch
  int unet_batch = 16;
};

struct DemoBaseOptions {
  DemoArch arch = DemoArch::kSD1;
  uint64_t seed = 1234;
  // The real architecture's shapes (SD1.5: 860M-parameter UNet, SD VAE, CLIP ViT-L; SDXL base:
  // 2.6B UNet, CLIP ViT-L + OpenCLIP ViT-bigG) instead of the tiny demo sizes.
  bool full_size = false;
  // A diffusers folder (model_index.json, unet/, vae/, text_encoder/, tokenizer/, and for SDXL
  // text_encoder_2/, tokenizer_2/, scheduler/) instead of a single file.
  bool diffusers = false;
  at::ScalarType dtype = at::kFloat;  // of the written weights (fp32, fp16 or bf16)
  DemoPretrainOptions pretrain;       // tiny SD1 single file only
};

// Single file (default): OUT/model.safetensors with the original key names a downloaded
// checkpoint has (SD1: model.diffusion_model.*, first_stage_model.*, cond_stage_model.transformer.*;
// SDXL: model.diffusion_model.* with label_emb, conditioner.embedders.0.transformer.* CLIP,
// conditioner.embedders.1.model.* OpenCLIP with fused in_proj and text_projection,
// first_stage_model.*) and OUT/tokenizer/ (vocab.json + merges.txt covering the demo captions'
// words and the trigger word "ltdemo"). With `diffusers`, the same weights as a diffusers folder.
// Same seed and arch: the same models in both layouts.
//
// Flux: OUT/model.safetensors is a ComfyUI all-in-one checkpoint (model.diffusion_model.* in BFL
// names with fused qkv, text_encoders.clip_l.transformer.*, text_encoders.t5xxl.transformer.*,
// vae.* in LDM names), with OUT/tokenizer/ (CLIP vocabulary) and OUT/tokenizer_2/spiece.model (a
// SentencePiece model trained on the demo words by Debian's spm_train). With `diffusers`: a
// FluxPipeline folder whose transformer/ is split into two shards with an index.
void write_demo_base(const std::filesystem::path& out_dir, const DemoBaseOptions& options = {});

}  // namespace lt::train
