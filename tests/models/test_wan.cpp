// Wan 2.1 model code beyond the parity cases: the native (official/ComfyUI) key names against the
// diffusers conversion's table, sizes read back from a native file, scaled fp8 files, the errors
// for files that are not a Wan 2.1 text-to-video transformer, and the VAE's causality (a chunk
// computes what the whole video does) and frame-count rule.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/registry.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/models/wan/checkpoint.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using namespace lt::models::wan;

namespace {

// 128-wide heads as in every real Wan 2.1, otherwise tiny.
WanTransformerConfig tiny_config() {
  WanTransformerConfig c;
  c.num_attention_heads = 1;
  c.attention_head_dim = 128;
  c.text_dim = 32;
  c.freq_dim = 32;
  c.ffn_dim = 64;
  c.num_layers = 2;
  return c;
}

struct Inputs {
  at::Tensor latents, timestep, text;
};

Inputs tiny_inputs() {
  torch::manual_seed(3);
  return {torch::randn({1, 16, 2, 4, 6}), torch::tensor({640.0f}), torch::randn({1, 5, 32})};
}

WanTransformer3DModel tiny_model() {
  torch::manual_seed(7);
  WanTransformer3DModel model(tiny_config());
  model->eval();
  return model;
}

std::filesystem::path save(const std::string& name, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const auto path = lt::test::scratch_dir("wan_" + name) / (name + ".safetensors");
  lt::io::save_safetensors(path, tensors);
  return path;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// --- fp8 E4M3FN by the format's definition (LibTorch 1.13 has no fp8 dtype): file bytes by hand.
float e4m3_value(int code) {
  const int exponent = (code >> 3) & 0xF, mantissa = code & 7;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

uint8_t e4m3_code(float x) {
  int best = 0;
  float best_diff = std::numeric_limits<float>::infinity();
  for (int code = 0; code <= 0x7E; ++code) {
    const float diff = std::abs(std::abs(x) - e4m3_value(code));
    if (diff < best_diff) {
      best = code;
      best_diff = diff;
    }
  }
  return static_cast<uint8_t>(x < 0 && best != 0 ? best | 0x80 : best);
}

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

RawTensor raw(const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const std::string dtype = c.scalar_type() == torch::kFloat ? "F32" : "F16";
  return {name, dtype, c.sizes().vec(),
          std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()))};
}

std::filesystem::path write_raw(const std::string& name, const std::vector<RawTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xFF);
  const auto path = lt::test::scratch_dir("wan_" + name) / (name + ".safetensors");
  std::ofstream(path, std::ios::binary) << bytes << text << data;
  return path;
}

}  // namespace

CATCH_TEST_CASE("Wan native names follow the official/ComfyUI layout", "[wan][loader]") {
  CATCH_CHECK(native_transformer_key("blocks.3.attn1.to_q.weight") == "blocks.3.self_attn.q.weight");
  CATCH_CHECK(native_transformer_key("blocks.3.attn2.to_out.0.bias") == "blocks.3.cross_attn.o.bias");
  CATCH_CHECK(native_transformer_key("blocks.0.attn1.norm_k.weight") == "blocks.0.self_attn.norm_k.weight");
  CATCH_CHECK(native_transformer_key("blocks.0.norm2.weight") == "blocks.0.norm3.weight");  // the swap
  CATCH_CHECK(native_transformer_key("blocks.0.ffn.net.0.proj.weight") == "blocks.0.ffn.0.weight");
  CATCH_CHECK(native_transformer_key("blocks.0.ffn.net.2.bias") == "blocks.0.ffn.2.bias");
  CATCH_CHECK(native_transformer_key("blocks.12.scale_shift_table") == "blocks.12.modulation");
  CATCH_CHECK(native_transformer_key("scale_shift_table") == "head.modulation");
  CATCH_CHECK(native_transformer_key("proj_out.weight") == "head.head.weight");
  CATCH_CHECK(native_transformer_key("condition_embedder.time_proj.weight") == "time_projection.1.weight");
  CATCH_CHECK(native_transformer_key("condition_embedder.text_embedder.linear_2.bias") == "text_embedding.2.bias");
  CATCH_CHECK(native_transformer_key("condition_embedder.time_embedder.linear_1.weight") == "time_embedding.0.weight");
  CATCH_CHECK(native_transformer_key("patch_embedding.weight") == "patch_embedding.weight");

  const WanVaeConfig vae;  // Wan 2.1: 2 res blocks per level
  CATCH_CHECK(native_vae_key("encoder.conv_in.weight", vae) == "encoder.conv1.weight");
  CATCH_CHECK(native_vae_key("encoder.down_blocks.2.norm1.gamma", vae) == "encoder.downsamples.2.residual.0.gamma");
  CATCH_CHECK(native_vae_key("encoder.down_blocks.2.conv2.weight", vae) == "encoder.downsamples.2.residual.6.weight");
  CATCH_CHECK(native_vae_key("encoder.down_blocks.3.conv_shortcut.bias", vae) == "encoder.downsamples.3.shortcut.bias");
  CATCH_CHECK(native_vae_key("encoder.mid_block.attentions.0.to_qkv.weight", vae) == "encoder.middle.1.to_qkv.weight");
  CATCH_CHECK(native_vae_key("decoder.mid_block.resnets.1.norm2.gamma", vae) == "decoder.middle.2.residual.3.gamma");
  CATCH_CHECK(native_vae_key("encoder.norm_out.gamma", vae) == "encoder.head.0.gamma");
  CATCH_CHECK(native_vae_key("decoder.conv_out.weight", vae) == "decoder.head.2.weight");
  CATCH_CHECK(native_vae_key("quant_conv.weight", vae) == "conv1.weight");
  CATCH_CHECK(native_vae_key("post_quant_conv.bias", vae) == "conv2.bias");
  // Decoder levels regroup 0-2 (+3 upsampler), 4-6 (+7), 8-10 (+11), 12-14.
  CATCH_CHECK(native_vae_key("decoder.up_blocks.0.upsamplers.0.time_conv.weight", vae) == "decoder.upsamples.3.time_conv.weight");
  CATCH_CHECK(native_vae_key("decoder.up_blocks.1.resnets.0.conv1.weight", vae) == "decoder.upsamples.4.residual.2.weight");
  CATCH_CHECK(native_vae_key("decoder.up_blocks.2.upsamplers.0.resample.1.bias", vae) == "decoder.upsamples.11.resample.1.bias");
  CATCH_CHECK(native_vae_key("decoder.up_blocks.3.resnets.2.norm1.gamma", vae) == "decoder.upsamples.14.residual.0.gamma");
}

CATCH_TEST_CASE("Wan transformer single files: native names with and without the ComfyUI prefix, diffusers names", "[wan][loader]") {
  torch::NoGradGuard no_grad;
  WanTransformer3DModel model = tiny_model();
  const Inputs in = tiny_inputs();
  const at::Tensor expected = model->forward(in.latents, in.timestep, in.text);

  for (const std::string root : {"", kComfyTransformerRoot}) {
    CATCH_INFO("root '" << root << "'");
    const auto path = save("native", native_transformer_tensors(*model, root));
    WanTransformer3DModel loaded = load_transformer_file(path);
    CATCH_CHECK(loaded->config.to_json() == tiny_config().to_json());
    CATCH_CHECK(max_diff(loaded->forward(in.latents, in.timestep, in.text), expected) == 0.0);
  }
  std::vector<std::pair<std::string, at::Tensor>> diffusers;
  for (const auto& [k, v] : lt::models::module_tensors(*model)) diffusers.emplace_back(k, v);
  WanTransformer3DModel from_diffusers = load_transformer_file(save("diffusers", diffusers));
  CATCH_CHECK(max_diff(from_diffusers->forward(in.latents, in.timestep, in.text), expected) == 0.0);

  // A diffusers transformer/ folder: config.json + diffusion_pytorch_model.safetensors.
  const auto folder = lt::test::scratch_dir("wan_transformer_folder");
  lt::io::save_safetensors(folder / "diffusion_pytorch_model.safetensors", diffusers);
  std::ofstream(folder / "config.json") << tiny_config().to_json().dump();
  WanTransformer3DModel from_folder = load_transformer_file(folder);
  CATCH_CHECK(max_diff(from_folder->forward(in.latents, in.timestep, in.text), expected) == 0.0);

  // fp16 file (as wan2.1_t2v_1.3B_fp16 ships) loads into fp32 within fp16 rounding.
  std::vector<std::pair<std::string, at::Tensor>> half;
  for (auto& [k, v] : native_transformer_tensors(*model)) half.emplace_back(k, v.to(torch::kHalf));
  WanTransformer3DModel from_half = load_transformer_file(save("fp16", half));
  CATCH_CHECK(max_diff(from_half->forward(in.latents, in.timestep, in.text), expected) < 5e-2);
}

CATCH_TEST_CASE("Wan scaled fp8 transformer (ComfyUI *_fp8_scaled): Linear weights F8_E4M3 with scale_weight", "[wan][loader][fp8]") {
  torch::NoGradGuard no_grad;
  WanTransformer3DModel model = tiny_model();
  std::vector<RawTensor> tensors = {{"scaled_fp8", "F8_E4M3", {0}, ""}};
  std::map<std::string, at::Tensor> dequantized;  // native key -> the value the file holds
  for (auto& [k, v] : native_transformer_tensors(*model, kComfyTransformerRoot)) {
    const bool linear = v.dim() == 2 && k.size() > 7 && k.compare(k.size() - 7, 7, ".weight") == 0;
    if (!linear) {
      tensors.push_back(raw(k, v.to(torch::kHalf)));
      dequantized[k] = v.to(torch::kHalf).to(torch::kFloat);
      continue;
    }
    const at::Tensor scale = v.abs().max() / 448.0;
    const at::Tensor q = (v / scale).contiguous();
    std::string codes;
    at::Tensor values = torch::empty_like(q);
    for (int64_t i = 0; i < q.numel(); ++i) {
      const uint8_t c = e4m3_code(q.data_ptr<float>()[i]);
      codes.push_back(static_cast<char>(c));
      values.data_ptr<float>()[i] = e4m3_value(c);
    }
    tensors.push_back({k, "F8_E4M3", v.sizes().vec(), codes});
    const std::string stem = k.substr(0, k.size() - 6);
    tensors.push_back(raw(stem + "scale_weight", scale.to(torch::kFloat)));
    tensors.push_back(raw(stem + "scale_input", torch::ones({})));
    dequantized[k] = values * scale;
  }
  const auto file = write_raw("fp8_scaled", tensors);
  WanTransformer3DModel loaded = load_transformer_file(file);
  const auto native_of = native_transformer_tensors(*loaded, kComfyTransformerRoot);
  for (const auto& [k, v] : native_of) {
    CATCH_INFO(k);
    CATCH_CHECK(max_diff(v, dequantized.at(k)) <= 1e-6 * std::max(1.0, dequantized.at(k).abs().max().item<double>()));
  }

  // A base that trains in qfloat8 keeps the file's codes and scales: every Linear is 8-bit from
  // the load on, never widened, and computes what the widened load computes.
  WanTransformer3DModel kept = load_transformer_file(file, torch::kFloat, /*keep_fp8=*/true);
  size_t linears = 0, fp8 = 0;
  for (const auto& m : kept->modules(false)) {
    if (auto* linear = dynamic_cast<lt::models::LinearImpl*>(m.get())) {
      ++linears;
      if (linear->quantized() && linear->weight_int8.scalar_type() == torch::kByte) ++fp8;
    }
  }
  CATCH_CHECK(linears > 0);
  CATCH_CHECK(fp8 == linears);
  const Inputs in = tiny_inputs();
  const at::Tensor widened = loaded->forward(in.latents, in.timestep, in.text);
  CATCH_CHECK(max_diff(kept->forward(in.latents, in.timestep, in.text), widened) <=
              1e-5 * std::max(1.0, widened.abs().max().item<double>()));
}

CATCH_TEST_CASE("Files that are not a Wan 2.1 text-to-video transformer get one clear error", "[wan][loader]") {
  torch::NoGradGuard no_grad;
  WanTransformer3DModel model = tiny_model();
  auto tensors = native_transformer_tensors(*model);

  auto with = tensors;
  with.emplace_back("img_emb.proj.0.weight", torch::ones({4}));
  CATCH_CHECK_THROWS_WITH(load_transformer_file(save("i2v", with)), Catch::Contains("image-to-video"));

  CATCH_CHECK_THROWS_WITH(load_transformer_file(save("flux", {{"double_blocks.0.img_attn.qkv.weight", torch::ones({6, 2})}})),
                          Catch::Contains("not a Wan 2.1 transformer") && Catch::Contains("Flux"));
  CATCH_CHECK_THROWS_WITH(load_transformer_file(save("vae", {{"encoder.conv1.weight", torch::ones({2})},
                                                              {"decoder.conv1.weight", torch::ones({2})}})),
                          Catch::Contains("not a Wan 2.1 transformer") && Catch::Contains("autoencoder"));

  auto broken = tensors;
  broken.erase(std::remove_if(broken.begin(), broken.end(), [](const auto& t) { return t.first == "blocks.1.cross_attn.k.weight"; }),
               broken.end());
  CATCH_CHECK_THROWS_WITH(load_transformer_file(save("broken", broken)), Catch::Contains("blocks.1.attn2.to_k.weight"));
  CATCH_CHECK_THROWS_AS(load_transformer_file(save("broken", broken)), lt::InputError);
}

namespace {
WanVaeConfig tiny_vae_config() {
  WanVaeConfig c;
  c.base_dim = 8;
  c.dim_mult = {1, 2, 2, 2};
  c.num_res_blocks = 1;
  return c;
}
}  // namespace

CATCH_TEST_CASE("Wan VAE: causal chunks, 4k+1 frames, native names", "[wan][vae]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  AutoencoderKLWan vae(tiny_vae_config());
  vae->eval();
  const at::Tensor video = torch::rand({1, 3, 9, 16, 16}) * 2 - 1;

  // Causality: the first 5 frames encode to the first 2 latent frames of the 9-frame video.
  const at::Tensor whole = vae->encode(video).first;
  CATCH_CHECK(whole.sizes() == at::IntArrayRef({1, 16, 3, 2, 2}));
  const at::Tensor head = vae->encode(video.narrow(2, 0, 5)).first;
  CATCH_CHECK(max_diff(whole.narrow(2, 0, 2), head) < 1e-6);

  // Decoding: 1 + 4(F'-1) frames, in [-1, 1]; the first latent frames decode the same alone.
  const at::Tensor decoded = vae->decode(whole);
  CATCH_CHECK(decoded.sizes() == at::IntArrayRef({1, 3, 9, 16, 16}));
  CATCH_CHECK(decoded.abs().max().item<double>() <= 1.0);
  CATCH_CHECK(max_diff(vae->decode(whole.narrow(2, 0, 2)), decoded.narrow(2, 0, 5)) < 1e-6);

  CATCH_CHECK_THROWS_WITH(vae->encode(video.narrow(2, 0, 4)), Catch::Contains("4k+1"));
  CATCH_CHECK(max_diff(vae->denormalize(vae->normalize(whole)), whole) < 1e-5);

  const auto path = save("vae_native", native_vae_tensors(*vae));
  const auto detected = lt::models::detect_checkpoint(*lt::io::SafetensorsFile::open(path));
  CATCH_CHECK(detected.family == lt::models::ModelFamily::kWan);
  CATCH_CHECK(detected.format == lt::models::KeyFormat::kWanOriginal);
  std::vector<std::pair<std::string, at::Tensor>> diffusers_names;
  for (const auto& [k, v] : lt::models::module_tensors(*vae)) diffusers_names.emplace_back(k, v);
  const auto detected_diffusers = lt::models::detect_checkpoint(*lt::io::SafetensorsFile::open(save("vae_diffusers", diffusers_names)));
  CATCH_CHECK(detected_diffusers.family == lt::models::ModelFamily::kWan);
  CATCH_CHECK(detected_diffusers.format == lt::models::KeyFormat::kDiffusers);
  AutoencoderKLWan loaded(tiny_vae_config());
  load_vae(*loaded, *lt::io::SafetensorsFile::open(path));
  CATCH_CHECK(max_diff(loaded->encode(video).first, whole) == 0.0);
  CATCH_CHECK_THROWS_WITH(load_vae(*loaded, *lt::io::SafetensorsFile::open(save("not_vae", {{"x.weight", torch::ones({1})}}))),
                          Catch::Contains("not a Wan 2.1 VAE"));
}

CATCH_TEST_CASE("Wan transformer: gradient checkpointing and query chunks change nothing", "[wan][training]") {
  WanTransformer3DModel model = tiny_model();
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  const Inputs in = tiny_inputs();
  auto grad_of_input = [&]() {
    at::Tensor x = in.latents.clone().set_requires_grad(true);
    at::Tensor out = model->forward(x, in.timestep, in.text);
    out.pow(2).mean().backward();
    return std::make_pair(out.detach(), x.grad());
  };
  const auto [plain_out, plain_grad] = grad_of_input();
  model->set_gradient_checkpointing(true);
  model->set_attention_query_chunk(5);
  const auto [ckpt_out, ckpt_grad] = grad_of_input();
  CATCH_CHECK(max_diff(plain_out, ckpt_out) < 1e-5);
  CATCH_CHECK(max_diff(plain_grad, ckpt_grad) < 1e-6 * std::max(1.0, plain_grad.abs().max().item<double>()));
  CATCH_CHECK(plain_grad.abs().sum().item<double>() > 0);
}

CATCH_TEST_CASE("Wan transformer in bf16 stays close to fp32 (modulation and norms in fp32)", "[wan]") {
  torch::NoGradGuard no_grad;
  WanTransformer3DModel model = tiny_model();
  const Inputs in = tiny_inputs();
  const at::Tensor reference = model->forward(in.latents, in.timestep, in.text);
  model->to(torch::kBFloat16);
  const at::Tensor out = model->forward(in.latents, in.timestep, in.text);
  CATCH_CHECK(out.scalar_type() == torch::kBFloat16);
  CATCH_CHECK(max_diff(out.to(torch::kFloat), reference) < 0.05 * std::max(1.0, reference.abs().max().item<double>()));
}
