#include "loratrain/models/packed_conv.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/autograd.h>

#include "loratrain/util/cpu_features.h"


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

at::Tensor PackedConvWeights::forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                      int64_t padding, const at::Tensor& known) {
  const int64_t kernel = weight.size(2);
  if (source_ != weight.data_ptr() || source_version_ != weight._version() || padding_ != padding ||
      (forward_.defined() && forward_.scalar_type() != weight.scalar_type())) {
    reset();
    forward_ = pack(weight, padding);
    source_ = weight.data_ptr();
    source_version_ = weight._version();
    padding_ = padding;
  }
  const bool input_grad = at::GradMode::is_enabled() && x.requires_grad();
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
}

}  // namespace lt::models
