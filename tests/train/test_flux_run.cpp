// `lora-train run` on Flux.1, end to end on the tiny Flux bases: the ComfyUI all-in-one single file
// and the diffusers folder (sharded transformer) train the same LoRA; kohya and diffusers/PEFT
// names; schnell; resume; and the errors look-alikes and broken inputs get.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>

#include "loratrain/io/safetensors.h"
#include "loratrain/train/demo_base.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace {

// Tiny Flux.1 dev as a single file and as a diffusers folder, and schnell as a single file.
const fs::path& tiny_flux() {
  static const fs::path dir = [] {
    auto d = lt::test::scratch_dir("train_flux");
    lt::train::DemoBaseOptions options;
    options.arch = lt::train::DemoArch::kFluxDev;
    lt::train::write_demo_base(d / "dev", options);
    options.diffusers = true;
    lt::train::write_demo_base(d / "dev-diffusers", options);
    options.diffusers = false;
    options.arch = lt::train::DemoArch::kFluxSchnell;
    lt::train::write_demo_base(d / "schnell", options);
    return d;
  }();
  return dir;
}

std::map<std::string, at::Tensor> read_all(const fs::path& path) {
  auto file = lt::io::SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : file->tensors()) out[t.name] = file->load(t.name);
  return out;
}

const std::string kSample =
    "      sample:\n        sample_every: 2\n        width: 64\n        height: 64\n"
    "        sample_steps: 2\n        sampler: flowmatch\n        guidance_scale: 3.5\n        prompts: [\"a red circle\"]\n";

lt::train::RunRequest flux_run(const fs::path& root, const std::string& name, int steps, const fs::path& model,
                               std::vector<std::string> extra = {}) {
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, name, steps, "", "", kSample);
  request.overrides = {"model.name_or_path=" + model.string(), "model.arch=flux", "train.disable_sampling=false"};
  request.overrides.insert(request.overrides.end(), extra.begin(), extra.end());
  return request;
}

// The tensors of `source` renamed by `rename` (empty: left out), into `target`.
void rewrite(const fs::path& source, const fs::path& target, const std::function<std::string(const std::string&)>& rename) {
  auto file = lt::io::SafetensorsFile::open(source);
  std::vector<std::pair<std::string, at::Tensor>> kept;
  for (const auto& t : file->tensors()) {
    const std::string name = rename(t.name);
    if (!name.empty()) kept.emplace_back(name, file->load(t.name));
  }
  lt::io::save_safetensors(target, kept, {});
}

}  // namespace

CATCH_TEST_CASE("Flux dev: the single file and the diffusers folder train the same LoRA, with previews and kohya names",
                "[train][e2e][flux]") {
  auto root = lt::test::scratch_dir("flux_run");
  auto single = lt::train::run_training(flux_run(root / "single", "fx", 4, tiny_flux() / "dev" / "model.safetensors"));
  auto folder = lt::train::run_training(flux_run(root / "folder", "fx", 4, tiny_flux() / "dev-diffusers"));
  CATCH_REQUIRE(single.exit_code == 0);
  CATCH_REQUIRE(folder.exit_code == 0);
  // The same weights in two layouts (fused BFL qkv, swapped adaLN halves vs diffusers shards).
  CATCH_CHECK(single.losses == folder.losses);
  for (double loss : single.losses) CATCH_CHECK(std::isfinite(loss));

  // BFL's own layout: the bare transformer (flux1-dev.safetensors) with ComfyUI's text encoder and
  // VAE files beside it, as users keep them.
  const auto bfl = root / "bfl";
  fs::create_directories(bfl);
  const auto all_in_one = tiny_flux() / "dev" / "model.safetensors";
  auto part = [](const std::string& prefix) {
    return [prefix](const std::string& n) { return n.rfind(prefix, 0) == 0 ? n.substr(prefix.size()) : std::string(); };
  };
  rewrite(all_in_one, bfl / "flux1-dev.safetensors", part("model.diffusion_model."));
  rewrite(all_in_one, bfl / "clip_l.safetensors", part("text_encoders.clip_l.transformer."));
  rewrite(all_in_one, bfl / "t5xxl_fp16.safetensors", part("text_encoders.t5xxl.transformer."));
  rewrite(all_in_one, bfl / "ae.safetensors", part("vae."));
  fs::copy(tiny_flux() / "dev" / "tokenizer", bfl / "tokenizer", fs::copy_options::recursive);
  fs::copy(tiny_flux() / "dev" / "tokenizer_2", bfl / "tokenizer_2", fs::copy_options::recursive);
  auto bare = lt::train::run_training(flux_run(root / "bare", "fx", 4, bfl / "flux1-dev.safetensors"));
  CATCH_REQUIRE(bare.exit_code == 0);
  CATCH_CHECK(bare.losses == single.losses);
  const auto run = root / "single" / "fx";
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000000.png"));
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000002.png"));
  auto file = lt::io::SafetensorsFile::open(run / "fx.safetensors");
  CATCH_CHECK(file->metadata().at("ss_base_model_version") == "flux1");
  CATCH_CHECK(file->metadata().at("modelspec.architecture") == "flux-1-dev/lora");
  size_t moved = 0;
  std::set<std::string> names;
  for (const auto& [name, t] : read_all(run / "fx.safetensors")) {
    CATCH_CHECK(name.rfind("lora_transformer_", 0) == 0);
    names.insert(name);
    if (name.find("lora_up") != std::string::npos && t.abs().max().item<double>() > 0) ++moved;
  }
  CATCH_CHECK(moved > 0);
  // Double and single blocks, attention, MLPs and modulation; not the embedders.
  CATCH_CHECK(names.count("lora_transformer_transformer_blocks_0_attn_to_q.lora_down.weight"));
  CATCH_CHECK(names.count("lora_transformer_transformer_blocks_1_attn_add_k_proj.lora_up.weight"));
  CATCH_CHECK(names.count("lora_transformer_transformer_blocks_0_ff_context_net_2.alpha"));
  CATCH_CHECK(names.count("lora_transformer_single_transformer_blocks_1_proj_mlp.lora_down.weight"));
  CATCH_CHECK(names.count("lora_transformer_single_transformer_blocks_0_norm_linear.lora_down.weight"));
  for (const auto& n : names) CATCH_CHECK(n.find("x_embedder") == std::string::npos);
}

CATCH_TEST_CASE("Flux: save_format diffusers writes PEFT names; dev embeds train.cfg_scale (or bypasses it), schnell has no guidance",
                "[train][e2e][flux]") {
  auto root = lt::test::scratch_dir("flux_peft");
  auto peft = lt::train::run_training(
      flux_run(root / "peft", "fx", 2, tiny_flux() / "dev" / "model.safetensors", {"save.save_format=diffusers"}));
  CATCH_REQUIRE(peft.exit_code == 0);
  const auto tensors = read_all(root / "peft" / "fx" / "fx.safetensors");
  CATCH_CHECK(tensors.count("transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight"));
  CATCH_CHECK(tensors.count("transformer.transformer_blocks.0.attn.to_out.0.lora_B.weight"));
  for (const auto& [name, t] : tensors) CATCH_CHECK(name.rfind("transformer.", 0) == 0);

  auto schnell = lt::train::run_training(flux_run(root / "schnell", "fs", 2, tiny_flux() / "schnell" / "model.safetensors"));
  CATCH_REQUIRE(schnell.exit_code == 0);
  auto file = lt::io::SafetensorsFile::open(root / "schnell" / "fs" / "fs.safetensors");
  CATCH_CHECK(file->metadata().at("modelspec.architecture") == "flux-1-schnell/lora");

  // Dev embeds train.cfg_scale (same seed, same noise: only the guidance differs) unless
  // bypass_guidance_embedding leaves the embedder out; schnell has no embedder to give it to.
  const auto dev = tiny_flux() / "dev" / "model.safetensors";
  auto first_loss = [&root](const std::string& name, const fs::path& model, std::vector<std::string> extra) {
    auto r = lt::train::run_training(flux_run(root / name, name, 1, model, std::move(extra)));
    CATCH_REQUIRE(r.exit_code == 0);
    return r.losses.at(0);
  };
  const double plain = first_loss("g1", dev, {});
  const double guided = first_loss("g35", dev, {"train.cfg_scale=3.5"});
  const double bypassed = first_loss("gbypass", dev, {"train.bypass_guidance_embedding=true"});
  CATCH_CHECK(plain != guided);
  CATCH_CHECK(plain != bypassed);
  CATCH_CHECK(guided != bypassed);
  const auto schnell_model = tiny_flux() / "schnell" / "model.safetensors";
  const double schnell_plain = first_loss("s1", schnell_model, {});
  CATCH_CHECK(schnell_plain == first_loss("s35", schnell_model, {"train.cfg_scale=3.5"}));
  // An assistant adapter (here the schnell LoRA trained above) changes what the base computes
  // while training.
  const fs::path assistant = root / "schnell" / "fs" / "fs.safetensors";
  CATCH_CHECK(schnell_plain != first_loss("sassist", schnell_model, {"model.assistant_lora_path=" + assistant.string()}));
}

CATCH_TEST_CASE("Flux: an interrupted run resumes bit-identically", "[train][e2e][flux][resume]") {
  auto root = lt::test::scratch_dir("flux_resume");
  const auto model = tiny_flux() / "dev" / "model.safetensors";
  auto whole = lt::train::run_training(flux_run(root / "a", "fx", 4, model));
  CATCH_REQUIRE(whole.exit_code == 0);
  auto first = flux_run(root / "b", "fx", 4, model);
  first.stop_after_steps = 2;
  CATCH_REQUIRE(lt::train::run_training(first).exit_code == 130);
  auto resumed = lt::train::run_training(flux_run(root / "b", "fx", 4, model));
  CATCH_REQUIRE(resumed.exit_code == 0);
  CATCH_REQUIRE(resumed.losses.size() == 2);
  for (size_t i = 0; i < 2; ++i) CATCH_CHECK(resumed.losses[i] == whole.losses[2 + i]);
  auto a = read_all(root / "a" / "fx" / "fx.safetensors");
  auto b = read_all(root / "b" / "fx" / "fx.safetensors");
  CATCH_REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) CATCH_CHECK(torch::equal(t, b.at(name)));
}

namespace {

// The run fails with exit 2 and a message containing `expected`, and writes no LoRA.
void check_rejected(const fs::path& root, const std::string& name, const fs::path& model, const std::string& expected) {
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, name, 2);
  request.overrides = {"model.name_or_path=" + model.string(), "model.arch=flux"};
  try {
    lt::train::run_training(request);
    CATCH_FAIL("expected an error for " << name);
  } catch (const lt::Error& e) {
    CATCH_INFO(e.what());
    CATCH_CHECK(static_cast<int>(e.code()) == 2);
    CATCH_CHECK_THAT(std::string(e.what()), Catch::Contains(expected));
  }
  CATCH_CHECK_FALSE(fs::exists(root / name / (name + ".safetensors")));
  CATCH_CHECK_FALSE(fs::exists(root / name / "state"));
}

}  // namespace

CATCH_TEST_CASE("Flux: look-alikes and broken inputs get one clear error, exit 2, no output", "[train][e2e][flux]") {
  auto root = lt::test::scratch_dir("flux_bad");
  const auto single = tiny_flux() / "dev" / "model.safetensors";
  fs::create_directories(root / "files");

  // Flux.2: its shared modulation keys beside Flux-like block names.
  rewrite(single, root / "files" / "flux2.safetensors", [](const std::string& n) {
    if (n.find("double_blocks.0.img_mod.lin.weight") != std::string::npos) return std::string("model.diffusion_model.double_stream_modulation_img.lin.weight");
    if (n.find("single_blocks.0.modulation.lin.weight") != std::string::npos) return std::string("model.diffusion_model.single_stream_modulation.lin.weight");
    return n;
  });
  check_rejected(root, "flux2", root / "files" / "flux2.safetensors", "Flux.2");

  // Chroma: the distilled guidance approximator instead of the embedders.
  rewrite(single, root / "files" / "chroma.safetensors", [](const std::string& n) {
    if (n.find("time_in.in_layer.bias") != std::string::npos) return std::string("distilled_guidance_layer.in_proj.bias");
    return n.rfind("model.diffusion_model.", 0) == 0 ? n.substr(22) : std::string();
  });
  check_rejected(root, "chroma", root / "files" / "chroma.safetensors", "chroma");

  // A T5 file given as the transformer.
  const std::string t5_root = "text_encoders.t5xxl.transformer.";
  rewrite(single, root / "files" / "t5xxl_fp16.safetensors",
          [&t5_root](const std::string& n) { return n.rfind(t5_root, 0) == 0 ? n.substr(t5_root.size()) : std::string(); });
  check_rejected(root, "t5_as_transformer", root / "files" / "t5xxl_fp16.safetensors", "T5 text encoder");

  // The checkpoint without its tokenizer_2/spiece.model beside it.
  fs::create_directories(root / "no_spiece");
  fs::copy_file(single, root / "no_spiece" / "model.safetensors");
  fs::copy(tiny_flux() / "dev" / "tokenizer", root / "no_spiece" / "tokenizer", fs::copy_options::recursive);
  check_rejected(root, "no_spiece", root / "no_spiece" / "model.safetensors", "spiece.model");

  // A diffusers folder with its second transformer shard cut short.
  fs::copy(tiny_flux() / "dev-diffusers", root / "truncated", fs::copy_options::recursive);
  const auto shard = root / "truncated" / "transformer" / "diffusion_pytorch_model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  check_rejected(root, "truncated_shard", root / "truncated", "diffusion_pytorch_model-00002-of-00002.safetensors");

  // ... and with that shard missing altogether.
  fs::remove(shard);
  check_rejected(root, "missing_shard", root / "truncated", "diffusion_pytorch_model-00002-of-00002.safetensors");
}
