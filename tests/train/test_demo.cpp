// The demo shows learning: lt-make-demo-base --pretrain gives a base that has learned shapes in the
// palette's colours and draws the colours its prompts name, and the demo's LoRA (configs/demo.yaml)
// teaches it a colour it never saw (cyan) under the trigger word "ltdemo", and only there. The
// acceptance case ("[demo-full]") pretrains with the defaults (about 5 CPU minutes), so it is hidden
// here and registered with ctest on its own as test_demo_full (label slow).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "loratrain/data/demo_data.h"
#include "loratrain/io/image.h"
#include "loratrain/train/demo_base.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

namespace {

namespace fs = std::filesystem;

// decode(encode(x)) mean squared error (pixels in [-1, 1]) on fresh shapes in random colours,
// through the trainer's own loader.
double reconstruction_mse(const fs::path& model_dir) {
  lt::train::ModelLoadOptions options;
  options.name_or_path = model_dir;
  auto model = lt::train::load_diffusion_model(options);
  model->set_training(false);
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> images;
  for (const auto& item : lt::data::make_shape_images(32, lt::train::DemoPretrainOptions{}.image_size, 999,
                                                      lt::data::ShapeColours::random)) {
    images.push_back(lt::io::image_to_tensor(item.image));
  }
  const at::Tensor x = torch::stack(images);
  return (model->decode_latents(model->encode_pixels(x, std::nullopt)) - x).pow(2).mean().item<double>();
}

template <typename Pred>
double share(const fs::path& png, Pred pred) {
  const lt::io::Image image = lt::io::read_image(png);
  int64_t hits = 0;
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) hits += pred(image.at(x, y));
  return static_cast<double>(hits) / (static_cast<double>(image.width) * image.height);
}

bool is_concept(const uint8_t* p) { return lt::data::is_concept_pixel(p); }
// The palette's red (220, 40, 40).
bool is_red(const uint8_t* p) { return p[0] > 150 && p[1] < 100 && p[2] < 100; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

CATCH_TEST_CASE("pretraining is offered for the tiny SD1 base only, with a group count that fits", "[demo]") {
  const fs::path dir = lt::test::scratch_dir("demo_options");
  lt::train::DemoBaseOptions options;
  options.pretrain.enabled = true;
  options.arch = lt::train::DemoArch::kSDXL;
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "sdxl", options), lt::InputError);
  options.arch = lt::train::DemoArch::kSD1;
  options.pretrain.norm_groups = 3;
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "groups", options), lt::InputError);
  options.pretrain.norm_groups = 1;
  options.pretrain.vae_levels = 2;
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "levels", options), lt::InputError);
  options.pretrain.vae_levels = 4;
  options.pretrain.image_size = 40;  // 5 latent cells of 8: the UNet cannot halve them
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "size", options), lt::InputError);
  options.pretrain.image_size = 32;
  options.pretrain.vae_crop = 12;  // the VAE cannot halve 12 pixels three times
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "crop", options), lt::InputError);
  options.pretrain.vae_crop = 16;
  options.pretrain.norm_groups = 8;
  options.pretrain.unet_width = 44;  // not a multiple of the 8 groups
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "width", options), lt::InputError);
  options.pretrain.unet_width = 64;
  options.pretrain.other_words_share = 1.5;
  CATCH_CHECK_THROWS_AS(lt::train::write_demo_base(dir / "share", options), lt::InputError);
  CATCH_CHECK_FALSE(fs::exists(dir / "share"));
  CATCH_CHECK_FALSE(fs::exists(dir / "crop"));
  CATCH_CHECK_FALSE(fs::exists(dir / "width"));
  CATCH_CHECK_FALSE(fs::exists(dir / "sdxl"));
  CATCH_CHECK_FALSE(fs::exists(dir / "groups"));
  CATCH_CHECK_FALSE(fs::exists(dir / "levels"));
  CATCH_CHECK_FALSE(fs::exists(dir / "size"));
}

// Other words in the colour's place: only in captions that name a colour, in colours away from the
// palette and the concept's; without them the captions are the palette's as before.
CATCH_TEST_CASE("pretraining captions can put another word in the colour's place", "[demo]") {
  using lt::data::ShapeColours;
  const auto plain = lt::data::make_shape_images(64, 32, 7, ShapeColours::palette);
  const auto none = lt::data::make_shape_images(64, 32, 7, ShapeColours::palette, {{"photo"}, 0.0});
  const auto all = lt::data::make_shape_images(64, 32, 7, ShapeColours::palette, {{"photo"}, 1.0});
  for (size_t i = 0; i < plain.size(); ++i) {
    CATCH_CHECK(none[i].caption == plain[i].caption);
    CATCH_CHECK_FALSE(none[i].other_word);
  }
  // At share 1, every caption that names a colour names the other word instead.
  int others = 0;
  for (const auto& item : all) {
    const std::string& caption = item.caption;
    const bool named = caption.rfind("a circle", 0) != 0 && caption.rfind("a square", 0) != 0 &&
                       caption.rfind("a triangle", 0) != 0;
    CATCH_CHECK(item.other_word == named);
    CATCH_CHECK((caption.rfind("a photo ", 0) == 0) == named);
    if (!item.other_word) continue;
    ++others;
    // No pixel in the concept colour, the shape's antialiased edge included.
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) CATCH_CHECK_FALSE(lt::data::is_concept_pixel(item.image.at(x, y)));
  }
  CATCH_CHECK(others > 32);
  CATCH_CHECK_THROWS_AS(lt::data::make_shape_images(4, 32, 7, ShapeColours::palette, {{"photo"}, -0.1}), lt::InputError);
}

// The pretrained base's VAE has three levels (4 pixels per latent cell): the trainer's loader reads the
// factor from its config rather than assuming SD's 8, and a run on it trains, previews and saves.
CATCH_TEST_CASE("the loaders take the latent scale from the VAE's config", "[demo]") {
  const fs::path dir = lt::test::scratch_dir("demo_levels");
  for (const int levels : {3, 4}) {
    lt::train::DemoBaseOptions base;
    base.pretrain.enabled = true;
    base.pretrain.vae_levels = levels;
    base.pretrain.image_size = 32;
    base.pretrain.images = 8;
    base.pretrain.vae_steps = 1;
    base.pretrain.unet_steps = 1;
    base.pretrain.vae_batch = base.pretrain.unet_batch = 2;
    const fs::path folder = dir / ("base" + std::to_string(levels));
    lt::train::write_demo_base(folder, base);
    lt::train::ModelLoadOptions options;
    options.name_or_path = folder;
    auto model = lt::train::load_diffusion_model(options);
    const int64_t cell = levels == 3 ? 4 : 8;
    CATCH_CHECK(model->traits().latent_downscale == cell);
    CATCH_CHECK(model->traits().bucket_divisibility == 2 * cell);
    torch::NoGradGuard no_grad;
    const at::Tensor pixels = torch::zeros({1, 3, 32, 48});
    const at::Tensor latents = model->encode_pixels(pixels, std::nullopt);
    CATCH_CHECK(latents.sizes() == at::IntArrayRef({1, 4, 32 / cell, 48 / cell}));
    CATCH_CHECK(model->decode_latents(latents).sizes() == pixels.sizes());
  }
  // configs/demo.yaml's run on the three-level base at 32 px, with a preview: the previews' latents
  // come from the same factor.
  lt::data::DemoDataOptions data;
  data.count = 4;
  data.size = 32;
  lt::data::make_demo_dataset(dir / "data", data);
  lt::train::RunRequest run;
  run.config_path = lt::test::source_dir() / "configs" / "demo.yaml";
  run.overrides = {"training_folder=" + (dir / "runs").string(), "model.name_or_path=" + (dir / "base3").string(),
                   "datasets.0.folder_path=" + (dir / "data").string(), "datasets.0.resolution=[32]",
                   "train.steps=2", "sample.sample_every=2", "sample.width=32", "sample.height=32", "sample.sample_steps=2"};
  const auto result = lt::train::run_training(run);
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 2);
  // The previews at step 2 (one per prompt of the config) are 32x32.
  size_t previews = 0;
  for (const auto& entry : fs::directory_iterator(result.run_dir / "samples")) {
    const std::string name = entry.path().filename().string();
    if (name.find("__000000002_") == std::string::npos) continue;
    const lt::io::Image image = lt::io::read_image(entry.path());
    CATCH_CHECK(image.width == 32);
    CATCH_CHECK(image.height == 32);
    ++previews;
  }
  CATCH_CHECK(previews > 0);
}

// The whole demo: pretraining with the defaults, configs/demo.yaml's run on the concept dataset
// (lt-make-demo-data --concept-every 2), then samples with and without the LoRA and the trigger word.
// LT_DEMO_PRETRAINED=DIR takes a base that `lt-make-demo-base DIR --pretrain` (the defaults) wrote
// instead of pretraining one here (the pretraining is most of the time).
CATCH_TEST_CASE("the demo's LoRA draws the unseen colour with the trigger word and not without it", "[.][demo-full][slow]") {
  const fs::path dir = lt::test::scratch_dir("demo_full");
  auto start = std::chrono::steady_clock::now();
  lt::train::DemoBaseOptions base;
  base.pretrain.enabled = true;
  const char* given = std::getenv("LT_DEMO_PRETRAINED");
  const fs::path base_dir = given ? fs::path(given) : dir / "base";
  if (!given) lt::train::write_demo_base(base_dir, base);
  const double pretrain_s = seconds_since(start);

  // A diffusers folder whose configs carry the group count and the levels the loaders must use.
  nlohmann::json vae_config;
  std::ifstream(base_dir / "vae" / "config.json") >> vae_config;
  CATCH_CHECK(vae_config.at("norm_num_groups") == base.pretrain.norm_groups);
  CATCH_CHECK(vae_config.at("block_out_channels").size() == static_cast<size_t>(base.pretrain.vae_levels));
  CATCH_REQUIRE(fs::exists(base_dir / "model_index.json"));
  const double mse = reconstruction_mse(base_dir);

  lt::data::DemoDataOptions data;
  data.concept_every = 2;
  lt::data::make_demo_dataset(dir / "data", data);

  start = std::chrono::steady_clock::now();
  lt::train::RunRequest run;
  run.config_path = lt::test::source_dir() / "configs" / "demo.yaml";
  // configs/demo.yaml as scripts/demo runs it, on this base and data.
  run.overrides = {"training_folder=" + (dir / "runs").string(), "model.name_or_path=" + base_dir.string(),
                   "datasets.0.folder_path=" + (dir / "data").string()};
  const auto result = lt::train::run_training(run);
  const double train_s = seconds_since(start);
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_REQUIRE(fs::exists(result.run_dir / "samples" / "progress.png"));

  // Mean shares over 4 seeds of: the concept colour with the trigger word, the concept colour
  // without it, and the palette's red where the prompt asks for a red background without the word.
  struct Shares {
    double concept_with = 0, concept_without = 0, red_without = 0;
  };
  auto measure = [&](double multiplier, const std::string& tag) {
    lt::train::SampleRequest request;
    request.config_path = run.config_path;
    request.overrides = run.overrides;
    request.loras = {{result.lora_path, multiplier}};
    request.multiplier_given = true;
    request.prompts = {"a ltdemo circle on a red background", "a ltdemo square on a black background",
                       "a circle on a red background", "a square on a black background"};
    Shares s;
    constexpr int kSeeds = 4;
    for (int64_t seed = 100; seed < 100 + kSeeds; ++seed) {
      request.seed = seed;
      request.output_dir = dir / (tag + std::to_string(seed));
      const auto images = lt::train::run_sampling(request).images;
      CATCH_REQUIRE(images.size() == 4);
      s.concept_with += (share(images[0], is_concept) + share(images[1], is_concept)) / (2 * kSeeds);
      s.concept_without += (share(images[2], is_concept) + share(images[3], is_concept)) / (2 * kSeeds);
      s.red_without += share(images[2], is_red) / kSeeds;
    }
    return s;
  };
  const Shares trained = measure(1.0, "lora");
  const Shares untrained = measure(0.0, "base");
  CATCH_INFO("pretraining " << pretrain_s << " s, demo run " << train_s << " s");
  CATCH_INFO("VAE held-out reconstruction MSE " << mse);
  CATCH_INFO("cyan share with the LoRA: trigger " << trained.concept_with << ", no trigger " << trained.concept_without);
  CATCH_INFO("cyan share of the base: trigger " << untrained.concept_with << ", no trigger " << untrained.concept_without);
  CATCH_INFO("red share, 'a circle on a red background': base " << untrained.red_without << ", LoRA "
                                                                << trained.red_without);
  // Thresholds from the measured runs (2026-12-05, docs/benchmarks.md "A UNet that follows its
  // captions"): MSE 0.042; base red 0.74, cyan 0.000 with the word and 0.0005 without; LoRA cyan
  // 0.168-0.201 with, 0.002-0.023 without, red 0.80-0.88; the defaults end to end (a fresh
  // pretraining, 07:55 UTC) 0.200 with, 0.041 without. A LoRA on all default targets (cyan
  // 0.014-0.057, 0.027-0.082 without the word) or data whose captions always name a colour (0.164
  // with, 0.080 without) fails them. The faster defaults (docs/benchmarks.md "The demo base in a
  // third of the time"): MSE 0.028-0.032, base red 0.69-0.82, LoRA cyan 0.104-0.154 with, 0
  // without, red 0.52-1.0; shorter schedules and narrower UNets that fail them are listed there.
  // The defaults, each batch in two halves (deterministic on a given CPU: the default seed's base
  // is the same in every run here): cyan 0.250 / 0, red 0.884 / 0.993. On the bases of seeds 1-4
  // the LoRA drew too little cyan (0.007-0.092): its learning speed differs by base, and no recipe
  // tried passed on all of them (docs/benchmarks.md "A demo LoRA for any base: not found yet"), so
  // this case can fail where another CPU pretrains another base. Bases pretrained with other words
  // in the colour's place (--other-words-share 0.25, off by default) passed on one of four (cyan
  // 0.179 / 0 there, 0-0.068 on the others; "Teaching the base to read any word in the colour's
  // place").
  CATCH_CHECK(mse < 0.06);  // each image's mean colour scores about 0.11
  // The base draws the colour a prompt names (the red background fills most of the picture) and
  // never the concept's.
  CATCH_CHECK(untrained.red_without > 0.5);
  CATCH_CHECK(untrained.concept_with < 0.02);
  CATCH_CHECK(untrained.concept_without < 0.02);
  // The LoRA: cyan with the trigger word (a shape covers about a quarter of the picture), not
  // without it, and the named colours kept.
  CATCH_CHECK(trained.concept_with > 0.1);
  CATCH_CHECK(trained.concept_without < 0.06);
  CATCH_CHECK(trained.concept_with > 3 * trained.concept_without);
  CATCH_CHECK(trained.red_without > 0.5);
  // Printed for docs/benchmarks.md.
  CATCH_WARN("pretraining " << pretrain_s << " s, demo run " << train_s << " s; VAE MSE " << mse << "; cyan with/without "
                            << trained.concept_with << "/" << trained.concept_without << " (base " << untrained.concept_with
                            << "/" << untrained.concept_without << "); red " << untrained.red_without << "/"
                            << trained.red_without);
}
