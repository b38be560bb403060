#include "loratrain/models/attention.h"

#include "loratrain/models/attention_blocks.h"
#include "loratrain/models/checkpointing.h"
#include "loratrain/models/fused_attention.h"

#include <ATen/ATen.h>

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <cmath>

namespace lt::models {

namespace {
std::atomic<int64_t> g_default_chunk{0};

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                  const std::optional<at::Tensor>& mask, bool upcast, int64_t row_offset, bool causal) {
  at::Tensor qs = upcast ? q.to(at::kFloat) : q;
  at::Tensor ks = upcast ? k.to(at::kFloat) : k;
  const int64_t lq = q.size(-2), lk = k.size(-2);
  // The scale goes on q ([.., lq, D]) rather than on the [.., lq, Lk] scores: no second pass over,
  // and no second copy of, the score matrix in forward or backward.
  at::Tensor scores = at::matmul(qs * scale, ks.transpose(-1, -2));  // [B, H, lq, Lk]
  if (mask) scores = scores + *mask;
  if (causal) {
    auto rows = at::arange(row_offset, row_offset + lq, q.options().dtype(at::kLong)).unsqueeze(1);
    auto cols = at::arange(lk, q.options().dtype(at::kLong)).unsqueeze(0);
    scores = scores.masked_fill(cols > rows, -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
  return at::matmul(probs, v);
}

// One head's inputs: q [Lq, D], k and v [Lk, D], the additive mask rows [Lq or 1, Lk] (undefined: none).
struct Head {
  at::Tensor q, k, v, mask;
};

struct BlockSetup {
  double scale;
  int64_t block;  // query rows per block
  bool causal;
};

// Heads of [N, L, D] tensors, N = B * H; the mask is 4-D, broadcastable to [B, H, Lq, Lk], or empty.
Head head_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, int64_t heads,
             int64_t n) {
  Head h{q[n], k[n], v[n], at::Tensor()};
  if (mask.numel() > 0) h.mask = mask[(n / heads) % mask.size(0)][(n % heads) % mask.size(1)];
  return h;
}

// Softmax probabilities of query rows [start, start + len) of one head: [len, Lk] in v's dtype.
// Forward and backward call it with the same arguments, so backward sees exactly the
// probabilities forward used.
at::Tensor block_probs(const Head& h, int64_t start, int64_t len, const BlockSetup& s) {
  // The scale on the query rows ([len, D]) rather than on the scores ([len, Lk]), as in attend():
  // one pass over D columns instead of Lk.
  at::Tensor scores = at::mm(h.q.narrow(0, start, len) * s.scale, h.k.t());  // [len, Lk]
  if (h.mask.defined()) scores.add_(h.mask.size(0) == 1 ? h.mask : h.mask.narrow(0, start, len));
  if (s.causal) {
    const int64_t lk = h.k.size(0);
    auto rows = at::arange(start, start + len, scores.options().dtype(at::kLong)).unsqueeze(1);
    auto cols = at::arange(lk, scores.options().dtype(at::kLong)).unsqueeze(0);
    scores.masked_fill_(cols > rows, -std::numeric_limits<float>::infinity());
  }
  return at::softmax(scores, -1).to(h.v.scalar_type());
}

// LibTorch 1.13 parallelises neither a batched matrix product over its batch nor OpenBLAS well
// on these shapes (head_dim 40..160 is a thin inner dimension): heads are spread over LibTorch's
// threads instead, each running single-threaded BLAS on its own head, with OpenBLAS's own pool
// held at one thread meanwhile so the two pools never compete for the same cores. (This file is
// compiled with OpenMP for that: lt_enable_intra_op_threads in cmake/LtTorch.cmake; without it,
// with a PyTorch wheel's own OpenMP runtime, the heads run one after the other.)
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() {
    if (set_ && get_) {
      previous_ = get_();
      if (previous_ != 1) set_(1);
    }
  }
  ~SingleThreadedBlas() {
    if (set_ && get_ && previous_ != 1) set_(previous_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  using Set = void (*)(int);
  using Get = int (*)();
  static inline Set set_ = reinterpret_cast<Set>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  static inline Get get_ = reinterpret_cast<Get>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  int previous_ = 1;
};

// Each thread takes the next head as it finishes one (not a fixed half of them): on a machine
// shared with other work one thread may be descheduled, and the other takes over its heads.
template <typename Fn>
void for_each_head(int64_t n, const Fn& fn) {
#ifdef _OPENMP
  SingleThreadedBlas blas;
#endif
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(n, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    // Autograd's thread-local state does not follow into LibTorch's worker threads: without this
    // the block products would be recorded (and refuse their out= arguments) there.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (int64_t i = next++; i < n; i = next++) fn(i);
  });
}

// q [N, Lq, D], k and v [N, Lk, D] (contiguous; q and k already in the scores' dtype).
at::Tensor blocked_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           int64_t heads, const BlockSetup& s) {
  const int64_t lq = q.size(1);
  at::Tensor out = at::empty({q.size(0), lq, v.size(2)}, v.options());
  for_each_head(q.size(0), [&](int64_t n) {
    const Head h = head_of(q, k, v, mask, heads, n);
    const at::Tensor o = out[n];
    for (int64_t start = 0; start < lq; start += s.block) {
      const int64_t len = std::min(s.block, lq - start);
      at::Tensor o_rows = o.narrow(0, start, len);
      at::mm_out(o_rows, block_probs(h, start, len, s), h.v);
    }
  });
  return out;
}

// Memory-efficient attention with an exact backward: only q, k, v (and the mask) are kept for
// backward, which recomputes each block's probabilities and applies the softmax gradient to that
// block alone. The extra memory is one block per thread instead of the whole [N, Lq, Lk] matrix
// that autograd through plain attention keeps (and no score matrix of a whole layer is ever
// written, scaled and re-read).
struct BlockedAttention : public torch::autograd::Function<BlockedAttention> {
  // known: the output when it is already known (a checkpoint's recomputation hands back the one
  // its forward computed from the same q, k, v), else null.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& mask, double scale, int64_t block, int64_t heads,
                            bool causal, const at::Tensor* known) {
    ctx->save_for_backward({q, k, v, mask});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["block"] = block;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["causal"] = causal;
    if (known != nullptr) return *known;
    return blocked_forward(q, k, v, mask, heads, {scale, block, causal});
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &mask = saved[3];
    const BlockSetup s{ctx->saved_data["scale"].toDouble(), ctx->saved_data["block"].toInt(),
                       ctx->saved_data["causal"].toBool()};
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const at::Tensor grad_out = grads[0].to(v.scalar_type()).contiguous();  // [N, Lq, D]
    const int64_t lq = q.size(1);
    at::Tensor dq = at::empty_like(q);
    at::Tensor dk = at::zeros_like(k);
    at::Tensor dv = at::zeros_like(v);
    for_each_head(q.size(0), [&](int64_t n) {
      const Head h = head_of(q, k, v, mask, heads, n);
      at::Tensor dq_h = dq[n], dk_h = dk[n], dv_h = dv[n];
      const at::Tensor d_out_h = grad_out[n];
      const at::Tensor v_t = h.v.t();
      for (int64_t start = 0; start < lq; start += s.block) {
        const int64_t len = std::min(s.block, lq - start);
        const at::Tensor q_rows = h.q.narrow(0, start, len);
        const at::Tensor probs = block_probs(h, start, len, s);                 // [len, Lk]
        const at::Tensor d_out = d_out_h.narrow(0, start, len);                 // [len, D]
        dv_h.addmm_(probs.t(), d_out);                                          // dV += P^T dO
        const at::Tensor d_probs = at::mm(d_out, v_t).to(q.scalar_type());     // [len, Lk]
        const at::Tensor d_scores =
            at::_softmax_backward_data(d_probs, probs.to(q.scalar_type()), -1, q.scalar_type());
        at::Tensor dq_rows = dq_h.narrow(0, start, len);
        at::mm_out(dq_rows, d_scores, h.k).mul_(s.scale);                      // dQ = dS K * scale
        dk_h.addmm_(d_scores.t(), q_rows, 1.0, s.scale);                        // dK += dS^T Q * scale
      }
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The fused kernel's forward over every head: out [N, Lq, D] and the rows' log-sum-exp [N, Lq].
std::pair<at::Tensor, at::Tensor> fused_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                double scale) {
  const int64_t lq = q.size(1), lk = k.size(1), d = q.size(2);
  const at::Tensor kt = k.transpose(1, 2).contiguous();  // [N, D, Lk]: the score kernel's layout
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), lq}, q.options());
  for_each_head(q.size(0), [&](int64_t n) {
    at::Tensor scratch = at::empty({fused_attention::scratch_floats(lk)}, q.options());
    fused_attention::forward(q[n].data_ptr<float>(), kt[n].data_ptr<float>(), v[n].data_ptr<float>(), lq, lk, d,
                             static_cast<float>(scale), out[n].data_ptr<float>(), lse[n].data_ptr<float>(),
                             scratch.data_ptr<float>());
  });
  return {out, lse};
}

// Attention by the fused kernel (fused_attention.h): fp32, no mask, on an AVX-512 CPU. Keeps q, k,
// v, the output and the rows' log-sum-exp for backward, which recomputes each block's
// probabilities from them.
struct FusedAttention : public torch::autograd::Function<FusedAttention> {
  // known_out, known_lse: a checkpoint's recomputation hands back what its forward computed.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale, const at::Tensor* known_out,
                            const at::Tensor* known_lse) {
    at::Tensor out, lse;
    if (known_out != nullptr) {
      out = *known_out;
      lse = *known_lse;
    } else {
      std::tie(out, lse) = fused_forward(q, k, v, scale);
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const float scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const int64_t lq = q.size(1), lk = k.size(1), d = q.size(2);
    const at::Tensor grad_out = grads[0].to(at::kFloat).contiguous();
    const at::Tensor delta = (grad_out * out).sum(-1);  // [N, Lq]: rowsum(dO * O), the softmax gradient's shift
    const at::Tensor kt = k.transpose(1, 2).contiguous();
    const at::Tensor vt = v.transpose(1, 2).contiguous();
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    for_each_head(q.size(0), [&](int64_t n) {
      at::Tensor scratch = at::empty({fused_attention::scratch_floats(lk)}, q.options());
      fused_attention::backward(q[n].data_ptr<float>(), k[n].data_ptr<float>(), kt[n].data_ptr<float>(),
                                vt[n].data_ptr<float>(), grad_out[n].data_ptr<float>(), delta[n].data_ptr<float>(),
                                lse[n].data_ptr<float>(), lq, lk, d, scale, dq[n].data_ptr<float>(),
                                dk[n].data_ptr<float>(), dv[n].data_ptr<float>(), scratch.data_ptr<float>());
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

bool fused_kernel_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool masked, bool causal) {
  return !masked && !causal && q.is_cpu() && q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
         v.scalar_type() == at::kFloat && v.size(-1) == q.size(-1) && q.size(-1) <= fused_attention::kMaxHeadDim &&
         fused_attention::available();
}

// Query rows per block: the caller's chunk, at least 16 rows (below that the per-block overhead
// dominates: 32 rows ran slower than 64 and 128 in the measurement of attention_blocks.h).
int64_t block_rows(int64_t limit) { return std::max<int64_t>(16, limit); }

}  // namespace

void set_default_query_chunk(int64_t rows) { g_default_chunk = rows; }
int64_t default_query_chunk() { return g_default_chunk; }

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options, const std::optional<at::Tensor>& mask) {
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const int64_t lq = q.size(-2);
  // q, k, v: [B, H, L, D] -> [B * H, L, D]; scores in fp32 when upcast.
  const int64_t b = q.size(0), heads = q.size(1), lk = k.size(-2), d = q.size(-1), dv = v.size(-1);
  const at::ScalarType score_dtype = options.upcast ? at::kFloat : q.scalar_type();
  const int64_t chunk = query_block_rows(lq, lk, options.query_chunk, q.device().is_cpu() && options.cpu_speed_rule,
                                         static_cast<int64_t>(c10::elementSize(score_dtype)));
  if (chunk <= 0 || chunk >= lq) return attend(q, k, v, scale, mask, options.upcast, 0, options.causal);
  const at::Tensor q3 = q.to(score_dtype).reshape({b * heads, lq, d}).contiguous();
  const at::Tensor k3 = k.to(score_dtype).reshape({b * heads, lk, d}).contiguous();
  const at::Tensor v3 = v.reshape({b * heads, lk, dv}).contiguous();
  // No mask = an empty tensor: autograd functions take defined tensors only.
  at::Tensor m = mask ? *mask : at::empty({0}, q3.options());
  if (mask) {
    while (m.dim() < 4) m = m.unsqueeze(0);
    m = m.to(score_dtype);
  }
  const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (options.cpu_speed_rule && options.fused_kernel &&
      fused_kernel_takes(q3, k3, v3, mask.has_value(), options.causal)) {
    // In a checkpointed block the forward's output and log-sum-exp are kept for the recomputation.
    const at::Tensor kept_out = kept_result();
    const at::Tensor kept_lse = kept_out.defined() ? kept_result() : at::Tensor();
    at::Tensor out, lse;
    if (grad) {
      out = FusedAttention::apply(q3, k3, v3, scale, kept_out.defined() ? &kept_out : nullptr,
                                  kept_lse.defined() ? &kept_lse : nullptr);
    } else if (kept_out.defined()) {
      out = kept_out;
      lse = kept_lse;
    } else {
      std::tie(out, lse) = fused_forward(q3, k3, v3, scale);
    }
    keep_for_recompute(out);
    if (lse.defined()) keep_for_recompute(lse);
    return out.view({b, heads, lq, dv});
  }
  const int64_t rows = block_rows(chunk);
  // In a checkpointed block the forward's output is kept (L x D per head, against L^2 work) and
  // the recomputation takes it back instead of attending again: backward needs only q, k, v.
  const at::Tensor kept = kept_result();
  at::Tensor out;
  if (grad) {
    out = BlockedAttention::apply(q3, k3, v3, m, scale, rows, heads, options.causal, kept.defined() ? &kept : nullptr);
  } else {
    out = kept.defined() ? kept : blocked_forward(q3, k3, v3, m, heads, {scale, rows, options.causal});
  }
  keep_for_recompute(out);
  return out.view({b, heads, lq, dv});
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor xf = x.to(at::kFloat);
  const auto pairs = xf.unflatten(-1, {-1, 2}).unbind(-1);
  const at::Tensor rotated = at::stack({-pairs[1], pairs[0]}, -1).flatten(3);
  const at::Tensor c = cos.unsqueeze(0).unsqueeze(2), s = sin.unsqueeze(0).unsqueeze(2);
  return (xf * c + rotated * s).to(x.scalar_type());
}

}  // namespace lt::models
