#include "loratrain/models/layers.h"

#include "loratrain/models/checkpointing.h"

#include <torch/nn/functional.h>
#include <torch/nn/init.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace lt::models {

namespace {
// torch.nn.Linear/Conv2d defaults: kaiming_uniform(a=sqrt(5)) for weight, U(-1/sqrt(fan_in), ..) bias.
void default_init(torch::Tensor& weight, torch::Tensor& bias, int64_t fan_in) {
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}
}  // namespace

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias) : in_features(in), out_features(out) {
  weight = register_parameter("weight", torch::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}));
  reset_parameters();
}

void LinearImpl::reset_parameters() { default_init(weight, bias, in_features); }

const torch::Tensor& fp8_e4m3_table() {
  static const torch::Tensor table = [] {
    std::vector<float> v(256);
    for (int code = 0; code < 256; ++code) {
      const int e = (code >> 3) & 0xF, m = code & 0x7;
      float value = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
      if ((code & 0x7F) == 0x7F) value = 0.0f;  // NaN codes
      v[static_cast<size_t>(code)] = (code & 0x80) ? -value : value;
    }
    return torch::tensor(v, torch::kFloat);
  }();
  return table;
}

const torch::Tensor& fp8_e5m2_table() {
  static const torch::Tensor table = [] {
    std::vector<float> v(256);
    for (int code = 0; code < 256; ++code) {
      const int e = (code >> 2) & 0x1F, m = code & 0x3;
      float value = e == 0 ? std::ldexp(static_cast<float>(m), -16) : std::ldexp(1.0f + static_cast<float>(m) / 4.0f, e - 15);
      if (e == 0x1F) value = 0.0f;  // inf and NaN codes
      v[static_cast<size_t>(code)] = (code & 0x80) ? -value : value;
    }
    return torch::tensor(v, torch::kFloat);
  }();
  return table;
}

torch::Tensor fp8_e4m3_encode(const torch::Tensor& x) {
  // The positive codes 0..126 are ascending in value: find the two neighbours of |x| and keep the
  // nearer (ties to the even code, as round-to-nearest-even does). Each temporary is released as
  // soon as it is used, and the codes are bytes from the choice on: about 32 bytes per element at
  // the peak (the planner's fp8 workspace), not the 67 the plain expressions hold.
  const torch::Tensor positive = fp8_e4m3_table().narrow(0, 0, 127).to(x.device());
  torch::Tensor upper, lower, take_lower;
  {
    torch::Tensor a = x.to(torch::kFloat).abs().clamp_max_(448.0);
    upper = torch::bucketize(a, positive).clamp_(0, 126);
    lower = (upper - 1).clamp_min_(0);
    const torch::Tensor d_upper = positive.index_select(0, upper.flatten()).view_as(a).sub_(a).abs_();
    const torch::Tensor d_lower = positive.index_select(0, lower.flatten()).view_as(a).sub_(a).abs_();
    a.reset();
    take_lower = d_lower.lt(d_upper);
    take_lower.logical_or_(d_lower.eq(d_upper).logical_and_(lower.to(torch::kByte).bitwise_and_(1).logical_not()));
  }
  torch::Tensor code = torch::where(take_lower, lower.to(torch::kByte), upper.to(torch::kByte));
  upper.reset();
  lower.reset();
  take_lower.reset();
  return code.add_(x.lt(0).to(torch::kByte).mul_(128));
}

namespace {

// Int8 values or fp8 codes (of `format`) times their per-row scale, in the scale's dtype.
torch::Tensor dequantize(const torch::Tensor& q, const torch::Tensor& scale, Fp8Format format) {
  if (q.scalar_type() == torch::kByte) {
    const torch::Tensor& table = format == Fp8Format::e5m2 ? fp8_e5m2_table() : fp8_e4m3_table();
    return table.to(q.device()).index_select(0, q.flatten().to(torch::kLong)).view(q.sizes()).to(scale.scalar_type()) *
           scale;
  }
  return q.to(scale.scalar_type()) * scale;
}

// y = x W^T with W = dequantize(q, scale), dequantised in forward and again in backward (the bias
// is added outside: autograd functions take defined tensors only).
struct QuantizedLinearFunction : public torch::autograd::Function<QuantizedLinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& q, const torch::Tensor& scale, Fp8Format format) {
    ctx->save_for_backward({q, scale});
    ctx->saved_data["e5m2"] = format == Fp8Format::e5m2;
    return x.matmul(dequantize(q, scale, format).to(x.scalar_type()).t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& grad = grad_outputs[0];
    const Fp8Format format = ctx->saved_data["e5m2"].toBool() ? Fp8Format::e5m2 : Fp8Format::e4m3fn;
    return {grad.matmul(dequantize(saved[0], saved[1], format).to(grad.scalar_type())), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

void LinearImpl::quantize(WeightQuantization format) {
  if (format == WeightQuantization::int8) return quantize_int8();
  if (quantized()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor w = weight.detach().to(torch::kFloat);
  torch::Tensor scale = w.abs().amax(1, true).clamp_min(1e-12) / 448.0;  // [out, 1]
  weight_scale = register_buffer("weight_scale", scale.to(weight.device()));
  weight_int8 = register_buffer("weight_int8", fp8_e4m3_encode(w / scale).to(weight.device()));
  fp8_format = Fp8Format::e4m3fn;
  weight.set_data(torch::empty({0}, weight.options()));
}

void LinearImpl::quantize_int8() {
  if (quantized()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor w = weight.detach().to(torch::kFloat);
  torch::Tensor scale = w.abs().amax(1, true).clamp_min(1e-12) / 127.0;  // [out, 1]
  torch::Tensor q = (w / scale).round().clamp(-127, 127).to(torch::kChar);
  weight_scale = register_buffer("weight_scale", scale.to(weight.device()));
  weight_int8 = register_buffer("weight_int8", q.to(weight.device()));
  // Release the full-precision storage; the parameter stays registered under its name.
  weight.set_data(torch::empty({0}, weight.options()));
}

void LinearImpl::set_fp8_weight(const torch::Tensor& codes, const torch::Tensor& scale, Fp8Format format) {
  TORCH_CHECK(codes.scalar_type() == torch::kByte && codes.dim() == 2 && codes.size(0) == out_features &&
                  codes.size(1) == in_features,
              "fp8 codes must be uint8 [", out_features, ", ", in_features, "], got ", codes.sizes());
  torch::NoGradGuard no_grad;
  weight_scale = register_buffer("weight_scale", scale.to(torch::kFloat).reshape({out_features, 1}).contiguous().to(weight.device()));
  weight_int8 = register_buffer("weight_int8", codes.contiguous().to(weight.device()));
  fp8_format = format;
  weight.set_data(torch::empty({0}, weight.options()));
}

void LinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  if (!quantized()) return torch::nn::Module::to(device, dtype, non_blocking);
  // Module::to would cast the byte codes to `dtype` as well: only the bias (and the empty weight)
  // take it; the codes keep their type and the scales stay fp32.
  weight.set_data(weight.to(device, dtype, non_blocking));
  if (bias.defined()) bias.set_data(bias.to(device, dtype, non_blocking));
  weight_int8.set_data(weight_int8.to(device, weight_int8.scalar_type(), non_blocking));
  weight_scale.set_data(weight_scale.to(device, torch::kFloat, non_blocking));
}

void LinearImpl::to(torch::Dtype dtype, bool non_blocking) { to(weight.device(), dtype, non_blocking); }

torch::Tensor LinearImpl::dequantized_weight() const { return dequantize(weight_int8, weight_scale, fp8_format); }

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (quantized()) {
    const torch::Tensor input = x.to(bias.defined() ? bias.scalar_type() : weight.scalar_type());
    torch::Tensor y = QuantizedLinearFunction::apply(input, weight_int8, weight_scale, fp8_format);
    if (bias.defined()) y = y + bias.to(y.scalar_type());
    if (base_adapter) y = y + base_adapter->delta(x).to(y.scalar_type());
    if (adapter) y = y + adapter->delta(x).to(y.scalar_type());
    return y;
  }
  torch::Tensor y = torch::nn::functional::linear(x.to(weight.scalar_type()), weight, bias);
  if (base_adapter) y = y + base_adapter->delta(x).to(y.scalar_type());
  if (adapter) y = y + adapter->delta(x).to(y.scalar_type());
  return y;
}

Conv2dImpl::Conv2dImpl(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, bool with_bias)
    : in_channels(in), out_channels(out), kernel_size(k), stride(s), padding(p) {
  weight = register_parameter("weight", torch::empty({out, in, k, k}));
  if (with_bias) bias = register_parameter("bias", torch::empty({out}));
  reset_parameters();
}

void Conv2dImpl::reset_parameters() { default_init(weight, bias, in_channels * kernel_size * kernel_size); }

torch::Tensor Conv2dImpl::forward(const torch::Tensor& x) {
  torch::Tensor y;
  if (!cpu_speed_rule || !PackedConvWeights::applies(weight, bias, stride, padding)) {
    if (packed_weights.packed()) packed_weights.reset();
  } else if (is_training() && pointwise_conv_applies(weight, bias, stride, padding)) {
    if (packed_weights.packed()) packed_weights.reset();
    y = pointwise_conv(x.to(weight.scalar_type()), weight, bias);
  } else if (is_training()) {
    // In a checkpointed segment that keeps results, the recomputation takes back the forward's
    // output instead of convolving again (one [C_out, H, W] tensor against 9 C_in multiply-adds per
    // element); the input gradient needs only the weight.
    y = packed_weights.forward(x.to(weight.scalar_type()), weight, bias, padding, kept_result());
    keep_for_recompute(y);
  }
  if (!y.defined()) y = torch::conv2d(x.to(weight.scalar_type()), weight, bias, {stride, stride}, {padding, padding});
  if (adapter) y = y + adapter->delta(x).to(y.scalar_type());
  return y;
}

int64_t quantize_linear_layers(torch::nn::Module& root, WeightQuantization format) {
  int64_t released = 0;
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* linear = dynamic_cast<LinearImpl*>(module.get())) {
      if (linear->quantized()) continue;
      released += linear->weight.numel() * static_cast<int64_t>(linear->weight.element_size()) -
                  linear->weight.numel() - linear->out_features * 4;
      linear->quantize(format);
    }
  }
  return released;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return (normed * weight.to(at::kFloat)).to(x.scalar_type());
}

}  // namespace lt::models
