#include "loratrain/models/packed_conv.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/autograd.h>

#include <atomic>

namespace lt::models {

namespace {

std::atomic<bool> g_enabled{true};

// LibTorch's oneDNN bf16 convolution refuses CPUs without these (mkldnn_bf16_device_check).
bool cpu_runs_onednn_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

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
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const PackedArgs* args) {
    ctx->saved_data["weight_t"] = args->backward;
    ctx->saved_data["padding"] = args->kernel - 1 - args->padding;
    return convolve(x, args->forward, args->bias, args->padding);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor weight_t = ctx->saved_data["weight_t"].toTensor();
    const int64_t padding = ctx->saved_data["padding"].toInt();
    return {convolve(grad_outputs[0], weight_t, at::Tensor(), padding), at::Tensor()};
  }
};

}  // namespace

void set_packed_convolutions(bool enabled) { g_enabled.store(enabled); }
bool packed_convolutions_enabled() { return g_enabled.load(); }

bool packed_convolutions_available() { return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn(); }

bool PackedConvWeights::applies(const at::Tensor& weight, const at::Tensor& bias, int64_t stride) {
  if (stride != 1 || !packed_convolutions_enabled() || !weight.defined() || weight.dim() != 4 || weight.numel() == 0) {
    return false;
  }
  if (weight.requires_grad() || !weight.device().is_cpu() || weight.is_mkldnn()) return false;
  const at::ScalarType dtype = weight.scalar_type();
  if (dtype != at::kFloat && !(dtype == at::kBFloat16 && cpu_runs_onednn_bf16())) return false;
  if (bias.defined() && (bias.requires_grad() || bias.scalar_type() != dtype || !bias.device().is_cpu())) return false;
  return packed_convolutions_available();
}

at::Tensor PackedConvWeights::forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                      int64_t padding) {
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
  if (!input_grad) return convolve(x, forward_, bias, padding);
  const PackedArgs args{forward_, backward_, bias, padding, kernel};
  return PackedConvFunction::apply(x, &args);
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
