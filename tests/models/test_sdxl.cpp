// SDXL checkpoints: detection (SDXL vs SD1/SD2, incomplete files), strict loading of all components
// from the single-file layout and a diffusers folder (lt-make-demo-base's tiny SDXL in both), fp16 /
// bf16 files, tokenizer_2's pad token, the text conditioning and add_time_ids.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/registry.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/sd/sdxl.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/train/demo_base.h"
#include "loratrain/util/error.h"
#include "models/reference_unet_map.h"
#include "test_support.h"

using namespace lt::models;
using namespace lt::models::sd;
namespace fs = std::filesystem;

using lt::test::input_error_of;

namespace {

fs::path demo_base(const std::string& name, lt::train::DemoArch arch, bool diffusers = false,
                   at::ScalarType dtype = at::kFloat) {
  const fs::path dir = lt::test::binary_dir() / "test-scratch" / "sdxl-bases" / name;
  if (!fs::exists(dir / (diffusers ? "model_index.json" : "model.safetensors"))) {
    fs::remove_all(dir);
    lt::train::DemoBaseOptions o;
    o.arch = arch;
    o.diffusers = diffusers;
    o.dtype = dtype;
    lt::train::write_demo_base(dir, o);
  }
  return diffusers ? dir : dir / "model.safetensors";
}

fs::path sdxl_file() { return demo_base("single", lt::train::DemoArch::kSDXL); }
fs::path sdxl_folder() { return demo_base("diffusers", lt::train::DemoArch::kSDXL, true); }

// A copy of `src` without the tensors whose names start with `drop`.
fs::path without(const fs::path& src, const std::string& drop, const std::string& name) {
  auto file = lt::io::SafetensorsFile::open(src);
  std::vector<std::pair<std::string, at::Tensor>> kept;
  for (const auto& t : file->tensors()) {
    if (t.name.rfind(drop, 0) != 0) kept.emplace_back(t.name, file->load(t.name));
  }
  const fs::path out = lt::test::scratch_dir("sdxl_" + name) / "model.safetensors";
  lt::io::save_safetensors(out, kept);
  return out;
}

void check_same_tensors(torch::nn::Module& a, torch::nn::Module& b, const std::string& what) {
  auto ta = module_tensors(a), tb = module_tensors(b);
  CATCH_REQUIRE(ta.size() == tb.size());
  for (const auto& [key, t] : ta) {
    CATCH_INFO(what << ": " << key);
    CATCH_REQUIRE(tb.count(key) == 1);
    CATCH_CHECK(torch::equal(t, tb.at(key)));
  }
}

}  // namespace

CATCH_TEST_CASE("the tiny SDXL single file has the real key layout and is detected as SDXL", "[sdxl][registry]") {
  auto file = lt::io::SafetensorsFile::open(sdxl_file());
  for (const char* key : {"model.diffusion_model.label_emb.0.0.weight",
                          "model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn1.to_q.weight",
                          "model.diffusion_model.middle_block.1.proj_in.weight",
                          "conditioner.embedders.0.transformer.text_model.encoder.layers.1.self_attn.q_proj.weight",
                          "conditioner.embedders.1.model.transformer.resblocks.1.attn.in_proj_weight",
                          "conditioner.embedders.1.model.positional_embedding", "conditioner.embedders.1.model.text_projection",
                          "conditioner.embedders.1.model.logit_scale", "first_stage_model.decoder.up.3.block.0.conv1.weight"}) {
    CATCH_INFO(key);
    CATCH_CHECK(file->contains(key));
  }
  CATCH_CHECK(file->info("first_stage_model.encoder.mid.attn_1.q.weight").shape.size() == 4);  // SD's 1x1 convs
  CATCH_CHECK(file->info("model.diffusion_model.label_emb.0.0.weight").shape == std::vector<int64_t>{128, 32 + 6 * 256});
  CATCH_CHECK(file->info("conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight").shape ==
              std::vector<int64_t>{3 * 96, 96});

  const Detection d = detect_checkpoint(*file);
  CATCH_CHECK(d.family == ModelFamily::kSDXL);
  CATCH_CHECK(d.format == KeyFormat::kLDM);
  CATCH_CHECK(d.missing.empty());
  CATCH_CHECK_THAT(d.evidence, Catch::Contains("label_emb.0.0.weight [128, 1568]"));
  CATCH_CHECK_THAT(d.evidence, Catch::Contains("cross-attention width 160"));
  CATCH_CHECK_THAT(d.evidence, Catch::Contains("conditioner.embedders.1.model: OpenCLIP 96 wide"));
  std::vector<std::string> names;
  for (const auto& c : d.components) names.push_back(c.name);
  CATCH_CHECK(names == std::vector<std::string>{"unet", "vae", "text_encoder", "text_encoder_2"});
  CATCH_CHECK_NOTHROW(require_complete(d, "x"));

  const Detection folder = detect_diffusers_folder(sdxl_folder());
  CATCH_CHECK(folder.family == ModelFamily::kSDXL);
  CATCH_CHECK(folder.missing.empty());
  CATCH_CHECK_THAT(folder.evidence, Catch::Contains("StableDiffusionXLPipeline"));
  CATCH_CHECK_THAT(folder.evidence, Catch::Contains("add_embedding"));

  // The SD1 demo base: the evidence says what tells it apart.
  auto sd1 = lt::io::SafetensorsFile::open(demo_base("sd1", lt::train::DemoArch::kSD1));
  const Detection d1 = detect_checkpoint(*sd1);
  CATCH_CHECK(d1.family == ModelFamily::kSD1);
  CATCH_CHECK(d1.missing.empty());
  CATCH_CHECK_THAT(d1.evidence, Catch::Contains("no label_emb"));
  CATCH_CHECK_THAT(d1.evidence, Catch::Contains("cond_stage_model.transformer: CLIP"));
}

CATCH_TEST_CASE("wrong family, incomplete and broken SDXL checkpoints: one clear error each", "[sdxl][registry][errors]") {
  // An SD1 checkpoint where SDXL is expected.
  const std::string sd1 = input_error_of([] { SDXLCheckpoint::open(demo_base("sd1", lt::train::DemoArch::kSD1)); });
  CATCH_CHECK_THAT(sd1, Catch::Contains("not an SDXL checkpoint: an sd1 checkpoint"));
  CATCH_CHECK_THAT(sd1, Catch::Contains("cross-attention width 64"));

  // No second text encoder: every missing part in one message.
  const fs::path no_te2 = without(sdxl_file(), "conditioner.embedders.1.", "no_te2");
  const Detection d = detect_checkpoint(*lt::io::SafetensorsFile::open(no_te2));
  CATCH_CHECK(d.family == ModelFamily::kSDXL);
  CATCH_CHECK(d.missing.count("text_encoder_2") == 1);
  const std::string te2 = input_error_of([&] { SDXLCheckpoint::open(no_te2); });
  CATCH_CHECK_THAT(te2, Catch::Contains("incomplete sdxl checkpoint"));
  CATCH_CHECK_THAT(te2, Catch::Contains("conditioner.embedders.1.model.*"));

  // No VAE: an error, unless a separate VAE is given.
  const fs::path no_vae = without(sdxl_file(), "first_stage_model.", "no_vae");
  CATCH_CHECK_THAT(input_error_of([&] { SDXLCheckpoint::open(no_vae); }), Catch::Contains("first_stage_model."));
  const SDXLCheckpoint separate = SDXLCheckpoint::open(no_vae, /*separate_vae=*/true);
  auto vae_file = without(sdxl_file(), "model.", "vae_only");  // a VAE file in the LDM layout (and two encoders)
  CATCH_CHECK(separate.load_vae(vae_file)->config.scaling_factor == Approx(0.13025));

  // A truncated file.
  const fs::path truncated = lt::test::scratch_dir("sdxl_truncated") / "model.safetensors";
  fs::copy_file(sdxl_file(), truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  CATCH_CHECK_THAT(input_error_of([&] { SDXLCheckpoint::open(truncated); }), Catch::Contains("truncated"));

  // One component alone, a LoRA, a folder without text_encoder_2/.
  CATCH_CHECK_THAT(input_error_of([] { SDXLCheckpoint::open(sdxl_folder() / "unet" / "diffusion_pytorch_model.safetensors"); }),
                   Catch::Contains("holds only one component"));
  const fs::path lora = lt::test::scratch_dir("sdxl_lora") / "lora.safetensors";
  lt::io::save_safetensors(lora, {{"lora_unet_input_blocks_4_1_proj_in.lora_down.weight", torch::zeros({4, 64})}});
  CATCH_CHECK_THAT(input_error_of([&] { SDXLCheckpoint::open(lora); }), Catch::Contains("LoRA file"));
  const fs::path partial = lt::test::scratch_dir("sdxl_partial");
  for (const char* c : {"unet", "vae", "text_encoder", "tokenizer", "tokenizer_2"}) {
    fs::copy(sdxl_folder() / c, partial / c, fs::copy_options::recursive);
  }
  fs::copy_file(sdxl_folder() / "model_index.json", partial / "model_index.json");
  const std::string folder = input_error_of([&] { SDXLCheckpoint::open(partial); });
  CATCH_CHECK_THAT(folder, Catch::Contains("text_encoder_2: text_encoder_2/"));
  CATCH_CHECK_THAT(input_error_of([] { SDXLCheckpoint::open("/nonexistent/sdxl.safetensors"); }), Catch::Contains("not found"));
}

CATCH_TEST_CASE("SDXL single file and diffusers folder load the same components", "[sdxl][loader]") {
  SDXLComponents a = load_sdxl_components(sdxl_file());
  SDXLComponents b = load_sdxl_components(sdxl_folder());
  check_same_tensors(*a.unet, *b.unet, "unet");
  check_same_tensors(*a.vae, *b.vae, "vae");
  check_same_tensors(*a.text_encoder, *b.text_encoder, "text_encoder");
  check_same_tensors(*a.text_encoder_2, *b.text_encoder_2, "text_encoder_2");
  // The same configs, but for what weights do not carry (a folder's informational fields).
  auto without_info = [](nlohmann::json j) {
    j.erase("sample_size");
    j.erase("bos_token_id");
    return j;
  };
  CATCH_CHECK(without_info(a.unet->config.to_json()) == without_info(b.unet->config.to_json()));
  CATCH_CHECK(without_info(a.text_encoder->config.to_json()) == without_info(b.text_encoder->config.to_json()));
  CATCH_CHECK(without_info(a.text_encoder_2->config.to_json()) == without_info(b.text_encoder_2->config.to_json()));
  CATCH_CHECK(a.vae->config.to_json() == b.vae->config.to_json());
  for (const auto* c : {&a, &b}) {
    CATCH_CHECK(c->vae->config.scaling_factor == Approx(0.13025));
    CATCH_CHECK(c->text_encoder->config.hidden_act == "gelu");
    CATCH_CHECK(c->text_encoder_2->config.projection_dim == 32);
    CATCH_CHECK(c->tokenizer->pad_token_id() == c->tokenizer->eos_token_id());
    CATCH_CHECK(c->tokenizer_2->pad_token_id() == 0);  // "!"
    CATCH_CHECK_FALSE(c->unet->is_training());
    for (const auto& p : c->unet->parameters()) CATCH_REQUIRE_FALSE(p.requires_grad());
  }

  // The conditioning: both penultimate states side by side, the projected pooled output.
  torch::NoGradGuard no_grad;
  const std::vector<std::string> captions = {"a photo of ltdemo", "a red circle on a blue background"};
  const at::Tensor ids = clip_input_ids(*a.tokenizer, captions);
  const at::Tensor ids2 = clip_input_ids(*a.tokenizer_2, captions);
  CATCH_CHECK(ids.sizes() == at::IntArrayRef({2, 77}));
  CATCH_CHECK(ids2[0][76].item<int64_t>() == 0);
  const SDXLTextEmbeddings e = encode_sdxl_text(*a.text_encoder, *a.text_encoder_2, ids, ids2);
  CATCH_CHECK(e.context.sizes() == at::IntArrayRef({2, 77, 160}));
  CATCH_CHECK(e.pooled.sizes() == at::IntArrayRef({2, 32}));
  const CLIPTextOutput o1 = a.text_encoder->forward(ids, true);
  const CLIPTextOutput o2 = a.text_encoder_2->forward(ids2, true);
  CATCH_CHECK(torch::equal(e.context.narrow(-1, 0, 64), o1.hidden_states.at(1)));  // 2 layers: index 1 is the penultimate
  CATCH_CHECK(torch::equal(e.context.narrow(-1, 64, 96), o2.hidden_states.at(1)));
  CATCH_CHECK(torch::equal(e.pooled, o2.text_embeds));
  CATCH_CHECK_FALSE(torch::equal(e.context.narrow(-1, 64, 96), o2.last_hidden_state));

  const at::Tensor time_ids = sdxl_add_time_ids({{96, 80, 0, 8, 64, 64}, {64, 64, 0, 0, 64, 64}});
  CATCH_CHECK(time_ids.sizes() == at::IntArrayRef({2, 6}));
  CATCH_CHECK(time_ids[0][1].item<float>() == 80.0f);
  CATCH_CHECK(time_ids[0][3].item<float>() == 8.0f);
  UNetAddedCond added{e.pooled, time_ids};
  const at::Tensor latents = torch::randn({2, 4, 8, 8});
  const at::Tensor out = a.unet->forward(latents, torch::tensor({10, 900}), e.context, added);
  CATCH_CHECK(out.sizes() == latents.sizes());
  CATCH_CHECK(torch::isfinite(out).all().item<bool>());
  // The size conditioning reaches the output.
  UNetAddedCond other{e.pooled, sdxl_add_time_ids({{1024, 1024, 0, 0, 64, 64}, {64, 64, 0, 0, 64, 64}})};
  CATCH_CHECK_FALSE(torch::allclose(a.unet->forward(latents, torch::tensor({10, 900}), e.context, other), out));
  const at::Tensor z = a.vae->encode(torch::zeros({1, 3, 64, 64})).mode();
  CATCH_CHECK(z.sizes() == at::IntArrayRef({1, 4, 8, 8}));
}

CATCH_TEST_CASE("SDXL fp16 and bf16 single files load, converted as read", "[sdxl][loader][dtype]") {
  SDXLComponents full = load_sdxl_components(sdxl_file());
  for (const auto dtype : {at::kHalf, at::kBFloat16}) {
    CATCH_INFO(c10::toString(dtype));
    const fs::path path = demo_base(std::string("single_") + c10::toString(dtype), lt::train::DemoArch::kSDXL, false, dtype);
    auto file = lt::io::SafetensorsFile::open(path);
    for (const auto& t : file->tensors()) CATCH_REQUIRE(lt::io::dtype_name(t.dtype) == (dtype == at::kHalf ? "F16" : "BF16"));
    SDXLLoadOptions options;  // weights widened to fp32
    SDXLComponents widened = load_sdxl_components(path, options);
    auto want = module_tensors(*full.text_encoder_2);
    for (const auto& [key, t] : module_tensors(*widened.text_encoder_2)) {
      if (key.find("position_ids") != std::string::npos) continue;
      CATCH_INFO(key);
      CATCH_CHECK(t.scalar_type() == at::kFloat);
      CATCH_CHECK(torch::equal(t, want.at(key).to(dtype).to(at::kFloat)));
    }
    options.dtype = dtype;
    SDXLComponents narrow = load_sdxl_components(path, options);
    CATCH_CHECK(narrow.unet->conv_in->weight.scalar_type() == dtype);
    CATCH_CHECK(narrow.text_encoder_2->text_projection->weight.scalar_type() == dtype);
    CATCH_CHECK(narrow.vae->encoder->conv_in->weight.scalar_type() == at::kFloat);  // SDXL's VAE stays fp32
  }
}

CATCH_TEST_CASE("SDXL tokenizers: folders, a tokenizer_path, and the single-file convention", "[sdxl][tokenizer]") {
  const SDXLCheckpoint single = SDXLCheckpoint::open(sdxl_file());
  // Next to the single file there is tokenizer/ only: tokenizer_2 is its vocabulary padding with "!".
  CATCH_CHECK_FALSE(fs::exists(sdxl_file().parent_path() / "tokenizer_2"));
  CATCH_CHECK(single.load_tokenizer_2().pad_token_id() == 0);
  CATCH_CHECK(single.load_tokenizer_2().options().pad_token == "!");
  CATCH_CHECK(single.load_tokenizer().options().pad_token == "<|endoftext|>");
  // A tokenizer_path into a diffusers folder: its tokenizer_2/ beside it is used (its files say "!").
  const fs::path folder_tok = sdxl_folder() / "tokenizer";
  CATCH_CHECK(single.load_tokenizer_2(folder_tok).options().pad_token == "!");
  CATCH_CHECK(single.load_tokenizer_2(sdxl_folder()).options().pad_token == "!");
  // A single file with no tokenizer anywhere: the message says what to set.
  const fs::path alone = lt::test::scratch_dir("sdxl_alone") / "model.safetensors";
  fs::copy_file(sdxl_file(), alone);
  CATCH_CHECK_THAT(input_error_of([&] { SDXLCheckpoint::open(alone).load_tokenizer(); }), Catch::Contains("model.tokenizer_path"));
  CATCH_CHECK_THAT(input_error_of([&] { SDXLCheckpoint::open(alone).load_tokenizer_2(); }), Catch::Contains("model.tokenizer_path"));
}

CATCH_TEST_CASE("check_sdxl_components names a width mismatch", "[sdxl]") {
  const SDXLCheckpoint c = SDXLCheckpoint::open(sdxl_file());
  const auto unet = c.load_unet()->config;
  auto te1 = c.load_text_encoder()->config;
  auto te2 = c.load_text_encoder_2()->config;
  CATCH_CHECK_NOTHROW(check_sdxl_components(unet, te1, te2, "x"));
  te2.projection_dim = 64;
  CATCH_CHECK_THAT(input_error_of([&] { check_sdxl_components(unet, te1, te2, "x"); }), Catch::Contains("1568"));
  te1.hidden_size = 32;
  CATCH_CHECK_THAT(input_error_of([&] { check_sdxl_components(unet, te1, te2, "x"); }), Catch::Contains("160"));
}

CATCH_TEST_CASE("sdxl_unet fixture from LDM single-file names (ComfyUI's numbering) matches diffusers", "[sdxl][parity][loader]") {
  const fs::path dir = lt::test::fixtures_dir() / "parity" / "sdxl_unet";
  std::ifstream in(dir / "config.json");
  const UNetConfig config = UNetConfig::from_json(nlohmann::json::parse(in));
  // Written under the names an SGM checkpoint has, by an independent statement of the numbering:
  // one resnet per level, transformer depths 0 and 2.
  const auto reference = lt::test::reference_unet_to_ldm({{1, 1}, {0, 2}, {0, 0, 2, 2}, 2});
  auto weights = lt::io::SafetensorsFile::open(dir / "weights.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> ldm;
  for (const auto& t : weights->tensors()) {
    CATCH_INFO(t.name);
    CATCH_REQUIRE(reference.count(t.name) == 1);
    ldm.emplace_back("model.diffusion_model." + reference.at(t.name), weights->load(t.name));
  }
  const fs::path path = lt::test::scratch_dir("sdxl_unet_ldm") / "unet_ldm.safetensors";
  lt::io::save_safetensors(path, ldm);
  auto file = lt::io::SafetensorsFile::open(path);
  CATCH_CHECK(detect_unet_layout(*file) == WeightLayout::kLdm);
  const UNetConfig detected = UNetConfig::detect_from_weights(*file, "model.diffusion_model.");
  CATCH_CHECK(detected.transformer_layers_per_block == config.transformer_layers_per_block);
  CATCH_CHECK(detected.addition_embed_type == config.addition_embed_type);
  CATCH_CHECK(detected.projection_class_embeddings_input_dim == config.projection_class_embeddings_input_dim);
  CATCH_CHECK(detected.use_linear_projection);

  UNet2DConditionModel unet(config);
  unet->eval();
  load_unet(*unet, *file);
  auto io = lt::io::SafetensorsFile::open(dir / "io.safetensors");
  torch::NoGradGuard no_grad;
  UNetAddedCond added{io->load("in.added_cond_kwargs.text_embeds"), io->load("in.added_cond_kwargs.time_ids")};
  const at::Tensor out = unet->forward(io->load("in.sample"), io->load("in.timestep"), io->load("in.encoder_hidden_states"), added);
  const at::Tensor want = io->load("out.sample");
  CATCH_CHECK((out - want).abs().max().item<double>() <= 1e-4 * std::max(1.0, want.abs().max().item<double>()));
}
