// Frozen convolutions on the CPU: LibTorch's own convolution (which reorders the weight into oneDNN's
// blocked layout on every call) against the packed copies of models/packed_conv.h and, for the 1x1
// ones, the matrix product over the channels that Conv2d runs for them; one layer's forward +
// input gradient at the full-size SD1.5 UNet's shapes (512 px = 64x64 latents, batch 1).
//
//   lt-bench-packed-conv [--iters N] [--threads N (default 2)] [--dtype fp32|bf16]
//
// Prints per shape the best of N (default 5) of each path, alternating, and the one-time cost of
// packing; the outputs of all paths must agree.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "loratrain/models/layers.h"
#include "loratrain/models/packed_conv.h"

using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Shape {
  int64_t in, out, kernel, size;
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 5;
  int threads = 2;
  torch::Dtype dtype = torch::kFloat;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc && !std::strcmp(argv[i + 1], "fp32")) ++i;
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc && !std::strcmp(argv[i + 1], "bf16")) {
      dtype = torch::kBFloat16;
      ++i;
    } else {
      std::fprintf(stderr, "usage: lt-bench-packed-conv [--iters N] [--threads N] [--dtype fp32|bf16]\n");
      return 2;
    }
  }
  torch::set_num_threads(std::max(1, threads));
  if (!lt::models::packed_convolutions_available()) {
    std::fprintf(stderr, "lt-bench-packed-conv: this LibTorch has no oneDNN (MKLDNN) convolutions\n");
    return 1;
  }
  std::printf("threads %d, best of %d, forward + input gradient, %s\n", torch::get_num_threads(), iters,
              dtype == torch::kFloat ? "fp32" : "bf16");
  std::printf("%-26s %10s %10s %7s %10s %12s %7s\n", "shape", "stock ms", "packed ms", "ratio", "pack ms", "pointwise ms",
              "ratio");
  // The UNet's resnet convolutions per level (and the up path's widest concatenations), its 1x1
  // shortcuts and its attention projections (proj_in / proj_out).
  const Shape shapes[] = {{320, 320, 3, 64},   {960, 320, 3, 64},   {640, 640, 3, 32},   {1920, 640, 3, 32},
                          {1280, 1280, 3, 16}, {2560, 1280, 3, 16}, {1280, 1280, 3, 8},  {2560, 1280, 3, 8},
                          {320, 320, 1, 64},   {960, 320, 1, 64},   {640, 640, 1, 32},   {1920, 640, 1, 32},
                          {1280, 1280, 1, 16}, {2560, 1280, 1, 16}, {1280, 1280, 1, 8},  {2560, 1280, 1, 8}};
  torch::manual_seed(0);
  for (const Shape& s : shapes) {
    lt::models::Conv2d conv(s.in, s.out, s.kernel, 1, s.kernel / 2);
    for (auto& p : conv->parameters()) p.set_requires_grad(false);
    conv->to(dtype);
    lt::models::PackedConvWeights packed_weights;
    const torch::Tensor x = torch::randn({1, s.in, s.size, s.size}).to(dtype);
    const torch::Tensor grad = torch::randn({1, s.out, s.size, s.size}).to(dtype);
    const int paths = s.kernel == 1 ? 3 : 2;  // stock, packed, pointwise (1x1 only)
    torch::Tensor outputs[3];
    auto step = [&](int path) {
      const torch::Tensor input = x.detach().requires_grad_(true);
      const int64_t padding = s.kernel / 2;
      const torch::Tensor y = path == 0   ? torch::conv2d(input, conv->weight, conv->bias, 1, padding)
                              : path == 1 ? packed_weights.forward(input, conv->weight, conv->bias, padding)
                                          : lt::models::pointwise_conv(input, conv->weight, conv->bias);
      y.backward(grad);
      outputs[path] = input.grad().to(torch::kFloat);
    };
    step(0);
    auto t0 = Clock::now();
    step(1);  // the first packed call packs both copies
    const double first = ms_since(t0);
    double best[3] = {1e30, 1e30, 1e30};
    for (int i = 0; i < iters; ++i) {
      for (int path = 0; path < paths; ++path) {
        t0 = Clock::now();
        step(path);
        best[path] = std::min(best[path], ms_since(t0));
      }
    }
    const double tolerance = dtype == torch::kFloat ? 1e-4 : 5e-2;
    for (int path = 1; path < paths; ++path) {
      const double diff = ((outputs[path] - outputs[0]).abs().max() / outputs[0].abs().max()).item<double>();
      if (diff > tolerance) {
        std::fprintf(stderr, "lt-bench-packed-conv: path %d and stock input gradients differ (relative %.2e)\n", path, diff);
        return 1;
      }
    }
    const std::string name = std::to_string(s.in) + "->" + std::to_string(s.out) + " k" + std::to_string(s.kernel) +
                             " " + std::to_string(s.size) + "x" + std::to_string(s.size);
    std::printf("%-26s %10.1f %10.1f %7.2f %10.1f", name.c_str(), best[0], best[1], best[1] / best[0],
                std::max(0.0, first - best[1]));
    if (paths == 3) std::printf(" %12.1f %7.2f", best[2], best[2] / best[0]);
    std::printf("\n");
  }
  return 0;
}
