#include "loratrain/models/wan/vae.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "loratrain/models/attention.h"
#include "loratrain/models/json_fields.h"
#include "loratrain/util/error.h"

namespace lt::models::wan {

namespace {

constexpr int64_t kCacheFrames = 2;  // a temporal kernel of 3 needs the 2 frames before a chunk

// [B, C, T, H, W] -> per-frame [B*T, C, H, W], and back.
at::Tensor frames_as_batch(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3, 4}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
at::Tensor batch_as_frames(const at::Tensor& x, int64_t b, int64_t t) {
  return x.view({b, t, x.size(1), x.size(2), x.size(3)}).permute({0, 2, 1, 3, 4});
}

at::Tensor last_frames(const at::Tensor& x, int64_t n) {
  const int64_t t = x.size(2);
  return x.narrow(2, std::max<int64_t>(0, t - n), std::min(n, t)).clone();
}

// An identity placeholder keeping diffusers' Sequential indices (resample.0 has no weights).
struct PlaceholderImpl : torch::nn::Module {};
TORCH_MODULE(Placeholder);

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config

int64_t WanVaeConfig::temporal_factor() const {
  int64_t f = 1;
  for (bool t : temperal_downsample) f *= t ? 2 : 1;
  return f;
}

WanVaeConfig WanVaeConfig::from_json(const nlohmann::json& j, const std::string& source) {
  WanVaeConfig c;
  const std::string what = "AutoencoderKLWan (" + source + ")";
  const char* w = what.c_str();
  c.base_dim = json_get_or<int64_t>(j, "base_dim", c.base_dim, w);
  c.decoder_base_dim = json_get_or<int64_t>(j, "decoder_base_dim", 0, w);
  c.z_dim = json_get_or<int64_t>(j, "z_dim", c.z_dim, w);
  c.dim_mult = json_get_or<std::vector<int64_t>>(j, "dim_mult", c.dim_mult, w);
  c.num_res_blocks = json_get_or<int64_t>(j, "num_res_blocks", c.num_res_blocks, w);
  c.temperal_downsample = json_get_or<std::vector<bool>>(j, "temperal_downsample", c.temperal_downsample, w);
  c.in_channels = json_get_or<int64_t>(j, "in_channels", c.in_channels, w);
  c.out_channels = json_get_or<int64_t>(j, "out_channels", c.out_channels, w);
  c.latents_mean = json_get_or<std::vector<double>>(j, "latents_mean", c.latents_mean, w);
  c.latents_std = json_get_or<std::vector<double>>(j, "latents_std", c.latents_std, w);
  if (json_get_or<bool>(j, "is_residual", false, w) || json_get_or<int64_t>(j, "patch_size", 1, w) > 1) {
    throw InputError(source + ": this AutoencoderKLWan is Wan 2.2's (is_residual / patch_size): only Wan 2.1's VAE is supported");
  }
  if (!json_get_or<std::vector<double>>(j, "attn_scales", {}, w).empty()) {
    throw InputError(source + ": AutoencoderKLWan attn_scales must be empty (Wan 2.1 has attention only in the middle blocks)");
  }
  c.validate(source);
  return c;
}

nlohmann::json WanVaeConfig::to_json() const {
  return {{"_class_name", "AutoencoderKLWan"},
          {"base_dim", base_dim},
          {"decoder_base_dim", decoder_base_dim > 0 ? nlohmann::json(decoder_base_dim) : nlohmann::json(nullptr)},
          {"z_dim", z_dim},
          {"dim_mult", dim_mult},
          {"num_res_blocks", num_res_blocks},
          {"attn_scales", nlohmann::json::array()},
          {"temperal_downsample", temperal_downsample},
          {"dropout", 0.0},
          {"latents_mean", latents_mean},
          {"latents_std", latents_std},
          {"is_residual", false},
          {"in_channels", in_channels},
          {"out_channels", out_channels},
          {"patch_size", nullptr},
          {"scale_factor_temporal", temporal_factor()},
          {"scale_factor_spatial", spatial_factor()}};
}

void WanVaeConfig::validate(const std::string& source) const {
  if (base_dim <= 0 || z_dim <= 0 || num_res_blocks <= 0 || in_channels <= 0 || out_channels <= 0 || dim_mult.size() < 2) {
    throw InputError(source + ": AutoencoderKLWan sizes must be positive (at least two dim_mult levels)");
  }
  if (temperal_downsample.size() != dim_mult.size() - 1) {
    throw InputError(source + ": AutoencoderKLWan temperal_downsample needs one entry per downsampling level (" +
                     std::to_string(dim_mult.size() - 1) + ")");
  }
  if (static_cast<int64_t>(latents_mean.size()) != z_dim || static_cast<int64_t>(latents_std.size()) != z_dim) {
    throw InputError(source + ": AutoencoderKLWan latents_mean and latents_std need z_dim (" + std::to_string(z_dim) + ") entries");
  }
}

// ---------------------------------------------------------------------------------------------
// Layers

CausalCache::Slot& CausalCache::take() {
  if (next == slots.size()) slots.emplace_back();
  return slots[next++];
}

CausalConv3dImpl::CausalConv3dImpl(int64_t in, int64_t out, std::vector<int64_t> kernel, std::vector<int64_t> stride_,
                                   std::vector<int64_t> padding_)
    : stride(std::move(stride_)), padding(std::move(padding_)) {
  weight = register_parameter("weight", torch::empty({out, in, kernel[0], kernel[1], kernel[2]}));
  bias = register_parameter("bias", torch::zeros({out}));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in * kernel[0] * kernel[1] * kernel[2]));
  torch::NoGradGuard no_grad;
  weight.uniform_(-bound, bound);
  bias.uniform_(-bound, bound);
}

at::Tensor CausalConv3dImpl::forward(const at::Tensor& x_in, const at::Tensor& cached) {
  at::Tensor x = x_in.to(weight.scalar_type());
  int64_t front = 2 * padding[0];
  if (cached.defined() && front > 0) {
    x = torch::cat({cached.to(x.scalar_type()), x}, 2);
    front -= cached.size(2);
  }
  x = at::constant_pad_nd(x, {padding[2], padding[2], padding[1], padding[1], front, 0}, 0);
  return at::conv3d(x, weight, bias, stride);
}

at::Tensor CausalConv3dImpl::forward_cached(const at::Tensor& x, CausalCache& cache) {
  CausalCache::Slot& slot = cache.take();
  at::Tensor keep = last_frames(x, kCacheFrames);
  // A one-frame chunk keeps the last frame of the previous chunk in front of it.
  if (keep.size(2) < kCacheFrames && slot.frames.defined()) {
    keep = torch::cat({slot.frames.narrow(2, slot.frames.size(2) - 1, 1), keep}, 2);
  }
  at::Tensor out = forward(x, slot.frames);
  slot.frames = keep;
  return out;
}

VaeRMSNormImpl::VaeRMSNormImpl(int64_t dim, bool images) : scale(std::sqrt(static_cast<double>(dim))) {
  gamma = register_parameter("gamma", images ? torch::ones({dim, 1, 1}) : torch::ones({dim, 1, 1, 1}));
}

at::Tensor VaeRMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor norm = x.norm(2, {1}, /*keepdim=*/true).clamp_min(1e-12);
  return x / norm * scale * gamma;
}

WanResidualBlockImpl::WanResidualBlockImpl(int64_t in, int64_t out) {
  norm1 = register_module("norm1", VaeRMSNorm(in, false));
  conv1 = register_module("conv1", CausalConv3d(in, out, std::vector<int64_t>{3, 3, 3}, std::vector<int64_t>{1, 1, 1},
                                                std::vector<int64_t>{1, 1, 1}));
  norm2 = register_module("norm2", VaeRMSNorm(out, false));
  conv2 = register_module("conv2", CausalConv3d(out, out, std::vector<int64_t>{3, 3, 3}, std::vector<int64_t>{1, 1, 1},
                                                std::vector<int64_t>{1, 1, 1}));
  if (in != out) conv_shortcut = register_module("conv_shortcut", CausalConv3d(in, out, std::vector<int64_t>{1, 1, 1}));
}

at::Tensor WanResidualBlockImpl::forward(const at::Tensor& x, CausalCache& cache) {
  const at::Tensor shortcut = conv_shortcut ? conv_shortcut(x) : x;
  at::Tensor h = conv1->forward_cached(torch::silu(norm1(x)), cache);
  h = conv2->forward_cached(torch::silu(norm2(h)), cache);
  return h + shortcut;
}

WanVaeAttentionImpl::WanVaeAttentionImpl(int64_t dim) {
  norm = register_module("norm", VaeRMSNorm(dim, true));
  to_qkv = register_module("to_qkv", Conv2d(dim, 3 * dim, 1));
  proj = register_module("proj", Conv2d(dim, dim, 1));
}

at::Tensor WanVaeAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor frames = norm(frames_as_batch(x));
  const at::Tensor qkv = to_qkv(frames).reshape({b * t, 1, 3 * c, h * w}).permute({0, 1, 3, 2});  // [BT, 1, HW, 3C]
  const auto parts = qkv.chunk(3, -1);
  AttentionOptions options;
  options.cpu_speed_rule = cpu_speed_rule;
  at::Tensor out = attention(parts[0], parts[1], parts[2], options);  // [BT, 1, HW, C]
  out = out.squeeze(1).permute({0, 2, 1}).reshape({b * t, c, h, w});
  return batch_as_frames(proj(out), b, t) + x;
}

WanResampleImpl::WanResampleImpl(int64_t dim, const std::string& mode_, int64_t upsample_out_dim) : mode(mode_) {
  const bool up = mode == "upsample2d" || mode == "upsample3d";
  // Upsamplers: nearest 2x then a padded 3x3; downsamplers: pad right/bottom by one, 3x3 stride 2.
  conv = up ? Conv2d(dim, upsample_out_dim, 3, 1, 1) : Conv2d(dim, dim, 3, 2, 0);
  resample = register_module("resample", torch::nn::ModuleList(Placeholder(), conv));
  if (mode == "upsample3d") {
    time_conv = register_module("time_conv", CausalConv3d(dim, 2 * dim, std::vector<int64_t>{3, 1, 1},
                                                          std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 0, 0}));
  } else if (mode == "downsample3d") {
    time_conv = register_module("time_conv", CausalConv3d(dim, dim, std::vector<int64_t>{3, 1, 1}, std::vector<int64_t>{2, 1, 1}));
  }
}

at::Tensor WanResampleImpl::forward(const at::Tensor& x_in, CausalCache& cache) {
  at::Tensor x = x_in;
  const int64_t b = x.size(0), c = x.size(1);
  if (mode == "upsample3d") {
    CausalCache::Slot& slot = cache.take();
    if (!slot.frames.defined() && !slot.repeat) {
      slot.repeat = true;  // the first chunk (the first frame) is not doubled in time
    } else {
      at::Tensor keep = last_frames(x, kCacheFrames);
      if (keep.size(2) < kCacheFrames) {
        keep = torch::cat({slot.repeat ? torch::zeros_like(keep) : slot.frames.narrow(2, slot.frames.size(2) - 1, 1), keep}, 2);
      }
      x = slot.repeat ? time_conv(x) : time_conv(x, slot.frames);
      slot.frames = keep;
      slot.repeat = false;
      // Channels [2, C] become two consecutive frames.
      const int64_t t = x.size(2), h = x.size(3), w = x.size(4);
      x = x.reshape({b, 2, c, t, h, w}).permute({0, 2, 3, 1, 4, 5}).reshape({b, c, 2 * t, h, w});
    }
  }
  const int64_t t = x.size(2);
  at::Tensor frames = frames_as_batch(x);
  if (mode == "upsample2d" || mode == "upsample3d") {
    frames = at::upsample_nearest2d(frames.to(at::kFloat), {2 * frames.size(2), 2 * frames.size(3)}).to(x.scalar_type());
  } else {
    frames = at::constant_pad_nd(frames, {0, 1, 0, 1}, 0);
  }
  x = batch_as_frames(conv(frames), b, t);
  if (mode == "downsample3d") {
    CausalCache::Slot& slot = cache.take();
    if (!slot.frames.defined()) {
      slot.frames = x.clone();  // the first chunk passes through; its frames feed the next one
    } else {
      const at::Tensor keep = last_frames(x, 1);
      x = time_conv(torch::cat({slot.frames.narrow(2, slot.frames.size(2) - 1, 1), x}, 2));
      slot.frames = keep;
    }
  }
  return x;
}

WanVaeMidBlockImpl::WanVaeMidBlockImpl(int64_t dim) {
  resnets = register_module("resnets", torch::nn::ModuleList(WanResidualBlock(dim, dim), WanResidualBlock(dim, dim)));
  attentions = register_module("attentions", torch::nn::ModuleList(WanVaeAttention(dim)));
}

at::Tensor WanVaeMidBlockImpl::forward(const at::Tensor& x, CausalCache& cache) {
  at::Tensor h = resnets[0]->as<WanResidualBlockImpl>()->forward(x, cache);
  h = attentions[0]->as<WanVaeAttentionImpl>()->forward(h);
  return resnets[1]->as<WanResidualBlockImpl>()->forward(h, cache);
}

// ---------------------------------------------------------------------------------------------
// Encoder, decoder

WanEncoder3dImpl::WanEncoder3dImpl(const WanVaeConfig& config) {
  std::vector<int64_t> dims = {config.base_dim};
  for (int64_t m : config.dim_mult) dims.push_back(config.base_dim * m);
  conv_in = register_module("conv_in", CausalConv3d(config.in_channels, dims[0], std::vector<int64_t>{3, 3, 3},
                                                    std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  const size_t levels = config.dim_mult.size();
  for (size_t i = 0; i < levels; ++i) {
    int64_t in = dims[i];
    const int64_t out = dims[i + 1];
    for (int64_t r = 0; r < config.num_res_blocks; ++r) {
      down_blocks->push_back(WanResidualBlock(in, out));
      in = out;
    }
    if (i + 1 != levels) down_blocks->push_back(WanResample(out, config.temperal_downsample[i] ? "downsample3d" : "downsample2d", out / 2));
  }
  const int64_t out = dims.back();
  mid_block = register_module("mid_block", WanVaeMidBlock(out));
  norm_out = register_module("norm_out", VaeRMSNorm(out, false));
  conv_out = register_module("conv_out", CausalConv3d(out, 2 * config.z_dim, std::vector<int64_t>{3, 3, 3},
                                                      std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
}

at::Tensor WanEncoder3dImpl::forward(const at::Tensor& x_in, CausalCache& cache) {
  at::Tensor x = conv_in->forward_cached(x_in, cache);
  for (const auto& layer : *down_blocks) {
    if (auto* res = layer->as<WanResidualBlockImpl>()) x = res->forward(x, cache);
    else x = layer->as<WanResampleImpl>()->forward(x, cache);
  }
  x = mid_block(x, cache);
  return conv_out->forward_cached(torch::silu(norm_out(x)), cache);
}

WanUpBlockImpl::WanUpBlockImpl(int64_t in, int64_t out, int64_t num_res_blocks, const std::string& upsample_mode) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t r = 0; r <= num_res_blocks; ++r) {
    resnets->push_back(WanResidualBlock(in, out));
    in = out;
  }
  if (!upsample_mode.empty()) {
    upsamplers = register_module("upsamplers", torch::nn::ModuleList(WanResample(out, upsample_mode, out / 2)));
  }
}

at::Tensor WanUpBlockImpl::forward(const at::Tensor& x_in, CausalCache& cache) {
  at::Tensor x = x_in;
  for (const auto& r : *resnets) x = r->as<WanResidualBlockImpl>()->forward(x, cache);
  if (upsamplers) x = upsamplers[0]->as<WanResampleImpl>()->forward(x, cache);
  return x;
}

WanDecoder3dImpl::WanDecoder3dImpl(const WanVaeConfig& config) {
  const int64_t base = config.decoder_dim();
  std::vector<int64_t> dims = {base * config.dim_mult.back()};
  for (auto it = config.dim_mult.rbegin(); it != config.dim_mult.rend(); ++it) dims.push_back(base * *it);
  conv_in = register_module("conv_in", CausalConv3d(config.z_dim, dims[0], std::vector<int64_t>{3, 3, 3},
                                                    std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
  mid_block = register_module("mid_block", WanVaeMidBlock(dims[0]));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  const size_t levels = config.dim_mult.size();
  // The temporal upsamples mirror the encoder's downsamples, last level first.
  std::vector<bool> temporal(config.temperal_downsample.rbegin(), config.temperal_downsample.rend());
  for (size_t i = 0; i < levels; ++i) {
    // Every upsampler halves its channels, so the levels after the first start at half width.
    const int64_t in = i > 0 ? dims[i] / 2 : dims[i];
    std::string mode;
    if (i + 1 != levels) mode = temporal[i] ? "upsample3d" : "upsample2d";
    up_blocks->push_back(WanUpBlock(in, dims[i + 1], config.num_res_blocks, mode));
  }
  norm_out = register_module("norm_out", VaeRMSNorm(dims.back(), false));
  conv_out = register_module("conv_out", CausalConv3d(dims.back(), config.out_channels, std::vector<int64_t>{3, 3, 3},
                                                      std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1, 1, 1}));
}

at::Tensor WanDecoder3dImpl::forward(const at::Tensor& x_in, CausalCache& cache) {
  at::Tensor x = conv_in->forward_cached(x_in, cache);
  x = mid_block(x, cache);
  for (const auto& block : *up_blocks) x = block->as<WanUpBlockImpl>()->forward(x, cache);
  return conv_out->forward_cached(torch::silu(norm_out(x)), cache);
}

// ---------------------------------------------------------------------------------------------
// Model

AutoencoderKLWanImpl::AutoencoderKLWanImpl(const WanVaeConfig& c) : config(c) {
  config.validate("AutoencoderKLWan");
  encoder = register_module("encoder", WanEncoder3d(config));
  quant_conv = register_module("quant_conv", CausalConv3d(2 * config.z_dim, 2 * config.z_dim, std::vector<int64_t>{1, 1, 1}));
  post_quant_conv = register_module("post_quant_conv", CausalConv3d(config.z_dim, config.z_dim, std::vector<int64_t>{1, 1, 1}));
  decoder = register_module("decoder", WanDecoder3d(config));
}

std::pair<at::Tensor, at::Tensor> AutoencoderKLWanImpl::encode(const at::Tensor& video) {
  if (video.dim() != 5 || video.size(1) != config.in_channels) {
    throw InputError("AutoencoderKLWan.encode: expected a video [B, " + std::to_string(config.in_channels) + ", F, H, W]");
  }
  const int64_t frames = video.size(2);
  const int64_t tf = config.temporal_factor(), sf = config.spatial_factor();
  if ((frames - 1) % tf != 0 || video.size(3) % sf != 0 || video.size(4) % sf != 0) {
    throw InputError("AutoencoderKLWan.encode: " + std::to_string(frames) + " frames of " + std::to_string(video.size(3)) +
                     "x" + std::to_string(video.size(4)) + ": frames must be " + std::to_string(tf) + "k+1 and sides multiples of " +
                     std::to_string(sf));
  }
  const at::Tensor x = video.to(quant_conv->weight.scalar_type());
  CausalCache cache;
  std::vector<at::Tensor> chunks;
  for (int64_t start = 0; start < frames;) {
    const int64_t length = start == 0 ? 1 : tf;
    cache.begin_chunk();
    chunks.push_back(encoder(x.narrow(2, start, length), cache));
    start += length;
  }
  const at::Tensor moments = quant_conv(torch::cat(chunks, 2));
  const auto parts = moments.chunk(2, 1);
  return {parts[0], parts[1].clamp(-30.0, 20.0)};
}

at::Tensor AutoencoderKLWanImpl::decode(const at::Tensor& latents) {
  if (latents.dim() != 5 || latents.size(1) != config.z_dim) {
    throw InputError("AutoencoderKLWan.decode: expected latents [B, " + std::to_string(config.z_dim) + ", F, h, w]");
  }
  const at::Tensor x = post_quant_conv(latents.to(post_quant_conv->weight.scalar_type()));
  CausalCache cache;
  std::vector<at::Tensor> frames;
  for (int64_t i = 0; i < x.size(2); ++i) {
    cache.begin_chunk();
    frames.push_back(decoder(x.narrow(2, i, 1), cache));
  }
  return torch::cat(frames, 2).clamp(-1.0, 1.0);
}

at::Tensor AutoencoderKLWanImpl::normalize(const at::Tensor& mean) const {
  const auto opts = mean.options();
  const at::Tensor m = torch::tensor(config.latents_mean, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  const at::Tensor s = torch::tensor(config.latents_std, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  return (mean - m) / s;
}

at::Tensor AutoencoderKLWanImpl::denormalize(const at::Tensor& latents) const {
  const auto opts = latents.options();
  const at::Tensor m = torch::tensor(config.latents_mean, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  const at::Tensor s = torch::tensor(config.latents_std, opts.dtype(at::kDouble)).to(opts).view({1, -1, 1, 1, 1});
  return latents * s + m;
}

}  // namespace lt::models::wan
