// The low-VRAM path's 8-bit frozen weights: int8 and fp8 e4m3 codes with per-row scales.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/models/layers.h"

using lt::models::Linear;
using lt::models::WeightQuantization;

CATCH_TEST_CASE("fp8 e4m3fn codes decode and encode as the format defines", "[models][quantize]") {
  const auto& table = lt::models::fp8_e4m3_table();
  CATCH_CHECK(table[0x38].item<float>() == 1.0f);          // exponent 7 = bias: 1.0
  CATCH_CHECK(table[0x7E].item<float>() == 448.0f);        // the largest finite value
  CATCH_CHECK(table[0x01].item<float>() == std::ldexp(1.0f, -9));  // the smallest subnormal
  CATCH_CHECK(table[0xB8].item<float>() == -1.0f);
  CATCH_CHECK(table[0x7F].item<float>() == 0.0f);          // NaN codes read as 0
  // Every finite value encodes to its own code; values between two codes go to the nearer one.
  torch::Tensor finite = table.narrow(0, 0, 127);
  CATCH_CHECK(torch::equal(lt::models::fp8_e4m3_encode(finite), torch::arange(0, 127, torch::kLong).to(torch::kByte)));
  CATCH_CHECK(lt::models::fp8_e4m3_encode(torch::tensor({1.06f, 1.07f, 1000.0f, -0.3f})).to(torch::kLong).equal(
      lt::models::fp8_e4m3_encode(torch::tensor({1.0f, 1.125f, 448.0f, -0.3125f})).to(torch::kLong)));
}

CATCH_TEST_CASE("a Linear quantized to int8 or fp8 keeps one byte per weight and stays close", "[models][quantize]") {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({4, 64});
  for (auto format : {WeightQuantization::int8, WeightQuantization::fp8_e4m3}) {
    Linear linear(64, 32);
    const torch::Tensor reference = linear(x).detach();
    linear->quantize(format);
    CATCH_CHECK(linear->quantized());
    CATCH_CHECK(linear->weight.numel() == 0);
    CATCH_CHECK(linear->weight_int8.element_size() == 1);
    CATCH_CHECK(linear->weight_int8.scalar_type() == (format == WeightQuantization::int8 ? torch::kChar : torch::kByte));
    const torch::Tensor y = linear(x).detach();
    const double rel = ((y - reference).norm() / reference.norm()).item<double>();
    CATCH_INFO("relative error " << rel);
    // e4m3 keeps 3 mantissa bits (relative step 1/8 at worst), int8 7 bits of the row maximum.
    CATCH_CHECK(rel < (format == WeightQuantization::int8 ? 0.01 : 0.05));
    CATCH_CHECK(rel > 0.0);
    // Input gradients flow through the dequantized weight.
    torch::Tensor xi = x.clone().requires_grad_(true);
    linear(xi).sum().backward();
    const torch::Tensor expected = torch::ones({4, 32}).matmul(linear->dequantized_weight());
    CATCH_CHECK(torch::allclose(xi.grad(), expected, 1e-5, 1e-5));
  }
}

CATCH_TEST_CASE("fp8 e5m2 codes decode as the format defines, and a Linear keeps them as its 8-bit weight", "[models][quantize]") {
  const auto& table = lt::models::fp8_e5m2_table();
  CATCH_CHECK(table[0x3C].item<float>() == 1.0f);                   // exponent 15 = bias: 1.0
  CATCH_CHECK(table[0x7B].item<float>() == 57344.0f);               // the largest finite value
  CATCH_CHECK(table[0x01].item<float>() == std::ldexp(1.0f, -16));  // the smallest subnormal
  CATCH_CHECK(table[0x3D].item<float>() == 1.25f);                  // 2 mantissa bits
  CATCH_CHECK(table[0xBC].item<float>() == -1.0f);
  CATCH_CHECK(table[0x7C].item<float>() == 0.0f);  // inf and NaN codes read as 0
  CATCH_CHECK(table[0xFF].item<float>() == 0.0f);
  // Where e4m3fn would read the same byte differently: the Linear decodes with its own format.
  torch::manual_seed(6);
  const torch::Tensor codes = torch::randint(0, 0x7B, {8, 16}, torch::kLong).to(torch::kByte) +
                              (torch::rand({8, 16}) < 0.5).to(torch::kByte) * 128;
  const torch::Tensor scale = torch::rand({8, 1}) + 0.5;
  Linear linear(16, 8);
  linear->set_fp8_weight(codes, scale, lt::models::Fp8Format::e5m2);
  CATCH_CHECK(linear->quantized());
  CATCH_CHECK(linear->weight_int8.scalar_type() == torch::kByte);
  const torch::Tensor expected = table.index_select(0, codes.flatten().to(torch::kLong)).view({8, 16}) * scale;
  CATCH_CHECK(torch::equal(linear->dequantized_weight(), expected));
  const torch::Tensor x = torch::randn({3, 16}).requires_grad_(true);
  const torch::Tensor y = linear(x);
  CATCH_CHECK(torch::allclose(y, x.matmul(expected.t()) + linear->bias, 1e-5, 1e-5));
  y.sum().backward();
  CATCH_CHECK(torch::allclose(x.grad(), torch::ones({3, 8}).matmul(expected), 1e-5, 1e-5));
  // Placing it in a dtype keeps the codes and their format.
  linear->to(torch::kBFloat16);
  linear->to(torch::kFloat);
  CATCH_CHECK(linear->fp8_format == lt::models::Fp8Format::e5m2);
  CATCH_CHECK(torch::equal(linear->dequantized_weight(), expected));
}
