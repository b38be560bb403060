// The CPU's faster frozen convolutions (packed_conv.h: oneDNN-packed weights, 1x1 as a matrix
// product) against LibTorch's own convolution: the same output and input gradient, with a LoRA
// adapter on top training through them.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <memory>

#include "loratrain/lora/network.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/packed_conv.h"
#include "loratrain/util/cpu_features.h"

namespace {

struct Result {
  torch::Tensor y, grad_x, grad_down, grad_up;
};

// One forward + backward of `conv` (with its adapter) on x, the CPU's faster paths on or off.
Result run(lt::models::Conv2d& conv, const std::shared_ptr<lt::lora::LoRAModuleImpl>& lora, const torch::Tensor& x,
           bool packed) {
  conv->cpu_speed_rule = packed;
  for (auto& p : lora->parameters()) p.mutable_grad() = torch::Tensor();
  const torch::Tensor input = x.detach().clone().requires_grad_(true);
  const torch::Tensor y = conv->forward(input);
  // A fixed, non-uniform upstream gradient.
  y.mul(torch::linspace(-1.0, 2.0, y.numel(), y.options()).view_as(y)).sum().backward();
  Result r{y.detach().to(torch::kFloat), input.grad().to(torch::kFloat), lora->lora_down.grad().clone(),
           lora->lora_up.grad().clone()};
  conv->cpu_speed_rule = true;
  return r;
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace

CATCH_TEST_CASE("a frozen convolution on packed weights matches the stock one, LoRA on top",
                "[models][packed_conv]") {
  struct Case {
    int64_t kernel, stride, padding;
  };
  std::vector<torch::Dtype> dtypes{torch::kFloat};
  if (lt::util::cpu_has_avx512_core()) dtypes.push_back(torch::kBFloat16);  // oneDNN's bf16 convolutions
  for (const torch::Dtype dtype : dtypes) {
    for (const Case c : {Case{3, 1, 1}, Case{1, 1, 0}, Case{3, 2, 1}, Case{1, 1, 1}}) {
      CATCH_INFO("kernel " << c.kernel << ", stride " << c.stride << ", padding " << c.padding << ", "
                           << (dtype == torch::kFloat ? "fp32" : "bf16"));
      torch::manual_seed(11);
      lt::models::Conv2d conv(24, 40, c.kernel, c.stride, c.padding);
      for (auto& p : conv->parameters()) p.set_requires_grad(false);
      conv->to(dtype);
      auto lora = std::make_shared<lt::lora::LoRAModuleImpl>("lora_conv", "conv", conv.ptr(), 4, 4.0, 0.0);
      {
        torch::NoGradGuard no_grad;
        for (auto& p : lora->parameters()) p.normal_(0.0, 0.1);  // a zero up-projection would hide its gradient
      }
      lora->attach();
      conv->train();
      const torch::Tensor x = torch::randn({2, 24, 12, 10}).to(dtype);

      const Result stock = run(conv, lora, x, false);
      CATCH_CHECK_FALSE(conv->packed_weights.packed());
      const Result packed = run(conv, lora, x, true);
      // 1x1 stride-1 unpadded convolutions run as a matrix product: nothing to pack.
      const bool pointwise = c.kernel == 1 && c.padding == 0;
      CATCH_CHECK(lt::models::pointwise_conv_applies(conv->weight, conv->bias, c.stride, c.padding) == pointwise);
      // A padding over k-1 (the 1x1 padded by 1) would need a negative one for the input gradient.
      const bool packs = c.stride == 1 && c.padding < c.kernel && !pointwise && lt::models::packed_convolutions_available();
      CATCH_CHECK(conv->packed_weights.packed() == packs);
      if (packs) {
        // Both copies: the forward one and the transposed one for the input gradient.
        CATCH_CHECK(conv->packed_weights.bytes() >= 2 * conv->weight.numel() * conv->weight.element_size());
      }
      const double tolerance = dtype == torch::kFloat ? 1e-5 : 2e-2;
      CATCH_CHECK(relative(packed.y, stock.y) < tolerance);
      CATCH_CHECK(relative(packed.grad_x, stock.grad_x) < tolerance);
      CATCH_CHECK(relative(packed.grad_down, stock.grad_down) < tolerance);
      CATCH_CHECK(relative(packed.grad_up, stock.grad_up) < tolerance);
    }
  }
}

CATCH_TEST_CASE("a frozen 3x3 convolution by Winograd matches the stock one, LoRA on top, one packed copy",
                "[models][packed_conv]") {
  if (!lt::models::winograd_convolutions_available()) {
    CATCH_WARN("no oneDNN Winograd convolutions in this build or on this CPU");
    return;
  }
  // Channels in multiples of 16 and inputs from 32x32 on (16x16 on AMD): where the Winograd kernels serve.
  for (const bool bias : {true, false}) {
    CATCH_INFO((bias ? "with" : "without") << " a bias");
    torch::manual_seed(12);
    lt::models::Conv2d conv(32, 48, 3, 1, 1, bias);
    for (auto& p : conv->parameters()) p.set_requires_grad(false);
    auto lora = std::make_shared<lt::lora::LoRAModuleImpl>("lora_conv", "conv", conv.ptr(), 4, 4.0, 0.0);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : lora->parameters()) p.normal_(0.0, 0.1);
    }
    lora->attach();
    conv->train();
    const torch::Tensor x = torch::randn({2, 32, 34, 32});
    const Result stock = run(conv, lora, x, false);
    const Result winograd = run(conv, lora, x, true);
    CATCH_CHECK(conv->packed_weights.winograd());
    // One copy serves the forward and the input gradient.
    CATCH_CHECK(conv->packed_weights.bytes() == conv->weight.numel() * 4);
    CATCH_CHECK(relative(winograd.y, stock.y) < 1e-5);
    CATCH_CHECK(relative(winograd.grad_x, stock.grad_x) < 1e-5);
    CATCH_CHECK(relative(winograd.grad_down, stock.grad_down) < 1e-5);
    CATCH_CHECK(relative(winograd.grad_up, stock.grad_up) < 1e-5);
    // Below that the direct kernels take over, on their own two copies.
    const Result small_stock = run(conv, lora, x.narrow(2, 0, 12), false);
    const Result small = run(conv, lora, x.narrow(2, 0, 12), true);
    CATCH_CHECK_FALSE(conv->packed_weights.winograd());
    CATCH_CHECK(conv->packed_weights.bytes() >= 2 * conv->weight.numel() * 4);
    CATCH_CHECK(relative(small.grad_x, small_stock.grad_x) < 1e-5);
  }
}

CATCH_TEST_CASE("packed convolution weights follow the weight and stay out of eval mode and trainable weights",
                "[models][packed_conv]") {
  if (!lt::models::packed_convolutions_available()) return;
  torch::manual_seed(3);
  lt::models::Conv2d conv(8, 16, 3, 1, 1);
  for (auto& p : conv->parameters()) p.set_requires_grad(false);
  const torch::Tensor x = torch::randn({1, 8, 9, 9});

  conv->eval();  // eval mode never makes the packed copies (a VAE encoding, previews)
  conv->forward(x);
  CATCH_CHECK_FALSE(conv->packed_weights.packed());

  conv->train();
  conv->forward(x);  // no input gradient: the forward copy only
  CATCH_CHECK(conv->packed_weights.packed());
  CATCH_CHECK(conv->packed_weights.bytes() < 2 * conv->weight.numel() * 4);

  // An in-place write to the weight (a LoRA merge, a reload) repacks it.
  {
    torch::NoGradGuard no_grad;
    conv->weight.mul_(-2.0);
  }
  const torch::Tensor expected = torch::conv2d(x, conv->weight, conv->bias, 1, 1);
  CATCH_CHECK(relative(conv->forward(x), expected) < 1e-5);

  // Eval mode keeps the copies but takes the stock path: previews draw what `sample` draws.
  conv->eval();
  CATCH_CHECK(torch::equal(conv->forward(x), expected));
  CATCH_CHECK(conv->packed_weights.packed());
  conv->train();

  // A trainable weight takes the stock path and releases the copies.
  conv->weight.set_requires_grad(true);
  conv->forward(x);
  CATCH_CHECK_FALSE(conv->packed_weights.packed());
}

CATCH_TEST_CASE("a 1x1 convolution as a matrix product takes strided inputs and leaves eval mode to the stock path",
                "[models][packed_conv]") {
  torch::manual_seed(5);
  lt::models::Conv2d conv(16, 12, 1, 1, 0);
  for (auto& p : conv->parameters()) p.set_requires_grad(false);
  conv->train();
  // Channels-last strides, as a permuted token layout hands them over.
  const torch::Tensor base = torch::randn({3, 7, 5, 16});
  const torch::Tensor x = base.permute({0, 3, 1, 2}).requires_grad_(false);
  const torch::Tensor input = x.detach().clone(torch::MemoryFormat::Preserve).requires_grad_(true);
  const torch::Tensor y = conv->forward(input);
  const torch::Tensor upstream = torch::linspace(-1.0, 2.0, y.numel()).view_as(y);
  y.mul(upstream).sum().backward();

  const torch::Tensor reference_input = x.detach().contiguous().requires_grad_(true);
  const torch::Tensor expected = torch::conv2d(reference_input, conv->weight, conv->bias);
  expected.mul(upstream).sum().backward();
  CATCH_CHECK(y.is_contiguous());
  CATCH_CHECK(relative(y.detach(), expected.detach()) < 1e-5);
  CATCH_CHECK(relative(input.grad(), reference_input.grad()) < 1e-5);
  CATCH_CHECK_FALSE(conv->packed_weights.packed());

  conv->eval();
  torch::NoGradGuard no_grad;
  CATCH_CHECK(relative(conv->forward(x), expected.detach()) < 1e-5);
  CATCH_CHECK_FALSE(conv->packed_weights.packed());
}
