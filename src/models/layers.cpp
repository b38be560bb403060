#include "loratrain/models/layers.h"

#include <torch/nn/functional.h>
#include <torch/nn/init.h>
#include <torch/torch.h>

#include <cmath>

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

namespace {
// y = x W^T with W = int8 * scale, dequantised in forward and again in backward (the bias is added
// outside: autograd functions take defined tensors only).
struct Int8LinearFunction : public torch::autograd::Function<Int8LinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& q, const torch::Tensor& scale) {
    ctx->save_for_backward({q, scale});
    const torch::Tensor w = q.to(scale.scalar_type()) * scale;
    return x.matmul(w.to(x.scalar_type()).t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& grad = grad_outputs[0];
    const torch::Tensor w = (saved[0].to(saved[1].scalar_type()) * saved[1]).to(grad.scalar_type());
    return {grad.matmul(w), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

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

torch::Tensor LinearImpl::dequantized_weight() const { return weight_int8.to(weight_scale.scalar_type()) * weight_scale; }

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (quantized()) {
    const torch::Tensor input = x.to(bias.defined() ? bias.scalar_type() : weight.scalar_type());
    torch::Tensor y = Int8LinearFunction::apply(input, weight_int8, weight_scale);
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
  torch::Tensor y = torch::conv2d(x.to(weight.scalar_type()), weight, bias, {stride, stride}, {padding, padding});
  if (adapter) y = y + adapter->delta(x).to(y.scalar_type());
  return y;
}

int64_t quantize_linear_layers(torch::nn::Module& root) {
  int64_t released = 0;
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* linear = dynamic_cast<LinearImpl*>(module.get())) {
      if (linear->quantized()) continue;
      released += linear->weight.numel() * static_cast<int64_t>(linear->weight.element_size()) -
                  linear->weight.numel() - linear->out_features * 4;
      linear->quantize_int8();
    }
  }
  return released;
}

}  // namespace lt::models
