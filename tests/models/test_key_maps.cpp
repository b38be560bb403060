// LDM single-file <-> diffusers key maps, both directions, with string pairs and the reference map
// that diffusers' own converter produced for the sd15_unet fixture.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "loratrain/models/key_maps.h"
#include "loratrain/models/sd/load.h"
#include "models/reference_unet_map.h"
#include "test_support.h"

using namespace lt::models;
using namespace lt::models::sd;

using lt::test::read_json;

namespace {
}  // namespace

CATCH_TEST_CASE("UNet LDM key map matches diffusers' converter on every key, both ways", "[keymap]") {
  const UNetConfig config = UNetConfig::from_json(read_json(lt::test::parity_case("sd15_unet") / "config.json"));
  const KeyMap map = unet_ldm_key_map(config);
  const auto reference = read_json(lt::test::parity_case("sd15_unet") / "ldm_key_map.json");  // diffusers -> LDM
  CATCH_REQUIRE(reference.size() == 304);
  for (const auto& [diffusers, ldm] : reference.items()) {
    CATCH_INFO(diffusers << " <-> " << ldm.get<std::string>());
    CATCH_CHECK(map.to_ldm(diffusers) == ldm.get<std::string>());
    CATCH_CHECK(map.to_diffusers(ldm.get<std::string>()) == diffusers);
  }
  CATCH_CHECK(map.to_diffusers("first_stage_model.encoder.conv_in.weight").empty());
  CATCH_CHECK(map.to_ldm("not_a_unet_key.weight").empty());
}

CATCH_TEST_CASE("UNet LDM key map for the full SD1.5 layout (string pairs)", "[keymap]") {
  const KeyMap map = unet_ldm_key_map(UNetConfig::sd15());
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"model.diffusion_model.input_blocks.0.0.weight", "conv_in.weight"},
      {"model.diffusion_model.time_embed.2.bias", "time_embedding.linear_2.bias"},
      {"model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
       "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"},
      {"model.diffusion_model.input_blocks.3.0.op.weight", "down_blocks.0.downsamplers.0.conv.weight"},
      {"model.diffusion_model.input_blocks.4.0.skip_connection.weight", "down_blocks.1.resnets.0.conv_shortcut.weight"},
      {"model.diffusion_model.input_blocks.8.1.proj_out.bias", "down_blocks.2.attentions.1.proj_out.bias"},
      {"model.diffusion_model.input_blocks.11.0.out_layers.3.weight", "down_blocks.3.resnets.1.conv2.weight"},
      {"model.diffusion_model.middle_block.1.transformer_blocks.0.ff.net.0.proj.weight",
       "mid_block.attentions.0.transformer_blocks.0.ff.net.0.proj.weight"},
      {"model.diffusion_model.middle_block.2.emb_layers.1.weight", "mid_block.resnets.1.time_emb_proj.weight"},
      {"model.diffusion_model.output_blocks.2.1.conv.weight", "up_blocks.0.upsamplers.0.conv.weight"},
      {"model.diffusion_model.output_blocks.5.2.conv.bias", "up_blocks.1.upsamplers.0.conv.bias"},
      {"model.diffusion_model.output_blocks.11.1.norm.weight", "up_blocks.3.attentions.2.norm.weight"},
      {"model.diffusion_model.output_blocks.9.0.in_layers.0.weight", "up_blocks.3.resnets.0.norm1.weight"},
      {"model.diffusion_model.out.0.weight", "conv_norm_out.weight"},
      {"model.diffusion_model.out.2.bias", "conv_out.bias"},
  };
  for (const auto& [ldm, diffusers] : pairs) {
    CATCH_INFO(ldm << " <-> " << diffusers);
    CATCH_CHECK(map.to_diffusers(ldm) == diffusers);
    CATCH_CHECK(map.to_ldm(diffusers) == ldm);
  }
  // Every parameter of the SD1.5 topology has an LDM name and maps back to itself (names depend on
  // the block layout and channel ratios only, so narrow channels keep the test fast).
  UNetConfig narrow = UNetConfig::sd15();
  narrow.block_out_channels = {32, 64, 128, 128};  // same ratios: same shortcut convs
  narrow.cross_attention_dim = {64, 64, 64, 64};
  UNet2DConditionModel unet(narrow);
  size_t n = 0;
  for (const auto& p : unet->named_parameters()) {
    const std::string ldm = map.to_ldm(p.key());
    CATCH_REQUIRE(!ldm.empty());
    CATCH_REQUIRE(map.to_diffusers(ldm) == p.key());
    ++n;
  }
  CATCH_CHECK(n == 686);  // diffusers' SD1.5 UNet state dict has 686 tensors
}

CATCH_TEST_CASE("VAE LDM key map (string pairs and every module key round trip)", "[keymap]") {
  const KeyMap map = vae_ldm_key_map(VAEConfig::sd());
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"first_stage_model.encoder.conv_in.weight", "encoder.conv_in.weight"},
      {"first_stage_model.encoder.down.0.block.1.norm2.bias", "encoder.down_blocks.0.resnets.1.norm2.bias"},
      {"first_stage_model.encoder.down.1.block.0.nin_shortcut.weight", "encoder.down_blocks.1.resnets.0.conv_shortcut.weight"},
      {"first_stage_model.encoder.down.2.downsample.conv.weight", "encoder.down_blocks.2.downsamplers.0.conv.weight"},
      {"first_stage_model.encoder.mid.block_2.conv1.weight", "encoder.mid_block.resnets.1.conv1.weight"},
      {"first_stage_model.encoder.mid.attn_1.norm.weight", "encoder.mid_block.attentions.0.group_norm.weight"},
      {"first_stage_model.encoder.mid.attn_1.q.weight", "encoder.mid_block.attentions.0.to_q.weight"},
      {"first_stage_model.decoder.mid.attn_1.proj_out.bias", "decoder.mid_block.attentions.0.to_out.0.bias"},
      {"first_stage_model.encoder.norm_out.weight", "encoder.conv_norm_out.weight"},
      {"first_stage_model.decoder.up.3.block.0.conv1.weight", "decoder.up_blocks.0.resnets.0.conv1.weight"},
      {"first_stage_model.decoder.up.3.upsample.conv.weight", "decoder.up_blocks.0.upsamplers.0.conv.weight"},
      {"first_stage_model.decoder.up.0.block.2.conv2.bias", "decoder.up_blocks.3.resnets.2.conv2.bias"},
      {"first_stage_model.decoder.up.1.block.0.nin_shortcut.weight", "decoder.up_blocks.2.resnets.0.conv_shortcut.weight"},
      {"first_stage_model.quant_conv.weight", "quant_conv.weight"},
      {"first_stage_model.post_quant_conv.bias", "post_quant_conv.bias"},
  };
  for (const auto& [ldm, diffusers] : pairs) {
    CATCH_INFO(ldm << " <-> " << diffusers);
    CATCH_CHECK(map.to_diffusers(ldm) == diffusers);
    CATCH_CHECK(map.to_ldm(diffusers) == ldm);
  }
  AutoencoderKL vae(VAEConfig::sd());
  for (const auto& p : vae->named_parameters()) {
    const std::string ldm = map.to_ldm(p.key());
    CATCH_INFO(p.key());
    CATCH_REQUIRE(!ldm.empty());
    CATCH_REQUIRE(map.to_diffusers(ldm) == p.key());
  }
  CATCH_CHECK(is_vae_attention_weight("decoder.mid_block.attentions.0.to_out.0.weight"));
  CATCH_CHECK_FALSE(is_vae_attention_weight("decoder.mid_block.attentions.0.to_out.0.bias"));
}

CATCH_TEST_CASE("CLIP text encoder LDM key map", "[keymap]") {
  const KeyMap map = clip_ldm_key_map();
  CATCH_CHECK(map.to_diffusers("cond_stage_model.transformer.text_model.encoder.layers.3.self_attn.q_proj.weight") ==
              "text_model.encoder.layers.3.self_attn.q_proj.weight");
  CATCH_CHECK(map.to_ldm("text_model.final_layer_norm.bias") == "cond_stage_model.transformer.text_model.final_layer_norm.bias");
  // The legacy spelling without text_model. is read, and written in the current one.
  CATCH_CHECK(map.to_diffusers("cond_stage_model.transformer.embeddings.token_embedding.weight") ==
              "text_model.embeddings.token_embedding.weight");
  CATCH_CHECK(map.to_ldm("text_model.embeddings.token_embedding.weight") ==
              "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight");
  CATCH_CHECK(map.to_diffusers("model.diffusion_model.out.0.weight").empty());
}

CATCH_TEST_CASE("LDM VAE with 1x1-conv attention weights loads identically to diffusers weights", "[keymap][loader]") {
  const VAEConfig config = VAEConfig::from_json(read_json(lt::test::parity_case("vae") / "config.json"));
  auto diffusers_file = lt::io::SafetensorsFile::open(lt::test::parity_case("vae") / "weights.safetensors");
  const KeyMap map = vae_ldm_key_map(config);
  std::vector<std::pair<std::string, at::Tensor>> ldm;
  for (const auto& info : diffusers_file->tensors()) {
    at::Tensor t = diffusers_file->load(info.name);
    if (is_vae_attention_weight(info.name)) t = t.view({t.size(0), t.size(1), 1, 1});
    ldm.emplace_back(map.to_ldm(info.name), t);
  }
  ldm.emplace_back("model.diffusion_model.out.2.bias", torch::zeros({4}));  // another component: ignored
  const auto path = lt::test::scratch_dir("vae_ldm") / "vae_ldm.safetensors";
  lt::io::save_safetensors(path, ldm);
  auto ldm_file = lt::io::SafetensorsFile::open(path);
  CATCH_CHECK(detect_vae_layout(*ldm_file) == WeightLayout::kLdm);
  CATCH_CHECK(detect_vae_layout(*diffusers_file) == WeightLayout::kDiffusers);

  AutoencoderKL a(config), b(config);
  load_vae(*a, *diffusers_file);
  load_vae(*b, *ldm_file);
  auto pa = lt::models::module_tensors(*a), pb = lt::models::module_tensors(*b);
  CATCH_REQUIRE(pa.size() == pb.size());
  for (const auto& [k, t] : pa) {
    CATCH_INFO(k);
    CATCH_CHECK(torch::equal(t, pb.at(k)));
  }
  // Config detection reads the same architecture from both layouts.
  for (const auto& f : {diffusers_file, ldm_file}) {
    VAEConfig d = VAEConfig::detect_from_weights(*f, f == ldm_file ? "first_stage_model." : "");
    CATCH_CHECK(d.block_out_channels == config.block_out_channels);
    CATCH_CHECK(d.layers_per_block == config.layers_per_block);
    CATCH_CHECK(d.latent_channels == config.latent_channels);
    CATCH_CHECK(d.use_quant_conv == config.use_quant_conv);
    CATCH_CHECK(d.mid_block_add_attention);
  }

  // A missing attention weight is reported, not silently left at its initial value.
  ldm.erase(std::remove_if(ldm.begin(), ldm.end(), [](const auto& kv) { return kv.first == "first_stage_model.encoder.mid.attn_1.k.weight"; }),
            ldm.end());
  lt::io::save_safetensors(path, ldm);
  AutoencoderKL c(config);
  CATCH_CHECK_THROWS_WITH(load_vae(*c, *lt::io::SafetensorsFile::open(path)), Catch::Contains("encoder.mid.attn_1.k.weight"));
}

CATCH_TEST_CASE("UNet LDM key map for the full SDXL layout (string pairs, ComfyUI's numbering)", "[keymap][sdxl]") {
  const KeyMap map = unet_ldm_key_map(UNetConfig::sdxl());
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"model.diffusion_model.label_emb.0.0.weight", "add_embedding.linear_1.weight"},
      {"model.diffusion_model.label_emb.0.2.bias", "add_embedding.linear_2.bias"},
      {"model.diffusion_model.input_blocks.0.0.weight", "conv_in.weight"},
      {"model.diffusion_model.input_blocks.2.0.in_layers.2.weight", "down_blocks.0.resnets.1.conv1.weight"},
      {"model.diffusion_model.input_blocks.3.0.op.weight", "down_blocks.0.downsamplers.0.conv.weight"},
      {"model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn1.to_q.weight",
       "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight"},
      {"model.diffusion_model.input_blocks.4.0.skip_connection.weight", "down_blocks.1.resnets.0.conv_shortcut.weight"},
      {"model.diffusion_model.input_blocks.6.0.op.bias", "down_blocks.1.downsamplers.0.conv.bias"},
      {"model.diffusion_model.input_blocks.8.1.transformer_blocks.9.ff.net.2.weight",
       "down_blocks.2.attentions.1.transformer_blocks.9.ff.net.2.weight"},
      {"model.diffusion_model.middle_block.1.transformer_blocks.9.attn2.to_k.weight",
       "mid_block.attentions.0.transformer_blocks.9.attn2.to_k.weight"},
      {"model.diffusion_model.output_blocks.2.2.conv.weight", "up_blocks.0.upsamplers.0.conv.weight"},
      {"model.diffusion_model.output_blocks.5.1.proj_out.bias", "up_blocks.1.attentions.2.proj_out.bias"},
      {"model.diffusion_model.output_blocks.5.2.conv.bias", "up_blocks.1.upsamplers.0.conv.bias"},
      {"model.diffusion_model.output_blocks.8.0.out_layers.3.weight", "up_blocks.2.resnets.2.conv2.weight"},
  };
  for (const auto& [ldm, diffusers] : pairs) {
    CATCH_INFO(ldm << " <-> " << diffusers);
    CATCH_CHECK(map.to_diffusers(ldm) == diffusers);
    CATCH_CHECK(map.to_ldm(diffusers) == ldm);
  }
  // Every parameter of SDXL's topology (narrow channels, same ratios and depths) against an
  // independent statement of ComfyUI's numbering.
  UNetConfig narrow = UNetConfig::sdxl();
  narrow.block_out_channels = {32, 64, 128};
  narrow.attention_head_dim = {1, 1, 2};
  narrow.cross_attention_dim = {32, 32, 32};
  narrow.projection_class_embeddings_input_dim = 16 + 6 * 256;
  UNet2DConditionModel unet(narrow);
  const auto reference = lt::test::reference_unet_to_ldm(lt::test::reference_sdxl_layout());
  size_t n = 0;
  for (const auto& p : unet->named_parameters()) {
    CATCH_INFO(p.key());
    const std::string ldm = map.to_ldm(p.key());
    CATCH_REQUIRE(reference.count(p.key()) == 1);
    CATCH_CHECK(ldm == "model.diffusion_model." + reference.at(p.key()));
    CATCH_CHECK(map.to_diffusers(ldm) == p.key());
    ++n;
  }
  CATCH_CHECK(n == 1680);  // diffusers' SDXL UNet state dict has 1680 tensors
}

CATCH_TEST_CASE("SDXL's first text encoder: transformers names under conditioner.embedders.0.transformer.", "[keymap][sdxl]") {
  const KeyMap map = clip_ldm_key_map("conditioner.embedders.0.transformer.");
  CATCH_CHECK(map.to_diffusers("conditioner.embedders.0.transformer.text_model.encoder.layers.11.mlp.fc2.bias") ==
              "text_model.encoder.layers.11.mlp.fc2.bias");
  CATCH_CHECK(map.to_ldm("text_model.embeddings.position_embedding.weight") ==
              "conditioner.embedders.0.transformer.text_model.embeddings.position_embedding.weight");
  CATCH_CHECK(map.to_diffusers("conditioner.embedders.1.model.ln_final.weight").empty());
}

CATCH_TEST_CASE("OpenCLIP text key map (SD2 and SDXL roots, string pairs both ways)", "[keymap][openclip]") {
  const std::string root = "conditioner.embedders.1.model.";
  const KeyMap map = open_clip_key_map(root, 32);
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {root + "token_embedding.weight", "text_model.embeddings.token_embedding.weight"},
      {root + "positional_embedding", "text_model.embeddings.position_embedding.weight"},
      {root + "ln_final.weight", "text_model.final_layer_norm.weight"},
      {root + "ln_final.bias", "text_model.final_layer_norm.bias"},
      {root + "text_projection", "text_projection.weight"},
      {root + "transformer.resblocks.0.ln_1.weight", "text_model.encoder.layers.0.layer_norm1.weight"},
      {root + "transformer.resblocks.3.ln_2.bias", "text_model.encoder.layers.3.layer_norm2.bias"},
      {root + "transformer.resblocks.31.mlp.c_fc.weight", "text_model.encoder.layers.31.mlp.fc1.weight"},
      {root + "transformer.resblocks.1.mlp.c_proj.bias", "text_model.encoder.layers.1.mlp.fc2.bias"},
      {root + "transformer.resblocks.10.attn.out_proj.weight", "text_model.encoder.layers.10.self_attn.out_proj.weight"},
      {root + "transformer.resblocks.10.attn.in_proj_weight", "text_model.encoder.layers.10.self_attn.in_proj_weight"},
      {root + "transformer.resblocks.2.attn.in_proj_bias", "text_model.encoder.layers.2.self_attn.in_proj_bias"},
  };
  for (const auto& [ldm, diffusers] : pairs) {
    CATCH_INFO(ldm << " <-> " << diffusers);
    CATCH_CHECK(map.to_diffusers(ldm) == diffusers);
    CATCH_CHECK(map.to_ldm(diffusers) == ldm);
  }
  // Beyond the layer count, and other components, nothing maps.
  CATCH_CHECK(map.to_diffusers(root + "transformer.resblocks.32.ln_1.weight").empty());
  CATCH_CHECK(map.to_diffusers(root + "logit_scale").empty());
  CATCH_CHECK(map.to_diffusers("conditioner.embedders.0.transformer.text_model.final_layer_norm.weight").empty());
  const KeyMap sd2 = open_clip_key_map("cond_stage_model.model.", 23);
  CATCH_CHECK(sd2.to_diffusers("cond_stage_model.model.transformer.resblocks.22.mlp.c_fc.bias") ==
              "text_model.encoder.layers.22.mlp.fc1.bias");
  CATCH_CHECK(sd2.to_diffusers("cond_stage_model.model.transformer.resblocks.23.mlp.c_fc.bias").empty());

  CATCH_CHECK(fused_qkv_parts("text_model.encoder.layers.4.self_attn.in_proj_weight") ==
              std::vector<std::string>{"text_model.encoder.layers.4.self_attn.q_proj.weight",
                                       "text_model.encoder.layers.4.self_attn.k_proj.weight",
                                       "text_model.encoder.layers.4.self_attn.v_proj.weight"});
  CATCH_CHECK(fused_qkv_parts("text_model.encoder.layers.4.self_attn.in_proj_bias").at(2) ==
              "text_model.encoder.layers.4.self_attn.v_proj.bias");
  CATCH_CHECK(fused_qkv_parts("text_model.encoder.layers.4.self_attn.q_proj.weight").empty());
}
