#pragma once
// How many query rows attention processes at a time. Header without LibTorch: the planner
// predicts with the same rule the models run.
#include <algorithm>
#include <cstdint>

namespace lt::models {

// On an AVX-512 CPU, attention whose score matrix per head is at least kCpuLongSequence^2
// (self-attention over kCpuLongSequence tokens, or the same number of queries x keys) runs blocked
// even when memory.attention_chunk asks for the plain path, in blocks of at most kCpuQueryBlock
// rows: there the blocked kernel is faster as well as lighter. One layer's forward + backward on 2
// cores of a Xeon with AVX-512/AMX (lt-bench-attention, docs/benchmarks.md), blocks of 128 rows
// against plain, fp32: x0.21 at 1024 tokens of 4 heads x 4 (the tiny UNet, batch 4), x0.29 at 256
// of 4 x 6, x0.55 at 256 of 8 x 160, x0.45 at 512 of 8 x 64, x0.49 at 1024 of 8 x 80, x0.48 at 4096
// of 8 x 40; cross-attention to 77 text tokens x0.22-0.33 from 1024 queries, x0.72 at 4096, but
// x1.12 at 256 queries (256 x 77 scores). bf16 only from 1024 x 1024 scores (x0.59-0.79 there;
// x1.4-2.6 slower at 256 and 512 tokens and in cross-attention to 77 tokens up to 4096 queries).
// On an AVX2 EPYC blocks were slower than the plain path (4096 tokens, 256 rows: 4.2 s against
// 2.4 s), so there the configured path stands, as it does for smaller score matrices and for a CPU
// run standing for a GPU (memory.simulate_vram: it must run out of memory where the GPU would).
constexpr int64_t kCpuLongSequence = 256;     // fp32 scores
constexpr int64_t kCpuLongSequence16 = 1024;  // 16-bit (bf16) scores
constexpr int64_t kCpuQueryBlock = 128;

// Whether this CPU takes the blocked path for long sequences by default.
inline bool cpu_blocks_long_sequences() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// Rows per block for `query_rows` queries over `key_rows` keys; 0 or >= query_rows: the plain
// path. `configured` is memory.attention_chunk (0 = plain); `cpu_speed_rule`: the tensors are in
// host memory of a run that is not standing for a GPU (memory.simulate_vram), so the rule above may
// apply; `score_bytes`: the size of one attention score (4 in fp32, 2 in bf16).
inline int64_t cpu_long_sequence(int64_t score_bytes) {
  return score_bytes >= 4 ? kCpuLongSequence : kCpuLongSequence16;
}
inline int64_t query_block_rows(int64_t query_rows, int64_t key_rows, int64_t configured, bool cpu_speed_rule,
                                int64_t score_bytes) {
  const int64_t long_sequence = cpu_long_sequence(score_bytes);
  if (!cpu_speed_rule || query_rows * key_rows < long_sequence * long_sequence || !cpu_blocks_long_sequences()) {
    return configured;
  }
  return configured > 0 ? std::min(configured, kCpuQueryBlock) : kCpuQueryBlock;
}

}  // namespace lt::models
