#include "loratrain/models/sd/vae.h"

#include <cmath>

#include <torch/torch.h>

#include <map>
#include <nlohmann/json.hpp>

#include "loratrain/models/sd/unet.h"
#include "loratrain/models/json_fields.h"
#include "loratrain/util/error.h"

namespace lt::models::sd {

// ---------------------------------------------------------------------------------------------
// VAEConfig

namespace {

[[noreturn]] void vae_config_error(const std::string& message) { throw InputError("VAE config: " + message); }

template <typename T>
T vae_get_or(const nlohmann::json& j, const char* key, T fallback) {
  return json_get_or(j, key, fallback, "VAE");
}

void validate(const VAEConfig& c) {
  const size_t n = c.block_out_channels.size();
  if (n == 0) vae_config_error("'block_out_channels' is empty");
  if (c.down_block_types.size() != n || c.up_block_types.size() != n) {
    vae_config_error("'down_block_types' and 'up_block_types' need one entry per block_out_channels entry");
  }
  for (const auto& t : c.down_block_types) {
    if (t != "DownEncoderBlock2D") vae_config_error("unsupported down block type '" + t + "' (only DownEncoderBlock2D)");
  }
  for (const auto& t : c.up_block_types) {
    if (t != "UpDecoderBlock2D") vae_config_error("unsupported up block type '" + t + "' (only UpDecoderBlock2D)");
  }
  if (!is_known_activation(c.act_fn)) vae_config_error("unsupported act_fn '" + c.act_fn + "'");
  for (int64_t ch : c.block_out_channels) {
    if (ch % c.norm_num_groups != 0) {
      vae_config_error("block_out_channels entry " + std::to_string(ch) + " is not divisible by norm_num_groups " +
                   std::to_string(c.norm_num_groups));
    }
  }
}

}  // namespace

VAEConfig VAEConfig::sd() {
  VAEConfig c;
  c.block_out_channels = {128, 256, 512, 512};
  c.down_block_types = std::vector<std::string>(4, "DownEncoderBlock2D");
  c.up_block_types = std::vector<std::string>(4, "UpDecoderBlock2D");
  return c;
}

VAEConfig VAEConfig::sdxl() {
  VAEConfig c = sd();
  c.scaling_factor = 0.13025;
  c.sample_size = 1024;
  return c;
}

VAEConfig VAEConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) vae_config_error("expected a JSON object");
  if (auto it = j.find("_class_name"); it != j.end() && it->is_string() && *it != "AutoencoderKL") {
    vae_config_error("_class_name is '" + it->get<std::string>() + "', expected AutoencoderKL");
  }
  for (const char* key : {"latents_mean", "latents_std"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      vae_config_error(std::string("'") + key + "' (per-channel latent normalisation) is not supported");
    }
  }
  VAEConfig c;
  c.in_channels = vae_get_or<int64_t>(j, "in_channels", 3);
  c.out_channels = vae_get_or<int64_t>(j, "out_channels", 3);
  c.block_out_channels = vae_get_or<std::vector<int64_t>>(j, "block_out_channels", {64});
  const size_t n = c.block_out_channels.size();
  c.down_block_types = vae_get_or<std::vector<std::string>>(j, "down_block_types", std::vector<std::string>(n, "DownEncoderBlock2D"));
  c.up_block_types = vae_get_or<std::vector<std::string>>(j, "up_block_types", std::vector<std::string>(n, "UpDecoderBlock2D"));
  c.layers_per_block = vae_get_or<int64_t>(j, "layers_per_block", 1);
  c.act_fn = vae_get_or<std::string>(j, "act_fn", "silu");
  c.latent_channels = vae_get_or<int64_t>(j, "latent_channels", 4);
  c.norm_num_groups = vae_get_or<int64_t>(j, "norm_num_groups", 32);
  c.sample_size = vae_get_or<int64_t>(j, "sample_size", 32);
  c.scaling_factor = vae_get_or<double>(j, "scaling_factor", 0.18215);
  if (auto it = j.find("shift_factor"); it != j.end() && !it->is_null()) c.shift_factor = it->get<double>();
  c.force_upcast = vae_get_or<bool>(j, "force_upcast", true);
  c.use_quant_conv = vae_get_or<bool>(j, "use_quant_conv", true);
  c.use_post_quant_conv = vae_get_or<bool>(j, "use_post_quant_conv", true);
  c.mid_block_add_attention = vae_get_or<bool>(j, "mid_block_add_attention", true);
  validate(c);
  return c;
}

nlohmann::json VAEConfig::to_json() const {
  nlohmann::json j;
  j["_class_name"] = "AutoencoderKL";
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels;
  j["down_block_types"] = down_block_types;
  j["up_block_types"] = up_block_types;
  j["block_out_channels"] = block_out_channels;
  j["layers_per_block"] = layers_per_block;
  j["act_fn"] = act_fn;
  j["latent_channels"] = latent_channels;
  j["norm_num_groups"] = norm_num_groups;
  j["sample_size"] = sample_size;
  j["scaling_factor"] = scaling_factor;
  j["shift_factor"] = shift_factor ? nlohmann::json(*shift_factor) : nlohmann::json(nullptr);
  j["force_upcast"] = force_upcast;
  j["use_quant_conv"] = use_quant_conv;
  j["use_post_quant_conv"] = use_post_quant_conv;
  j["mid_block_add_attention"] = mid_block_add_attention;
  return j;
}

VAEConfig VAEConfig::detect_from_weights(const io::SafetensorsFile& file, const std::string& prefix) {
  std::map<std::string, std::vector<int64_t>> s;
  for (const auto& t : file.tensors()) {
    if (t.name.rfind(prefix, 0) == 0) s[t.name.substr(prefix.size())] = t.shape;
  }
  auto has_prefix = [&](const std::string& p) {
    auto it = s.lower_bound(p);
    return it != s.end() && it->first.rfind(p, 0) == 0;
  };
  auto count = [&](const std::string& stem) {
    int64_t n = 0;
    while (has_prefix(stem + std::to_string(n) + ".")) ++n;
    return n;
  };
  auto shape = [&](const std::string& key) -> const std::vector<int64_t>& {
    auto it = s.find(key);
    if (it == s.end()) {
      throw InputError(file.path().string() + ": cannot detect the VAE config: tensor '" + prefix + key + "' is missing");
    }
    return it->second;
  };
  const bool ldm = has_prefix("encoder.down.0.");
  if (!ldm && !has_prefix("encoder.down_blocks.0.")) {
    throw InputError(file.path().string() + ": no VAE found under '" + prefix + "' (no encoder.down_blocks / encoder.down)");
  }
  VAEConfig c;
  const std::string down = ldm ? "encoder.down." : "encoder.down_blocks.";
  const std::string res = ldm ? ".block." : ".resnets.";
  const int64_t n = count(down);
  for (int64_t i = 0; i < n; ++i) c.block_out_channels.push_back(shape(down + std::to_string(i) + res + "0.conv1.weight")[0]);
  c.layers_per_block = count(down + "0" + res);
  c.down_block_types = std::vector<std::string>(n, "DownEncoderBlock2D");
  c.up_block_types = std::vector<std::string>(n, "UpDecoderBlock2D");
  c.in_channels = shape("encoder.conv_in.weight")[1];
  c.out_channels = shape("decoder.conv_out.weight")[0];
  c.latent_channels = shape("decoder.conv_in.weight")[1];
  c.use_quant_conv = s.count("quant_conv.weight") != 0;
  c.use_post_quant_conv = s.count("post_quant_conv.weight") != 0;
  c.mid_block_add_attention = has_prefix(ldm ? "encoder.mid.attn_1." : "encoder.mid_block.attentions.0.");
  c.norm_num_groups = conventional_groups(c.block_out_channels);
  if (c.latent_channels == 16) {
    c.scaling_factor = 0.3611;  // Flux.1
    c.shift_factor = 0.1159;
    c.sample_size = 1024;
  } else {
    c.sample_size = 512;
  }
  validate(c);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Blocks

namespace {

ResnetBlock2D make_resnet(const VAEConfig& c, int64_t in, int64_t out) {
  ResnetBlock2DOptions o;
  o.in_channels = in;
  o.out_channels = out;
  o.groups = c.norm_num_groups;
  o.eps = 1e-6;
  o.act_fn = c.act_fn;
  return ResnetBlock2D(o);
}

}  // namespace

VAEMidBlockImpl::VAEMidBlockImpl(const VAEConfig& c, int64_t ch) {
  attentions = register_module("attentions", torch::nn::ModuleList());
  resnets = register_module("resnets", torch::nn::ModuleList());
  resnets->push_back(make_resnet(c, ch, ch));
  if (c.mid_block_add_attention) {
    AttentionModuleOptions a;
    a.query_dim = ch;
    a.heads = 1;  // attention_head_dim = channels
    a.dim_head = ch;
    a.bias = true;
    a.out_bias = true;
    a.upcast_attention = true;  // diffusers upcast_softmax
    a.norm_num_groups = c.norm_num_groups;
    a.eps = 1e-6;
    a.residual_connection = true;
    attentions->push_back(Attention(a));
  }
  resnets->push_back(make_resnet(c, ch, ch));
}

at::Tensor VAEMidBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = resnets[0]->as<ResnetBlock2DImpl>()->forward(x);
  for (size_t l = 1; l < resnets->size(); ++l) {
    if (l - 1 < attentions->size()) h = attentions[l - 1]->as<AttentionImpl>()->forward(h);
    h = resnets[l]->as<ResnetBlock2DImpl>()->forward(h);
  }
  return h;
}

VAEBlockImpl::VAEBlockImpl(const VAEConfig& c, int64_t in, int64_t out, int64_t num_layers, bool down, bool resample) {
  resnets = register_module("resnets", torch::nn::ModuleList());
  for (int64_t l = 0; l < num_layers; ++l) resnets->push_back(make_resnet(c, l == 0 ? in : out, out));
  if (resample && down) downsamplers = register_module("downsamplers", torch::nn::ModuleList(Downsample2D(out, out, 0)));
  if (resample && !down) upsamplers = register_module("upsamplers", torch::nn::ModuleList(Upsample2D(out, out)));
}

at::Tensor VAEBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (auto& m : *resnets) h = m->as<ResnetBlock2DImpl>()->forward(h);
  if (downsamplers) h = downsamplers[0]->as<Downsample2DImpl>()->forward(h);
  if (upsamplers) h = upsamplers[0]->as<Upsample2DImpl>()->forward(h);
  return h;
}

EncoderImpl::EncoderImpl(const VAEConfig& c) {
  const auto& ch = c.block_out_channels;
  conv_in = register_module("conv_in", Conv2d(c.in_channels, ch[0], 3, 1, 1));
  down_blocks = register_module("down_blocks", torch::nn::ModuleList());
  for (size_t i = 0; i < ch.size(); ++i) {
    const int64_t in = i == 0 ? ch[0] : ch[i - 1];
    down_blocks->push_back(VAEBlock(c, in, ch[i], c.layers_per_block, /*down=*/true, i + 1 < ch.size()));
  }
  mid_block = register_module("mid_block", VAEMidBlock(c, ch.back()));
  conv_norm_out = register_module(
      "conv_norm_out", torch::nn::GroupNorm(torch::nn::GroupNormOptions(c.norm_num_groups, ch.back()).eps(1e-6)));
  conv_out = register_module("conv_out", Conv2d(ch.back(), 2 * c.latent_channels, 3, 1, 1));
}

at::Tensor EncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in(x);  // [B, ch0, H, W]
  for (auto& m : *down_blocks) h = m->as<VAEBlockImpl>()->forward(h);
  h = mid_block(h);  // [B, ch_last, H/f, W/f]
  h = torch::silu(conv_norm_out(h));
  return conv_out(h);  // [B, 2*latent, H/f, W/f]
}

DecoderImpl::DecoderImpl(const VAEConfig& c) {
  const auto& ch = c.block_out_channels;
  const size_t n = ch.size();
  conv_in = register_module("conv_in", Conv2d(c.latent_channels, ch.back(), 3, 1, 1));
  mid_block = register_module("mid_block", VAEMidBlock(c, ch.back()));
  up_blocks = register_module("up_blocks", torch::nn::ModuleList());
  int64_t out = ch.back();
  for (size_t i = 0; i < n; ++i) {
    const int64_t prev = out;
    out = ch[n - 1 - i];
    up_blocks->push_back(VAEBlock(c, prev, out, c.layers_per_block + 1, /*down=*/false, i + 1 < n));
  }
  conv_norm_out = register_module("conv_norm_out",
                                  torch::nn::GroupNorm(torch::nn::GroupNormOptions(c.norm_num_groups, ch[0]).eps(1e-6)));
  conv_out = register_module("conv_out", Conv2d(ch[0], c.out_channels, 3, 1, 1));
}

at::Tensor DecoderImpl::forward(const at::Tensor& z) {
  at::Tensor h = conv_in(z);  // [B, ch_last, h, w]
  h = mid_block(h);
  // diffusers runs the up blocks in their own parameter dtype (an fp32 decoder tail under fp16).
  h = h.to(up_blocks[0]->parameters()[0].scalar_type());
  for (auto& m : *up_blocks) h = m->as<VAEBlockImpl>()->forward(h);
  h = torch::silu(conv_norm_out(h));
  return conv_out(h);  // [B, out, h*f, w*f]
}

// ---------------------------------------------------------------------------------------------
// AutoencoderKL

DiagonalGaussian DiagonalGaussian::from_moments(const at::Tensor& moments) {
  DiagonalGaussian d;
  auto parts = moments.chunk(2, 1);
  d.mean = parts[0];
  d.logvar = torch::clamp(parts[1], -30.0, 20.0);
  d.stddev = torch::exp(0.5 * d.logvar);
  d.var = torch::exp(d.logvar);
  return d;
}

at::Tensor DiagonalGaussian::sample(std::optional<at::Generator> generator) const {
  if (!generator) return mean + stddev * torch::randn(mean.sizes(), mean.options());
  // Seeded noise comes from a CPU generator, so that a seed gives the same latents on every
  // device: draw it there and move it.
  const auto on = generator->device();
  at::Tensor noise = torch::randn(mean.sizes(), *generator, mean.options().device(on));
  return mean + stddev * (on == mean.device() ? noise : noise.to(mean.device()));
}

AutoencoderKLImpl::AutoencoderKLImpl(const VAEConfig& c) : config(c) {
  validate(config);
  encoder = register_module("encoder", Encoder(config));
  decoder = register_module("decoder", Decoder(config));
  const int64_t lc = config.latent_channels;
  if (config.use_quant_conv) quant_conv = register_module("quant_conv", Conv2d(2 * lc, 2 * lc, 1, 1, 0));
  if (config.use_post_quant_conv) post_quant_conv = register_module("post_quant_conv", Conv2d(lc, lc, 1, 1, 0));
  tile_latent_min_size = config.sample_size / downscale_factor();
}

DiagonalGaussian AutoencoderKLImpl::encode(const at::Tensor& image) {
  auto moments_of = [this](const at::Tensor& x) {
    const int64_t f = downscale_factor();
    if (use_tiling) {
      if (int64_t tile = tile_latent_for(x.size(-2) / f, x.size(-1) / f)) return tiled_encode(x, tile);
    }
    at::Tensor h = encoder(x);
    return quant_conv ? quant_conv(h) : h;  // [B, 2*latent, h, w]
  };
  if (use_slicing && image.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& one : image.split(1)) parts.push_back(moments_of(one));
    return DiagonalGaussian::from_moments(torch::cat(parts));
  }
  return DiagonalGaussian::from_moments(moments_of(image));
}

at::Tensor AutoencoderKLImpl::decode(const at::Tensor& latent) {
  if (use_slicing && latent.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& one : latent.split(1)) parts.push_back(decode_one(one));
    return torch::cat(parts);
  }
  return decode_one(latent);
}

at::Tensor AutoencoderKLImpl::decode_one(const at::Tensor& latent) {
  if (use_tiling) {
    if (int64_t tile = tile_latent_for(latent.size(-2), latent.size(-1))) return tiled_decode(latent, tile);
  }
  return decoder(post_quant_conv ? post_quant_conv(latent) : latent);
}

int64_t AutoencoderKLImpl::tile_latent_for(int64_t h, int64_t w) const {
  const int64_t side = std::max(h, w);
  if (side > tile_latent_min_size) return tile_latent_min_size;
  // Half the side, rounded up until the tiles step by whole latent cells (a multiple of 4 for the
  // 0.25 overlap): otherwise the joined tiles miss the image's size (a 92-cell side tiled by 46
  // joined to 93).
  int64_t half = std::max(kMinTileLatent, (side + 1) / 2);
  while (std::fmod(static_cast<double>(half) * (1 - tile_overlap_factor), 1.0) != 0.0) ++half;
  return half < side ? half : 0;
}

namespace {

// Overlapping tiles -> one tensor: each tile blended in place with its (already blended) upper and
// left neighbours over `blend_extent`, cropped to `row_limit`, joined (diffusers' tiled encode and
// decode share this).
at::Tensor join_tiles(std::vector<std::vector<at::Tensor>>& rows, int64_t blend_extent, int64_t row_limit) {
  // b's first `extent` rows (dim 2) or columns (dim 3) fade in from a's last ones.
  auto blend = [](const at::Tensor& a, at::Tensor& b, int64_t extent, int64_t dim) {
    extent = std::min({a.size(dim), b.size(dim), extent});
    if (extent <= 0) return;
    at::Tensor w = torch::arange(extent, b.options()) / static_cast<double>(extent);  // y / extent
    std::vector<int64_t> shape(4, 1);
    shape[dim] = extent;
    w = w.view(shape);
    at::Tensor mixed = a.narrow(dim, a.size(dim) - extent, extent) * (1 - w) + b.narrow(dim, 0, extent) * w;
    b = b.clone();
    b.narrow(dim, 0, extent).copy_(mixed);
  };
  std::vector<at::Tensor> result_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> result_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& tile = rows[i][j];
      if (i > 0) blend(rows[i - 1][j], tile, blend_extent, 2);
      if (j > 0) blend(rows[i][j - 1], tile, blend_extent, 3);
      result_row.push_back(tile.slice(2, 0, row_limit).slice(3, 0, row_limit));
    }
    result_rows.push_back(torch::cat(result_row, 3));
  }
  return torch::cat(result_rows, 2);
}

}  // namespace

// Mirrors diffusers AutoencoderKL._tiled_encode: overlapping pixel tiles encoded separately, their
// moments blended at the seams.
at::Tensor AutoencoderKLImpl::tiled_encode(const at::Tensor& x, int64_t tile_latent) {
  const int64_t tile_sample = tile_latent * downscale_factor();
  const int64_t overlap_size = static_cast<int64_t>(tile_sample * (1 - tile_overlap_factor));
  const int64_t blend_extent = static_cast<int64_t>(tile_latent * tile_overlap_factor);
  const int64_t row_limit = tile_latent - blend_extent;
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < x.size(2); i += overlap_size) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < x.size(3); j += overlap_size) {
      at::Tensor tile = encoder(x.slice(2, i, i + tile_sample).slice(3, j, j + tile_sample));
      row.push_back(quant_conv ? quant_conv(tile) : tile);
    }
    rows.push_back(std::move(row));
  }
  return join_tiles(rows, blend_extent, row_limit);
}

// Mirrors diffusers AutoencoderKL.tiled_decode.
at::Tensor AutoencoderKLImpl::tiled_decode(const at::Tensor& z, int64_t tile_latent) {
  const int64_t tile_sample = tile_latent * downscale_factor();
  const int64_t overlap_size = static_cast<int64_t>(tile_latent * (1 - tile_overlap_factor));
  const int64_t blend_extent = static_cast<int64_t>(tile_sample * tile_overlap_factor);
  const int64_t row_limit = tile_sample - blend_extent;
  TORCH_CHECK(overlap_size > 0, "VAE tiling: tile_latent_min_size too small for the overlap factor");
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < z.size(2); i += overlap_size) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < z.size(3); j += overlap_size) {
      at::Tensor tile = z.slice(2, i, i + tile_latent).slice(3, j, j + tile_latent);
      if (post_quant_conv) tile = post_quant_conv(tile);
      row.push_back(decoder(tile));
    }
    rows.push_back(std::move(row));
  }
  return join_tiles(rows, blend_extent, row_limit);
}

at::Tensor AutoencoderKLImpl::scale_latents(const at::Tensor& z) const {
  return (config.shift_factor ? z - *config.shift_factor : z) * config.scaling_factor;
}

at::Tensor AutoencoderKLImpl::unscale_latents(const at::Tensor& z) const {
  at::Tensor x = z / config.scaling_factor;
  return config.shift_factor ? x + *config.shift_factor : x;
}

void AutoencoderKLImpl::set_gradient_checkpointing(bool on) {
  for (auto& m : modules(false)) {
    if (auto* r = m->as<ResnetBlock2DImpl>()) r->gradient_checkpointing = on;
  }
}

void AutoencoderKLImpl::set_attention_query_chunk(int64_t rows) {
  for (auto& m : modules(false)) {
    if (auto* a = m->as<AttentionImpl>()) a->options.query_chunk = rows;
  }
}

}  // namespace lt::models::sd
