// AI Toolkit's own UI jobs and example configs for the families lora-train trains run to the end,
// on a tiny base of the same layout found through the local Hugging Face cache (as the repo ids
// resolve).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>

#include "../config/scoped_env.h"
#include "loratrain/config/config.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/flux/transformer.h"
#include "loratrain/train/trainer.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

CATCH_TEST_CASE("AI Toolkit's UI jobs for SD 1.5 and SDXL run to the end on a tiny base in the Hugging Face cache",
                "[train][e2e][aitk]") {
  const auto [job, repo, arch] =
      GENERATE(std::make_tuple(std::string("ui_sd15.yaml"), std::string("stable-diffusion-v1-5/stable-diffusion-v1-5"),
                               lt::train::DemoArch::kSD1),
               std::make_tuple(std::string("ui_sdxl.yaml"), std::string("stabilityai/stable-diffusion-xl-base-1.0"),
                               lt::train::DemoArch::kSDXL));
  CATCH_INFO(job);
  const fs::path root = lt::test::scratch_dir("aitk_run_" + job.substr(0, job.find('.')));
  lt::test::put_in_hub_cache(root / "hub", repo, arch);
  // Its own images: this executable runs beside test_train, whose shared assets it must not touch.
  lt::data::DemoDataOptions images;
  images.count = 8;
  images.size = 64;
  lt::data::make_demo_dataset(root / "images", images);
  lt::test::ScopedEnv env;
  env.set("HF_HUB_CACHE", (root / "hub").string());

  lt::train::RunRequest request;
  request.config_path = lt::test::source_dir() / "tests" / "config" / "data" / "aitk" / job;
  // folder_path and device, as a user changes them; the rest only keeps the test short (a few
  // steps, small previews) and the outputs in the scratch folder.
  request.overrides = {"datasets.0.folder_path=" + (root / "images").string(),
                       "device=cpu",
                       "training_folder=" + root.string(),
                       "train.steps=4",
                       "save.save_every=2",
                       "sample.sample_every=4",
                       "sample.sample_steps=2",
                       "sample.width=64",
                       "sample.height=64"};
  const auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 4);
  const fs::path run = root / "my_first_lora_v1";
  CATCH_CHECK(fs::exists(run / "my_first_lora_v1_000000002.safetensors"));
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000000.png"));  // skip_first_sample: false
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000004.png"));
  CATCH_CHECK(fs::exists(run / "report.html"));
  // save_format: diffusers -> PEFT names, in bf16 (save.dtype), with the UI's conv 16 on SD UNets.
  auto lora = lt::io::SafetensorsFile::open(run / "my_first_lora_v1.safetensors");
  bool peft = false, conv = false;
  for (const auto& t : lora->tensors()) {
    if (t.name.find(".lora_A.weight") != std::string::npos) peft = true;
    if (t.name.find("conv") != std::string::npos && t.shape.size() == 4) conv = true;
    CATCH_CHECK(t.dtype == lt::io::DType::BF16);
  }
  CATCH_CHECK(peft);
  CATCH_CHECK(conv);
}

CATCH_TEST_CASE("train.unload_text_encoder: prompts encoded once, the text encoder unloaded, previews still made",
                "[train][e2e][aitk]") {
  const fs::path root = lt::test::scratch_dir("aitk_run_unload");
  lt::test::put_in_hub_cache(root / "hub", "stable-diffusion-v1-5/stable-diffusion-v1-5", lt::train::DemoArch::kSD1);
  lt::data::DemoDataOptions images;
  images.count = 4;
  images.size = 64;
  lt::data::make_demo_dataset(root / "images", images);
  lt::test::ScopedEnv env;
  env.set("HF_HUB_CACHE", (root / "hub").string());

  lt::train::RunRequest request;
  request.config_path = lt::test::source_dir() / "tests" / "config" / "data" / "aitk" / "ui_sd15.yaml";
  request.overrides = {"datasets.0.folder_path=" + (root / "images").string(),
                       "device=cpu",
                       "training_folder=" + root.string(),
                       "trigger_word=sks",
                       "train.unload_text_encoder=true",
                       "train.steps=2",
                       "save.save_every=2",
                       "sample.sample_every=2",
                       "sample.sample_steps=2",
                       "sample.width=64",
                       "sample.height=64"};
  const auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  const fs::path run = root / "my_first_lora_v1";
  std::ifstream in(run / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(in)), {});
  CATCH_INFO(log);
  CATCH_CHECK(log.find("text encoders unloaded") != std::string::npos);
  // The UI's bookkeeping keys: listed once, at info level.
  const std::string ignored = "I accepted for AI Toolkit compatibility, no effect in lora-train (docs/config.md): ";
  const size_t listed = log.find(ignored);
  CATCH_CHECK(listed != std::string::npos);
  CATCH_CHECK(log.find("accepted for AI Toolkit compatibility", listed + ignored.size()) == std::string::npos);
  // Text embeddings are not cached (the UI writes cache_text_embeddings: false): every image trains
  // on the trigger word, not its caption, as AI Toolkit does, and the log says so.
  CATCH_CHECK(log.find("text embeddings are not cached, so every image trains on the trigger word 'sks'") !=
              std::string::npos);
  // Previews use the prompts encoded before the unload.
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000000.png"));
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000002.png"));

  // With cached embeddings of captions that do not change, the captions are trained on.
  request.overrides.push_back("train.cache_text_embeddings=true");
  request.overrides.push_back("datasets.0.caption_dropout_rate=0");
  for (auto& o : request.overrides)
    if (o.rfind("training_folder=", 0) == 0) o = "training_folder=" + (root / "cached").string();
  const auto cached = lt::train::run_training(request);
  CATCH_REQUIRE(cached.exit_code == 0);
  std::ifstream in2(root / "cached" / "my_first_lora_v1" / "log.txt");
  const std::string log2((std::istreambuf_iterator<char>(in2)), {});
  CATCH_INFO(log2);
  CATCH_CHECK(log2.find("text encoders unloaded") != std::string::npos);
  CATCH_CHECK(log2.find("trains on the trigger word") == std::string::npos);
}


namespace {

// The assistant adapter AI Toolkit's schnell example names (ostris/FLUX.1-schnell-training-adapter):
// a PEFT LoRA on every block Linear of the cached base's transformer, with non-zero weights.
void put_assistant_in_hub_cache(const fs::path& hub, const fs::path& base) {
  const fs::path dir = hub / "models--ostris--FLUX.1-schnell-training-adapter";
  fs::create_directories(dir / "refs");
  std::ofstream(dir / "refs" / "main") << "a1b2c3";
  std::ifstream in(base / "transformer" / "config.json");
  lt::models::flux::FluxTransformer2DModel transformer(lt::models::flux::FluxConfig::from_json(nlohmann::json::parse(in)));
  lt::lora::NetworkConfig config;
  config.linear = 2;
  config.linear_alpha = 2;
  lt::lora::LoRANetwork network(config);
  const auto spec = lt::lora::ComponentSpec::flux_transformer();
  network->add_component(spec, *transformer);
  torch::manual_seed(3);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : network->parameters()) p.normal_(0.0, 0.05);
  }
  fs::create_directories(dir / "snapshots" / "a1b2c3");
  lt::lora::SaveOptions save;
  save.format = lt::lora::LoRAFormat::PEFT;
  network->save(dir / "snapshots" / "a1b2c3" / "pytorch_lora_weights.safetensors", save);
}

}  // namespace

CATCH_TEST_CASE("AI Toolkit's Flux examples (dev, schnell with its assistant adapter) run on a tiny Flux in the "
                "Hugging Face cache",
                "[train][e2e][aitk][flux]") {
  const auto [job, repo, arch] =
      GENERATE(std::make_tuple(std::string("example_flux_24gb.yaml"), std::string("black-forest-labs/FLUX.1-dev"),
                               lt::train::DemoArch::kFluxDev),
               std::make_tuple(std::string("example_flux_schnell_24gb.yaml"),
                               std::string("black-forest-labs/FLUX.1-schnell"), lt::train::DemoArch::kFluxSchnell));
  CATCH_INFO(job);
  const fs::path root = lt::test::scratch_dir("aitk_run_" + job.substr(0, job.find('.')));
  lt::test::put_in_hub_cache(root / "hub", repo, arch);
  if (arch == lt::train::DemoArch::kFluxSchnell) {
    put_assistant_in_hub_cache(root / "hub", root / "hub" / "models--black-forest-labs--FLUX.1-schnell" / "snapshots" / "5f2c1a");
  }
  lt::data::DemoDataOptions images;
  images.count = 6;
  images.size = 64;
  lt::data::make_demo_dataset(root / "images", images);
  lt::test::ScopedEnv env;
  env.set("HF_HUB_CACHE", (root / "hub").string());

  lt::train::RunRequest request;
  request.config_path = lt::test::source_dir() / "tests" / "config" / "data" / "aitk" / job;
  // The paths and the device, as a user changes them; the rest keeps the test short.
  request.overrides = {"datasets.0.folder_path=" + (root / "images").string(),
                       "device=cpu",
                       "training_folder=" + root.string(),
                       "train.steps=3",
                       "save.save_every=2",
                       "sample.sample_every=3",
                       "sample.sample_steps=2",
                       "sample.width=64",
                       "sample.height=64"};
  const auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 3);
  const fs::path run = root / "my_first_flux_lora_v1";
  CATCH_CHECK(fs::exists(run / "my_first_flux_lora_v1_000000002.safetensors"));
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000003.png"));
  // The assistant is part of the base: only the trained adapter is saved.
  auto lora = lt::io::SafetensorsFile::open(run / "my_first_flux_lora_v1.safetensors");
  size_t modules = 0;
  for (const auto& t : lora->tensors()) {
    if (t.name.find("lora_down") == std::string::npos && t.name.find("lora_A") == std::string::npos) continue;
    ++modules;
    CATCH_REQUIRE(t.shape.size() == 2);
    // The example's linear: 16, not the assistant's rank 2. kohya's BFL layout stacks the downs of a
    // fused module (img/txt qkv: 3 parts, single-block linear1: q, k, v and the MLP in: 4 parts).
    const bool fused = t.name.find("_qkv.") != std::string::npos || t.name.find("_linear1.") != std::string::npos;
    CATCH_CHECK(t.shape[0] == (fused ? 16 * (t.name.find("_qkv.") != std::string::npos ? 3 : 4) : 16));
  }
  CATCH_CHECK(modules > 0);
}
