// lt-make-demo-base OUT_DIR [--arch sd1|sdxl|flux|flux-schnell|wan21] [--diffusers] [--seed N] [--full-size]
//                   [--dtype D] [--pretrain [--pretrain-images N] [--vae-steps N] [--unet-steps N] [--norm-groups N]
//                   [--vae-image-size N] [--vae-levels 3|4] [--image-size N] [--vae-lr LR] [--vae-batch N]
//                   [--vae-crop N] [--unet-lr LR] [--unet-batch N] [--unet-width N]
//                   [--other-words-share S]]:
// writes the embedded demo's tiny base model (random weights, or with --pretrain trained on generated
// shapes) and its vocabulary; see train/demo_base.h.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <map>

#include "loratrain/train/demo_base.h"
#include "loratrain/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Writes the embedded demo's tiny base model (random weights): SD1 (default), SDXL, Flux.1 dev (flux) "
               "Flux.1 schnell (flux-schnell) or Wan 2.1 text-to-video (wan21) architecture"};
  std::string out_dir;
  std::string arch = "sd1";
  std::string dtype = "fp32";
  lt::train::DemoBaseOptions options;
  app.add_option("out_dir", out_dir, "folder for model.safetensors and tokenizer/ (or the diffusers folder)")->required();
  app.add_option("--arch", arch, "architecture")->check(CLI::IsMember({"sd1", "sdxl", "flux", "flux-schnell", "wan21"}))->capture_default_str();
  app.add_flag("--diffusers", options.diffusers, "write a diffusers folder instead of a single-file checkpoint");
  app.add_option("--seed", options.seed, "weight seed")->capture_default_str();
  app.add_flag("--full-size", options.full_size,
               "the real shapes (SD1.5: about 4 GiB in fp32; SDXL base: about 14 GiB in fp32, 7 in fp16/bf16) "
               "instead of the tiny demo model");
  auto& pre = options.pretrain;
  app.add_flag("--pretrain", pre.enabled,
               "train the tiny SD1 base on generated shapes (VAE, then UNet; a few minutes on 2 cores) so that its "
               "images show shapes instead of noise; written as a diffusers folder");
  app.add_option("--pretrain-images", pre.images, "captioned shape images to pretrain on")->capture_default_str();
  app.add_option("--vae-steps", pre.vae_steps, "autoencoder steps (batches of " + std::to_string(pre.vae_batch) + ")")
      ->capture_default_str();
  app.add_option("--vae-image-size", pre.vae_image_size, "size of the autoencoder's square training images (multiple of 8)")
      ->capture_default_str();
  app.add_option("--vae-batch", pre.vae_batch, "autoencoder batch size")->capture_default_str();
  app.add_option("--vae-crop", pre.vae_crop, "train the autoencoder on random square crops of this many pixels (0: whole images)")
      ->capture_default_str();
  app.add_option("--unet-steps", pre.unet_steps, "UNet steps (batches of " + std::to_string(pre.unet_batch) + ")")
      ->capture_default_str();
  app.add_option("--unet-lr", pre.unet_lr, "the UNet's peak learning rate (Adam)")->capture_default_str();
  app.add_option("--unet-width", pre.unet_width, "channels of the UNet's first level (the second: twice as many)")
      ->capture_default_str();
  app.add_option("--unet-batch", pre.unet_batch, "UNet batch size")->capture_default_str();
  app.add_option("--other-words-share", pre.other_words_share,
                 "share of the UNet's colour-naming captions with another word in the colour's place and the shape in "
                 "a colour outside the palette")
      ->capture_default_str();
  app.add_option("--vae-levels", pre.vae_levels, "levels of the pretrained VAE: 3 (4 pixels per latent cell) or 4 (8, SD's)")
      ->capture_default_str();
  app.add_option("--image-size", pre.image_size, "the pretrained base's square image size (pixels)")->capture_default_str();
  app.add_option("--vae-lr", pre.vae_lr, "the autoencoder's peak learning rate (Adam)")->capture_default_str();
  app.add_option("--norm-groups", pre.norm_groups, "GroupNorm groups of the pretrained VAE and UNet (divides 32)")
      ->capture_default_str();
  app.add_option("--dtype", dtype, "dtype of the written weights")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::map<std::string, lt::train::DemoArch> archs = {{"sd1", lt::train::DemoArch::kSD1},
                                                            {"sdxl", lt::train::DemoArch::kSDXL},
                                                            {"flux", lt::train::DemoArch::kFluxDev},
                                                            {"flux-schnell", lt::train::DemoArch::kFluxSchnell},
                                                            {"wan21", lt::train::DemoArch::kWan21}};
  options.arch = archs.at(arch);
  const std::map<std::string, at::ScalarType> dtypes = {{"fp32", at::kFloat}, {"fp16", at::kHalf}, {"bf16", at::kBFloat16}};
  options.dtype = dtypes.at(dtype);
  try {
    lt::train::write_demo_base(out_dir, options);
    return 0;
  } catch (const lt::InputError& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
