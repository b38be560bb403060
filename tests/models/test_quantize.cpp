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
