// The kernels of fused_attention.h. Plain C++ on raw arrays (no LibTorch here), compiled at -O3 with
// AVX-512 enabled per function (target attribute), so that the rest of the program stays buildable
// and runnable on CPUs without it: callers check available() first.
#include "loratrain/models/fused_attention.h"

#include "loratrain/util/cpu_features.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
// GCC 12's AVX-512 headers start masked and reducing intrinsics from _mm512_undefined_ps(), which its
// flow analysis then reports as uninitialised (a known false positive of those headers).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define LT_AVX512 __attribute__((target("avx512f,avx512vl,fma")))

namespace lt::models::fused_attention {

namespace {

// Rows of a register tile with nv 16-wide column vectors: rows x nv accumulators, the nv vectors
// of B and one broadcast of A fit AVX-512's 32 registers, and the row pointers the general-purpose
// registers (at most 8 rows).
constexpr int rows_for(int nv) { return nv <= 3 ? 8 : nv == 4 ? 6 : nv == 5 ? 5 : nv == 6 ? 4 : nv <= 8 ? 3 : 2; }

// e^x for x <= 0 (scores minus their row's maximum or log-sum-exp): 2^n e^f with |f| <= ln2/2,
// e^f by its Taylor series to f^7 (truncation error below 1e-8 there), 2^n by scalef.
LT_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln 2 in two parts (Cody-Waite)
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// What a tile does with its products x = A B before storing them into C.
struct Epilogue {
  float alpha = 1.0f;                 // x *= alpha ...
  const float* row_scale = nullptr;   // ... or by row_scale[r], a factor per row
  const float* exp_shift = nullptr;   // x = exp(x - exp_shift[r]): probabilities from log-sum-exps
  const float* probs = nullptr;       // x = probs[r, j] (x - probs_shift[r]): the softmax's gradient
  const float* probs_shift = nullptr;
  float* row_max = nullptr;           // row_max[r] = max(row_max[r], max_j x) (after the above)
  bool accumulate = false;            // C += x instead of C = x
};

// C[R, 16 nv] (+)= epilogue(A[R, kn] B[kn, 16 nv]). A's element (r, k) is a[r * a_row + k * a_col]:
// row-major A (a_col = 1) and a transposed one (a_row = 1) alike, without a copy. `last` masks the
// columns of the last vector; HALF: it has at most 8 columns and runs at 256 bits (a head of 40 is
// 16 + 16 + 8 wide: where a 512-bit multiply-add takes both of a core's 256-bit units, as on AMD's
// Zen 4, the half-width one leaves one of them to the next).
template <int R, int NV, bool HALF>
LT_AVX512 void tile(int64_t kn, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb, float* c,
                    int64_t ldc, __mmask16 last, const Epilogue& e) {
  constexpr int FULL = HALF ? NV - 1 : NV;  // 512-bit column vectors
  __m512 acc[R][NV];
  __m256 acc_half[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < FULL; ++v) acc[r][v] = _mm512_setzero_ps();
    if constexpr (HALF) acc_half[r] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kn; ++k) {
    const float* bk = b + k * ldb;
    __m512 bv[NV];
    __m256 b_half;
#pragma GCC unroll 16
    for (int v = 0; v < NV - 1; ++v) bv[v] = _mm512_loadu_ps(bk + 16 * v);
    if constexpr (HALF) {
      b_half = _mm256_maskz_loadu_ps(static_cast<__mmask8>(last), bk + 16 * (NV - 1));
    } else {
      bv[NV - 1] = _mm512_maskz_loadu_ps(last, bk + 16 * (NV - 1));
    }
    const float* ak = a + k * a_col;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(ak[r * a_row]);
#pragma GCC unroll 16
      for (int v = 0; v < FULL; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
      if constexpr (HALF) acc_half[r] = _mm256_fmadd_ps(_mm512_castps512_ps256(ar), b_half, acc_half[r]);
    }
  }
  if constexpr (HALF) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][NV - 1] = _mm512_zextps256_ps512(acc_half[r]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 scale = _mm512_set1_ps(e.row_scale != nullptr ? e.row_scale[r] : e.alpha);
    __m512 top = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      float* cv = c + r * ldc + 16 * v;
      const __mmask16 m = v == NV - 1 ? last : static_cast<__mmask16>(0xFFFF);
      __m512 x = _mm512_mul_ps(acc[r][v], scale);
      if (e.exp_shift != nullptr) x = exp16(_mm512_sub_ps(x, _mm512_set1_ps(e.exp_shift[r])));
      if (e.probs != nullptr) {
        x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, e.probs + r * ldc + 16 * v),
                          _mm512_sub_ps(x, _mm512_set1_ps(e.probs_shift[r])));
      }
      if (e.row_max != nullptr) top = _mm512_mask_max_ps(top, m, top, x);
      if (e.accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, cv));
      _mm512_mask_storeu_ps(cv, m, x);
    }
    if (e.row_max != nullptr) e.row_max[r] = std::max(e.row_max[r], _mm512_reduce_max_ps(top));
  }
}

// The rows left after the full tiles: one tile of exactly `rows` (< R) rows.
template <int R, int NV, bool HALF>
LT_AVX512 void rest(int64_t rows, int64_t kn, const float* a, int64_t a_row, int64_t a_col, const float* b,
                    int64_t ldb, float* c, int64_t ldc, __mmask16 last, const Epilogue& e) {
  if constexpr (R > 0) {
    if (rows == R) {
      tile<R, NV, HALF>(kn, a, a_row, a_col, b, ldb, c, ldc, last, e);
    } else {
      rest<R - 1, NV, HALF>(rows, kn, a, a_row, a_col, b, ldb, c, ldc, last, e);
    }
  }
}

// The epilogue of the tile whose top left element is C's (row, col).
Epilogue epilogue_at(const Epilogue& e, int64_t row, int64_t col, int64_t ldc) {
  Epilogue at = e;
  if (at.row_scale != nullptr) at.row_scale += row;
  if (at.exp_shift != nullptr) at.exp_shift += row;
  if (at.probs != nullptr) at.probs += row * ldc + col;
  if (at.probs_shift != nullptr) at.probs_shift += row;
  if (at.row_max != nullptr) at.row_max += row;
  return at;
}

template <int NV, bool HALF>
LT_AVX512 void panel(int64_t m, int64_t kn, const float* a, int64_t a_row, int64_t a_col, const float* b,
                     int64_t ldb, float* c, int64_t ldc, __mmask16 last, const Epilogue& e, int64_t col) {
  constexpr int R = rows_for(NV);
  int64_t i = 0;
  for (; i + R <= m; i += R) {
    tile<R, NV, HALF>(kn, a + i * a_row, a_row, a_col, b, ldb, c + i * ldc, ldc, last, epilogue_at(e, i, col, ldc));
  }
  rest<R - 1, NV, HALF>(m - i, kn, a + i * a_row, a_row, a_col, b, ldb, c + i * ldc, ldc, last,
                        epilogue_at(e, i, col, ldc));
}

// C[m, n] (+)= epilogue(A[m, kn] B[kn, n]), B and C row-major. Columns in panels of 64 when n is
// wider than a head (the panel of B then stays in L1 across the row tiles), else all at once.
LT_AVX512 void gemm(int64_t m, int64_t n, int64_t kn, const float* a, int64_t a_row, int64_t a_col, const float* b,
                    int64_t ldb, float* c, int64_t ldc, const Epilogue& e) {
  const int64_t step = n <= kMaxHeadDim ? n : 64;
  for (int64_t j = 0; j < n; j += step) {
    const int64_t w = std::min(step, n - j);
    const int nv = static_cast<int>((w + 15) / 16);
    const auto last = static_cast<__mmask16>((1u << (w - 16 * (nv - 1))) - 1u);
    const float* bj = b + j;
    float* cj = c + j;
    const bool half = w - 16 * (nv - 1) <= 8;
    switch (nv * 2 + (half ? 1 : 0)) {
#define LT_PANEL(NV)                                                                         \
  case NV * 2: panel<NV, false>(m, kn, a, a_row, a_col, bj, ldb, cj, ldc, last, e, j); break; \
  case NV * 2 + 1: panel<NV, true>(m, kn, a, a_row, a_col, bj, ldb, cj, ldc, last, e, j); break;
      LT_PANEL(1) LT_PANEL(2) LT_PANEL(3) LT_PANEL(4) LT_PANEL(5)
      LT_PANEL(6) LT_PANEL(7) LT_PANEL(8) LT_PANEL(9) LT_PANEL(10)
#undef LT_PANEL
    }
  }
}

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
}

// row <- exp(row - shift) in place; returns the sum.
LT_AVX512 float exp_row(float* row, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail_mask(n - j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), s));
    sum = _mm512_mask_add_ps(sum, m, sum, e);
    _mm512_mask_storeu_ps(row + j, m, e);
  }
  return _mm512_reduce_add_ps(sum);
}

LT_AVX512 void forward_avx512(const float* q, const float* kt, const float* v, int64_t lq, int64_t lk, int64_t d,
                              float scale, float* out, float* lse, float* scratch) {
  const int64_t br = block_rows(lk);
  float* s = scratch;                // [br, lk]: scores, then unnormalised probabilities
  float* row_max = scratch + br * lk;  // [br]
  float* inv_sum = row_max + br;     // [br]
  for (int64_t i0 = 0; i0 < lq; i0 += br) {
    const int64_t rows = std::min(br, lq - i0);
    std::fill(row_max, row_max + rows, -INFINITY);
    Epilogue scores;
    scores.alpha = scale;
    scores.row_max = row_max;
    gemm(rows, lk, d, q + i0 * d, d, 1, kt, lk, s, lk, scores);
    for (int64_t r = 0; r < rows; ++r) {
      const float sum = exp_row(s + r * lk, lk, row_max[r]);
      inv_sum[r] = 1.0f / sum;
      lse[i0 + r] = row_max[r] + std::log(sum);
    }
    Epilogue normalised;  // the rows' 1/sum applied to the [rows, d] output, not the [rows, lk] probabilities
    normalised.row_scale = inv_sum;
    gemm(rows, d, lk, s, lk, 1, v, d, out + i0 * d, d, normalised);
  }
}

LT_AVX512 void backward_avx512(const float* q, const float* k, const float* kt, const float* vt, const float* d_out,
                               const float* delta, const float* lse, int64_t lq, int64_t lk, int64_t d, float scale,
                               float* dq, float* dk, float* dv, float* scratch) {
  const int64_t br = block_rows(lk);
  float* probs = scratch;               // [br, lk]
  float* d_scores = scratch + br * lk;  // [br, lk]
  std::memset(dk, 0, sizeof(float) * lk * d);
  std::memset(dv, 0, sizeof(float) * lk * d);
  Epilogue accumulate;
  accumulate.accumulate = true;
  Epilogue accumulate_scaled = accumulate;
  accumulate_scaled.alpha = scale;
  Epilogue scaled;
  scaled.alpha = scale;
  for (int64_t i0 = 0; i0 < lq; i0 += br) {
    const int64_t rows = std::min(br, lq - i0);
    const float* q_rows = q + i0 * d;
    const float* d_out_rows = d_out + i0 * d;
    Epilogue recomputed;  // P = exp(scale q k^T - lse), as forward normalised them
    recomputed.alpha = scale;
    recomputed.exp_shift = lse + i0;
    gemm(rows, lk, d, q_rows, d, 1, kt, lk, probs, lk, recomputed);
    gemm(lk, d, rows, probs, 1, lk, d_out_rows, d, dv, d, accumulate);  // dV += P^T dO
    Epilogue softmax_grad;  // dS = P (dO V^T - delta)
    softmax_grad.probs = probs;
    softmax_grad.probs_shift = delta + i0;
    gemm(rows, lk, d, d_out_rows, d, 1, vt, lk, d_scores, lk, softmax_grad);
    gemm(rows, d, lk, d_scores, lk, 1, k, d, dq + i0 * d, d, scaled);             // dQ = dS K scale
    gemm(lk, d, rows, d_scores, 1, lk, q_rows, d, dk, d, accumulate_scaled);  // dK += dS^T Q scale
  }
}

}  // namespace

bool available() { return util::cpu_has_avx512_core(); }  // F and VL, with BW and DQ

void forward(const float* q, const float* kt, const float* v, int64_t lq, int64_t lk, int64_t d, float scale,
             float* out, float* lse, float* scratch) {
  forward_avx512(q, kt, v, lq, lk, d, scale, out, lse, scratch);
}

void backward(const float* q, const float* k, const float* kt, const float* vt, const float* d_out,
              const float* delta, const float* lse, int64_t lq, int64_t lk, int64_t d, float scale, float* dq,
              float* dk, float* dv, float* scratch) {
  backward_avx512(q, k, kt, vt, d_out, delta, lse, lq, lk, d, scale, dq, dk, dv, scratch);
}

}  // namespace lt::models::fused_attention

#else

namespace lt::models::fused_attention {
bool available() { return false; }
void forward(const float*, const float*, const float*, int64_t, int64_t, int64_t, float, float*, float*, float*) {
  throw std::logic_error("fused attention: AVX-512 kernels are not built for this CPU architecture");
}
void backward(const float*, const float*, const float*, const float*, const float*, const float*, const float*,
              int64_t, int64_t, int64_t, float, float*, float*, float*, float*) {
  throw std::logic_error("fused attention: AVX-512 kernels are not built for this CPU architecture");
}
}  // namespace lt::models::fused_attention

#endif

namespace lt::models::fused_attention {

// Up to 240 rows, a block's scores at most 4 MiB: more rows per block mean fewer passes over dK and
// dV (accumulated once per block), which at 4096 keys outweighed keeping the block in L2 (blocks of
// 24 rows 479 ms per layer, 64 rows 457, 120 rows 444, 240 rows 438, 480 rows 452: docs/benchmarks.md).
// A multiple of 24 rows, so that the register tiles (8 or 6 rows) divide a block.
int64_t block_rows(int64_t key_rows) {
  const int64_t fit = (1024 * 1024) / std::max<int64_t>(1, key_rows);
  return std::clamp<int64_t>(fit / 24 * 24, 24, 240);
}

int64_t scratch_floats(int64_t key_rows) { return 2 * block_rows(key_rows) * (key_rows + 1); }

}  // namespace lt::models::fused_attention
