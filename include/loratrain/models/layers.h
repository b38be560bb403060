// Leaf modules that LoRA can attach to. They register `weight` and `bias` exactly as
// torch.nn.Linear / torch.nn.Conv2d do, so checkpoint keys map straight onto them; a trainable
// adapter (lora/) can be attached without changing the base parameters or their names.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "loratrain/models/packed_conv.h"

namespace lt::models {

// How the low-VRAM path stores a frozen Linear weight: one byte per value with one fp32 scale per
// output channel, as int8 (value = q * scale, scale = max|row| / 127) or as fp8 e4m3fn codes
// (value = e4m3(code) * scale, scale = max|row| / 448; kept as bytes and decoded through a
// 256-entry table, so it works on LibTorch builds without float8 types).
enum class WeightQuantization { int8, fp8_e4m3 };
// The 8-bit float formats an fp8 checkpoint stores (safetensors F8_E4M3 / F8_E5M2): which 256-entry
// table decodes a Linear's byte codes.
enum class Fp8Format { e4m3fn, e5m2 };

// A trainable delta added to a frozen leaf's output. The adapter is not a registered submodule of
// the base model: base checkpoints keep their exact key sets, and the LoRA network owns adapters.
class Adapter {
 public:
  virtual ~Adapter() = default;
  // x: the leaf's input; returns the delta to add to the leaf's output (same shape as it).
  virtual torch::Tensor delta(const torch::Tensor& x) = 0;
};

// Mirrors torch.nn.Linear. x: [..., in_features] -> [..., out_features].
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias = true);
  torch::Tensor forward(const torch::Tensor& x);
  void reset_parameters();  // torch.nn.Linear's default init (kaiming-uniform a=sqrt(5))

  // The low-VRAM path: stores the frozen weight as int8 with one fp32 scale per output channel
  // (a quarter of fp32's memory). Forward dequantises it for the matmul and backward dequantises
  // it again for the input gradient, so no dequantised copy stays alive between the two.
  // `weight` becomes an empty placeholder; the base weight never trains.
  void quantize_int8();
  void quantize(WeightQuantization format);  // quantize_int8() or the fp8 e4m3 codes
  // Takes an fp8 checkpoint's byte codes [out, in] (e4m3fn or e5m2) and fp32 scales [out, 1] (1 for
  // plain fp8 files, ComfyUI's scale_weight for scaled ones) as the frozen weight, as stored: for
  // e4m3fn the state quantize(fp8_e4m3) leaves, without a widened copy.
  void set_fp8_weight(const torch::Tensor& codes, const torch::Tensor& scale, Fp8Format format = Fp8Format::e4m3fn);
  bool quantized() const { return weight_int8.defined(); }
  // Module::to, but a quantized weight's scales stay fp32 whatever the dtype (a bf16 scale would
  // round every weight of its row).
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  torch::Tensor dequantized_weight() const;  // [out, in] in the scale's dtype

  int64_t in_features;
  int64_t out_features;
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out] or undefined
  torch::Tensor weight_int8;   // [out, in] int8, or uint8 fp8 codes, when quantized (a buffer, not a checkpoint key)
  torch::Tensor weight_scale;  // [out, 1] fp32 when quantized
  Fp8Format fp8_format = Fp8Format::e4m3fn;  // the format of uint8 codes in weight_int8
  std::shared_ptr<Adapter> adapter;
  // A frozen adapter that belongs to the base while training (AI Toolkit's assistant LoRA, e.g.
  // FLUX.1-schnell's training adapter): added like `adapter`, never trained or saved.
  std::shared_ptr<Adapter> base_adapter;
};
TORCH_MODULE(Linear);

// Mirrors torch.nn.Conv2d (groups = 1, dilation = 1). x: [N, C_in, H, W] -> [N, C_out, H', W'].
// On the CPU a frozen convolution of a module in training mode takes a faster path (packed_conv.h):
// a 1x1 stride-1 unpadded one runs as a matrix product over the channels; another stride-1
// one runs on oneDNN-packed copies of its weight (two more copies, made on the first training
// forward). Eval mode always takes the stock path and keeps the copies for the next training step:
// the packed kernels round differently, and a preview must match `lora-train sample`'s image, which
// never trains, bit for bit.
class Conv2dImpl : public torch::nn::Module {
 public:
  Conv2dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
             int64_t padding = 0, bool bias = true);
  torch::Tensor forward(const torch::Tensor& x);
  void reset_parameters();

  int64_t in_channels;
  int64_t out_channels;
  int64_t kernel_size;
  int64_t stride;
  int64_t padding;
  torch::Tensor weight;  // [out, in, k, k]
  torch::Tensor bias;    // [out] or undefined
  std::shared_ptr<Adapter> adapter;
  PackedConvWeights packed_weights;
  // Whether the CPU's faster paths above may run (AttentionOptions::cpu_speed_rule's counterpart):
  // off where a CPU run stands for a GPU (memory.simulate_vram), whose convolutions keep no packed
  // copies. The trainer sets it through its ComputeMode (train/diffusion_model.h).
  bool cpu_speed_rule = true;
};
TORCH_MODULE(Conv2d);

// Quantizes every Linear leaf under `root`; returns the bytes of weights released.
int64_t quantize_linear_layers(torch::nn::Module& root, WeightQuantization format = WeightQuantization::int8);

// The value of each fp8 e4m3fn byte code (sign, 4 exponent bits with bias 7, 3 mantissa bits; the
// two NaN codes read as 0), float32 [256].
const torch::Tensor& fp8_e4m3_table();
// The same for e5m2 (sign, 5 exponent bits with bias 15, 2 mantissa bits; inf and NaN codes read as 0).
const torch::Tensor& fp8_e5m2_table();
// x (float) -> the nearest e4m3fn codes (uint8), saturating at +-448.
torch::Tensor fp8_e4m3_encode(const torch::Tensor& x);

// Mirrors diffusers' RMSNorm(dim, eps, elementwise_affine=True) (torch.nn.RMSNorm): x * rsqrt(mean(x²) + eps)
// * weight, computed in fp32. Flux's and Wan's q/k norms.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  double eps;
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

}  // namespace lt::models
