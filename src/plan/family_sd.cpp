// The planner's model of Stable Diffusion 1.x/2.x and SDXL: UNet2DConditionModel, AutoencoderKL
// and CLIP text encoders, as src/models/sd implements them. Shapes come from the checkpoint's
// header (UNetConfig/VAEConfig::detect_from_weights read names and shapes only) or a diffusers
// folder's config.json, else from the family's standard config.
//
// Activations are counted the way autograd holds them in this implementation (docs/plan.md):
// per ResnetBlock2D the GroupNorm/SiLU outputs and the time-embedding sum, per BasicTransformerBlock
// the LayerNorm outputs, q/k/v copies, the softmax probabilities (unless attention is chunked:
// BlockedAttention keeps q, k, v only), the GEGLU projection and the residual sums. Gradient
// checkpointing (resnets and transformer blocks) keeps each block's output (and a transformer
// block's blocked attention outputs and a resnet's convolution outputs on packed weights, which
// the recomputation takes back) and recomputes one block at a time in backward. The factors below
// are element counts of those tensors, checked against measured peaks
// (tests/plan/test_plan_accuracy.cpp, docs/benchmarks.md); none is fitted.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "architecture.h"
#include "autoencoder_kl.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/models/registry.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::plan {

namespace fs = std::filesystem;
using models::sd::UNetConfig;
using models::sd::VAEConfig;

namespace {

constexpr int64_t kContextTokens = 77;  // CLIP's sequence: the cross-attention keys

// Elements: what a block keeps for backward, what it needs on top while it runs (forward without
// gradients, or its backward), and its output.
struct BlockCost {
  int64_t saved = 0;      // kept for backward when not checkpointed
  int64_t transient = 0;  // extra while the block's backward (or no-grad forward) runs
  int64_t output = 0;     // the block's output (kept by the next block, and as a skip)
  int64_t fp32_copies = 0;  // LoRA's fp32 copies of its inputs (only when computing in 16 bits)
  int64_t kept = 0;         // kept besides the output when checkpointed (blocked attention, packed convolutions)
  bool checkpointed = false;
};

struct Tally {
  std::vector<BlockCost> blocks;
  int64_t skips = 0;  // down-path outputs held until the up path uses them (inference)
};

class SDArchitecture final : public Architecture {
 public:
  SDArchitecture(UNetConfig unet, VAEConfig vae, Parameters known, std::vector<int64_t> text_widths)
      : unet_(std::move(unet)), vae_(std::move(vae)), known_(known), text_widths_(std::move(text_widths)) {}

  Parameters parameters(const AdapterShape& adapter) const override;
  int64_t training_activations(const Shape& s, const Compute& c) const override;
  int64_t inference_activations(const Shape& s, const Compute& c) const override;
  int64_t vae_encode(const Shape& s, const Compute& c) const override;
  int64_t vae_decode(const Shape& s, const Compute& c) const override;
  int64_t text_encode(int64_t batch, const Compute& c) const override;
  int64_t text_embedding_elements() const override {
    int64_t n = 0;
    for (int64_t width : text_widths_) n += kContextTokens * width + width;  // hidden states (+ SDXL's pooled)
    return n;
  }
  // From the VAE's levels (SD's VAE: 8), as the trainer's traits.
  int latent_downscale() const override { return static_cast<int>(vae_.downscale_factor()); }
  int bucket_divisibility() const override { return 2 * latent_downscale(); }

 private:
  Tally walk_unet(const Shape& s, const Compute& c, bool training) const;
  BlockCost resnet(int64_t b, int64_t cin, int64_t cout, int64_t hw, bool concat_input, const Compute& comp) const;
  std::vector<BlockCost> transformer(int64_t b, size_t level, int64_t c, int64_t hw, const Compute& comp,
                                     bool training) const;

  UNetConfig unet_;
  VAEConfig vae_;
  Parameters known_;  // base counts from the header (adapter counts are computed)
  std::vector<int64_t> text_widths_;
};

BlockCost SDArchitecture::resnet(int64_t b, int64_t cin, int64_t cout, int64_t hw, bool concat_input,
                                 const Compute& comp) const {
  const int64_t n_in = b * cin * hw, n_out = b * cout * hw;
  BlockCost r;
  // norm1 and SiLU outputs (in channels), the time-embedding sum, norm2 and SiLU outputs.
  r.saved = 2 * n_in + 3 * n_out + (concat_input ? n_in : 0);
  r.transient = 2 * std::max(n_in, n_out);
  r.output = n_out;
  // Checkpointed, the two 3x3 convolutions' outputs stay until the resnet's backward when they run
  // on packed weights (the recomputation takes them back).
  r.kept = comp.packed_convolutions() ? 2 * n_out : 0;
  r.checkpointed = true;
  return r;
}

std::vector<BlockCost> SDArchitecture::transformer(int64_t b, size_t level, int64_t c, int64_t hw,
                                                   const Compute& comp, bool training) const {
  const int64_t heads = unet_.attention_head_dim.at(level);
  const int64_t depth = unet_.transformer_layers_per_block.at(level);
  const int64_t n = b * hw * c;
  const int64_t block_rows = comp.query_block(hw);
  const bool chunked = block_rows > 0 && block_rows < hw;
  const int64_t cross_rows = comp.query_block(hw, kContextTokens);
  const bool cross_chunked = cross_rows > 0 && cross_rows < hw;
  const int64_t probs_self = b * heads * hw * hw;
  const int64_t probs_cross = b * heads * hw * kContextTokens;
  // A chunked attention holds one block of scores (and in backward its gradient) per thread.
  const int64_t chunk_work = int64_t(std::max(1, comp.threads)) * block_rows * hw * 2;
  const int64_t rank_wide = b * hw * comp.adapter_rank;

  std::vector<BlockCost> out;
  BlockCost proj;  // GroupNorm output, the token layout of proj_in's output and proj_out's input
  proj.saved = 3 * n;
  proj.transient = 2 * n;
  proj.output = n;
  proj.fp32_copies = 2 * n;
  for (int64_t i = 0; i < depth; ++i) {
    BlockCost blk;
    // LayerNorm outputs 3n; the batched products' copies of q, k, v (self) and q (cross) 4n; the
    // head-merged attention outputs 2n; the two inner residual sums 2n; the GEGLU projection 8n
    // (its gate half keeps all of it), its GELU and product 4n + 4n; the probabilities unless
    // chunked (then q, k, v are what BlockedAttention keeps: the same 3n).
    blk.saved = 27 * n + (chunked ? 0 : probs_self) + probs_cross + 2 * b * kContextTokens * c + 10 * rank_wide;
    const int64_t attention_work = chunked ? chunk_work : 2 * probs_self;
    blk.transient = training ? std::max<int64_t>(attention_work, 12 * n) : std::max<int64_t>(attention_work + 4 * n, 16 * n);
    blk.output = n;
    // LoRA's fp32 copy of each adapted Linear's input: q, k, v, out (self), q, out (cross), and
    // the GEGLU projection's and the output Linear's (4n) inputs.
    blk.fp32_copies = 11 * n;
    // Checkpointed, each blocked attention's output (n) stays until the block's backward.
    blk.kept = (chunked ? n : 0) + (cross_chunked ? n : 0);
    blk.checkpointed = true;
    out.push_back(blk);
  }
  out.push_back(proj);
  return out;
}

Tally SDArchitecture::walk_unet(const Shape& s, const Compute& comp, bool training) const {
  Tally t;
  const int64_t b = s.batch;
  int64_t h = std::max<int64_t>(1, s.height / latent_downscale());
  int64_t w = std::max<int64_t>(1, s.width / latent_downscale());
  const size_t levels = unet_.num_blocks();
  const auto& ch = unet_.block_out_channels;
  std::vector<std::pair<int64_t, int64_t>> skips;  // channels, hw
  // conv_in
  BlockCost conv_in;
  conv_in.output = b * ch[0] * h * w;
  t.blocks.push_back(conv_in);
  skips.push_back({ch[0], h * w});
  int64_t prev = ch[0];
  for (size_t i = 0; i < levels; ++i) {
    for (int64_t r = 0; r < unet_.layers_per_block.at(i); ++r) {
      t.blocks.push_back(resnet(b, prev, ch[i], h * w, false, comp));
      prev = ch[i];
      if (unet_.down_has_attention(i)) {
        for (const auto& blk : transformer(b, i, ch[i], h * w, comp, training)) t.blocks.push_back(blk);
      }
      skips.push_back({ch[i], h * w});
    }
    if (i + 1 < levels) {
      h = std::max<int64_t>(1, (h + 1) / 2);
      w = std::max<int64_t>(1, (w + 1) / 2);
      BlockCost down;
      down.output = b * ch[i] * h * w;
      t.blocks.push_back(down);
      skips.push_back({ch[i], h * w});
    }
  }
  // mid: resnet, attention, resnet
  t.blocks.push_back(resnet(b, prev, prev, h * w, false, comp));
  for (const auto& blk : transformer(b, levels - 1, prev, h * w, comp, training)) t.blocks.push_back(blk);
  t.blocks.push_back(resnet(b, prev, prev, h * w, false, comp));
  for (const auto& [c, hw] : skips) t.skips += b * c * hw;
  // up path: reversed levels, layers + 1 resnets each on the concatenated skip
  for (size_t j = 0; j < levels; ++j) {
    const size_t level = levels - 1 - j;
    for (int64_t r = 0; r <= unet_.layers_per_block.at(level); ++r) {
      const int64_t skip_channels = skips.back().first;
      skips.pop_back();
      t.blocks.push_back(resnet(b, prev + skip_channels, ch[level], h * w, true, comp));
      prev = ch[level];
      if (unet_.up_has_attention(j)) {
        for (const auto& blk : transformer(b, level, ch[level], h * w, comp, training)) t.blocks.push_back(blk);
      }
    }
    if (j + 1 < levels) {
      h *= 2;
      w *= 2;
      BlockCost up;  // nearest-neighbour upsample, then its conv
      up.saved = b * prev * h * w;
      up.transient = b * prev * h * w;
      up.output = b * prev * h * w;
      t.blocks.push_back(up);
    }
  }
  BlockCost out;  // conv_norm_out, SiLU, conv_out
  out.saved = 2 * b * ch[0] * h * w;
  out.transient = 2 * b * ch[0] * h * w;
  out.output = b * unet_.out_channels * h * w;
  t.blocks.push_back(out);
  return t;
}

Parameters SDArchitecture::parameters(const AdapterShape& adapter) const {
  Parameters p = known_;
  p.adapter = 0;
  p.adapter_modules = 0;
  const int64_t r = adapter.linear_rank;
  auto add_module = [&](int64_t in, int64_t out, int64_t k, int64_t rank) {
    p.adapter += adapter_module_parameters(adapter, in, out, k, rank);
    p.adapter_modules += 1;
  };
  auto add = [&](int64_t in, int64_t out, int64_t rank) { add_module(in, out, 1, rank); };
  // Transformer2DModel's Linear layers (and 1x1 proj_in/proj_out): at every attention of the
  // down path, the mid block and the up path.
  auto transformer_modules = [&](size_t level, int64_t c) {
    const int64_t ctx = unet_.cross_attention_dim.at(level);
    add(c, c, r);  // proj_in
    add(c, c, r);  // proj_out
    for (int64_t i = 0; i < unet_.transformer_layers_per_block.at(level); ++i) {
      for (int k = 0; k < 4; ++k) add(c, c, r);  // attn1 q, k, v, out
      add(c, c, r);                              // attn2 q
      add(ctx, c, r);                            // attn2 k
      add(ctx, c, r);                            // attn2 v
      add(c, c, r);                              // attn2 out
      add(c, 8 * c, r);                          // GEGLU proj
      add(4 * c, c, r);                          // ff out
    }
  };
  const size_t levels = unet_.num_blocks();
  const auto& ch = unet_.block_out_channels;
  for (size_t i = 0; i < levels; ++i) {
    if (unet_.down_has_attention(i)) {
      for (int64_t k = 0; k < unet_.layers_per_block.at(i); ++k) transformer_modules(i, ch[i]);
    }
    if (unet_.up_has_attention(levels - 1 - i)) {
      for (int64_t k = 0; k <= unet_.layers_per_block.at(i); ++k) transformer_modules(i, ch[i]);
    }
  }
  transformer_modules(levels - 1, ch.back());
  // AI Toolkit's full-rank LoKr adapts the convs too (the trainer sets the conv rank to the linear one).
  const int64_t cr = adapter.conv_rank > 0 ? adapter.conv_rank : (adapter.type == "lokr" && adapter.lokr_full_rank ? r : 0);
  if (cr > 0) {
    // kohya's conv targets, walked as the UNet is built: every ResnetBlock2D (3x3 conv1 and conv2 at the
    // conv rank, its time_emb_proj and a 1x1 conv_shortcut where the channels change at the linear rank),
    // every Downsample2D / Upsample2D conv.
    const int64_t temb = ch[0] * 4;
    auto resnet = [&](int64_t in, int64_t out) {
      add_module(in, out, 3, cr);
      add_module(out, out, 3, cr);
      add(temb, out, r);
      if (in != out) add(in, out, r);
    };
    std::vector<int64_t> skips = {ch[0]};
    int64_t prev = ch[0];
    for (size_t i = 0; i < levels; ++i) {
      for (int64_t k = 0; k < unet_.layers_per_block.at(i); ++k) {
        resnet(prev, ch[i]);
        prev = ch[i];
        skips.push_back(prev);
      }
      if (i + 1 < levels) {
        add_module(prev, prev, 3, cr);  // downsampler
        skips.push_back(prev);
      }
    }
    resnet(prev, prev);  // mid block
    resnet(prev, prev);
    for (size_t j = 0; j < levels; ++j) {
      const size_t level = levels - 1 - j;
      for (int64_t k = 0; k <= unet_.layers_per_block.at(level); ++k) {
        const int64_t skip = skips.back();
        skips.pop_back();
        resnet(prev + skip, ch[level]);
        prev = ch[level];
      }
      if (j + 1 < levels) add_module(prev, prev, 3, cr);  // upsampler
    }
  }
  return p;
}

int64_t SDArchitecture::training_activations(const Shape& s, const Compute& c) const {
  const Tally t = walk_unet(s, c, true);
  const int64_t copy_bytes = c.bytes < 4 ? 4 : 0;  // LoRA computes in fp32
  int64_t boundary = 0, saved = 0, worst_block = 0, worst_transient = 0;
  for (const BlockCost& b : t.blocks) {
    const int64_t block_bytes = (b.saved + b.output) * c.bytes + b.fp32_copies * copy_bytes;
    if (c.checkpointing && b.checkpointed) {
      boundary += (b.output + b.kept) * c.bytes;
      worst_block = std::max(worst_block, block_bytes + b.transient * c.bytes);
    } else {
      saved += block_bytes;
      worst_transient = std::max(worst_transient, b.transient * c.bytes);
    }
  }
  return boundary + saved + std::max(worst_block, worst_transient);
}

int64_t SDArchitecture::inference_activations(const Shape& s, const Compute& c) const {
  const Tally t = walk_unet(s, c, false);
  int64_t worst = 0;
  for (const BlockCost& b : t.blocks) worst = std::max(worst, (b.transient + 2 * b.output) * c.bytes);
  return t.skips * c.bytes + worst;
}

int64_t SDArchitecture::vae_encode(const Shape& s, const Compute& c) const { return autoencoder_kl_encode(vae_, s, c); }

int64_t SDArchitecture::vae_decode(const Shape& s, const Compute& c) const { return autoencoder_kl_decode(vae_, s, c); }

int64_t SDArchitecture::text_encode(int64_t batch, const Compute& c) const {
  int64_t worst = 0;
  for (int64_t width : text_widths_) {
    const int64_t heads = std::max<int64_t>(1, width / 64);
    worst = std::max(worst, batch * (8 * kContextTokens * width + 2 * heads * kContextTokens * kContextTokens));
  }
  return worst * c.bytes;
}

// Parameter counts from a checkpoint's headers: per component, and the Linear weights (2-D
// `.weight` tensors) of the denoiser.
struct Counted {
  Parameters params;
  std::vector<int64_t> text_widths;
};

void count_file(const io::SafetensorsFile& file, const models::Detection& d, Counted& out) {
  std::map<std::string, std::string> prefix_to_component;
  for (const auto& c : d.components) prefix_to_component[c.prefix] = c.name;
  for (const auto& t : file.tensors()) {
    // The longest component prefix the tensor starts with.
    std::string component;
    size_t best = 0;
    for (const auto& [prefix, name] : prefix_to_component) {
      if (starts_with(t.name, prefix) && prefix.size() >= best) {
        best = prefix.size();
        component = name;
      }
    }
    int64_t n = 1;
    for (int64_t v : t.shape) n *= v;
    if (component == "unet") {
      out.params.largest_denoiser_tensor = std::max(out.params.largest_denoiser_tensor, n);
      out.params.denoiser += n;
      if (t.shape.size() == 2 && ends_with(t.name, ".weight")) {
        out.params.denoiser_linear += n;
        out.params.largest_denoiser_linear = std::max(out.params.largest_denoiser_linear, n);
      }
      // The downsamplers (diffusers' downsamplers.0.conv, the original layout's op) have stride 2.
      if (t.shape.size() == 4 && ends_with(t.name, ".weight") && t.name.find("downsamplers") == std::string::npos &&
          !ends_with(t.name, ".op.weight")) {
        if (t.shape[2] != 1 || t.shape[3] != 1) out.params.denoiser_packed_conv += n;  // 1x1: matrix products
      }
    } else if (starts_with(component, "text_encoder")) {
      out.params.text_encoders += n;
      out.params.largest_text_tensor = std::max(out.params.largest_text_tensor, n);
      if (ends_with(t.name, "token_embedding.weight") && t.shape.size() == 2) out.text_widths.push_back(t.shape[1]);
      if (t.shape.size() == 2 && !ends_with(t.name, "embedding.weight")) {
        out.params.largest_text_linear = std::max(out.params.largest_text_linear, n);
      }
      if (ends_with(t.name, "embedding.weight") || ends_with(t.name, "positional_embedding")) {
        out.params.text_embeddings += n;
      }
    } else if (component == "vae") {
      out.params.vae += n;
      out.params.largest_vae_tensor = std::max(out.params.largest_vae_tensor, n);
    }
  }
}

}  // namespace

std::unique_ptr<Architecture> make_sd_architecture(const ModelSource& source) {
  const bool xl = source.family == playbook::ModelFamily::kSDXL;
  UNetConfig unet = xl ? UNetConfig::sdxl() : UNetConfig::sd15();
  VAEConfig vae = xl ? VAEConfig::sdxl() : VAEConfig::sd();
  Counted counted;
  if (source.checkpoint && fs::is_directory(*source.checkpoint)) {
    const fs::path& dir = *source.checkpoint;
    unet = UNetConfig::from_json(models::sd::read_component_config(dir / "unet"));
    vae = VAEConfig::from_json(models::sd::read_component_config(dir / "vae"));
    for (const char* component : {"unet", "vae", "text_encoder", "text_encoder_2"}) {
      if (!fs::exists(dir / component)) continue;
      auto file = io::SafetensorsFile::open(models::sd::diffusers_component_weights(dir / component));
      models::Detection d;
      d.components.push_back({component, "", 0, 0, {}});
      count_file(*file, d, counted);
    }
  } else if (source.checkpoint) {
    auto file = io::SafetensorsFile::open(*source.checkpoint);
    const models::Detection d = models::detect_checkpoint(*file);
    unet = UNetConfig::detect_from_weights(*file, "model.diffusion_model.");
    vae = VAEConfig::detect_from_weights(*file, "first_stage_model.");
    count_file(*file, d, counted);
  } else {
    // The released checkpoints' parameter counts (diffusers' UNet2DConditionModel, AutoencoderKL
    // and CLIP/OpenCLIP text towers of SD 1.5, SD 2.1 and SDXL base 1.0).
    const bool sd2 = source.family == playbook::ModelFamily::kSD2;
    counted.params.denoiser = xl ? 2567463684 : sd2 ? 865910724 : 859520964;
    counted.params.text_encoders = xl ? 123060480 + 694659840 : sd2 ? 340387840 : 123060480;
    counted.params.vae = 83653863;
    counted.text_widths = xl ? std::vector<int64_t>{768, 1280} : sd2 ? std::vector<int64_t>{1024} : std::vector<int64_t>{768};
    // The largest tensors: the up path's first convolutions (1280 x 2560 x 3 x 3), the last text
    // encoder's token embedding (49408 tokens), the VAE decoder's 512 x 512 x 3 x 3 convolutions.
    counted.params.largest_denoiser_tensor = 1280 * 2560 * 9;
    counted.params.largest_denoiser_linear = 1280 * 10240;  // the GEGLU projection of the widest blocks
    // Their stride-1 convolutions (diffusers' UNet2DConditionModel with these configs).
    // Their stride-1 convolutions but the 1x1 ones (all: 328,624,640 / 544,893,440 / 569,674,240; of
    // those 1x1, the resnets' shortcuts and SD 1.5's proj_in/proj_out: 13,414,400 / 23,244,800 /
    // 48,025,600).
    counted.params.denoiser_packed_conv = xl ? 315210240 : sd2 ? 521648640 : 521648640;
    counted.params.largest_text_tensor = 49408 * counted.text_widths.back();
    counted.params.largest_text_linear = 4 * counted.text_widths.back() * counted.text_widths.back();  // the MLP's fc1
    for (int64_t width : counted.text_widths) counted.params.text_embeddings += (49408 + 77) * width;
    counted.params.largest_vae_tensor = 512 * 512 * 9;
    if (sd2) {
      unet.attention_head_dim = {5, 10, 20, 20};
      unet.cross_attention_dim.assign(unet.num_blocks(), 1024);
      unet.use_linear_projection = true;
    }
  }
  if (source.vae) {
    auto file = io::SafetensorsFile::open(*source.vae);
    vae = VAEConfig::detect_from_weights(*file, "");
    counted.params.vae = 0;
    counted.params.largest_vae_tensor = 0;
    for (const auto& t : file->tensors()) {
      int64_t n = 1;
      for (int64_t v : t.shape) n *= v;
      counted.params.vae += n;
      counted.params.largest_vae_tensor = std::max(counted.params.largest_vae_tensor, n);
    }
  }
  if (counted.params.denoiser_linear == 0) {
    // Without a header: the transformer Linear weights, counted from the config.
    int64_t linear = 0;
    const auto& ch = unet.block_out_channels;
    auto per_attention = [&](size_t level) {
      const int64_t c = ch[level], ctx = unet.cross_attention_dim.at(level);
      return unet.transformer_layers_per_block.at(level) * (18 * c * c + 2 * ctx * c) +
             (unet.use_linear_projection ? 2 * c * c : 0);
    };
    for (size_t i = 0; i < unet.num_blocks(); ++i) {
      if (unet.down_has_attention(i)) linear += unet.layers_per_block.at(i) * per_attention(i);
      if (unet.up_has_attention(unet.num_blocks() - 1 - i)) linear += (unet.layers_per_block.at(i) + 1) * per_attention(i);
    }
    counted.params.denoiser_linear = linear + per_attention(unet.num_blocks() - 1);
  }
  if (counted.text_widths.empty()) counted.text_widths.push_back(unet.cross_attention_dim.at(0));
  return std::make_unique<SDArchitecture>(std::move(unet), std::move(vae), counted.params, counted.text_widths);
}

}  // namespace lt::plan
