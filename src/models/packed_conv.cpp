#include "loratrain/models/packed_conv.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/autograd.h>

#include "loratrain/util/cpu_features.h"

#ifdef LT_HAVE_ONEDNN
#include <dnnl.hpp>

#include <map>
#include <mutex>
#include <tuple>
#endif

namespace lt::models {

namespace {

// `w` [out, in, k, k] reordered once into the blocked layout oneDNN's convolution with this
// padding (stride 1) asks for.
at::Tensor pack(const at::Tensor& w, int64_t padding) {
  at::NoGradGuard no_grad;
  return at::mkldnn_reorder_conv2d_weight(w.contiguous().to_mkldnn(), {padding, padding}, {1, 1}, {1, 1}, 1);
}

// conv2d(x, packed, bias) with stride 1: LibTorch's oneDNN convolution takes a weight already in
// oneDNN's layout as it is.
at::Tensor convolve(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias, int64_t padding) {
  const c10::optional<at::Tensor> b = bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  return at::mkldnn_convolution(x.contiguous(), packed, b, {padding, padding}, {1, 1}, {1, 1}, 1);
}

#ifdef LT_HAVE_ONEDNN

// Winograd F(4x4, 3x3) convolutions through oneDNN, which LibTorch's convolution never picks: a
// 3x3 convolution in about a quarter of the multiplications. The weight is reordered once into the
// layout oneDNN's Winograd kernels read, for the forward and the input gradient alike (one copy,
// where the direct path keeps two); activations are reordered to and from NCHW around each call.
namespace winograd {

dnnl::engine& engine() {
  static dnnl::engine cpu(dnnl::engine::kind::cpu, 0);
  return cpu;
}

using dims = dnnl::memory::dims;
dnnl::memory::desc plain(const dims& d, dnnl::memory::format_tag tag) {
  return dnnl::memory::desc(d, dnnl::memory::data_type::f32, tag);
}
dnnl::memory::desc any(const dims& d) {
  return dnnl::memory::desc(d, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
}

// The primitives of one problem: input [n, c, h, w], weight [o, c, 3, 3], padding 1.
struct Problem {
  dnnl::convolution_forward::primitive_desc forward_desc;
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data::primitive_desc backward_desc;
  dnnl::convolution_backward_data backward;
};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;  // n, c, o, h, w, bias

// Null where oneDNN has no Winograd kernel for it (an unsupported CPU or channel count).
const Problem* problem(int64_t n, int64_t c, int64_t o, int64_t h, int64_t w, bool bias) {
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Problem>> problems;
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{n, c, o, h, w, bias};
  auto it = problems.find(key);
  if (it != problems.end()) return it->second.get();
  std::unique_ptr<Problem> made;
  try {
    const dims src{n, c, h, w}, weights{o, c, 3, 3}, dst{n, o, h, w}, strides{1, 1}, padding{1, 1};
    const auto alg = dnnl::algorithm::convolution_winograd;
    const auto forward_op =
        bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any(src), any(weights),
                                               plain({o}, dnnl::memory::format_tag::a), any(dst), strides, padding,
                                               padding)
             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any(src), any(weights),
                                               any(dst), strides, padding, padding);
    dnnl::convolution_forward::primitive_desc forward_desc(forward_op, engine());
    const dnnl::convolution_backward_data::desc backward_op(alg, any(src), any(weights), any(dst), strides, padding,
                                                            padding);
    dnnl::convolution_backward_data::primitive_desc backward_desc(backward_op, engine(), forward_desc);
    if (backward_desc.weights_desc() == forward_desc.weights_desc()) {
      made = std::make_unique<Problem>(Problem{forward_desc, dnnl::convolution_forward(forward_desc), backward_desc,
                                               dnnl::convolution_backward_data(backward_desc)});
    }
  } catch (const dnnl::error&) {
    made.reset();
  }
  return problems.emplace(key, std::move(made)).first->second.get();
}

// `tensor` (contiguous fp32, laid out as `tag` says: activations nchw, weights oihw) reordered into
// `desc`, in a buffer of LibTorch's allocator.
at::Tensor to_layout(const at::Tensor& tensor, const dnnl::memory::desc& desc, dnnl::stream& stream,
                     dnnl::memory::format_tag tag = dnnl::memory::format_tag::nchw) {
  at::Tensor out = at::empty({static_cast<int64_t>(desc.get_size())}, tensor.options().dtype(at::kByte));
  const dims d(tensor.sizes().begin(), tensor.sizes().end());
  dnnl::memory from(plain(d, tag), engine(), tensor.data_ptr());
  dnnl::memory to(desc, engine(), out.data_ptr());
  dnnl::reorder(from, to).execute(stream, from, to);
  return out;
}

// A [n, ch, h, w] fp32 NCHW tensor from `buffer` in `desc`.
at::Tensor from_layout(const at::Tensor& buffer, const dnnl::memory::desc& desc, const dims& d,
                       const at::TensorOptions& options, dnnl::stream& stream) {
  at::Tensor out = at::empty(at::IntArrayRef(d.data(), d.size()), options);
  dnnl::memory from(desc, engine(), buffer.data_ptr());
  dnnl::memory to(plain(d, dnnl::memory::format_tag::nchw), engine(), out.data_ptr());
  dnnl::reorder(from, to).execute(stream, from, to);
  return out;
}

// One direction of a Winograd convolution: `op` (the forward or the input gradient's primitive)
// from `input` in NCHW to a [n, out_channels, h, w] NCHW result.
at::Tensor run(const dnnl::primitive& op, const dnnl::memory::desc& in_desc, int in_arg,
               const dnnl::memory::desc& weights_desc, const dnnl::memory::desc& out_desc, int out_arg,
               const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
               const dnnl::memory::desc& bias_desc, int64_t out_channels) {
  dnnl::stream stream(engine());
  const at::Tensor in = to_layout(input.contiguous(), in_desc, stream);
  const at::Tensor out = at::empty({static_cast<int64_t>(out_desc.get_size())}, in.options());
  std::unordered_map<int, dnnl::memory> args{
      {in_arg, dnnl::memory(in_desc, engine(), in.data_ptr())},
      {DNNL_ARG_WEIGHTS, dnnl::memory(weights_desc, engine(), weights.data_ptr())},
      {out_arg, dnnl::memory(out_desc, engine(), out.data_ptr())}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_desc, engine(), bias.data_ptr()));
  op.execute(stream, args);
  at::Tensor result = from_layout(out, out_desc, {input.size(0), out_channels, input.size(2), input.size(3)},
                                  input.options(), stream);
  stream.wait();
  return result;
}

at::Tensor forward(const Problem& p, const at::Tensor& x, const at::Tensor& weights, const at::Tensor& bias,
                   int64_t out_channels) {
  const at::Tensor b = bias.defined() ? bias.contiguous() : at::Tensor();
  return run(p.forward, p.forward_desc.src_desc(), DNNL_ARG_SRC, p.forward_desc.weights_desc(),
             p.forward_desc.dst_desc(), DNNL_ARG_DST, x, weights, b,
             bias.defined() ? p.forward_desc.bias_desc() : dnnl::memory::desc(), out_channels);
}

at::Tensor input_gradient(const Problem& p, const at::Tensor& grad_y, const at::Tensor& weights,
                          int64_t in_channels) {
  return run(p.backward, p.backward_desc.diff_dst_desc(), DNNL_ARG_DIFF_DST, p.backward_desc.weights_desc(),
             p.backward_desc.diff_src_desc(), DNNL_ARG_DIFF_SRC, grad_y, weights, at::Tensor(), dnnl::memory::desc(),
             in_channels);
}

// The plain [o, c, 3, 3] weight in the layout of `p`'s primitives.
at::Tensor pack(const Problem& p, const at::Tensor& weight) {
  dnnl::stream stream(engine());
  at::Tensor out =
      to_layout(weight.contiguous(), p.forward_desc.weights_desc(), stream, dnnl::memory::format_tag::oihw);
  stream.wait();
  return out;
}

// y = conv2d(x, W, b, padding 1) by Winograd; dL/dx by Winograd on the same packed weight.
struct Function : public torch::autograd::Function<Function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const Problem* p,
                            const at::Tensor* weights, const at::Tensor* bias, int64_t out_channels,
                            const at::Tensor* known) {
    ctx->saved_data["problem"] = reinterpret_cast<int64_t>(p);  // cached for the process's lifetime
    ctx->saved_data["weights"] = *weights;
    ctx->saved_data["in_channels"] = x.size(1);
    if (known != nullptr) return *known;
    return winograd::forward(*p, x, *weights, *bias, out_channels);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto* p = reinterpret_cast<const Problem*>(ctx->saved_data["problem"].toInt());
    return {input_gradient(*p, grad_outputs[0], ctx->saved_data["weights"].toTensor(),
                           ctx->saved_data["in_channels"].toInt()),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace winograd
#endif

struct PackedArgs {
  at::Tensor forward;
  at::Tensor backward;
  at::Tensor bias;      // undefined without one
  int64_t padding;
  int64_t kernel;
};

// y = conv2d(x, W, b) on the packed weight; dL/dx = conv2d(dL/dy, flip(W)^T, padding k-1-p) on the
// packed transposed copy. Weight and bias are frozen: no gradient for them.
struct PackedConvFunction : public torch::autograd::Function<PackedConvFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const PackedArgs* args,
                            const at::Tensor* known) {
    ctx->saved_data["weight_t"] = args->backward;
    ctx->saved_data["padding"] = args->kernel - 1 - args->padding;
    if (known != nullptr) return *known;
    return convolve(x, args->forward, args->bias, args->padding);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor weight_t = ctx->saved_data["weight_t"].toTensor();
    const int64_t padding = ctx->saved_data["padding"].toInt();
    return {convolve(grad_outputs[0], weight_t, at::Tensor(), padding), at::Tensor(), at::Tensor()};
  }
};

// y[n] = W [out, in] @ x[n] [in, H*W] (+ b) for each sample: a 1x1 stride-1 unpadded convolution
// as one matrix product over the channels, in NCHW, with no layout reorder and no packed copy.
at::Tensor pointwise(const at::Tensor& x, const at::Tensor& weight2d, const at::Tensor& bias) {
  const int64_t n = x.size(0), out = weight2d.size(0), h = x.size(2), w = x.size(3);
  const at::Tensor x3 = x.contiguous().view({n, x.size(1), h * w});
  at::Tensor y = at::empty({n, out, h, w}, x.options());
  const at::Tensor y3 = y.view({n, out, h * w});
  const at::Tensor b = bias.defined() ? bias.view({out, 1}) : at::Tensor();
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor yi = y3.select(0, i);
    if (b.defined()) {
      at::addmm_out(yi, b, weight2d, x3.select(0, i));
    } else {
      at::mm_out(yi, weight2d, x3.select(0, i));
    }
  }
  return y;
}

// The frozen weight gets no gradient; dL/dx[n] = W^T @ dL/dy[n] (OpenBLAS reads W transposed in place).
struct PointwiseConvFunction : public torch::autograd::Function<PointwiseConvFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const PackedArgs* args) {
    ctx->saved_data["weight"] = args->forward;
    return pointwise(x, args->forward, args->bias);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor weight2d = ctx->saved_data["weight"].toTensor();
    return {pointwise(grad_outputs[0], weight2d.t(), at::Tensor()), at::Tensor()};
  }
};

}  // namespace

at::Tensor pointwise_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const at::Tensor weight2d = weight.view({weight.size(0), weight.size(1)});
  if (!(at::GradMode::is_enabled() && x.requires_grad())) return pointwise(x, weight2d, bias);
  const PackedArgs args{weight2d, at::Tensor(), bias, 0, 1};
  return PointwiseConvFunction::apply(x, &args);
}

bool pointwise_conv_applies(const at::Tensor& weight, const at::Tensor& bias, int64_t stride, int64_t padding) {
  if (stride != 1 || padding != 0 || !weight.defined() || weight.dim() != 4 || weight.size(2) != 1 ||
      weight.size(3) != 1 || weight.numel() == 0) {
    return false;
  }
  const at::ScalarType dtype = weight.scalar_type();
  if (weight.requires_grad() || !weight.device().is_cpu() || (dtype != at::kFloat && dtype != at::kBFloat16) ||
      !weight.is_contiguous()) {
    return false;
  }
  return !bias.defined() || (!bias.requires_grad() && bias.scalar_type() == dtype && bias.device().is_cpu());
}

bool packed_convolutions_available() { return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn(); }

bool winograd_convolutions_available() {
#ifdef LT_HAVE_ONEDNN
  return packed_convolutions_available() && util::cpu_has_avx512_core();
#else
  return false;
#endif
}

bool PackedConvWeights::applies(const at::Tensor& weight, const at::Tensor& bias, int64_t stride, int64_t padding) {
  if (stride != 1 || !weight.defined() || weight.dim() != 4 || weight.numel() == 0 || padding < 0 ||
      padding > weight.size(2) - 1 || weight.size(2) != weight.size(3)) {
    return false;
  }
  if (weight.requires_grad() || !weight.device().is_cpu() || weight.is_mkldnn()) return false;
  const at::ScalarType dtype = weight.scalar_type();
  // LibTorch's oneDNN bf16 convolution refuses CPUs without AVX-512 BW/VL/DQ (mkldnn_bf16_device_check).
  if (dtype != at::kFloat && !(dtype == at::kBFloat16 && util::cpu_has_avx512_core())) return false;
  if (bias.defined() && (bias.requires_grad() || bias.scalar_type() != dtype || !bias.device().is_cpu())) return false;
  return packed_convolutions_available();
}

#ifdef LT_HAVE_ONEDNN
namespace {
// The smallest input side Winograd serves. On 2 cores of an AMD EPYC (Zen 4) it was 2.3-2.8x
// faster than the direct kernels at 64x64 and 32x32, reorders included, 1.15x at 16x16 and 2x
// slower at 8x8; on a Xeon, whose direct kernels run twice as many multiply-adds per cycle,
// 1.6-2x at 64x64, even at 32x32 and slower at 16x16 (oneDNN 2.6, fp32; docs/benchmarks.md).
int64_t winograd_min_side() { return util::cpu_is_amd() ? 16 : 32; }

const winograd::Problem* winograd_problem(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                          int64_t padding) {
  if (weight.scalar_type() != at::kFloat || x.scalar_type() != at::kFloat || x.dim() != 4 || weight.size(2) != 3 ||
      padding != 1 || !util::cpu_has_avx512_core()) {
    return nullptr;
  }
  if (x.size(2) < winograd_min_side() || x.size(3) < winograd_min_side()) return nullptr;
  return winograd::problem(x.size(0), weight.size(1), weight.size(0), x.size(2), x.size(3), bias.defined());
}
}  // namespace
#endif

at::Tensor PackedConvWeights::forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                      int64_t padding, const at::Tensor& known) {
  const bool input_grad = at::GradMode::is_enabled() && x.requires_grad();
#ifdef LT_HAVE_ONEDNN
  if (const winograd::Problem* p = winograd_problem(x, weight, bias, padding)) {
    const auto* packed_for = static_cast<const winograd::Problem*>(winograd_problem_);
    if (source_ != weight.data_ptr() || source_version_ != weight._version() || packed_for == nullptr ||
        !(packed_for->forward_desc.weights_desc() == p->forward_desc.weights_desc())) {
      reset();
      forward_ = winograd::pack(*p, weight);
      source_ = weight.data_ptr();
      source_version_ = weight._version();
      padding_ = padding;
    }
    winograd_problem_ = p;
    if (!input_grad) return known.defined() ? known : winograd::forward(*p, x, forward_, bias, weight.size(0));
    return winograd::Function::apply(x, p, &forward_, &bias, weight.size(0), known.defined() ? &known : nullptr);
  }
#endif
  if (winograd_problem_ != nullptr) reset();  // packed for Winograd, now needed for the direct kernels
  const int64_t kernel = weight.size(2);
  if (source_ != weight.data_ptr() || source_version_ != weight._version() || padding_ != padding ||
      (forward_.defined() && forward_.scalar_type() != weight.scalar_type())) {
    reset();
    forward_ = pack(weight, padding);
    source_ = weight.data_ptr();
    source_version_ = weight._version();
    padding_ = padding;
  }
  if (input_grad && !backward_.defined()) backward_ = pack(weight.flip({2, 3}).transpose(0, 1), kernel - 1 - padding);
  if (!input_grad) return known.defined() ? known : convolve(x, forward_, bias, padding);
  const PackedArgs args{forward_, backward_, bias, padding, kernel};
  return PackedConvFunction::apply(x, &args, known.defined() ? &known : nullptr);
}

int64_t PackedConvWeights::bytes() const {
  int64_t n = 0;
  for (const at::Tensor* t : {&forward_, &backward_}) {
    if (t->defined()) n += t->numel() * static_cast<int64_t>(t->element_size());
  }
  return n;
}

void PackedConvWeights::reset() {
  forward_ = at::Tensor();
  backward_ = at::Tensor();
  source_ = nullptr;
  source_version_ = -1;
  padding_ = -1;
  winograd_problem_ = nullptr;
}

}  // namespace lt::models
