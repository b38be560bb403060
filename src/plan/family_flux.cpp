// The planner's model of Flux.1 dev and schnell: FluxTransformer2DModel over 2x2-packed latent
// tokens, T5-XXL and CLIP-L, and the 16-channel AutoencoderKL, as src/models/flux implements them.
// Shapes come from the transformer's header (BFL names: a bare flux1-dev.safetensors with its
// ComfyUI companions beside it, or a ComfyUI all-in-one file) or a diffusers folder's config.json
// and weight headers; without the checkpoint, from FLUX.1's config (schnell when the name says so).
//
// Activations are counted the way autograd holds them in this implementation (docs/plan.md): the
// transformer computes on b x (text + image) tokens of width D. Per double-stream block and stream:
// the modulated LayerNorm outputs, q/k before their RMSNorm, the attention output Linear's result,
// the residual sums, the MLP's 4D-wide projection and its GELU; over the joint sequence: q/k/v
// concatenated, the scaled q and k, the attention output and the softmax probabilities
// (H x S x S, unless attention is chunked: BlockedAttention keeps q, k, v only). Per single-stream block: the same attention, the 4D MLP projection and the 5D-wide
// concatenation proj_out reads. In 16-bit compute the RMSNorm and LoRA's inputs work in fp32
// copies (the rotary embedding's multiply by constant tables and keep nothing). Checkpointing keeps each block's output and recomputes one block at
// a time in backward. The counts below are element counts of those tensors, checked against
// measured peaks of the tiny Flux runs (tests/plan/test_plan_accuracy.cpp, docs/benchmarks.md).
#include <algorithm>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "architecture.h"
#include "autoencoder_kl.h"
#include "checkpoint_headers.h"
#include "t5_encoder.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/models/flux/checkpoint.h"
#include "loratrain/models/registry.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::plan {

namespace fs = std::filesystem;
using models::flux::FluxConfig;
using models::sd::VAEConfig;

namespace {

constexpr int64_t kClipTokens = 77;

// The text encoders' shapes the cache phase runs at.
struct TextShapes {
  T5Shape t5;
  int64_t clip_width = 768;
  int64_t clip_vocab = 49408;
  int64_t clip_positions = 77;
};

class FluxArchitecture final : public Architecture {
 public:
  FluxArchitecture(FluxConfig config, VAEConfig vae, Parameters known, TextShapes text)
      : config_(std::move(config)), vae_(std::move(vae)), known_(known), text_(text) {}

  Parameters parameters(const AdapterShape& adapter) const override;
  int64_t training_activations(const Shape& s, const Compute& c) const override;
  int64_t inference_activations(const Shape& s, const Compute& c) const override;
  int64_t vae_encode(const Shape& s, const Compute& c) const override { return autoencoder_kl_encode(vae_, s, c); }
  int64_t vae_decode(const Shape& s, const Compute& c) const override { return autoencoder_kl_decode(vae_, s, c); }
  int64_t text_encode(int64_t batch, const Compute& c) const override;
  int64_t text_embedding_elements() const override { return text_tokens() * config_.joint_attention_dim + text_.clip_width; }

 private:
  // T5's sequence: every max_length position, pads included (512 dev, 256 schnell).
  int64_t text_tokens() const { return config_.guidance_embeds ? 512 : 256; }
  int64_t image_tokens(const Shape& s) const {
    return std::max<int64_t>(1, s.height / 16) * std::max<int64_t>(1, s.width / 16) * std::max<int64_t>(1, s.frames);
  }

  FluxConfig config_;
  VAEConfig vae_;
  Parameters known_;
  TextShapes text_;
};

Parameters FluxArchitecture::parameters(const AdapterShape& adapter) const {
  Parameters p = known_;
  p.adapter = 0;
  p.adapter_modules = 0;
  const int64_t r = adapter.linear_rank, d = config_.inner_dim();
  auto add = [&](int64_t in, int64_t out) {
    p.adapter += adapter_module_parameters(adapter, in, out, 1, r);
    p.adapter_modules += 1;
  };
  // Every Linear inside the blocks (ComponentSpec::flux_transformer): the modulations, attention
  // projections and MLPs; not the embedders or the final layer.
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    for (int stream = 0; stream < 2; ++stream) {
      add(d, 6 * d);                           // norm1(.context).linear
      for (int k = 0; k < 4; ++k) add(d, d);   // to_q/k/v, to_out.0 (add_*_proj, to_add_out)
      add(d, 4 * d);                           // ff(_context).net.0.proj
      add(4 * d, d);                           // ff(_context).net.2
    }
  }
  for (int64_t i = 0; i < config_.num_single_layers; ++i) {
    add(d, 3 * d);                          // norm.linear
    add(d, 4 * d);                          // proj_mlp
    for (int k = 0; k < 3; ++k) add(d, d);  // to_q/k/v
    add(5 * d, d);                          // proj_out
  }
  return p;
}

// Bytes of what one block keeps for backward, what it adds while its backward runs, and its output.
struct FluxBlockBytes {
  int64_t saved = 0, transient = 0, output = 0;
};

int64_t FluxArchitecture::training_activations(const Shape& s, const Compute& c) const {
  const int64_t b = s.batch, d = config_.inner_dim(), heads = config_.num_attention_heads;
  const int64_t L = image_tokens(s), T = text_tokens(), S = L + T;
  const int64_t e = c.bytes;
  const bool half = e < 4;  // the RMSNorm, rotary and LoRA fp32 copies exist only in 16-bit compute
  const int64_t block_rows = c.query_block(S);
  const bool chunked = block_rows > 0 && block_rows < S;
  const int64_t probs = chunked ? 0 : b * heads * S * S * e;
  const int64_t chunk_work = int64_t(std::max(1, c.threads)) * block_rows * S * 2 * e;
  const int64_t rank_wide = int64_t(c.adapter_rank) * 4 * 2;  // per token and adapted Linear: down's output and its scaled copy
  auto units = [&](int64_t tokens, int64_t at_e, int64_t at_fp32) { return b * tokens * d * (at_e * e + (half ? at_fp32 * 4 : 0)); };

  FluxBlockBytes dbl;
  // Per stream: LayerNorm 1 + modulated 1 + q, k 2 + attention output 1 + residual 1 + LayerNorm 1
  // + modulated 1 + MLP 4 + GELU 4 + MLP output 1 = 17; in 16 bits the RMSNorm keeps fp32 q, k
  // (2) instead, and LoRA's fp32 inputs: q, k, v 3, output 1, MLP in 1 and out 4.
  dbl.saved = units(L + T, half ? 15 : 17, 11) + b * (L + T) * 6 * rank_wide;
  // Joint: v concatenated, the scaled q, k (the products' operands) and the attention output = 4.
  // The rotary embedding multiplies by constant tables: it keeps nothing, in fp32 copies or not.
  dbl.saved += units(S, 4, 0) + probs;
  dbl.output = b * (L + T) * d * e;
  FluxBlockBytes single;
  // LayerNorm 1 + modulated 1, MLP projection 4, q, k, v 3, scaled q and k 2, concatenation 5,
  // proj_out's output 1 = 17; in 16 bits RMSNorm's fp32 q, k (2) instead of q, k, and LoRA's
  // fp32 inputs (q, k, v, MLP 4, proj_out 5).
  single.saved = units(S, half ? 15 : 17, 11) + probs + b * S * 5 * rank_wide;
  single.output = b * S * d * e;
  // Backward of the attention: the probabilities' gradient beside them (or one block per thread);
  // of the MLP: its 4D-wide gradients.
  const int64_t transient = std::max<int64_t>(chunked ? chunk_work : 2 * probs, 12 * b * S * d * e);
  dbl.transient = single.transient = transient;

  // The embedders' outputs, the rotary tables (fp32 cos and sin) and the final layer's tensors.
  const int64_t outer = b * (S + 4 * L) * d * e + 2 * S * config_.attention_head_dim * 4;
  const int64_t blocks[2] = {config_.num_layers, config_.num_single_layers};
  const FluxBlockBytes kinds[2] = {dbl, single};
  int64_t held = outer, worst = 0;
  for (int k = 0; k < 2; ++k) {
    if (blocks[k] == 0) continue;
    const FluxBlockBytes& blk = kinds[k];
    if (c.checkpointing) {
      held += blocks[k] * blk.output;
      worst = std::max(worst, blk.saved + blk.output + blk.transient);
    } else {
      held += blocks[k] * (blk.saved + blk.output);
      worst = std::max(worst, blk.transient);
    }
  }
  return held + worst;
}

int64_t FluxArchitecture::inference_activations(const Shape& s, const Compute& c) const {
  const int64_t b = s.batch, d = config_.inner_dim(), heads = config_.num_attention_heads;
  const int64_t L = image_tokens(s), T = text_tokens(), S = L + T;
  const int64_t e = c.bytes;
  const int64_t block_rows = c.query_block(S);
  const bool chunked = block_rows > 0 && block_rows < S;
  const int64_t n = b * S * d;
  // Scores and probabilities (or one block of them per thread) beside q, k, v and the streams;
  // or a single block's MLP projection, its GELU and the concatenation.
  const int64_t attention = chunked ? int64_t(std::max(1, c.threads)) * block_rows * S * 2 : 2 * b * heads * S * S;
  const int64_t worst = std::max<int64_t>(attention + 6 * n, 16 * n);
  return (2 * n + worst) * e + 2 * S * config_.attention_head_dim * 4;
}

// The cache phase: T5 over its whole sequence and CLIP-L over 77 tokens.
int64_t FluxArchitecture::text_encode(int64_t batch, const Compute& c) const {
  const int64_t t5 = t5_encode_bytes(text_.t5, batch, text_tokens(), c.bytes);
  const int64_t clip_heads = std::max<int64_t>(1, text_.clip_width / 64);
  const int64_t clip = batch * (8 * kClipTokens * text_.clip_width + 2 * clip_heads * kClipTokens * kClipTokens) * c.bytes;
  return std::max(t5, clip);
}

void t5_shapes(const io::SafetensorsFile& file, const std::string& root, TextShapes& out) { read_t5_shape(file, root, out.t5); }

void clip_shapes(const io::SafetensorsFile& file, TextShapes& out) {
  for (const auto& t : file.tensors()) {
    if (ends_with(t.name, "token_embedding.weight") && t.shape.size() == 2) {
      out.clip_vocab = t.shape[0];
      out.clip_width = t.shape[1];
    }
    if (ends_with(t.name, "position_embedding.weight") && t.shape.size() == 2) out.clip_positions = t.shape[0];
  }
}

// FLUX.1's released sizes (diffusers' FluxTransformer2DModel of FLUX.1-dev / -schnell, T5-XXL's
// encoder, CLIP-L's text model, the 16-channel AutoencoderKL) for what is not on this machine.
constexpr int64_t kT5Parameters = 4762310656;
constexpr int64_t kT5LargestTensor = 32128LL * 4096;  // the shared token embedding
constexpr int64_t kClipParameters = 123060480;
constexpr int64_t kClipLargestTensor = 49408LL * 768;
constexpr int64_t kVaeParameters = 83819683;
constexpr int64_t kVaeLargestTensor = 512LL * 512 * 9;

// The transformer's parameters from its config: what a header would list.
void transformer_from_config(const FluxConfig& c, Parameters& p) {
  const int64_t d = c.inner_dim(), hd = c.attention_head_dim;
  auto linear = [&](int64_t in, int64_t out) {
    p.denoiser += in * out + out;
    p.denoiser_linear += in * out;
    p.largest_denoiser_tensor = std::max(p.largest_denoiser_tensor, in * out);
  };
  linear(c.in_channels, d);
  linear(c.joint_attention_dim, d);
  for (int k = 0; k < (c.guidance_embeds ? 2 : 1); ++k) {
    linear(256, d);
    linear(d, d);
  }
  linear(c.pooled_projection_dim, d);
  linear(d, d);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (int stream = 0; stream < 2; ++stream) {
      linear(d, 6 * d);
      linear(d, 3 * d);  // fused qkv (BFL's largest tensors are these and linear1)
      linear(d, d);
      linear(d, 4 * d);
      linear(4 * d, d);
      p.denoiser += 2 * hd;  // q and k RMSNorm scales
    }
  }
  for (int64_t i = 0; i < c.num_single_layers; ++i) {
    linear(d, 3 * d);
    linear(d, 7 * d);  // linear1: q, k, v and the MLP
    linear(5 * d, d);  // linear2
    p.denoiser += 2 * hd;
  }
  linear(d, 2 * d);
  linear(d, c.output_channels());
}

VAEConfig flux_vae_config() {
  VAEConfig v = VAEConfig::sd();
  v.latent_channels = 16;
  v.sample_size = 1024;
  return v;
}

}  // namespace

std::unique_ptr<Architecture> make_flux_architecture(const ModelSource& source) {
  FluxConfig config;
  VAEConfig vae = flux_vae_config();
  Parameters p;
  TextShapes text;
  bool have_text = false, have_clip = false, have_vae = false;
  if (source.checkpoint && fs::is_directory(*source.checkpoint)) {
    // A diffusers folder: the transformer's config.json and every component's weight headers.
    const fs::path& dir = *source.checkpoint;
    config = FluxConfig::from_json(models::sd::read_component_config(dir / "transformer"),
                                   (dir / "transformer" / "config.json").string());
    count_component(dir / "transformer", p.denoiser, p.largest_denoiser_tensor, &p.denoiser_linear);
    have_text = count_component(dir / "text_encoder_2", p.text_encoders, p.largest_text_tensor, nullptr,
                                [&](const io::SafetensorsFile& file) { t5_shapes(file, "", text); });
    have_clip = count_component(dir / "text_encoder", p.text_encoders, p.largest_text_tensor, nullptr,
                                [&](const io::SafetensorsFile& file) { clip_shapes(file, text); });
    if (fs::is_directory(dir / "vae")) vae = VAEConfig::from_json(models::sd::read_component_config(dir / "vae"));
    have_vae = count_component(dir / "vae", p.vae, p.largest_vae_tensor);
  } else if (source.checkpoint) {
    auto file = io::SafetensorsFile::open(*source.checkpoint);
    const std::string root = file->contains(std::string(models::flux::kComfyTransformerRoot) + "img_in.weight")
                                 ? models::flux::kComfyTransformerRoot
                                 : "";
    config = models::flux::detect_bfl_config(*file, root);
    count_weights(*file, root, p.denoiser, p.largest_denoiser_tensor, &p.denoiser_linear);
    if (!root.empty()) {
      // ComfyUI's all-in-one file: the text encoders and the VAE under their roots.
      int64_t t5 = 0, clip = 0;
      count_weights(*file, models::flux::kComfyT5Root, t5, p.largest_text_tensor);
      count_weights(*file, models::flux::kComfyClipLRoot, clip, p.largest_text_tensor);
      p.text_encoders = t5 + clip;
      have_text = t5 > 0;
      have_clip = clip > 0;
      t5_shapes(*file, models::flux::kComfyT5Root, text);
      clip_shapes(*file, text);
      count_weights(*file, models::flux::kComfyVAERoot, p.vae, p.largest_vae_tensor);
      have_vae = p.vae > 0;
      if (have_vae) vae = VAEConfig::detect_from_weights(*file, models::flux::kComfyVAERoot);
    } else {
      // A bare BFL transformer: the companions ComfyUI keeps beside it, when they are there.
      const fs::path dir = source.checkpoint->parent_path();
      for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (!ends_with(name, ".safetensors")) continue;
        if (!have_text && starts_with(name, "t5xxl")) {
          auto t5 = io::SafetensorsFile::open(e.path());
          count_weights(*t5, "", p.text_encoders, p.largest_text_tensor);
          t5_shapes(*t5, "", text);
          have_text = true;
        } else if (name == "clip_l.safetensors") {
          auto clip = io::SafetensorsFile::open(e.path());
          count_weights(*clip, "", p.text_encoders, p.largest_text_tensor);
          clip_shapes(*clip, text);
          have_clip = true;
        } else if (name == "ae.safetensors" && !source.vae) {
          auto ae = io::SafetensorsFile::open(e.path());
          count_weights(*ae, "", p.vae, p.largest_vae_tensor);
          vae = VAEConfig::detect_from_weights(*ae, "");
          have_vae = true;
        }
      }
    }
  } else {
    config.guidance_embeds = to_lower(source.name).find("schnell") == std::string::npos;
    transformer_from_config(config, p);
  }
  if (source.vae && fs::is_regular_file(*source.vae)) {
    auto file = io::SafetensorsFile::open(*source.vae);
    p.vae = p.largest_vae_tensor = 0;
    count_weights(*file, "", p.vae, p.largest_vae_tensor);
    vae = VAEConfig::detect_from_weights(*file, "");
    have_vae = true;
  }
  if (!have_text) {
    p.text_encoders += kT5Parameters;
    p.largest_text_tensor = std::max(p.largest_text_tensor, kT5LargestTensor);
  }
  if (!have_clip) {
    p.text_encoders += kClipParameters;
    p.largest_text_tensor = std::max(p.largest_text_tensor, kClipLargestTensor);
  }
  if (!have_vae) {
    p.vae = kVaeParameters;
    p.largest_vae_tensor = kVaeLargestTensor;
  }
  p.largest_text_linear = std::max(text.t5.ff * text.t5.width, 4 * text.clip_width * text.clip_width);
  // quantize_te converts Linears only: the token (and CLIP's position) embeddings keep the dtype.
  p.text_embeddings = text.t5.vocab * text.t5.width + (text.clip_vocab + text.clip_positions) * text.clip_width;
  return std::make_unique<FluxArchitecture>(std::move(config), std::move(vae), p, text);
}

}  // namespace lt::plan
