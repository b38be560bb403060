// The embedded demo's tiny base models with seeded random weights: SD1 (the default), SDXL,
// Flux.1 (dev, schnell) and Wan 2.1 text-to-video.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>

namespace lt::train {

enum class DemoArch { kSD1, kSDXL, kFluxDev, kFluxSchnell, kWan21 };

// Pretraining of the tiny SD1 base on generated shapes (lt-make-demo-base --pretrain), so that its
// images show shapes and colours instead of noise: first the VAE as an autoencoder of shapes in random
// colours, then the UNet on the diffusion loss over captioned shapes in the caption palette (never the
// demo's concept colour, data::kDemoConceptColour), conditioned by the seeded random CLIP text encoder,
// which is not trained (its features already tell the words apart). The pretrained base is written as
// a diffusers folder: its vae/ and unet/ configs carry norm_num_groups and the VAE's levels, which a
// single file cannot (single-file loaders assume 32 groups). The defaults are the measured ones of
// docs/benchmarks.md ("Against diffusers, then a VAE config that learns"): a three-level VAE at 32 px
// with 8 groups, peak learning rate 1e-3 without warm-up, learns colours and shapes; SD's four levels
// at 64 px did not within minutes, in diffusers' implementation as in ours.
struct DemoPretrainOptions {
  bool enabled = false;
  int norm_groups = 8;   // GroupNorm groups of the VAE and the UNet
  // VAE levels: 3 (4 pixels per latent cell) or 4 (8, SD's). Both are diffusers AutoencoderKL configs;
  // the loaders read the factor from the VAE's config.
  int vae_levels = 3;
  int image_size = 32;   // the diffusion model's square images (the demo's resolution), pixels
  int images = 512;      // captioned shape images (the autoencoder gets as many of its own)
  int vae_steps = 1200;  // batches of vae_batch
  int vae_batch = 16;
  double vae_lr = 1e-3;  // Adam's peak learning rate for the autoencoder
  // The autoencoder's training images (square, pixels; a multiple of 8): 32 costs a quarter of 64 per
  // image and learned faster for the CPU time than 64 did (docs/benchmarks.md).
  int vae_image_size = 32;
  // Random 16-pixel crops of those images (0: whole images): the shapes at their own scale for 40%
  // of the CPU time per step. 1200 steps of them: 800 gave a held-out error of 0.049-0.059, and at
  // 0.059 the base drew red as pink (docs/benchmarks.md, "The demo base in a third of the time");
  // fewer steps, a smaller batch or a higher rate did not learn the colours.
  int vae_crop = 16;
  // The UNet: batch 32 at peak 2e-3 for 400 steps (a third of the images and CPU time of 1500 x 16
  // at 1e-3): a base that draws the colours its prompts name and on which the demo's LoRA learns its
  // concept. 300 steps, peak 3e-3, or 32/64 and 48/96 channels did not always give both
  // (docs/benchmarks.md, "The demo base in a third of the time").
  int unet_steps = 400;  // batches of unet_batch
  int unet_batch = 32;
  int unet_width = 64;    // channels of the UNet's first level (the second has twice as many)
  double unet_lr = 2e-3;  // Adam's peak learning rate for the UNet
  // The share of the UNet's captions that name a shape colour in which another word takes the
  // colour's place (a placeholder whose token embedding is drawn anew for each caption, as the
  // trigger word's was) and the shape has a colour outside the palette, away from the concept's
  // (data::OtherColourWords). Off: at 0.25 the demo's LoRA passed on one of four bases
  // (docs/benchmarks.md, "Teaching the base to read any word in the colour's place").
  double other_words_share = 0.0;
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
//
// Wan 2.1: the official/ComfyUI files side by side, as ComfyUI users keep them:
// OUT/wan2.1_t2v_tiny.safetensors (the transformer in native names: blocks.N.self_attn.q, head.head;
// 128-wide heads as Wan's), OUT/umt5_xxl_fp16.safetensors (umT5 in transformers names plus the
// `spiece_model` bytes, as ComfyUI's umT5 files carry the tokenizer), OUT/wan_2.1_vae.safetensors
// (the causal video VAE in native names), and OUT/tokenizer/spiece.model. With `diffusers`: a
// WanPipeline folder (transformer/, vae/, text_encoder/ UMT5EncoderModel, tokenizer/, scheduler/).
// `full_size` is not offered for Wan.
void write_demo_base(const std::filesystem::path& out_dir, const DemoBaseOptions& options = {});

}  // namespace lt::train
