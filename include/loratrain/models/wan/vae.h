// Wan 2.1's video VAE: mirrors diffusers `AutoencoderKLWan` (module names = diffusers keys).
//
// Every 3-D convolution is causal: its temporal padding is all in front, so a frame only sees the
// frames before it. Encoding runs the first frame alone and then chunks of 4 frames; decoding runs
// one latent frame at a time. Between chunks each causal convolution keeps the last (up to 2)
// frames of its input in a CausalCache, so a chunk computes exactly what the whole video would,
// and memory stays that of one chunk whatever the frame count. Video frames must be 4k+1:
// F frames -> 1 + (F-1)/4 latent frames, 8x smaller sides, z_dim (16) channels.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/models/layers.h"

namespace lt::models::wan {

// The diffusers AutoencoderKLWan config.json keys, verbatim. Defaults: Wan 2.1's VAE.
struct WanVaeConfig {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 0;  // 0 (null): base_dim
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temperal_downsample = {false, true, true};
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<double> latents_mean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                                      0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
  std::vector<double> latents_std = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};

  int64_t decoder_dim() const { return decoder_base_dim > 0 ? decoder_base_dim : base_dim; }
  int64_t temporal_factor() const;  // 2^(number of temporal downsamples): 4
  int64_t spatial_factor() const { return int64_t{1} << (dim_mult.size() - 1); }  // 8

  // Throws lt::InputError for wrong types or what is not built: the Wan 2.2 VAE (is_residual,
  // patch_size), attention outside the middle blocks (attn_scales).
  static WanVaeConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  nlohmann::json to_json() const;
  void validate(const std::string& source) const;
};

// Per-convolution frames carried from one time chunk to the next. Slots are taken in call order;
// begin_chunk() rewinds to the first slot, reset() forgets everything (a new video).
struct CausalCache {
  struct Slot {
    at::Tensor frames;    // the last frames of this convolution's previous input (undefined: none yet)
    bool repeat = false;  // temporal upsampler: the first chunk passed through without its time conv
  };
  std::vector<Slot> slots;
  size_t next = 0;
  Slot& take();
  void begin_chunk() { next = 0; }
  void reset() { slots.clear(); next = 0; }
};

// Mirrors diffusers WanCausalConv3d: a Conv3d whose temporal padding 2*p_t goes in front, filled
// by the cached frames where there are some.
class CausalConv3dImpl : public torch::nn::Module {
 public:
  CausalConv3dImpl(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride = {1, 1, 1},
                   std::vector<int64_t> padding = {0, 0, 0});
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cached = at::Tensor());
  // Runs the convolution with `cache`'s next slot and stores the last frames of x there (the
  // diffusers feat_cache protocol for convolutions with a temporal kernel of 3).
  at::Tensor forward_cached(const at::Tensor& x, CausalCache& cache);
  std::vector<int64_t> stride, padding;
  at::Tensor weight, bias;
};
TORCH_MODULE(CausalConv3d);

// Mirrors diffusers WanRMS_norm: F.normalize over channels * sqrt(C) * gamma.
class VaeRMSNormImpl : public torch::nn::Module {
 public:
  VaeRMSNormImpl(int64_t dim, bool images);
  at::Tensor forward(const at::Tensor& x);
  double scale;
  at::Tensor gamma;  // [C, 1, 1, 1] (video) or [C, 1, 1] (images)
};
TORCH_MODULE(VaeRMSNorm);

class WanResidualBlockImpl : public torch::nn::Module {
 public:
  WanResidualBlockImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x, CausalCache& cache);
  VaeRMSNorm norm1{nullptr}, norm2{nullptr};
  CausalConv3d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};  // shortcut only when in != out
};
TORCH_MODULE(WanResidualBlock);

// Single-head attention over each frame's pixels (middle blocks).
class WanVaeAttentionImpl : public torch::nn::Module {
 public:
  explicit WanVaeAttentionImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x);
  VaeRMSNorm norm{nullptr};
  Conv2d to_qkv{nullptr}, proj{nullptr};
  // AttentionOptions::cpu_speed_rule: off where a CPU run stands for a GPU (the trainer's ComputeMode).
  bool cpu_speed_rule = true;
};
TORCH_MODULE(WanVaeAttention);

// Mirrors diffusers WanResample: "downsample2d", "downsample3d", "upsample2d", "upsample3d".
// resample.1 is the per-frame Conv2d; time_conv the temporal (3,1,1) convolution of the 3d modes.
class WanResampleImpl : public torch::nn::Module {
 public:
  WanResampleImpl(int64_t dim, const std::string& mode, int64_t upsample_out_dim);
  at::Tensor forward(const at::Tensor& x, CausalCache& cache);
  std::string mode;
  torch::nn::ModuleList resample{nullptr};
  Conv2d conv{nullptr};
  CausalConv3d time_conv{nullptr};
};
TORCH_MODULE(WanResample);

class WanVaeMidBlockImpl : public torch::nn::Module {
 public:
  explicit WanVaeMidBlockImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x, CausalCache& cache);
  torch::nn::ModuleList resnets{nullptr}, attentions{nullptr};
};
TORCH_MODULE(WanVaeMidBlock);

class WanEncoder3dImpl : public torch::nn::Module {
 public:
  explicit WanEncoder3dImpl(const WanVaeConfig& config);
  at::Tensor forward(const at::Tensor& x, CausalCache& cache);
  CausalConv3d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList down_blocks{nullptr};  // WanResidualBlock and WanResample, in order
  WanVaeMidBlock mid_block{nullptr};
  VaeRMSNorm norm_out{nullptr};
};
TORCH_MODULE(WanEncoder3d);

class WanUpBlockImpl : public torch::nn::Module {
 public:
  WanUpBlockImpl(int64_t in, int64_t out, int64_t num_res_blocks, const std::string& upsample_mode);
  at::Tensor forward(const at::Tensor& x, CausalCache& cache);
  torch::nn::ModuleList resnets{nullptr};
  torch::nn::ModuleList upsamplers{nullptr};  // [WanResample] or null
};
TORCH_MODULE(WanUpBlock);

class WanDecoder3dImpl : public torch::nn::Module {
 public:
  explicit WanDecoder3dImpl(const WanVaeConfig& config);
  at::Tensor forward(const at::Tensor& x, CausalCache& cache);
  CausalConv3d conv_in{nullptr}, conv_out{nullptr};
  WanVaeMidBlock mid_block{nullptr};
  torch::nn::ModuleList up_blocks{nullptr};
  VaeRMSNorm norm_out{nullptr};
};
TORCH_MODULE(WanDecoder3d);

class AutoencoderKLWanImpl : public torch::nn::Module {
 public:
  explicit AutoencoderKLWanImpl(const WanVaeConfig& config);
  // video [B, 3, F, H, W] in [-1, 1], F = 4k+1, H and W multiples of 8 -> {mean, logvar}
  // [B, z_dim, 1 + (F-1)/4, H/8, W/8] (logvar clamped to [-30, 20] as DiagonalGaussianDistribution).
  std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& video);
  // latents [B, z_dim, F', h, w] -> video [B, 3, 1 + 4(F'-1), 8h, 8w] clamped to [-1, 1].
  at::Tensor decode(const at::Tensor& latents);
  // The per-channel normalisation the transformer trains on: (mean - latents_mean) / latents_std, and back.
  at::Tensor normalize(const at::Tensor& mean) const;
  at::Tensor denormalize(const at::Tensor& latents) const;

  WanVaeConfig config;
  WanEncoder3d encoder{nullptr};
  CausalConv3d quant_conv{nullptr}, post_quant_conv{nullptr};
  WanDecoder3d decoder{nullptr};
};
TORCH_MODULE(AutoencoderKLWan);

}  // namespace lt::models::wan
