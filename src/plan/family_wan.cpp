// The planner's model of Wan 2.1 text-to-video (1.3B, 14B): WanTransformer3DModel over 1x2x2
// patches of the causal video VAE's latents, umT5-XXL over 512 tokens, and AutoencoderKLWan, as
// src/models/wan and src/train/family_wan.cpp run them. Shapes come from the transformer's header
// (a ComfyUI/official file with umt5_xxl* and wan_2.1_vae* beside it, or a WanPipeline folder);
// without the checkpoint, from Wan 2.1's configs (14B when the name says so) and the released
// umT5-XXL encoder. The loader widens fp8 files to the compute dtype as it reads them (only
// model.quantize stores 8-bit weights, after loading), so the file's dtype changes no phase.
//
// A clip of F frames (4k+1; an image is one frame) is 1 + (F-1)/4 latent frames of (H/16)(W/16)
// tokens each. Activations are counted the way autograd holds them in this implementation: per
// block, the self-attention over the clip's tokens (the modulated norm's output, q and k before
// and after their RMSNorm, v, the attention's output, the H x L x L probabilities unless attention
// is chunked), the cross-attention to the 512 text tokens (its k and v are text-sized), the FFN's
// two ffn_dim-wide tensors; in 16-bit compute the norms' and LoRA's fp32 copies. The text
// projection and the modulation carry no gradient (no adapter before them): they keep nothing.
// The VAE encodes the first frame alone, then 4 frames at a time with each causal convolution's
// last 2 input frames kept between chunks, and decodes one latent frame at a time: its peak is one
// chunk's, whatever the frame count, plus the whole clip going in (or the decoded frames coming out).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "architecture.h"
#include "checkpoint_headers.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/models/text/t5_checkpoint.h"
#include "loratrain/models/wan/checkpoint.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"
#include "t5_encoder.h"

namespace lt::plan {

namespace fs = std::filesystem;
using models::wan::WanTransformerConfig;
using models::wan::WanVaeConfig;

namespace {

constexpr int64_t kTextTokens = 512;  // Wan's text_len: every prompt is padded to it

class WanArchitecture final : public Architecture {
 public:
  WanArchitecture(WanTransformerConfig config, WanVaeConfig vae, Parameters known, T5Shape text)
      : config_(std::move(config)), vae_(std::move(vae)), known_(known), text_(text) {}

  Parameters parameters(const AdapterShape& adapter) const override;
  int64_t training_activations(const Shape& s, const Compute& c) const override;
  int64_t inference_activations(const Shape& s, const Compute& c) const override;
  int64_t vae_encode(const Shape& s, const Compute& c) const override;
  int64_t vae_decode(const Shape& s, const Compute& c) const override;
  int64_t text_encode(int64_t batch, const Compute& c) const override {
    return t5_encode_bytes(text_, batch, kTextTokens, c.bytes);
  }
  int64_t text_embedding_elements() const override { return kTextTokens * config_.text_dim; }
  int latent_downscale() const override { return 8; }
  int bucket_divisibility() const override { return static_cast<int>(8 * config_.patch_size[1]); }

 private:
  static int64_t latent_frames(const Shape& s) { return 1 + (std::max<int64_t>(1, s.frames) - 1) / 4; }
  int64_t tokens(const Shape& s) const {
    const auto& p = config_.patch_size;
    return std::max<int64_t>(1, latent_frames(s) / p[0]) * std::max<int64_t>(1, s.height / (8 * p[1])) *
           std::max<int64_t>(1, s.width / (8 * p[2]));
  }
  // The VAE's working set at full resolution for a chunk of `frames` frames of `channels`
  // channels, and the frames every causal convolution keeps for the next chunk (the VAE runs in
  // fp32 and without gradients).
  int64_t vae_chunk(int64_t channels, int64_t frames, const Shape& s, const Compute& c) const;
  int64_t vae_frame_cache(const Shape& s, bool decoder, int64_t kept) const;

  WanTransformerConfig config_;
  WanVaeConfig vae_;
  Parameters known_;
  T5Shape text_;
};

Parameters WanArchitecture::parameters(const AdapterShape& adapter) const {
  Parameters p = known_;
  p.adapter = 0;
  p.adapter_modules = 0;
  const int64_t r = adapter.linear_rank, d = config_.inner_dim(), f = config_.ffn_dim;
  auto add = [&](int64_t in, int64_t out) {
    p.adapter += adapter_module_parameters(adapter, in, out, 1, r);
    p.adapter_modules += 1;
  };
  // ComponentSpec::wan_transformer: both attentions' to_q/k/v/out.0 and the FFN, in every block.
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (int k = 0; k < 8; ++k) add(d, d);
    add(d, f);
    add(f, d);
  }
  return p;
}

int64_t WanArchitecture::training_activations(const Shape& s, const Compute& c) const {
  const int64_t b = s.batch, d = config_.inner_dim(), f = config_.ffn_dim, heads = config_.num_attention_heads;
  const int64_t L = tokens(s), T = kTextTokens;
  const int64_t e = c.bytes;
  const bool half = e < 4;  // the norms' and LoRA's fp32 copies exist only in 16-bit compute
  const int64_t block_rows = c.query_block(L);
  const bool chunked = block_rows > 0 && block_rows < L;
  const int64_t self_probs = chunked ? 0 : b * heads * L * L * e;
  const int64_t cross_probs = chunked ? 0 : b * heads * L * T * e;
  const int64_t rank_wide = int64_t(c.adapter_rank) * 4;  // per token and adapted Linear: down's fp32 output
  // RMSNorm (q and k of both attentions) computes mean(x^2): where autograd's mean keeps its input,
  // the fp32 square of each of the four stays beside x (three image-wide, the text-sized k).
  const int64_t rms_squares = c.mean_keeps_input ? b * (3 * L + T) * d * 4 : 0;

  // What a block keeps, by the order backward releases it (the counts are those of the CPU runs'
  // allocations). The FFN: its norm's fp32 input and the modulated output LoRA reads (fp32), the
  // projection and its GELU (ffn_dim wide; 16-bit: LoRA's fp32 copy of the GELU). The
  // cross-attention: the norm's input and output, q before its RMSNorm and scaled, its output
  // (16-bit: fp32 copies of four, the scaled q); over the text: k before and after its RMSNorm and
  // v (16-bit: RMSNorm's and LoRA's fp32 copies instead of k before its norm), the probabilities.
  // The self-attention: the rest of the 14 image-wide tensors (16-bit: 15 in all, 3 in the compute
  // dtype, 12 fp32 copies), its probabilities, LoRA's rank-wide outputs.
  const int64_t ffn_saved = b * L * d * 8 + b * L * f * (2 * e + (half ? 4 : 0));
  const int64_t cross_saved = (half ? b * L * d * (4 * 4 + e) : b * L * d * 5 * e) +
                              (half ? b * T * d * (2 * e + 3 * 4) : b * T * d * 3 * e) + cross_probs +
                              (c.mean_keeps_input ? b * (L + T) * d * 4 : 0);
  int64_t saved = (half ? b * L * d * (3 * e + 12 * 4) : b * L * d * 14 * e) + b * L * f * (2 * e + (half ? 4 : 0)) +
                  (half ? b * T * d * (2 * e + 3 * 4) : b * T * d * 3 * e);
  saved += self_probs + cross_probs + rms_squares + b * (8 * L + 2 * T) * rank_wide;
  const int64_t output = b * L * d * e;
  // Backward goes through a block's FFN first (its two ffn_dim-wide gradients; 16-bit: fp32
  // residual-stream neighbours), with everything the block saved still held; then the
  // cross-attention, whose gradients come after the FFN's saved tensors are gone: the
  // probabilities' gradient beside the probabilities, with v's text-sized gradient (or, after it,
  // the softmax's own), and the image-wide gradient of q; then the self-attention (its
  // probabilities' gradient beside them, or one block per thread), after the cross-attention's
  // are gone too. The incoming gradient (image-wide) is there throughout.
  const int64_t chunk_work = int64_t(std::max(1, c.threads)) * block_rows * (L + T) * 3 * e;
  const int64_t self_grad = chunked ? chunk_work : std::max(self_probs + output, 2 * self_probs);
  const int64_t cross_grad =
      (chunked ? chunk_work + b * T * d * e : std::max(cross_probs + b * T * d * e, 2 * cross_probs)) + output;
  const int64_t ffn_grad = b * L * (2 * f * e + (half ? 4 * d * 4 : 0));
  const int64_t backward =
      output + std::max({ffn_grad, cross_grad - ffn_saved, self_grad - ffn_saved - cross_saved});

  // Around the blocks: the text states (the cached umT5 embedding and its projection) and the
  // rotary tables (fp32 cos and sin) all along; at the end of the forward, the patch embedding's
  // tokens, the final norm and projection, and the flow-matching loss's latent-sized tensors (by
  // backward only the loss's gradient and the prediction are left).
  const int64_t latents = b * config_.in_channels * latent_frames(s) * (s.height / 8) * (s.width / 8);
  const int64_t states = b * T * (config_.text_dim + d) * e + 2 * L * config_.attention_head_dim * 4;
  const int64_t forward_end = states + b * L * d * (e + 2 * 4) + 6 * latents * 4;
  const int64_t backward_around = states + 2 * latents * 4;
  if (c.checkpointing) {
    // Every block keeps only its input; backward recomputes one block at a time, its output held
    // while that block's backward runs.
    return std::max(forward_end + (config_.num_layers + 1) * output,
                    backward_around + (config_.num_layers + 1) * output + saved + backward);
  }
  // Backward starts with the last block's FFN, every block's saved tensors still held.
  return std::max(forward_end, backward_around + backward) + config_.num_layers * (saved + output);
}

int64_t WanArchitecture::inference_activations(const Shape& s, const Compute& c) const {
  const int64_t b = s.batch, d = config_.inner_dim(), f = config_.ffn_dim, heads = config_.num_attention_heads;
  const int64_t L = tokens(s), T = kTextTokens;
  const int64_t e = c.bytes;
  const int64_t block_rows = c.query_block(L);
  const bool chunked = block_rows > 0 && block_rows < L;
  const int64_t n = b * L * d;
  const int64_t threads = std::max(1, c.threads);
  // The busiest moment of a block beside its input and fp32 residual sum: self-attention's scores
  // and probabilities (or one block of them per thread) with q, k, v and their copies; the
  // cross-attention's over the text, with its text-sized k and v; or the FFN's two ffn_dim-wide tensors.
  const int64_t self = (chunked ? threads * block_rows * L * 2 : 2 * b * heads * L * L) + 5 * n;
  const int64_t cross = (chunked ? threads * block_rows * T * 2 : 2 * b * heads * L * T) + 3 * b * T * d + 4 * n;
  const int64_t ffn = 2 * b * L * f + 3 * n;
  const int64_t worst = std::max({self, cross, ffn}) * e + 2 * n * 4;
  // Around the blocks: the text states (the cached umT5 embedding, its projection), the rotary
  // tables, and the sampler's latent-sized tensors (both guidance branches' predictions).
  const int64_t latents = b * config_.in_channels * latent_frames(s) * (s.height / 8) * (s.width / 8);
  return worst + b * T * (config_.text_dim + 2 * d) * e + 2 * L * config_.attention_head_dim * 4 + 6 * latents * 4;
}

// A residual block's second causal convolution at full resolution, on a chunk of `frames` frames
// of `channels` channels: the block's input (its shortcut), the first convolution's output, the
// normalised activation, that activation with its cached frames in front and padded, and the
// output. On the CPU, LibTorch 1.13 runs a 3-D convolution whose batch x channels x padded frames x
// padded rows is at most 20480 through vol2col, with a column buffer of 27 x the channels x the
// output (larger ones go to oneDNN, whose buffers are its own).
int64_t WanArchitecture::vae_chunk(int64_t channels, int64_t frames, const Shape& s, const Compute& c) const {
  const int64_t hw = s.height * s.width;
  const int64_t b = s.batch;
  const bool vol2col = c.host && b * channels * (frames + 2) * (s.height + 2) <= 20480;
  return b * channels * hw * (5 * frames + 2 + (vol2col ? 27 * frames : 0)) * 4;
}

// Each causal convolution with a temporal kernel of 3 keeps the last `kept` frames of its input (2;
// 1 after a one-frame chunk): summed over the levels, at each level's width and resolution.
int64_t WanArchitecture::vae_frame_cache(const Shape& s, bool decoder, int64_t kept) const {
  const int64_t hw = s.height * s.width;
  const int64_t base = decoder ? vae_.decoder_dim() : vae_.base_dim;
  const size_t levels = vae_.dim_mult.size();
  int64_t elements = (decoder ? vae_.z_dim : vae_.in_channels) * hw / (decoder ? 64 : 1);
  for (size_t i = 0; i < levels; ++i) {
    const int64_t channels = base * vae_.dim_mult[i];
    const int64_t cells = hw >> (2 * i);  // encoder level i; the decoder's level i from the top mirrors it
    const int64_t convs = 2 * (vae_.num_res_blocks + (decoder ? 1 : 0));
    elements += convs * channels * cells;
  }
  const int64_t top = base * vae_.dim_mult.back();
  elements += 4 * top * (hw >> (2 * (levels - 1)));  // the mid block's two residual blocks
  return s.batch * kept * elements * 4;
}

// The clip read in, the busiest chunk (the first frame alone, then 4 frames at a time: on the CPU
// the one-frame chunk can be the one that goes through vol2col) with every convolution's kept
// frames, and the latent moments.
int64_t WanArchitecture::vae_encode(const Shape& s, const Compute& c) const {
  const int64_t frames = std::max<int64_t>(1, s.frames);
  const int64_t channels = vae_.base_dim * vae_.dim_mult.front();
  const int64_t clip = s.batch * vae_.in_channels * frames * s.height * s.width * 4;
  const int64_t moments = s.batch * 2 * vae_.z_dim * latent_frames(s) * (s.height / 8) * (s.width / 8) * 4;
  int64_t chunk = vae_chunk(channels, 1, s, c) + vae_frame_cache(s, false, 1);
  if (frames > 1) chunk = std::max(chunk, vae_chunk(channels, 4, s, c) + vae_frame_cache(s, false, 2));
  return clip + chunk + 3 * moments;
}

// One latent frame at a time (the first to 1 output frame, the others to 4): the last level's
// busiest convolution with the kept frames beside the frames decoded so far; at the end the
// decoded frames, their concatenation and its clamped copy.
int64_t WanArchitecture::vae_decode(const Shape& s, const Compute& c) const {
  const int64_t frames = std::max<int64_t>(1, s.frames);
  const int64_t channels = vae_.decoder_dim() * vae_.dim_mult.front();
  const int64_t video = s.batch * vae_.out_channels * (1 + 4 * (latent_frames(s) - 1)) * s.height * s.width * 4;
  int64_t working = vae_chunk(channels, 1, s, c) + vae_frame_cache(s, true, 1);
  if (frames > 1) working = std::max(working, vae_chunk(channels, 4, s, c) + vae_frame_cache(s, true, 2));
  return std::max(video + working, 3 * video);
}

// Wan 2.1's released sizes for what is not on this machine: umT5-XXL's encoder (its 256384-token
// embedding is the largest tensor).
constexpr int64_t kUmt5Vocabulary = 256384;

void umt5_from_shape(const T5Shape& t5, int64_t layers, Parameters& p) {
  const int64_t per_layer = 4 * t5.width * t5.width + 3 * t5.width * t5.ff + 2 * t5.width + 32 * t5.heads;
  p.text_encoders = t5.vocab * t5.width + layers * per_layer + t5.width;
  p.largest_text_tensor = t5.vocab * t5.width;
}

// The transformer's parameters from its config: what a header would list.
void transformer_from_config(const WanTransformerConfig& c, Parameters& p) {
  const int64_t d = c.inner_dim(), f = c.ffn_dim;
  const int64_t patch = c.patch_size[0] * c.patch_size[1] * c.patch_size[2];
  auto linear = [&](int64_t in, int64_t out) {
    p.denoiser += in * out + out;
    p.denoiser_linear += in * out;
    p.largest_denoiser_tensor = std::max(p.largest_denoiser_tensor, in * out);
  };
  p.denoiser += d * c.in_channels * patch + d;  // the patch embedding (a Conv3d)
  linear(c.freq_dim, d);
  linear(d, d);
  linear(d, 6 * d);
  linear(c.text_dim, d);
  linear(d, d);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (int k = 0; k < 8; ++k) linear(d, d);
    p.denoiser += 4 * d;                          // both attentions' q and k RMSNorm scales
    if (c.cross_attn_norm) p.denoiser += 2 * d;   // the cross-attention norm's weight and bias
    linear(d, f);
    linear(f, d);
    p.denoiser += 6 * d;                          // scale_shift_table
  }
  linear(d, c.out_channels * patch);
  p.denoiser += 2 * d;
}

// AutoencoderKLWan's parameters from its config (every causal convolution 3x3x3 but the
// shortcuts and the quant convs, the resamplers' 2-D 3x3 and temporal 3x1x1 convolutions).
void vae_from_config(const WanVaeConfig& c, Parameters& p) {
  int64_t total = 0, largest = 0;
  auto conv = [&](int64_t in, int64_t out, int64_t kernel) {
    total += in * out * kernel + out;
    largest = std::max(largest, in * out * kernel);
  };
  auto residual = [&](int64_t in, int64_t out) {
    total += in + out;  // the two RMS norms' gamma
    conv(in, out, 27);
    conv(out, out, 27);
    if (in != out) conv(in, out, 1);
  };
  auto mid = [&](int64_t dim) {
    residual(dim, dim);
    residual(dim, dim);
    total += dim;  // the attention's norm
    conv(dim, 3 * dim, 1);
    conv(dim, dim, 1);
  };
  const size_t levels = c.dim_mult.size();
  std::vector<int64_t> dims = {c.base_dim};
  for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
  conv(c.in_channels, dims[0], 27);
  for (size_t i = 0; i < levels; ++i) {
    residual(dims[i], dims[i + 1]);
    for (int64_t r = 1; r < c.num_res_blocks; ++r) residual(dims[i + 1], dims[i + 1]);
    if (i + 1 != levels) {
      conv(dims[i + 1], dims[i + 1], 9);
      if (c.temperal_downsample[i]) conv(dims[i + 1], dims[i + 1], 3);
    }
  }
  mid(dims.back());
  total += dims.back();
  conv(dims.back(), 2 * c.z_dim, 27);
  conv(2 * c.z_dim, 2 * c.z_dim, 1);
  conv(c.z_dim, c.z_dim, 1);
  const int64_t base = c.decoder_dim();
  std::vector<int64_t> up = {base * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) up.push_back(base * *it);
  conv(c.z_dim, up[0], 27);
  mid(up[0]);
  for (size_t i = 0; i < levels; ++i) {
    const int64_t in = i > 0 ? up[i] / 2 : up[i];
    residual(in, up[i + 1]);
    for (int64_t r = 0; r < c.num_res_blocks; ++r) residual(up[i + 1], up[i + 1]);
    if (i + 1 != levels) {
      conv(up[i + 1], up[i + 1] / 2, 9);
      if (c.temperal_downsample[levels - 2 - i]) conv(up[i + 1], 2 * up[i + 1], 3);
    }
  }
  total += up.back();
  conv(up.back(), c.out_channels, 27);
  p.vae = total;
  p.largest_vae_tensor = largest;
}

}  // namespace

std::unique_ptr<Architecture> make_wan_architecture(const ModelSource& source) {
  WanTransformerConfig config;
  WanVaeConfig vae;
  Parameters p;
  T5Shape text;
  text.vocab = kUmt5Vocabulary;
  std::optional<fs::path> text_path, vae_path;
  if (source.vae) vae_path = source.vae;
  if (source.checkpoint && fs::is_directory(*source.checkpoint)) {
    // A WanPipeline folder: the transformer's config.json and every component's weight headers.
    const fs::path& dir = *source.checkpoint;
    config = WanTransformerConfig::from_json(models::sd::read_component_config(dir / "transformer"),
                                             (dir / "transformer" / "config.json").string());
    count_component(dir / "transformer", p.denoiser, p.largest_denoiser_tensor, &p.denoiser_linear);
    count_component(dir / "text_encoder", p.text_encoders, p.largest_text_tensor, nullptr,
                    [&](const io::SafetensorsFile& file) { read_t5_shape(file, "", text); });
    if (!vae_path && fs::is_directory(dir / "vae")) {
      vae = WanVaeConfig::from_json(models::sd::read_component_config(dir / "vae"));
      count_component(dir / "vae", p.vae, p.largest_vae_tensor);
    }
  } else if (source.checkpoint) {
    // A bare transformer file, with the umT5 and VAE files ComfyUI keeps beside it.
    auto file = io::SafetensorsFile::open(*source.checkpoint);
    const auto layout = models::wan::detect_transformer_layout(*file);
    config = models::wan::detect_transformer_config(*file, layout);
    count_weights(*file, layout.root, p.denoiser, p.largest_denoiser_tensor, &p.denoiser_linear);
    const fs::path dir = source.checkpoint->parent_path();
    text_path = models::find_companion(dir, {"umt5_xxl_fp16.safetensors", "umt5_xxl*", "umt5-xxl*", "umt5*"});
    if (!vae_path) vae_path = models::find_companion(dir, {"wan_2.1_vae.safetensors", "wan_2.1_vae*", "Wan2_1_VAE*", "wan2.1_vae*"});
  } else {
    if (to_lower(source.name).find("14b") != std::string::npos) config = WanTransformerConfig::wan21_14b();
    transformer_from_config(config, p);
  }
  if (text_path) {
    auto file = io::SafetensorsFile::open(*text_path);
    const std::string root = models::find_t5_encoder_root(*file);
    count_weights(*file, root + "encoder.", p.text_encoders, p.largest_text_tensor);
    count_weights(*file, root + "shared.", p.text_encoders, p.largest_text_tensor);
    read_t5_shape(*file, root, text);
  }
  if (vae_path && fs::is_regular_file(*vae_path)) {
    auto file = io::SafetensorsFile::open(*vae_path);
    p.vae = p.largest_vae_tensor = 0;
    count_weights(*file, "", p.vae, p.largest_vae_tensor);
    vae = models::wan::detect_vae_config(*file);
  }
  if (p.text_encoders == 0) umt5_from_shape(text, 24, p);
  if (p.vae == 0) vae_from_config(vae, p);
  p.largest_text_linear = text.ff * text.width;  // a gated MLP projection
  p.text_embeddings = text.vocab * text.width;    // quantize_te converts Linears only
  return std::make_unique<WanArchitecture>(std::move(config), std::move(vae), p, text);
}

}  // namespace lt::plan
