#include "loratrain/models/attention.h"

#include <ATen/ATen.h>

#include "loratrain/models/checkpointing.h"

#include <atomic>
#include <cmath>

namespace lt::models {

namespace {
std::atomic<int64_t> g_default_chunk{0};

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                  const std::optional<at::Tensor>& mask, bool upcast, int64_t row_offset, bool causal) {
  at::Tensor qs = upcast ? q.to(at::kFloat) : q;
  at::Tensor ks = upcast ? k.to(at::kFloat) : k;
  at::Tensor scores = at::matmul(qs, ks.transpose(-1, -2)) * scale;  // [B, H, lq, Lk]
  if (mask) scores = scores + *mask;
  if (causal) {
    const int64_t lq = q.size(-2), lk = k.size(-2);
    auto rows = at::arange(row_offset, row_offset + lq, q.options().dtype(at::kLong)).unsqueeze(1);
    auto cols = at::arange(lk, q.options().dtype(at::kLong)).unsqueeze(0);
    scores = scores.masked_fill(cols > rows, -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
  return at::matmul(probs, v);
}
}  // namespace

void set_default_query_chunk(int64_t rows) { g_default_chunk = rows; }
int64_t default_query_chunk() { return g_default_chunk; }

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options, const std::optional<at::Tensor>& mask) {
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const int64_t lq = q.size(-2);
  const int64_t chunk = options.query_chunk;
  if (chunk <= 0 || chunk >= lq) return attend(q, k, v, scale, mask, options.upcast, 0, options.causal);
  // With gradients, a chunk's probabilities would be kept for backward and the whole [Lq, Lk]
  // matrix would be alive again: each chunk is recomputed in backward instead, so only one chunk's
  // scores exist at any time, as in memory-efficient attention kernels.
  const bool recompute = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  std::vector<at::Tensor> outputs;
  for (int64_t start = 0; start < lq; start += chunk) {
    const int64_t len = std::min(chunk, lq - start);
    std::optional<at::Tensor> mask_rows;
    if (mask) {
      mask_rows = mask->size(-2) == 1 ? *mask : mask->narrow(-2, start, len);
    }
    const at::Tensor q_rows = q.narrow(-2, start, len);
    if (!recompute) {
      outputs.push_back(attend(q_rows, k, v, scale, mask_rows, options.upcast, start, options.causal));
      continue;
    }
    const bool upcast = options.upcast, causal = options.causal;
    outputs.push_back(checkpoint(
        [scale, upcast, causal, start](const std::vector<at::Tensor>& in) {
          std::optional<at::Tensor> m;
          if (in[3].defined()) m = in[3];
          return attend(in[0], in[1], in[2], scale, m, upcast, start, causal);
        },
        {q_rows, k, v, mask_rows.value_or(at::Tensor())}));
  }
  return at::cat(outputs, -2);
}

}  // namespace lt::models
