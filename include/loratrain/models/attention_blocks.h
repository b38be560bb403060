#pragma once
// How many query rows attention processes at a time. Header without LibTorch: the planner
// predicts with the same rule the models run.
#include <algorithm>
#include <cstdint>

namespace lt::models {

// On an AVX-512 CPU, sequences at least this long run blocked even when memory.attention_chunk
// asks for the plain path, in blocks of at most kCpuQueryBlock rows: there the blocked kernel is
// faster as well as lighter (Xeon with AVX-512/AMX, SD1.5 at 512 px = 4096 tokens, forward +
// backward of one layer on 2 cores: fp32 4.4 s plain, 3.0 s in blocks of 128 rows; bf16 2.6 s and
// 2.0 s; docs/benchmarks.md). On an AVX2 EPYC blocks were slower than the plain path (256 rows
// 4.2 s against 2.4 s), so there the configured path stands, as it does for shorter sequences.
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
