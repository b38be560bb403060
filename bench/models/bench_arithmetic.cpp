// How far an fp32 SD1.5 LoRA step on this CPU is from the CPU's own arithmetic rate: counts the
// multiply-adds of one training step of the full-size UNet (diffusers' SD1.5 config) from its block
// layout, measures the CPU's fp32 rate on the step's largest kernels (LibTorch's matrix product,
// which runs OpenBLAS, and the frozen 3x3 convolutions on packed oneDNN weights, forward + input
// gradient), and prints the step's lower bound at the best rate measured.
//
//   lt-bench-arithmetic [--latent 64] [--tokens 77] [--threads 2] [--iters 5] [--step S] [--ref S]
//
// --step: a measured s/step (bench/train/bench-step) to turn into an achieved rate; --ref: the
// reference's s/step, to print the rate that 0.6 of it would take.
//
// The count: every convolution and Linear once forward and once for its input gradient (the base
// is frozen: no weight gradients; the adapters' rank-4 products are left out), and attention's
// score products twice forward (Q K^T, P V) and five times backward (the blocked kernel recomputes
// Q K^T, then dV, dP, dQ, dK). Layers before the first adapter need no gradient; they are counted
// all the same, so the bound is a little high.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "loratrain/models/layers.h"
#include "loratrain/models/packed_conv.h"
#include "loratrain/models/sd/unet.h"

using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Multiply-adds of one forward pass, by kind.
struct Count {
  double conv = 0, linear = 0, attention = 0;
};

struct UNetCounter {
  const lt::models::sd::UNetConfig& config;
  int64_t text_tokens;
  Count count;

  void conv(int64_t pixels, int64_t in, int64_t out, int64_t kernel) {
    count.conv += static_cast<double>(pixels) * in * out * kernel * kernel;
  }
  void resnet(int64_t pixels, int64_t in, int64_t out) {
    conv(pixels, in, out, 3);
    conv(pixels, out, out, 3);
    if (in != out) conv(pixels, in, out, 1);
  }
  // One Transformer2DModel with its BasicTransformerBlocks: proj_in, self-attention (q, k, v,
  // out), cross-attention (q, out; k and v from the text), GEGLU feed-forward (C -> 8C, 4C -> C),
  // proj_out.
  void transformer(int64_t tokens, int64_t width, int64_t depth, int64_t context_width) {
    const double n = static_cast<double>(tokens), c = static_cast<double>(width);
    count.linear += 2 * n * c * c;
    for (int64_t d = 0; d < depth; ++d) {
      count.linear += (4 + 2 + 12) * n * c * c + 2.0 * text_tokens * context_width * c;
      count.attention += 2 * n * n * c + 2 * n * text_tokens * c;
    }
  }
  void unet(int64_t latent) {
    const auto& channels = config.block_out_channels;
    const size_t levels = config.num_blocks();
    auto pixels_at = [&](size_t level) { return (latent >> level) * (latent >> level); };
    conv(pixels_at(0), config.in_channels, channels[0], config.conv_in_kernel);
    int64_t width = channels[0];
    for (size_t i = 0; i < levels; ++i) {
      for (int64_t j = 0; j < config.layers_per_block[i]; ++j) {
        resnet(pixels_at(i), width, channels[i]);
        width = channels[i];
        if (config.down_has_attention(i))
          transformer(pixels_at(i), width, config.transformer_layers_per_block[i], config.cross_attention_dim[i]);
      }
      if (i + 1 < levels) conv(pixels_at(i + 1), width, width, 3);  // downsampler (stride 2)
    }
    const size_t last = levels - 1;
    resnet(pixels_at(last), width, width);
    transformer(pixels_at(last), width, config.transformer_layers_per_block[last], config.cross_attention_dim[last]);
    resnet(pixels_at(last), width, width);
    // Up blocks: diffusers' layout, each resnet taking the previous output and one skip connection.
    int64_t previous = channels[last];
    for (size_t u = 0; u < levels; ++u) {
      const size_t level = last - u;
      const int64_t out = channels[level];
      const int64_t skip_in = channels[level == 0 ? 0 : level - 1];
      const int64_t layers = config.layers_per_block[level] + 1;
      for (int64_t j = 0; j < layers; ++j) {
        const int64_t skip = j == layers - 1 ? skip_in : out;
        resnet(pixels_at(level), (j == 0 ? previous : out) + skip, out);
        if (config.up_has_attention(u))
          transformer(pixels_at(level), out, config.transformer_layers_per_block[level], config.cross_attention_dim[level]);
      }
      previous = out;
      if (level > 0) conv(pixels_at(level - 1), out, out, 3);  // upsampler (after nearest x2)
    }
    conv(pixels_at(0), channels[0], config.out_channels, config.conv_out_kernel);
  }
};

template <typename Fn>
double best_seconds(int iters, const Fn& fn) {
  fn();  // warm-up (and, for the packed convolution, packing)
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t latent = 64, tokens = 77;
  int threads = 2, iters = 5;
  double step = 0, ref = 0;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--latent") && has_value) latent = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--tokens") && has_value) tokens = std::atol(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && has_value) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && has_value) iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--step") && has_value) step = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--ref") && has_value) ref = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: lt-bench-arithmetic [--latent N] [--tokens N] [--threads N] [--iters N] [--step S] [--ref S]\n");
      return 2;
    }
  }
  torch::set_num_threads(std::max(1, threads));
  const auto config = lt::models::sd::UNetConfig::sd15();
  UNetCounter counter{config, tokens, {}};
  counter.unet(latent);
  const Count& c = counter.count;
  // FLOPs = 2 per multiply-add; forward once, input gradients once more, attention 7 products in all.
  const double conv = 2 * 2 * c.conv, linear = 2 * 2 * c.linear, attention = 2 * 3.5 * c.attention;
  const double total = conv + linear + attention;
  std::printf("SD1.5 UNet, %ldx%ld latents, batch 1, %ld text tokens: one LoRA step (forward + input gradients)\n",
              static_cast<long>(latent), static_cast<long>(latent), static_cast<long>(tokens));
  std::printf("  forward %.0f GFLOP (convolutions %.0f, Linears %.0f, attention scores %.0f)\n",
              2 * (c.conv + c.linear + c.attention) / 1e9, 2 * c.conv / 1e9, 2 * c.linear / 1e9, 2 * c.attention / 1e9);
  std::printf("  step %.0f GFLOP (convolutions %.0f, Linears %.0f, attention scores %.0f)\n", total / 1e9, conv / 1e9,
              linear / 1e9, attention / 1e9);

  std::printf("fp32 rate on %d threads, best of %d:\n", torch::get_num_threads(), iters);
  torch::manual_seed(0);
  double best_rate = 0;
  struct Product {
    int64_t m, k, n;
    const char* what;
  };
  for (const Product& p : {Product{2048, 2048, 2048, "square"}, Product{4096, 320, 2560, "GEGLU in, 64x64"},
                           Product{4096, 1280, 320, "GEGLU out, 64x64"}, Product{1024, 640, 5120, "GEGLU in, 32x32"},
                           Product{4096, 320, 320, "q/k/v/out, 64x64"}}) {
    const torch::Tensor a = torch::randn({p.m, p.k}), b = torch::randn({p.k, p.n});
    const double s = best_seconds(iters, [&] { torch::mm(a, b); });
    const double rate = 2.0 * p.m * p.k * p.n / s / 1e9;
    best_rate = std::max(best_rate, rate);
    std::printf("  mm %5ldx%-5ld x %5ldx%-5ld (%s): %6.1f GFLOPS\n", static_cast<long>(p.m), static_cast<long>(p.k),
                static_cast<long>(p.k), static_cast<long>(p.n), p.what, rate);
  }
  struct Conv {
    int64_t in, out, size;
  };
  for (const Conv& s : {Conv{320, 320, 64}, Conv{960, 320, 64}, Conv{640, 640, 32}, Conv{1280, 1280, 16}}) {
    lt::models::Conv2d layer(s.in, s.out, 3, 1, 1);
    for (auto& p : layer->parameters()) p.set_requires_grad(false);
    lt::models::PackedConvWeights packed;
    const torch::Tensor x = torch::randn({1, s.in, s.size, s.size});
    const torch::Tensor grad = torch::randn({1, s.out, s.size, s.size});
    const double secs = best_seconds(iters, [&] {
      const torch::Tensor input = x.detach().requires_grad_(true);
      packed.forward(input, layer->weight, layer->bias, 1).backward(grad);
    });
    const double rate = 2.0 * 2.0 * s.size * s.size * s.in * s.out * 9 / secs / 1e9;
    best_rate = std::max(best_rate, rate);
    std::printf("  3x3 convolution %4ld->%-4ld at %2ldx%-2ld, forward + input gradient, packed: %6.1f GFLOPS\n",
                static_cast<long>(s.in), static_cast<long>(s.out), static_cast<long>(s.size), static_cast<long>(s.size),
                rate);
  }
  std::printf("lower bound at the best rate measured (%.1f GFLOPS): %.2f s/step\n", best_rate, total / best_rate / 1e9);
  if (step > 0) std::printf("a step of %.3f s runs at %.1f GFLOPS on average\n", step, total / step / 1e9);
  if (ref > 0) {
    std::printf("0.6 x the reference's %.3f s = %.3f s/step takes %.1f GFLOPS on average\n", ref, 0.6 * ref,
                total / (0.6 * ref) / 1e9);
  }
  return 0;
}
