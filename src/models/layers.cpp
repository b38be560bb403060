#include "loratrain/models/layers.h"

#include <torch/nn/functional.h>
#include <torch/nn/init.h>

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

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::nn::functional::linear(x.to(weight.scalar_type()), weight, bias);
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

}  // namespace lt::models
