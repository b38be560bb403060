// Frozen convolution weights kept in oneDNN's blocked layout on the CPU. LibTorch's oneDNN
// convolution reorders a plain weight into that layout on every call, forward and backward-data
// alike; for a weight that never changes the reorder can be done once. The input gradient of a
// stride-1 convolution is itself a convolution (of the output gradient with the weight flipped in
// both spatial axes and its in/out channels swapped, padding k-1-p), so it runs on a second packed
// copy. Memory: two more copies of each packed weight (the plain one stays the parameter).
// Where oneDNN's headers were found at build time, fp32 3x3 convolutions (padding 1) on inputs of
// at least 32x32 (16x16 on AMD processors) on an AVX-512 CPU run oneDNN's Winograd F(4x4, 3x3)
// kernels instead, forward and input gradient on one packed copy (LibTorch's own convolution
// never chooses that algorithm).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace lt::models {

// Whether this LibTorch can run them: built with MKLDNN and not disabled at runtime.
bool packed_convolutions_available();
// Whether fp32 3x3 convolutions may run oneDNN's Winograd kernels: built with oneDNN's headers,
// on an AVX-512 CPU.
bool winograd_convolutions_available();

// A frozen 1x1 convolution (stride 1, no padding; the transformers' proj_in/proj_out and the
// resnets' shortcuts) as a matrix product over the channels: per sample W [out, in] @ x [in, H*W]
// in NCHW. OpenBLAS reads the plain weight as it is (transposed for the input gradient), so it
// needs neither oneDNN's activation reorders nor packed copies.
bool pointwise_conv_applies(const at::Tensor& weight, const at::Tensor& bias, int64_t stride, int64_t padding);
// conv2d(x, weight, bias) for such a convolution; the input gradient only (the weight is frozen).
at::Tensor pointwise_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// One Conv2d's packed copies, made on first use and again whenever the weight changes (new
// storage, dtype, or an in-place write).
class PackedConvWeights {
 public:
  // Whether the packed path serves a convolution with these tensors, stride and padding: the weight
  // and bias are frozen CPU tensors in fp32 or bf16, the stride is 1 (the input gradient of a
  // strided convolution is not a plain convolution; those few keep the stock path) and the padding
  // at most k-1 (the input gradient's padding k-1-p cannot be negative).
  static bool applies(const at::Tensor& weight, const at::Tensor& bias, int64_t stride, int64_t padding);

  // conv2d(x, weight, bias, stride 1, `padding`) on the packed weight, with the input gradient on
  // the packed transposed weight (packed when the input needs a gradient). x: [N, C_in, H, W].
  // known: the output when it is already known (a checkpoint's recomputation hands back the one its
  // forward computed from the same x); the convolution then does not run again, since the input
  // gradient needs only the weight.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t padding,
                     const at::Tensor& known = at::Tensor());

  bool packed() const { return forward_.defined(); }
  bool winograd() const { return winograd_problem_ != nullptr; }  // packed for the Winograd kernels
  int64_t bytes() const;  // of the packed copies held now
  void reset();

 private:
  at::Tensor forward_;   // oneDNN blocked [out, in, k, k]
  at::Tensor backward_;  // oneDNN blocked [in, out, k, k], spatially flipped
  const void* source_ = nullptr;
  int64_t source_version_ = -1;
  int64_t padding_ = -1;
  // Non-null: forward_ holds the weight for oneDNN's Winograd kernels (forward and input gradient
  // alike; backward_ stays empty), packed for this problem's primitives (packed_conv.cpp).
  const void* winograd_problem_ = nullptr;
};

}  // namespace lt::models
