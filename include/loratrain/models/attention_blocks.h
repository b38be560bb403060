#pragma once
// How many query rows attention processes at a time. Header without LibTorch: the planner
// predicts with the same rule the models run.
#include <algorithm>
#include <cstdint>

namespace lt::models {

// On an AVX-512 CPU, sequences at least this long run blocked even when memory.attention_chunk
// asks for the plain path, in blocks of at most kCpuQueryBlock rows: there the blocked kernel is
// faster as well as lighter. One layer's forward + backward on 2 cores of a Xeon with AVX-512/AMX
// (lt-bench-attention, docs/benchmarks.md), fp32 in blocks of 128 rows against plain: x0.48 at
// 4096 tokens (SD1.5 at 512 px), x0.46 at 1024, x0.30 at 256 (8 heads x 160), x0.23 at 1024 tokens
// of 4 heads x 4 (the tiny UNet, batch 4); bf16 x0.71 at 4096, x0.78 at 1024, x1.08 at 256; at 64
// tokens both paths take about a millisecond. On an AVX2 EPYC blocks were slower than the plain
// path (4096 tokens, 256 rows: 4.2 s against 2.4 s), so there the configured path stands, as it
// does for shorter sequences. From 256 tokens the blocks would be faster too (the tiny step x0.67
// of the reference instead of x1.00), but they change where a CPU run under memory.simulate_vram
// runs out of memory: the guard tests calibrated on the plain path (Flux's 512 bucket) then fit.
constexpr int64_t kCpuLongSequence = 2048;
constexpr int64_t kCpuQueryBlock = 128;

// Whether this CPU takes the blocked path for long sequences by default.
inline bool cpu_blocks_long_sequences() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// Rows per block for `query_rows` queries; 0 or >= query_rows: the plain path. `configured` is
// memory.attention_chunk (0 = plain); `on_cpu`: the tensors are in host memory.
inline int64_t query_block_rows(int64_t query_rows, int64_t configured, bool on_cpu) {
  if (!on_cpu || query_rows < kCpuLongSequence || !cpu_blocks_long_sequences()) return configured;
  return configured > 0 ? std::min(configured, kCpuQueryBlock) : kCpuQueryBlock;
}

}  // namespace lt::models
