// Fused fp32 attention for one head on AVX-512 CPUs: the scores of a block of query rows are
// computed, turned into probabilities and multiplied out by register-tiled loops of the kernel's
// own (no BLAS call, no packing per block, no score matrix of a whole head in memory; the
// scaling, exponentials and softmax gradient happen as the tiles are stored). Backward recomputes
// a block's probabilities from the row's log-sum-exp that forward saved. Header without LibTorch:
// raw row-major fp32 arrays.
#pragma once
#include <cstdint>

namespace lt::models::fused_attention {

// Whether this CPU runs the kernels (AVX-512: util::cpu_has_avx512_core), and the widest head
// they take.
bool available();
constexpr int64_t kMaxHeadDim = 160;

// Query rows per block for `key_rows` keys, and the scratch one head's forward or backward needs
// (floats): two blocks of scores, at most 2 x 4 MiB.
int64_t block_rows(int64_t key_rows);
int64_t scratch_floats(int64_t key_rows);

// One head: q [lq, d], kt = k transposed [d, lk], v [lk, d] -> out [lq, d], lse [lq] (the
// log-sum-exp of each row's scaled scores).
void forward(const float* q, const float* kt, const float* v, int64_t lq, int64_t lk, int64_t d, float scale,
             float* out, float* lse, float* scratch);

// Gradients of one head: d_out [lq, d]; delta [lq] = rowsum(d_out * out); k [lk, d], vt = v
// transposed [d, lk]. Writes dq [lq, d], dk and dv [lk, d] (overwritten, not accumulated).
void backward(const float* q, const float* k, const float* kt, const float* vt, const float* d_out,
              const float* delta, const float* lse, int64_t lq, int64_t lk, int64_t d, float scale, float* dq,
              float* dk, float* dv, float* scratch);

}  // namespace lt::models::fused_attention
