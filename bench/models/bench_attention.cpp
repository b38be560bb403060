// lt-bench-attention: one attention layer's forward + backward on the CPU, the plain path
// (softmax(q k^T * scale) v through autograd, all scores at once) against lora-train's blocked
// kernel (lt::models::attention with a query chunk; LibTorch's products block by block) and the
// default path (with the fused CPU kernel where it applies: fused_attention.h), at SD1.5's shapes, in fp32 and bf16. What
// models/attention_blocks.h decides from. Best of N after one warm-up, interleaved so that a busy
// machine slows both alike; prints ms and the ratio blocked / plain.
//
//   lt-bench-attention [--batch 1] [--tokens 4096] [--keys N] [--heads 8] [--head-dim 40] [--threads 2] [--repeat 3]
//                      [--rows 32,64,128]   (query rows per block; at most kCpuQueryBlock from kCpuLongSequence tokens)
//   (SD1.5 at 512 px: 4096 tokens of 8 heads x 40 at the first level, 1024 tokens of 8 x 80 at the
//   second; the reference's tiny UNet at 256 px, batch 4: 1024 tokens of 4 heads x 4). --keys: the
//   keys' length, for cross-attention (77 text tokens); default: --tokens (self-attention).
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "loratrain/models/attention.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 1, tokens = 4096, keys = 0, heads = 8, head_dim = 40;
  int threads = 2, repeat = 3;
  std::vector<int64_t> rows = {32, 64, 128};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (a == "--rows") {
      rows.clear();
      for (const char* p = argv[i + 1]; *p;) {
        char* end = nullptr;
        rows.push_back(std::strtol(p, &end, 10));
        if (end == p || rows.back() <= 0) {
          std::fprintf(stderr, "lt-bench-attention: --rows takes positive numbers separated by commas\n");
          return 2;
        }
        p = *end == ',' ? end + 1 : end;
      }
    } else if (a == "--batch") batch = v;
    else if (a == "--tokens") tokens = v;
    else if (a == "--keys") keys = v;
    else if (a == "--heads") heads = v;
    else if (a == "--head-dim") head_dim = v;
    else if (a == "--threads") threads = static_cast<int>(v);
    else if (a == "--repeat") repeat = static_cast<int>(v);
    else {
      std::fprintf(stderr, "lt-bench-attention: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (keys <= 0) keys = tokens;
  std::printf("attention forward + backward, batch %ld, %ld queries x %ld keys, %ld heads x %ld, %d threads (best of %d)\n",
              static_cast<long>(batch), static_cast<long>(tokens), static_cast<long>(keys), static_cast<long>(heads),
              static_cast<long>(head_dim), threads, repeat);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    auto make = [&](int64_t length) {
      return torch::randn({batch, heads, length, head_dim}).to(dtype).set_requires_grad(true);
    };
    at::Tensor q = make(tokens), k = make(keys), v = make(keys);
    const at::Tensor grad = torch::randn({batch, heads, tokens, head_dim}).to(dtype);
    auto plain = [&] {
      at::Tensor probs = at::softmax(at::matmul(q * scale, k.transpose(-1, -2)), -1);
      at::matmul(probs, v).backward(grad);
    };
    // best[0]: the hand-written plain path; 1..rows: blocks of those rows as configured (memory.attention_chunk:
    // backward recomputes each block's probabilities); last: lt::models::attention with nothing configured (the
    // CPU's speed rule may block it, keeping the probabilities).
    std::vector<double> best(rows.size() + 2, 1e30);
    for (int r = 0; r <= repeat; ++r) {  // r == 0: warm-up
      for (size_t i = 0; i <= rows.size() + 1; ++i) {
        const double s = seconds_of([&] {
          if (i == 0) return plain();
          lt::models::AttentionOptions options;
          options.query_chunk = i <= rows.size() ? rows[i - 1] : 0;
          options.fused_kernel = i > rows.size();
          lt::models::attention(q, k, v, options).backward(grad);
        });
        if (r > 0) best[i] = std::min(best[i], s);
      }
    }
    std::printf("%s: plain %.1f ms", dtype == at::kFloat ? "fp32" : "bf16", best[0] * 1e3);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::printf(" | blocks of %ld rows %.1f ms (x%.2f)", static_cast<long>(rows[i]), best[i + 1] * 1e3,
                  best[i + 1] / best[0]);
    }
    std::printf(" | default path (fused kernel where it applies) %.1f ms (x%.2f)\n", best.back() * 1e3, best.back() / best[0]);
    std::fflush(stdout);
  }
  return 0;
}
