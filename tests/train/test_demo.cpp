// The demo shows learning: lt-make-demo-base --pretrain gives a base that has learned shapes, and the
// demo's LoRA teaches it a colour it never saw (cyan) under the trigger word.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>

#include "loratrain/data/demo_data.h"
#include "loratrain/io/image.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/sample/noise.h"
#include "loratrain/train/demo_base.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/objective.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

at::Tensor shapes_tensor(int count, uint64_t seed) {
  std::vector<at::Tensor> images;
  for (const auto& item : lt::data::make_shape_images(count, 64, seed, lt::data::ShapeColours::palette)) {
    images.push_back(lt::io::image_to_tensor(item.image));
  }
  return torch::stack(images);
}

struct BaseScore {
  double reconstruction = 0;  // VAE decode(encode(x)) mean squared error on fresh shapes
  double latent_mean = 0, latent_std = 0;
  double diffusion_loss = 0;  // the trainer's loss on fresh captioned shapes, fixed noise
};

BaseScore score(const fs::path& model_file) {
  lt::train::ModelLoadOptions options;
  options.name_or_path = model_file;
  auto model = lt::train::load_diffusion_model(options);
  model->set_training(false);
  torch::NoGradGuard no_grad;
  const auto items = lt::data::make_shape_images(16, 64, 999, lt::data::ShapeColours::palette);
  const at::Tensor images = shapes_tensor(16, 999);
  BaseScore s;
  const at::Tensor latents = model->encode_pixels(images, std::nullopt);
  s.reconstruction = (model->decode_latents(latents) - images).pow(2).mean().item<double>();
  s.latent_mean = latents.mean().item<double>();
  s.latent_std = latents.std().item<double>();
  std::vector<std::string> captions;
  for (const auto& item : items) captions.push_back(item.caption);
  lt::train::Conditioning conditioning;
  conditioning.text = model->encode_text(captions);
  conditioning.images.assign(items.size(), {64, 64, 0, 0, 64, 64});
  const lt::train::TrainingObjective objective(model->traits(), {});
  auto generator = lt::sample::make_generator(5);
  s.diffusion_loss = lt::train::training_loss(*model, objective, latents, conditioning, generator).item<double>();
  return s;
}

// The share of an image's pixels in the concept colour.
double concept_share(const lt::io::Image& image) {
  int64_t hits = 0;
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) hits += lt::data::is_concept_pixel(image.at(x, y));
  return static_cast<double>(hits) / (static_cast<double>(image.width) * image.height);
}

}  // namespace

CATCH_TEST_CASE("pretraining teaches the tiny SD1 base to encode, decode and denoise shapes", "[demo]") {
  const fs::path dir = lt::test::scratch_dir("demo_pretrain");
  lt::train::write_demo_base(dir / "random");
  lt::train::DemoBaseOptions options;
  options.pretrain.enabled = true;
  options.pretrain.images = 128;
  options.pretrain.vae_steps = 120;
  options.pretrain.unet_steps = 150;
  options.pretrain.unet_batch = 16;
  lt::train::write_demo_base(dir / "pretrained", options);

  const auto file = lt::io::SafetensorsFile::open(dir / "pretrained" / "model.safetensors");
  CATCH_CHECK(file->metadata().at("lora_train_demo").find("pretrained on generated shapes") != std::string::npos);

  const BaseScore random = score(dir / "random" / "model.safetensors");
  const BaseScore trained = score(dir / "pretrained" / "model.safetensors");
  CATCH_INFO("reconstruction " << random.reconstruction << " -> " << trained.reconstruction);
  CATCH_INFO("latents mean " << trained.latent_mean << " std " << trained.latent_std);
  CATCH_INFO("diffusion loss " << random.diffusion_loss << " -> " << trained.diffusion_loss);
  CATCH_CHECK(trained.reconstruction < 0.25 * random.reconstruction);
  // Latents scaled as SD's: about zero mean and unit variance (on shapes it was not normalised on).
  CATCH_CHECK(std::abs(trained.latent_mean) < 0.3);
  CATCH_CHECK(trained.latent_std > 0.7);
  CATCH_CHECK(trained.latent_std < 1.4);
  CATCH_CHECK(trained.diffusion_loss < 0.7 * random.diffusion_loss);

  lt::train::DemoBaseOptions sdxl = options;
  sdxl.arch = lt::train::DemoArch::kSDXL;
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "sdxl", sdxl), lt::InputError);
  CATCH_CHECK_FALSE(fs::exists(dir / "sdxl" / "model.safetensors"));
}

// The whole demo as scripts/demo runs it (a few minutes on two cores): run by hand with
// `test_demo "[demo-full]"`, or by bench/demo/bench-demo.
CATCH_TEST_CASE("the demo's LoRA draws the unseen colour with the trigger word and not without it", "[.][demo-full]") {
  const fs::path dir = lt::test::scratch_dir("demo_full");
  lt::train::DemoBaseOptions base;
  base.pretrain.enabled = true;
  lt::train::write_demo_base(dir / "base", base);
  lt::data::DemoDataOptions data;
  data.concept_every = 2;
  lt::data::make_demo_dataset(dir / "data", data);

  lt::train::RunRequest run;
  run.config_path = lt::test::source_dir() / "configs" / "demo.yaml";
  run.overrides = {"training_folder=" + (dir / "runs").string(),
                   "model.name_or_path=" + (dir / "base" / "model.safetensors").string(),
                   "datasets.0.folder_path=" + (dir / "data").string()};
  const auto result = lt::train::run_training(run);
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_REQUIRE(fs::exists(result.run_dir / "samples" / "progress.png"));

  // With the final LoRA and without it (the base), the same prompts with and without the trigger word, 4 seeds each.
  auto shares = [&](const std::vector<lt::train::SampleLoRA>& loras, double multiplier, const std::string& tag) {
    lt::train::SampleRequest request;
    request.config_path = run.config_path;
    request.overrides = run.overrides;
    request.loras = loras;
    request.multiplier_given = true;
    for (auto& l : request.loras) l.multiplier = multiplier;
    request.prompts = {"a ltdemo circle on a red background", "a ltdemo square on a black background",
                       "a circle on a red background", "a square on a black background"};
    std::vector<double> with(0), without(0);
    for (int64_t seed = 100; seed < 104; ++seed) {
      request.seed = seed;
      request.output_dir = dir / (tag + std::to_string(seed));
      const auto images = lt::train::run_sampling(request).images;
      CATCH_REQUIRE(images.size() == 4);
      for (size_t i = 0; i < images.size(); ++i) (i < 2 ? with : without).push_back(concept_share(lt::io::read_image(images[i])));
    }
    double w = 0, wo = 0;
    for (double v : with) w += v / static_cast<double>(with.size());
    for (double v : without) wo += v / static_cast<double>(without.size());
    return std::pair<double, double>{w, wo};
  };
  const auto [trained_with, trained_without] = shares({{result.lora_path, 1.0}}, 1.0, "lora");
  const auto [base_with, base_without] = shares({{result.lora_path, 0.0}}, 0.0, "base");
  CATCH_INFO("cyan share with the LoRA: trigger " << trained_with << ", no trigger " << trained_without);
  CATCH_INFO("cyan share of the base: trigger " << base_with << ", no trigger " << base_without);
  CATCH_CHECK(trained_with > 0.08);
  CATCH_CHECK(trained_without < 0.02);
  CATCH_CHECK(base_with < 0.02);
  CATCH_CHECK(trained_with > 5 * trained_without);
}
