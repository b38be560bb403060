// `lora-train run` on Flux.1, end to end on the tiny Flux bases: the ComfyUI all-in-one single file
// and the diffusers folder (sharded transformer) train the same LoRA; kohya and diffusers/PEFT
// names; schnell; resume; and the errors look-alikes and broken inputs get.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "loratrain/config/config.h"
#include "loratrain/data/demo_data.h"
#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/fixes.h"
#include "loratrain/io/image.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/lora/format.h"
#include "loratrain/models/flux/checkpoint.h"
#include "loratrain/models/layers.h"
#include "loratrain/train/demo_base.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "train_fixture.h"
#include "tensor_support.h"
#include "test_support.h"

namespace fs = std::filesystem;

using lt::test::read_tensors;
using lt::test::read_json;

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
  for (const auto& [name, t] : read_tensors(run / "fx.safetensors")) {
    CATCH_CHECK(name.rfind("lora_unet_", 0) == 0);
    names.insert(name);
    if (name.find("lora_up") != std::string::npos && t.abs().max().item<double>() > 0) ++moved;
  }
  CATCH_CHECK(moved > 0);
  // kohya's BFL modules: double and single blocks, attention (fused qkv), MLPs and modulation; not
  // the embedders.
  CATCH_CHECK(names.count("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"));
  CATCH_CHECK(names.count("lora_unet_double_blocks_1_txt_attn_qkv.lora_up.weight"));
  CATCH_CHECK(names.count("lora_unet_double_blocks_0_txt_mlp_2.alpha"));
  CATCH_CHECK(names.count("lora_unet_double_blocks_1_img_mod_lin.alpha"));
  CATCH_CHECK(names.count("lora_unet_single_blocks_1_linear1.lora_down.weight"));
  CATCH_CHECK(names.count("lora_unet_single_blocks_0_modulation_lin.lora_down.weight"));
  CATCH_CHECK(names.size() == 3 * (2 * 10 + 2 * 3));
  for (const auto& n : names) CATCH_CHECK(n.find("img_in") == std::string::npos);
}

CATCH_TEST_CASE("Flux: save_format diffusers writes PEFT names; dev embeds train.cfg_scale (or bypasses it), schnell has no guidance",
                "[train][e2e][flux]") {
  auto root = lt::test::scratch_dir("flux_peft");
  auto peft = lt::train::run_training(
      flux_run(root / "peft", "fx", 2, tiny_flux() / "dev" / "model.safetensors", {"save.save_format=diffusers"}));
  CATCH_REQUIRE(peft.exit_code == 0);
  const auto tensors = read_tensors(root / "peft" / "fx" / "fx.safetensors");
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
  auto a = read_tensors(root / "a" / "fx" / "fx.safetensors");
  auto b = read_tensors(root / "b" / "fx" / "fx.safetensors");
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

namespace {

// ComfyUI's rules for a LoRA on a BFL-named Flux (comfy/lora.py, weight_adapter/lora.py): kohya
// stems lora_unet_<BFL module, '.' -> '_'> adapt that weight whole with alpha / rank (rank = the
// down's rows); PEFT names transformer.<diffusers module> adapt their rows of the fused BFL weight
// (q, k, v thirds of qkv; q, k, v, mlp of linear1) with scale 1 when the file has no alpha.
std::map<std::string, at::Tensor> comfy_merge(const std::map<std::string, at::Tensor>& base, const fs::path& lora) {
  std::map<std::string, at::Tensor> bfl;
  for (const auto& [key, t] : base) bfl[key] = t.clone();
  const auto tensors = read_tensors(lora);
  auto add = [&bfl](const std::string& key, int64_t offset, int64_t rows, const at::Tensor& delta) {
    CATCH_REQUIRE(bfl.count(key));
    at::Tensor& w = bfl.at(key);
    CATCH_REQUIRE(delta.size(1) == w.size(1));
    w.narrow(0, offset, rows < 0 ? w.size(0) : rows).add_(delta);
  };
  std::map<std::string, std::string> kohya_to_bfl;
  for (const auto& [key, t] : bfl) {
    if (key.size() < 7 || key.compare(key.size() - 7, 7, ".weight") != 0) continue;
    std::string stem = "lora_unet_" + key.substr(0, key.size() - 7);
    std::replace(stem.begin(), stem.end(), '.', '_');
    kohya_to_bfl[stem] = key;
  }
  for (const auto& [name, t] : tensors) {
    const std::string down = ".lora_down.weight", a = ".lora_A.weight";
    if (name.size() > down.size() && name.compare(name.size() - down.size(), down.size(), down) == 0) {
      const std::string stem = name.substr(0, name.size() - down.size());
      const at::Tensor up = tensors.at(stem + ".lora_up.weight");
      const double alpha = tensors.count(stem + ".alpha") ? tensors.at(stem + ".alpha").item<double>() : t.size(0);
      CATCH_REQUIRE(kohya_to_bfl.count(stem));
      add(kohya_to_bfl.at(stem), 0, -1, torch::mm(up, t) * (alpha / static_cast<double>(t.size(0))));
    } else if (name.size() > a.size() && name.compare(name.size() - a.size(), a.size(), a) == 0) {
      const std::string stem = name.substr(0, name.size() - a.size());
      const at::Tensor delta = torch::mm(tensors.at(stem + ".lora_B.weight"), t);
      const std::string path = stem.substr(std::string("transformer.").size());
      const size_t dot = path.find('.'), dot2 = path.find('.', dot + 1);
      const std::string kind = path.substr(0, dot), index = path.substr(dot + 1, dot2 - dot - 1), rest = path.substr(dot2 + 1);
      const int64_t h = delta.size(1);  // the blocks' input width: q, k and v are as wide
      static const std::map<std::string, std::pair<std::string, int>> double_map = {
          {"attn.to_q", {"img_attn.qkv", 0}},       {"attn.to_k", {"img_attn.qkv", 1}},
          {"attn.to_v", {"img_attn.qkv", 2}},       {"attn.add_q_proj", {"txt_attn.qkv", 0}},
          {"attn.add_k_proj", {"txt_attn.qkv", 1}}, {"attn.add_v_proj", {"txt_attn.qkv", 2}},
          {"attn.to_out.0", {"img_attn.proj", -1}}, {"attn.to_add_out", {"txt_attn.proj", -1}},
          {"ff.net.0.proj", {"img_mlp.0", -1}},     {"ff.net.2", {"img_mlp.2", -1}},
          {"ff_context.net.0.proj", {"txt_mlp.0", -1}}, {"ff_context.net.2", {"txt_mlp.2", -1}},
          {"norm1.linear", {"img_mod.lin", -1}},    {"norm1_context.linear", {"txt_mod.lin", -1}}};
      static const std::map<std::string, std::pair<std::string, int>> single_map = {
          {"attn.to_q", {"linear1", 0}}, {"attn.to_k", {"linear1", 1}}, {"attn.to_v", {"linear1", 2}},
          {"proj_mlp", {"linear1", 3}},  {"proj_out", {"linear2", -1}}, {"norm.linear", {"modulation.lin", -1}}};
      const bool dbl = kind == "transformer_blocks";
      const auto& row = (dbl ? double_map : single_map).at(rest);
      const std::string key = (dbl ? "double_blocks." : "single_blocks.") + index + "." + row.first + ".weight";
      if (row.second < 0) add(key, 0, -1, delta);
      else add(key, row.second * h, delta.size(0), delta);
    }
  }
  return bfl;
}

}  // namespace

CATCH_TEST_CASE("Flux: kohya's BFL layout (fused qkv and linear1, ss_* metadata) merges like the PEFT file in ComfyUI, "
                "and loads back for sample and inspect",
                "[train][e2e][flux][lora]") {
  auto root = lt::test::scratch_dir("flux_kohya");
  const auto model = tiny_flux() / "dev" / "model.safetensors";
  auto kohya = lt::train::run_training(flux_run(root / "kohya", "fx", 3, model));
  auto peft = lt::train::run_training(flux_run(root / "peft", "fx", 3, model, {"save.save_format=diffusers"}));
  CATCH_REQUIRE(kohya.exit_code == 0);
  CATCH_REQUIRE(peft.exit_code == 0);
  CATCH_REQUIRE(kohya.losses == peft.losses);  // the same training, two layouts
  const auto kohya_file = root / "kohya" / "fx" / "fx.safetensors";
  const auto peft_file = root / "peft" / "fx" / "fx.safetensors";

  // The fused modules: downs stacked (3 x rank 4), ups block-diagonal, alpha 3 x 4 (scale 1 kept).
  const auto k = read_tensors(kohya_file);
  const at::Tensor qkv_up = k.at("lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight");
  CATCH_CHECK(k.at("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight").sizes() == at::IntArrayRef({12, 64}));
  CATCH_CHECK(qkv_up.sizes() == at::IntArrayRef({192, 12}));
  CATCH_CHECK(qkv_up.narrow(0, 0, 64).narrow(1, 4, 8).abs().max().item<double>() == 0.0);
  CATCH_CHECK(qkv_up.narrow(0, 64, 64).narrow(1, 4, 4).abs().max().item<double>() > 0.0);
  CATCH_CHECK(k.at("lora_unet_double_blocks_0_img_attn_qkv.alpha").item<double>() == 12.0);
  CATCH_CHECK(k.at("lora_unet_single_blocks_0_linear1.lora_down.weight").size(0) == 16);
  CATCH_CHECK(k.at("lora_unet_single_blocks_0_linear1.alpha").item<double>() == 16.0);
  CATCH_CHECK(k.at("lora_unet_double_blocks_0_img_attn_proj.alpha").item<double>() == 4.0);
  auto file = lt::io::SafetensorsFile::open(kohya_file);
  CATCH_CHECK(file->metadata().at("ss_base_model_version") == "flux1");
  CATCH_CHECK(file->metadata().at("ss_network_module") == "networks.lora");
  CATCH_CHECK(file->metadata().at("ss_network_dim") == "4");

  // ComfyUI's merge of each file into the base's BFL weights: the same model, within 1e-5.
  std::map<std::string, at::Tensor> base;
  const std::string root_key = "model.diffusion_model.";
  for (const auto& [name, t] : read_tensors(model)) {
    if (name.rfind(root_key, 0) == 0) base[name.substr(root_key.size())] = t.to(at::kFloat);
  }
  const auto from_kohya = comfy_merge(base, kohya_file);
  const auto from_peft = comfy_merge(base, peft_file);
  double largest_change = 0.0, largest_gap = 0.0;
  for (const auto& [key, w] : base) {
    largest_change = std::max(largest_change, (from_kohya.at(key) - w).abs().max().item<double>());
    largest_gap = std::max(largest_gap, (from_kohya.at(key) - from_peft.at(key)).abs().max().item<double>());
  }
  CATCH_INFO("largest merged change " << largest_change << ", kohya vs PEFT " << largest_gap);
  CATCH_CHECK(largest_change > 1e-4);
  CATCH_CHECK(largest_gap <= 1e-5);

  // inspect: 26 BFL modules (10 per double block, 3 per single block), fused ranks 12 and 16.
  const auto info = lt::lora::inspect_lora(*file);
  CATCH_CHECK(info.modules == 26);
  CATCH_CHECK(info.problems.empty());
  CATCH_CHECK(info.ranks.at(12) == 4);
  CATCH_CHECK(info.ranks.at(16) == 2);
  CATCH_CHECK(info.ranks.at(4) == 20);

  // sample: the kohya file and the PEFT file draw the same image; without the adapter it differs.
  auto draw = [&](const fs::path& lora, double multiplier, const std::string& out) {
    lt::train::SampleRequest request;
    request.config_path = root / "kohya" / "fx.yaml";
    request.overrides = {"model.name_or_path=" + model.string(), "model.arch=flux"};
    request.loras = {{lora, multiplier}};
    request.multiplier_given = true;
    request.output_dir = root / out;
    auto result = lt::train::run_sampling(request);
    CATCH_REQUIRE(result.images.size() == 1);
    return lt::io::read_image(result.images[0]).pixels;
  };
  const auto with_kohya = draw(kohya_file, 1.0, "s_kohya");
  CATCH_CHECK(with_kohya == draw(peft_file, 1.0, "s_peft"));
  CATCH_CHECK(with_kohya != draw(kohya_file, 0.0, "s_base"));
}

namespace {

// The guard tests' runs: each under ROOT/NAME with the test's settings, the run's report and each
// step's own peak (metrics.jsonl).
struct GuardRuns {
  std::filesystem::path root;
  std::vector<std::string> shape;

  lt::train::RunResult run(const std::string& name, int steps, const std::string& memory, const std::string& sample,
                           const std::vector<std::string>& extra) const {
    lt::train::RunRequest request;
    request.config_path = lt::test::write_tiny_config(root / name, name, steps, "", memory, sample);
    request.overrides = shape;
    request.overrides.insert(request.overrides.end(), extra.begin(), extra.end());
    return lt::train::run_training(request);
  }
  lt::train::RunResult run(const std::string& name, int steps, const std::string& memory,
                           const std::vector<std::string>& extra) const {
    return run(name, steps, memory, "", extra);
  }
  nlohmann::json report(const std::string& name) const { return read_json(root / name / name / "report.json"); }
  static int64_t peak(const nlohmann::json& report, const char* phase) {
    return report.at("peaks").at(phase).at("peak_allocated").get<int64_t>();
  }
  std::vector<int64_t> step_peaks(const std::string& name) const {
    std::vector<int64_t> out;
    std::ifstream in(root / name / name / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("mem_peak").get<int64_t>());
    return out;
  }
};

}  // namespace

CATCH_TEST_CASE("Flux under a simulated VRAM budget: buckets [256, 384, 512] at batch 2 without checkpointing go down the "
                "whole image ladder (checkpointing, batch 1 + accumulation, drop 512, smaller previews) and finish every "
                "step; diagnose names Flux and the next lever",
                "[train][e2e][flux][guard]") {
  auto root = lt::test::scratch_dir("flux_guard");
  lt::data::DemoDataOptions images;
  images.count = 4;
  images.size = 512;
  lt::data::make_demo_dataset(root / "images", images);
  const auto model = tiny_flux() / "dev" / "model.safetensors";
  // AI Toolkit's Flux example (resolution [512, 768, 1024], previews at 1024) at half the size: on the
  // tiny model the buckets hold 256, 576 and 1024 image tokens beside T5's 512 (1024 px is too slow
  // for a test on the CPU). No baseline preview: the test follows the training ladder, and a preview
  // before training has its own (skip it, then the low-memory path).
  const std::vector<std::string> shape = {"datasets.0.folder_path=" + (root / "images").string(),
                                          "datasets.0.resolution=[256, 384, 512]", "model.name_or_path=" + model.string(),
                                          "model.arch=flux", "train.batch_size=2", "train.gradient_checkpointing=false",
                                          "train.disable_sampling=false", "train.skip_first_sample=true",
                                          // The calibration runs encode every bucket once: the guarded run
                                          // reads its latents from disk (the VAE encode is not measured here).
                                          "datasets.0.cache_latents_to_disk=true"};
  auto previews = [](int size, int every) {
    return fmt::format("      sample:\n        sample_every: {}\n        width: {}\n        height: {}\n"
                       "        sample_steps: 2\n        sampler: flowmatch\n        guidance_scale: 3.5\n"
                       "        prompts: [\"a red circle\"]\n",
                       every, size, size);
  };
  const std::string reactive = "        oom_guard:\n          plan: false\n";
  const GuardRuns runs{root, shape};

  // Calibration with the settings each rung leaves (attention chunked as the guard's first lever,
  // checkpointing, batch 1): every 512 entry (one epoch) with a tiled 512 preview; and every 256 and
  // 384 entry with the 256 preview that the shrink leaves.
  const std::vector<std::string> conservative = {"train.batch_size=1", "train.gradient_checkpointing=true",
                                                 "memory.attention_chunk=1024", "memory.vae_tiling=true"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), conservative.begin(), conservative.end());
    return more;
  };
  CATCH_REQUIRE(runs.run("only512", 4, lt::test::kCalibrationMemory, previews(512, 4), with({"datasets.0.resolution=[512]"})).exit_code == 0);
  CATCH_REQUIRE(runs.run("without512", 8, lt::test::kCalibrationMemory, previews(256, 8), with({"datasets.0.resolution=[256, 384]"})).exit_code == 0);
  const auto only512 = runs.report("only512"), without512 = runs.report("without512");
  const auto peaks512 = runs.step_peaks("only512");
  CATCH_REQUIRE(peaks512.size() == 4);
  // What must fit: training without the 512 bucket, the small preview, loading and saving.
  int64_t floor_peak = 0;
  for (const char* phase : {"load", "train_step", "sample", "save"}) floor_peak = std::max(floor_peak, GuardRuns::peak(without512, phase));
  floor_peak = std::max({floor_peak, GuardRuns::peak(only512, "load"), GuardRuns::peak(only512, "save")});
  // What must not: any 512 step at batch 1 with checkpointing, and the tiled 512 preview.
  const int64_t ceiling = std::min(*std::min_element(peaks512.begin(), peaks512.end()), GuardRuns::peak(only512, "sample"));
  CATCH_INFO("512 steps at batch 1 " << nlohmann::json(peaks512).dump() << ", tiled 512 preview " << GuardRuns::peak(only512, "sample")
                                     << "; without 512: steps " << GuardRuns::peak(without512, "train_step") << ", 256 preview "
                                     << GuardRuns::peak(without512, "sample") << "; floor " << floor_peak);
  CATCH_REQUIRE(ceiling > floor_peak * 21 / 20);
  const int64_t budget = floor_peak + (ceiling - floor_peak) / 2;

  // 12 steps: the first epoch (six batches of 2) holds a 512 batch; previews at the end only, so
  // that the training rungs come first as in the playbook.
  const int steps = 12;
  auto guarded = runs.run("guarded", steps, reactive + "        simulate_vram: " + std::to_string(budget) + "\n",
                     previews(512, steps), {});
  const auto report = runs.report("guarded");
  CATCH_INFO("budget " << budget << "\n" << report.at("attempts").dump(1));
  CATCH_REQUIRE(guarded.exit_code == 0);
  CATCH_CHECK(guarded.steps_completed == steps);
  CATCH_CHECK(guarded.losses.size() == static_cast<size_t>(steps));
  for (double loss : guarded.losses) CATCH_CHECK(std::isfinite(loss));
  // No lost samples: batch 1 with accumulation 2 trains as many images per step as batch 2 did.
  int64_t seen = 0;
  for (size_t n : guarded.images_seen) seen += static_cast<int64_t>(n);
  CATCH_CHECK(seen == 2 * steps);

  // The ladder, one change at a time in the playbook's order: the exact levers first (chunked
  // attention, then the tiled VAE for the preview), checkpointing, batch 1 with accumulation, the
  // 512 bucket dropped, the previews shrunk; never the quantized base or low_vram.
  std::vector<std::string> actions;
  for (const auto& a : report.at("attempts")) {
    if (a.at("action") != "empty_cache_retry") actions.push_back(a.at("action").get<std::string>());
  }
  CATCH_CHECK(actions == std::vector<std::string>{"chunk_attention", "enable_checkpointing", "batch_to_one",
                                                  "drop_largest_bucket", "tile_vae", "shrink_samples"});
  for (const auto& a : report.at("attempts")) {
    const std::string action = a.at("action").get<std::string>();
    const std::string phase = a.at("phase").get<std::string>();
    if (action == "tile_vae" || action == "shrink_samples") {
      CATCH_CHECK(phase == "sample");
      CATCH_CHECK(a.at("step") == steps);
      CATCH_CHECK(a.at("bucket") == nlohmann::json::array({512, 512}));  // the preview being made
    } else {
      CATCH_CHECK(phase == "train_step");
      CATCH_CHECK(a.at("step").get<int>() <= 10);  // early steps: the general ladder
    }
    if (action == "batch_to_one") CATCH_CHECK(a.at("batch") == 2);
    if (action == "drop_largest_bucket") {
      // Failed in a 512 bucket at batch 1 (its pixel count is 512's, whatever its aspect ratio).
      CATCH_CHECK(a.at("batch") == 1);
      const int64_t pixels = a.at("bucket")[0].get<int64_t>() * a.at("bucket")[1].get<int64_t>();
      CATCH_CHECK(pixels > 448 * 448);
    }
  }
  const auto& final_settings = report.at("final_settings");
  CATCH_CHECK(final_settings.at("quantize") == "none");
  CATCH_CHECK(final_settings.at("low_vram") == false);
  CATCH_CHECK(final_settings.at("sample_width") == 256);
  CATCH_CHECK(final_settings.at("disable_sampling") == false);
  // The run's result and log list each change, in order.
  std::ifstream log_file(root / "guarded" / "guarded" / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  CATCH_CHECK(log.find("loaded flux base") != std::string::npos);
  CATCH_REQUIRE(guarded.actions.size() == report.at("attempts").size());
  size_t at = 0;
  for (const auto& change : guarded.actions) {
    const size_t found = log.find(change, at);
    CATCH_CHECK(found != std::string::npos);
    if (found != std::string::npos) at = found;
  }
  CATCH_CHECK(std::find(guarded.actions.begin(), guarded.actions.end(), "train.gradient_checkpointing: false -> true") !=
              guarded.actions.end());
  CATCH_CHECK(log.find("datasets.resolution: drop 512 (its images are re-bucketed to 384)") != std::string::npos);
  CATCH_CHECK(log.find("sample.width/height: 512x512 -> 256x256") != std::string::npos);
  // The final preview was made, at the shrunk size.
  int previews_made = 0;
  for (const auto& e : fs::directory_iterator(root / "guarded" / "guarded" / "samples")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("grid_", 0) == 0 || name == "progress.png") continue;
    auto image = lt::io::read_image(e.path());
    CATCH_CHECK(image.width == 256);
    CATCH_CHECK(image.height == 256);
    ++previews_made;
  }
  CATCH_CHECK(previews_made >= 1);
  // The working settings are written down: batch 1 with the effective batch kept, 512 gone.
  auto effective = lt::config::load_config(root / "guarded" / "guarded" / "effective.yaml");
  const auto& p = lt::config::the_process(effective);
  CATCH_CHECK(p.train.gradient_checkpointing);
  CATCH_CHECK(p.train.batch_size == 1);
  CATCH_CHECK(p.train.gradient_accumulation == 2);
  CATCH_CHECK(p.datasets.at(0).resolution == std::vector<int>{256, 384});

  // diagnose reads the log as an OOM of lora-train on Flux and skips what the guard already did.
  auto diagnosis = lt::diagnose::diagnose_path((root / "guarded" / "guarded" / "log.txt").string());
  CATCH_CHECK(diagnosis.oom);
  CATCH_CHECK(diagnosis.trainer == lt::diagnose::Trainer::kLoraTrain);
  CATCH_CHECK(diagnosis.family == lt::diagnose::ModelFamily::kFlux);
  auto fixes = lt::diagnose::plan_fixes(diagnosis);
  CATCH_REQUIRE_FALSE(fixes.empty());
  std::string fix_ids;
  for (const auto& fix : fixes) fix_ids += fix.id + " ";
  CATCH_INFO("fixes: " << fix_ids);
  for (const auto& fix : fixes) {
    CATCH_CHECK(fix.id != "gradient_checkpointing");
    CATCH_CHECK(fix.config_key.find("batch_size") == std::string::npos);
  }
}

CATCH_TEST_CASE("Flux under a simulated VRAM budget that no step fits with the text encoders and VAE resident, nor with "
                "the full-width base: the guard takes the ladder's last rungs, low_vram then the 8-bit base, and finishes "
                "every step",
                "[train][e2e][flux][guard]") {
  auto root = lt::test::scratch_dir("flux_guard_last_rungs");
  lt::data::DemoDataOptions images;
  images.count = 4;
  images.size = 256;
  lt::data::make_demo_dataset(root / "images", images);
  const auto model = tiny_flux() / "dev" / "model.safetensors";
  // Every earlier lever already taken (attention chunked, checkpointing, batch 1, one resolution, no
  // previews), so that what is left of the ladder is its end: model.low_vram, then model.quantize.
  // The latents come from the disk cache the first run writes (the VAE encode is not what this
  // test is about); the captions are encoded in every run.
  const std::vector<std::string> shape = {"datasets.0.folder_path=" + (root / "images").string(),
                                          "model.name_or_path=" + model.string(), "model.arch=flux",
                                          "train.batch_size=1", "train.gradient_checkpointing=true",
                                          "memory.attention_chunk=1024", "datasets.0.resolution=[256]",
                                          "datasets.0.cache_latents_to_disk=true"};
  const GuardRuns runs{root, shape};

  // Calibration with the settings the two rungs leave, one epoch each (every bucket): low_vram alone
  // (none of its steps may fit), and low_vram with the guard's int8 base (everything must fit).
  const int steps = 4;
  CATCH_REQUIRE(runs.run("latents", 1, lt::test::kCalibrationMemory, {}).exit_code == 0);
  CATCH_REQUIRE(runs.run("low_vram", steps, lt::test::kCalibrationMemory, {"model.low_vram=true"}).exit_code == 0);
  CATCH_REQUIRE(runs.run("low_vram_int8", steps, lt::test::kCalibrationMemory, {"model.low_vram=true", "model.quantize=true", "model.qtype=qint8",
                                                 "model.quantize_te=false"}).exit_code == 0);
  const auto low_vram = runs.report("low_vram"), quantized = runs.report("low_vram_int8");
  int64_t floor_peak = 0;
  for (const auto& [phase, value] : quantized.at("peaks").items()) {
    floor_peak = std::max(floor_peak, value.at("peak_allocated").get<int64_t>());
  }
  for (const char* phase : {"load", "cache", "save"}) floor_peak = std::max(floor_peak, GuardRuns::peak(low_vram, phase));
  const auto full_steps = runs.step_peaks("low_vram");
  CATCH_REQUIRE(full_steps.size() == static_cast<size_t>(steps));
  const int64_t ceiling = *std::min_element(full_steps.begin(), full_steps.end());
  CATCH_INFO("low_vram steps " << nlohmann::json(full_steps).dump() << ", int8 steps "
                               << nlohmann::json(runs.step_peaks("low_vram_int8")).dump() << "; floor (low_vram's load, cache, "
                               << "save; every phase with the int8 base) " << floor_peak);
  CATCH_REQUIRE(ceiling > floor_peak * 21 / 20);
  const int64_t budget = floor_peak + (ceiling - floor_peak) / 2;

  auto guarded = runs.run("guarded", steps, "        oom_guard:\n          plan: false\n        simulate_vram: " +
                                           std::to_string(budget) + "\n", {});
  const auto report = runs.report("guarded");
  CATCH_INFO("budget " << budget << "\n" << report.at("attempts").dump(1));
  CATCH_REQUIRE(guarded.exit_code == 0);
  CATCH_CHECK(guarded.steps_completed == steps);
  CATCH_CHECK(guarded.losses.size() == static_cast<size_t>(steps));
  for (double loss : guarded.losses) CATCH_CHECK(std::isfinite(loss));
  // The last two rungs, in the ladder's order, and nothing else.
  std::vector<std::string> actions;
  for (const auto& a : report.at("attempts")) {
    if (a.at("action") != "empty_cache_retry") actions.push_back(a.at("action").get<std::string>());
  }
  CATCH_CHECK(actions == std::vector<std::string>{"enable_low_vram", "quantize_base"});
  for (const auto& a : report.at("attempts")) {
    // low_vram wherever the resident encoders first overflow (loading, caching the captions or the
    // first step); the base is quantized for a training step only (never for an encoder's failure).
    if (a.at("action") == "quantize_base") CATCH_CHECK(a.at("phase") == "train_step");
  }
  const auto& final_settings = report.at("final_settings");
  CATCH_CHECK(final_settings.at("low_vram") == true);
  CATCH_CHECK(final_settings.at("quantize") == "int8");
  std::ifstream log_file(root / "guarded" / "guarded" / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  CATCH_CHECK_THAT(log, Catch::Contains("model.low_vram: false -> true"));
  CATCH_CHECK_THAT(log, Catch::Contains("model.quantize: false -> true"));
  CATCH_CHECK_THAT(log, Catch::Contains("base weights quantised to int8"));
  // The working settings are written down for the next run.
  const auto effective = lt::config::load_config(root / "guarded" / "guarded" / "effective.yaml");
  const auto& p = lt::config::the_process(effective);
  CATCH_CHECK(p.model.low_vram);
  CATCH_CHECK(p.model.quantize);
}

CATCH_TEST_CASE("Flux previews with a sampler that does not fit flow matching: a warning and flowmatch; flowmatch on SD is "
                "an error",
                "[train][e2e][flux]") {
  auto root = lt::test::scratch_dir("flux_sampler");
  const auto model = tiny_flux() / "dev" / "model.safetensors";
  auto flow = lt::train::run_training(flux_run(root / "flow", "fx", 2, model));
  auto ddpm = lt::train::run_training(flux_run(root / "ddpm", "fx", 2, model, {"sample.sampler=ddpm"}));
  CATCH_REQUIRE(flow.exit_code == 0);
  CATCH_REQUIRE(ddpm.exit_code == 0);
  std::ifstream log_file(root / "ddpm" / "fx" / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  CATCH_CHECK(log.find("sample.sampler: ddpm does not fit flux's flow-matching objective; previews use flowmatch") !=
              std::string::npos);
  // The same previews as with flowmatch named.
  const auto grid = fs::path("fx") / "samples" / "grid_000000002.png";
  CATCH_CHECK(lt::io::read_image(root / "flow" / grid).pixels == lt::io::read_image(root / "ddpm" / grid).pixels);

  // An SD base has no flow-matching objective: flowmatch is refused up front (exit 2).
  lt::train::RunRequest sd;
  sd.config_path = lt::test::write_tiny_config(root / "sd", "sd", 2, "", "", kSample);
  sd.overrides = {"train.disable_sampling=false"};
  try {
    lt::train::run_training(sd);
    CATCH_FAIL("flowmatch on an SD base was accepted");
  } catch (const lt::Error& e) {
    CATCH_CHECK(static_cast<int>(e.code()) == 2);
    CATCH_CHECK_THAT(std::string(e.what()), Catch::Contains("flowmatch samples flow-matching models"));
  }
  CATCH_CHECK_FALSE(fs::exists(root / "sd" / "sd" / "sd.safetensors"));
}

namespace {

// A safetensors file written byte by byte (LibTorch 1.13 has no float8 dtype to save).
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

using lt::models::Fp8Format;

// Byte tensors are fp8 codes of `format`.
RawTensor raw(const std::string& name, const at::Tensor& t, Fp8Format format = Fp8Format::e4m3fn) {
  const at::Tensor c = t.contiguous();
  std::string dtype = c.scalar_type() == torch::kFloat ? "F32" : c.scalar_type() == torch::kHalf ? "F16" : "BF16";
  if (c.scalar_type() == torch::kByte) dtype = format == Fp8Format::e5m2 ? "F8_E5M2" : "F8_E4M3";
  return {name, dtype, c.sizes().vec(),
          std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()))};
}

void write_raw(const fs::path& path, const std::vector<RawTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  std::ofstream(path, std::ios::binary) << bytes << text << data;
}

// x -> the nearest codes of `format` (the positive finite codes ascend in value).
at::Tensor fp8_encode(const at::Tensor& x, Fp8Format format) {
  if (format == Fp8Format::e4m3fn) return lt::models::fp8_e4m3_encode(x);
  const at::Tensor positive = lt::models::fp8_e5m2_table().narrow(0, 0, 0x7C);
  const at::Tensor a = x.to(at::kFloat).abs().clamp_max(57344.0);
  const at::Tensor upper = torch::bucketize(a, positive).clamp(0, 0x7B);
  const at::Tensor lower = (upper - 1).clamp_min(0);
  const at::Tensor nearer_lower = (a - positive.index_select(0, lower.flatten()).view_as(a)).abs() <
                                  (positive.index_select(0, upper.flatten()).view_as(a) - a).abs();
  return (torch::where(nearer_lower, lower, upper) + (x < 0).to(torch::kLong) * 128).to(torch::kByte);
}

// The tiny all-in-one file with its transformer and T5 in fp8 (e4m3fn or e5m2): `scaled` as
// ComfyUI's *_fp8_scaled files (2-D weights as codes of w / scale with a per-tensor scale_weight, a
// scaled_fp8 marker, the rest as it was), else plain (every transformer and T5 tensor as codes, as
// flux1-dev-fp8 / t5xxl_fp8_e4m3fn).
fs::path fp8_copy(const fs::path& source, const fs::path& target, bool scaled, Fp8Format format = Fp8Format::e4m3fn) {
  const std::string transformer = lt::models::flux::kComfyTransformerRoot, t5 = lt::models::flux::kComfyT5Root;
  const std::string code_dtype = format == Fp8Format::e5m2 ? "F8_E5M2" : "F8_E4M3";
  const double largest = format == Fp8Format::e5m2 ? 57344.0 : 448.0;
  std::vector<RawTensor> out;
  if (scaled) {
    out.push_back({transformer + "scaled_fp8", code_dtype, {0}, ""});
    out.push_back({t5 + "scaled_fp8", code_dtype, {0}, ""});
  }
  for (const auto& [name, t] : read_tensors(source)) {
    const bool ours = name.rfind(transformer, 0) == 0 || name.rfind(t5, 0) == 0;
    const bool weight = t.dim() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    if (!ours || !t.is_floating_point() || (scaled && !weight)) {
      out.push_back(raw(name, t));
    } else if (scaled) {
      const at::Tensor scale = t.to(at::kFloat).abs().max().clamp_min(1e-8) / largest;
      out.push_back(raw(name, fp8_encode(t.to(at::kFloat) / scale, format), format));
      out.push_back(raw(name.substr(0, name.size() - 7) + ".scale_weight", scale.reshape({})));
    } else {
      out.push_back(raw(name, fp8_encode(t.to(at::kFloat), format), format));
    }
  }
  write_raw(target, out);
  return target;
}

int64_t tensor_bytes(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel() * static_cast<int64_t>(p.element_size());
  for (const auto& b : m.buffers()) n += b.numel() * static_cast<int64_t>(b.element_size());
  return n;
}

size_t quantized_linears(torch::nn::Module& m) {
  size_t n = 0;
  for (const auto& module : m.modules()) {
    if (auto* l = dynamic_cast<lt::models::LinearImpl*>(module.get()); l && l->quantized()) ++n;
  }
  return n;
}

}  // namespace

CATCH_TEST_CASE("Flux fp8 files (e4m3fn and e5m2, plain and scaled) load into the 8-bit Linear path without widening, "
                "with the same outputs",
                "[flux][fp8][quantize]") {
  namespace flux = lt::models::flux;
  auto root = lt::test::scratch_dir("flux_fp8");
  const auto source = tiny_flux() / "dev" / "model.safetensors";
  for (const Fp8Format format : {Fp8Format::e4m3fn, Fp8Format::e5m2})
  for (const bool scaled : {false, true}) {
    const std::string kind = std::string(scaled ? "scaled" : "plain") + (format == Fp8Format::e5m2 ? "_e5m2" : "");
    CATCH_INFO(kind);
    const fs::path dir = root / kind;
    fs::create_directories(dir);
    fs::copy(tiny_flux() / "dev" / "tokenizer", dir / "tokenizer", fs::copy_options::recursive);
    fs::copy(tiny_flux() / "dev" / "tokenizer_2", dir / "tokenizer_2", fs::copy_options::recursive);
    const auto file = fp8_copy(source, dir / "model.safetensors", scaled, format);
    const auto checkpoint = flux::FluxCheckpoint::open(file);

    auto wide = checkpoint.load_transformer(at::kFloat);
    auto kept = checkpoint.load_transformer(at::kFloat, /*keep_fp8=*/true);
    size_t linears = 0;
    for (const auto& module : kept->modules()) linears += dynamic_cast<lt::models::LinearImpl*>(module.get()) ? 1 : 0;
    CATCH_CHECK(quantized_linears(*wide) == 0);
    CATCH_CHECK(quantized_linears(*kept) == linears);  // every Linear weight of the file is fp8
    const int64_t wide_bytes = tensor_bytes(*wide), kept_bytes = tensor_bytes(*kept);
    CATCH_INFO("transformer weights after load: widened to fp32 " << wide_bytes << " B, kept in fp8 " << kept_bytes << " B");
    CATCH_CHECK(kept_bytes * 10 < wide_bytes * 4);
    // The same model: the codes decode to the values the widened load computed.
    torch::manual_seed(3);
    flux::FluxInputs in;
    const auto& c = wide->config;
    in.hidden_states = torch::randn({1, 16, c.in_channels});
    in.encoder_hidden_states = torch::randn({1, 8, c.joint_attention_dim});
    in.pooled_projections = torch::randn({1, c.pooled_projection_dim});
    in.timestep = torch::full({1}, 0.4);
    in.guidance = torch::full({1}, 3.5);
    in.img_ids = torch::zeros({16, 3});
    in.txt_ids = torch::zeros({8, 3});
    torch::NoGradGuard no_grad;
    const at::Tensor a = wide->forward(in), b = kept->forward(in);
    CATCH_CHECK((a - b).abs().max().item<double>() <= 1e-5 * std::max(1.0, a.abs().max().item<double>()));
    // Placing the model in a dtype leaves the codes bytes and the scales fp32.
    kept->to(torch::kBFloat16);
    kept->to(torch::kFloat);
    CATCH_CHECK(tensor_bytes(*kept) == kept_bytes);
    for (const auto& module : kept->modules()) {
      if (auto* l = dynamic_cast<lt::models::LinearImpl*>(module.get())) {
        CATCH_CHECK(l->weight_int8.scalar_type() == torch::kByte);
        CATCH_CHECK(l->weight_scale.scalar_type() == torch::kFloat);
        CATCH_CHECK(l->fp8_format == format);
      }
    }

    // T5 as well (quantize_te with qtype_te qfloat8).
    auto t5_wide = checkpoint.load_text_encoder_2(at::kFloat);
    auto t5_kept = checkpoint.load_text_encoder_2(at::kFloat, /*keep_fp8=*/true);
    CATCH_CHECK(quantized_linears(*t5_kept) > 0);
    CATCH_INFO("T5 weights after load: widened " << tensor_bytes(*t5_wide) << " B, kept " << tensor_bytes(*t5_kept) << " B");
    CATCH_CHECK(tensor_bytes(*t5_kept) < tensor_bytes(*t5_wide));
    const at::Tensor ids = torch::randint(0, 100, {1, 12}, torch::kLong);
    const at::Tensor ta = t5_wide->forward(ids), tb = t5_kept->forward(ids);
    CATCH_CHECK((ta - tb).abs().max().item<double>() <= 1e-5 * std::max(1.0, ta.abs().max().item<double>()));
  }

  // A run with model.quantize (qfloat8, and quantize_te) on the fp8 file trains on the codes.
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root / "run", "fp8run", 2);
  request.overrides = {"model.name_or_path=" + (root / "plain" / "model.safetensors").string(), "model.arch=flux",
                       "model.quantize=true", "model.qtype=qfloat8", "model.quantize_te=true", "model.qtype_te=qint8"};
  auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  for (double loss : result.losses) CATCH_CHECK(std::isfinite(loss));
  std::ifstream log_file(root / "run" / "fp8run" / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  CATCH_CHECK(log.find("base weights quantised to fp8 (e4m3), text encoders to int8") != std::string::npos);
}
