// Scaled dot-product attention shared by every model family.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

namespace lt::models {

struct AttentionOptions {
  // Queries are processed in chunks of this many rows so the full [Lq, Lk] score matrix is never
  // materialised (the memory-efficient path). 0 = one chunk (plain attention).
  int64_t query_chunk = 0;
  bool causal = false;            // mask keys after the query position (CLIP text encoder)
  bool upcast = false;            // compute scores and softmax in fp32 (diffusers upcast_attention)
  std::optional<double> scale;    // default 1/sqrt(head_dim)
  // Whether CPU tensors may follow the CPU's speed rule (attention_blocks.h: long sequences blocked
  // whatever query_chunk says). Off where a CPU run stands for a GPU (memory.simulate_vram): there
  // attention takes the configured path, as on the GPU, so it runs out of memory where the GPU would.
  bool cpu_speed_rule = true;
  // Whether the blocked path may run as the fused CPU kernel (fused_attention.h: fp32, no mask, an
  // AVX-512 CPU, under the speed rule); off: LibTorch's matrix products block by block (what the
  // benchmark and the tests compare it with).
  bool fused_kernel = true;
};

// q: [B, H, Lq, D], k and v: [B, H, Lk, D], mask (optional, additive, broadcastable to
// [B, H, Lq, Lk]) -> [B, H, Lq, D]. Mirrors torch.nn.functional.scaled_dot_product_attention.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options = {},
                     const std::optional<at::Tensor>& mask = std::nullopt);

// The process-wide default chunk size used by models built without an explicit one
// (config: the memory-efficient attention switch). 0 disables chunking.
void set_default_query_chunk(int64_t rows);
int64_t default_query_chunk();

// Rotary position embedding on adjacent pairs (Flux, Wan): x [B, L, H, D] rotated by cos/sin
// [L, D], each pair (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin), in fp32, back in x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace lt::models
