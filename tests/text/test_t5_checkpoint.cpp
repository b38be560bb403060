// T5 encoder files in the layouts users have, written here from the parity fixture's transformers
// weights (tests/fixtures/parity/t5_encoder): the transformers folder, t5xxl_fp16-style single files
// (tied embedding stored twice, or only under encoder.embed_tokens), ComfyUI's all-in-one prefix,
// a full T5ForConditionalGeneration, plain fp8 (every tensor F8_E4M3) and ComfyUI's scaled fp8 in
// both spellings. Each must load to the reference outputs (fp8: to the outputs of the fp8-rounded
// weights, which lie within fp8 rounding of the originals), and a file that does not match the
// model gives one error naming every bad tensor.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/models/text/t5_checkpoint.h"
#include "loratrain/util/error.h"
#include "tensor_support.h"
#include "test_paths.h"

using namespace lt::models;

using lt::test::Tensors;
using lt::test::read_tensors;
using lt::test::max_abs_diff;

using lt::test::parity_case;

namespace {


at::Tensor fixture_input() { return lt::io::SafetensorsFile::open(parity_case("t5_encoder") / "io.safetensors")->load("in.input_ids"); }
at::Tensor fixture_output() { return lt::io::SafetensorsFile::open(parity_case("t5_encoder") / "io.safetensors")->load("out.last_hidden_state"); }

at::Tensor run(T5EncoderModel& model) {
  torch::NoGradGuard no_grad;
  return model(fixture_input()).to(torch::kFloat);
}

// The fixture's own tolerance (meta.json): 1e-4 * max(1, max|out|).
void check_matches_reference(T5EncoderModel& model) {
  const at::Tensor expected = fixture_output();
  CATCH_CHECK(max_abs_diff(run(model), expected) <= 1e-4 * std::max(1.0, expected.abs().max().item<double>()));
}

// A model holding exactly `weights` (fp32), as the reference for a lossy file.
T5EncoderModel model_with(const std::map<std::string, at::Tensor>& weights) {
  T5EncoderModel m(T5Config::from_file(parity_case("t5_encoder") / "config.json"));
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters(true)) p.value().copy_(weights.at(p.key()));
  m->eval();
  return m;
}

std::filesystem::path save(const std::string& name, const Tensors& tensors) {
  const auto path = lt::test::scratch_dir("t5_ckpt_" + name) / (name + ".safetensors");
  lt::io::save_safetensors(path, tensors);
  return path;
}

Tensors with_prefix(const std::map<std::string, at::Tensor>& w, const std::string& prefix) {
  Tensors out;
  for (const auto& [k, v] : w) out.emplace_back(prefix + k, v);
  return out;
}

// --- fp8 (E4M3FN), which LibTorch 1.13 cannot hold: values by the format's definition, files by hand.

float e4m3_value(int code) {
  const int exponent = (code >> 3) & 0xF, mantissa = code & 7;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

// Round to the nearest E4M3FN value (ties to the even code), as a cast to float8_e4m3fn does; the
// inputs here stay inside +-448.
uint8_t e4m3_code(float x) {
  int best = 0;
  float best_diff = std::numeric_limits<float>::infinity();
  for (int code = 0; code <= 0x7E; ++code) {
    const float diff = std::abs(std::abs(x) - e4m3_value(code));
    if (diff < best_diff || (diff == best_diff && code % 2 == 0)) {
      best = code;
      best_diff = diff;
    }
  }
  return static_cast<uint8_t>(x < 0 && best != 0 ? best | 0x80 : best);
}

struct Fp8 {
  std::vector<uint8_t> codes;
  at::Tensor values;  // the decoded values, fp32
};

Fp8 to_fp8(const at::Tensor& t) {
  const at::Tensor f = t.to(torch::kFloat).contiguous();
  Fp8 out;
  out.values = torch::empty_like(f);
  for (int64_t i = 0; i < f.numel(); ++i) {
    const uint8_t c = e4m3_code(f.data_ptr<float>()[i]);
    out.codes.push_back(c);
    out.values.data_ptr<float>()[i] = e4m3_value(c);
  }
  return out;
}

struct RawTensor {
  std::string name;
  std::string dtype;  // safetensors dtype name
  std::vector<int64_t> shape;
  std::string bytes;
};

RawTensor raw(const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const std::string dtype = c.scalar_type() == torch::kFloat ? "F32" : c.scalar_type() == torch::kHalf ? "F16" : "U8";
  return {name, dtype, c.sizes().vec(),
          std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()))};
}

RawTensor raw_fp8(const std::string& name, const std::vector<int64_t>& shape, const std::vector<uint8_t>& codes) {
  return {name, "F8_E4M3", shape, std::string(codes.begin(), codes.end())};
}

// The safetensors layout: 8-byte little-endian header length, JSON header, data.
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
  const auto path = lt::test::scratch_dir("t5_ckpt_" + name) / (name + ".safetensors");
  std::ofstream(path, std::ios::binary) << bytes << text << data;
  return path;
}

bool is_linear_weight(const std::string& key) {
  for (const char* leaf : {".q.weight", ".k.weight", ".v.weight", ".o.weight", ".wi_0.weight", ".wi_1.weight", ".wo.weight"}) {
    if (key.size() > std::strlen(leaf) && key.compare(key.size() - std::strlen(leaf), std::string::npos, leaf) == 0) return true;
  }
  return false;
}

}  // namespace

CATCH_TEST_CASE("T5 from a transformers folder (config.json + model.safetensors)", "[t5][loader]") {
  const auto dir = lt::test::scratch_dir("t5_ckpt_folder");
  std::filesystem::copy_file(parity_case("t5_encoder") / "config.json", dir / "config.json");
  std::filesystem::copy_file(parity_case("t5_encoder") / "weights.safetensors", dir / "model.safetensors");
  T5EncoderModel model = load_t5_encoder(dir);
  CATCH_CHECK(!model->is_training());
  check_matches_reference(model);

  // Sharded as FLUX.1's text_encoder_2/ is: two files and model.safetensors.index.json.
  const auto sharded = lt::test::scratch_dir("t5_ckpt_sharded");
  std::filesystem::copy_file(parity_case("t5_encoder") / "config.json", sharded / "config.json");
  {
    auto all = read_tensors(parity_case("t5_encoder") / "weights.safetensors");
    Tensors shards[2];
    nlohmann::json weight_map = nlohmann::json::object();
    size_t i = 0;
    for (const auto& [key, tensor] : all) {
      const size_t shard = i++ % 2;
      shards[shard].emplace_back(key, tensor);
      weight_map[key] = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    }
    for (size_t k = 0; k < 2; ++k) {
      lt::io::save_safetensors(sharded / ("model-0000" + std::to_string(k + 1) + "-of-00002.safetensors"), shards[k], {});
    }
    std::ofstream(sharded / "model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump();
  }
  T5EncoderModel from_shards = load_t5_encoder(sharded);
  check_matches_reference(from_shards);

  const auto empty = lt::test::scratch_dir("t5_ckpt_no_weights");
  std::filesystem::copy_file(parity_case("t5_encoder") / "config.json", empty / "config.json");
  std::ofstream(empty / "model.safetensors.index.json") << "{}";
  CATCH_CHECK_THROWS_WITH(load_t5_encoder(empty), Catch::Contains("model.safetensors") && Catch::Contains("sharded"));
  CATCH_CHECK_THROWS_WITH(load_t5_encoder(empty / "nothing.safetensors"), Catch::Contains("does not exist"));
}

CATCH_TEST_CASE("T5 single files: tied embedding twice or once, ComfyUI prefix, full T5", "[t5][loader]") {
  auto w = read_tensors(parity_case("t5_encoder") / "weights.safetensors");
  CATCH_SECTION("t5xxl_fp16 layout: shared.weight and encoder.embed_tokens.weight") {
    Tensors t = with_prefix(w, "");
    t.emplace_back("encoder.embed_tokens.weight", w.at("shared.weight"));
    T5EncoderModel model = load_t5_encoder(save("t5xxl_both", t));
    check_matches_reference(model);
  }
  CATCH_SECTION("only encoder.embed_tokens.weight") {
    auto moved = w;
    moved["encoder.embed_tokens.weight"] = moved.at("shared.weight");
    moved.erase("shared.weight");
    T5EncoderModel model = load_t5_encoder(save("t5_tied_only", with_prefix(moved, "")));
    check_matches_reference(model);
  }
  CATCH_SECTION("ComfyUI all-in-one: text_encoders.t5xxl.transformer. beside other models") {
    Tensors t = with_prefix(w, kComfyT5XXLRoot);
    t.emplace_back("model.diffusion_model.img_in.weight", torch::zeros({2, 2}));
    t.emplace_back("text_encoders.clip_l.transformer.text_model.final_layer_norm.weight", torch::ones({4}));
    const auto path = save("comfy_aio", t);
    auto file = lt::io::SafetensorsFile::open(path);
    CATCH_CHECK(find_t5_encoder_root(*file) == kComfyT5XXLRoot);
    T5EncoderModel model = load_t5_encoder(path);
    check_matches_reference(model);
  }
  CATCH_SECTION("T5ForConditionalGeneration: decoder and lm_head are not read") {
    Tensors t = with_prefix(w, "");
    t.emplace_back("decoder.block.0.layer.0.SelfAttention.q.weight", torch::zeros({32, 32}));
    t.emplace_back("lm_head.weight", torch::zeros({1000, 32}));
    T5EncoderModel model = load_t5_encoder(save("t5_full", t));
    check_matches_reference(model);
  }
  CATCH_SECTION("fp16 file, fp32 compute: the fp16-rounded weights") {
    Tensors t;
    std::map<std::string, at::Tensor> rounded;
    for (const auto& [k, v] : w) {
      t.emplace_back(k, v.to(torch::kHalf));
      rounded[k] = v.to(torch::kHalf).to(torch::kFloat);
    }
    T5EncoderModel model = load_t5_encoder(save("t5_fp16", t));
    T5EncoderModel expected = model_with(rounded);
    CATCH_CHECK(max_abs_diff(run(model), run(expected)) < 1e-5);
  }
}

CATCH_TEST_CASE("T5 fp8 files: plain E4M3 everywhere, and ComfyUI scaled fp8", "[t5][loader][fp8]") {
  const auto w = read_tensors(parity_case("t5_encoder") / "weights.safetensors");
  CATCH_SECTION("t5xxl_fp8_e4m3fn: every tensor F8_E4M3, widened at load") {
    std::vector<RawTensor> tensors;
    std::map<std::string, at::Tensor> rounded;
    for (const auto& [k, v] : w) {
      const Fp8 q = to_fp8(v);
      tensors.push_back(raw_fp8(k, v.sizes().vec(), q.codes));
      rounded[k] = q.values;
    }
    T5EncoderModel model = load_t5_encoder(write_raw("t5_fp8", tensors));
    for (const auto& p : model->named_parameters(true)) {
      CATCH_INFO(p.key());
      CATCH_CHECK(torch::equal(p.value(), rounded.at(p.key())));
    }
    T5EncoderModel expected = model_with(rounded);
    CATCH_CHECK(max_abs_diff(run(model), run(expected)) < 1e-5);
  }

  // Per-tensor scale amax/448 (ComfyUI's), or one per output row (newer files).
  auto scaled_file = [&w](const std::string& name, bool new_spelling, bool per_row) {
    std::vector<RawTensor> tensors;
    std::map<std::string, at::Tensor> dequantized;
    if (!new_spelling) tensors.push_back({"scaled_fp8", "F8_E4M3", {0}, ""});
    for (const auto& [k, v] : w) {
      if (!is_linear_weight(k)) {
        tensors.push_back(raw(k, v.to(torch::kHalf)));
        dequantized[k] = v.to(torch::kHalf).to(torch::kFloat);
        continue;
      }
      const std::string stem = k.substr(0, k.size() - std::string("weight").size());
      const at::Tensor scale = per_row ? v.abs().amax(1) / 448.0 : v.abs().max() / 448.0;  // [out] or 0-d
      const at::Tensor broadcast = per_row ? scale.unsqueeze(1) : scale;
      const Fp8 q = to_fp8(v / broadcast);
      tensors.push_back(raw_fp8(k, v.sizes().vec(), q.codes));
      tensors.push_back(raw(stem + (new_spelling ? "weight_scale" : "scale_weight"), scale.to(torch::kFloat)));
      tensors.push_back(raw(stem + (new_spelling ? "input_scale" : "scale_input"), torch::ones({})));
      if (new_spelling) {
        const std::string marker = R"({"format": "float8_e4m3fn"})";
        tensors.push_back(raw(stem + "comfy_quant", torch::tensor(std::vector<uint8_t>(marker.begin(), marker.end()), torch::kByte)));
      }
      dequantized[k] = q.values * broadcast;
      // Within fp8 rounding of the original: half a step (1/16 relative) or the subnormal step.
      CATCH_CHECK(((dequantized[k] - v).abs() <= v.abs() / 16.0 + broadcast * std::ldexp(1.0, -10) + 1e-7).all().item<bool>());
    }
    return std::make_pair(write_raw(name, tensors), dequantized);
  };
  auto check = [](const std::filesystem::path& path, const std::map<std::string, at::Tensor>& dequantized) {
    T5EncoderModel model = load_t5_encoder(path);
    for (const auto& p : model->named_parameters(true)) {
      CATCH_INFO(p.key());
      CATCH_CHECK(max_abs_diff(p.value(), dequantized.at(p.key())) <= 1e-6 * std::max(1.0, dequantized.at(p.key()).abs().max().item<double>()));
    }
    T5EncoderModel expected = model_with(dequantized);
    CATCH_CHECK(max_abs_diff(run(model), run(expected)) < 1e-5);
  };
  CATCH_SECTION("t5xxl_fp8_e4m3fn_scaled: scaled_fp8 marker, scale_weight, scale_input") {
    const auto [path, dequantized] = scaled_file("t5_fp8_scaled", false, false);
    check(path, dequantized);
  }
  CATCH_SECTION("newer spelling: weight_scale per row, input_scale, comfy_quant") {
    const auto [path, dequantized] = scaled_file("t5_fp8_weight_scale", true, true);
    check(path, dequantized);
  }
  CATCH_SECTION("a quantization format other than fp8 is refused by name") {
    std::vector<RawTensor> tensors;
    for (const auto& [k, v] : w) tensors.push_back(raw(k, v));
    const std::string marker = R"({"format": "nvfp4"})";
    tensors.push_back(raw("encoder.block.0.layer.0.SelfAttention.q.comfy_quant",
                          torch::tensor(std::vector<uint8_t>(marker.begin(), marker.end()), torch::kByte)));
    CATCH_CHECK_THROWS_WITH(load_t5_encoder(write_raw("t5_nvfp4", tensors)), Catch::Contains("nvfp4"));
  }
}

CATCH_TEST_CASE("T5 loading is strict: one error lists missing, unexpected and mis-shaped tensors", "[t5][loader]") {
  auto w = read_tensors(parity_case("t5_encoder") / "weights.safetensors");
  const auto config = T5Config::from_file(parity_case("t5_encoder") / "config.json");
  w.erase("encoder.block.1.layer.1.layer_norm.weight");
  w["encoder.block.0.layer.0.SelfAttention.extra.weight"] = torch::zeros({2});
  w["encoder.block.1.layer.1.DenseReluDense.wo.weight"] = torch::zeros({32, 36});
  auto file = lt::io::SafetensorsFile::open(save("t5_bad", with_prefix(w, "")));
  try {
    load_t5_encoder(*file, "", std::nullopt, config);
    CATCH_FAIL("a mismatched checkpoint loaded");
  } catch (const lt::InputError& e) {
    const std::string m = e.what();
    // (The mis-shaped tensor is not loaded, so it is listed as missing too.)
    CATCH_CHECK_THAT(m, Catch::Contains("2 missing") && Catch::Contains("encoder.block.1.layer.1.layer_norm.weight"));
    CATCH_CHECK_THAT(m, Catch::Contains("1 unexpected") && Catch::Contains("SelfAttention.extra.weight"));
    CATCH_CHECK_THAT(m, Catch::Contains("1 mis-shaped") && Catch::Contains("DenseReluDense.wo.weight"));
  }
  // No T5 at all, or two that the file does not say how to choose between.
  CATCH_CHECK_THROWS_WITH(load_t5_encoder(save("t5_none", {{"x.weight", torch::zeros({2})}})),
                          Catch::Contains("no T5 encoder weights"));
  Tensors two = with_prefix(read_tensors(parity_case("t5_encoder") / "weights.safetensors"), "a.");
  for (auto& t : with_prefix(read_tensors(parity_case("t5_encoder") / "weights.safetensors"), "b.")) two.push_back(t);
  CATCH_CHECK_THROWS_WITH(load_t5_encoder(save("t5_two", two)), Catch::Contains("several T5 encoders"));
}

CATCH_TEST_CASE("T5 compute dtype: bf16 everywhere; fp16 keeps wo in fp32", "[t5][loader]") {
  const auto path = parity_case("t5_encoder") / "weights.safetensors";
  T5EncoderModel bf16 = load_t5_encoder(path, torch::kBFloat16);
  for (const auto& p : bf16->named_parameters(true)) CATCH_CHECK(p.value().scalar_type() == torch::kBFloat16);
  const at::Tensor expected = fixture_output();
  CATCH_CHECK(max_abs_diff(run(bf16), expected) < 0.05 * std::max(1.0, expected.abs().max().item<double>()));

  T5EncoderModel fp16 = load_t5_encoder(path, torch::kHalf);
  const auto w = read_tensors(parity_case("t5_encoder") / "weights.safetensors");
  for (const auto& p : fp16->named_parameters(true)) {
    CATCH_INFO(p.key());
    const bool wo = p.key().find(".wo.") != std::string::npos;
    CATCH_CHECK(p.value().scalar_type() == (wo ? torch::kFloat : torch::kHalf));
    CATCH_CHECK(torch::equal(p.value(), w.at(p.key()).to(p.value().scalar_type())));
  }
}
