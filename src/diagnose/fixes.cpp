// Playbook §2/§3 as code: which levers, in which order, for which phase and model kind, and how
// each trainer spells them. AI Toolkit's YAML keys are lora-train's keys too (DESIGN.md: one
// vocabulary), so an unknown trainer gets those.
#include "loratrain/diagnose/fixes.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>

#include "guard_ladder.h"
#include "loratrain/util/strings.h"

namespace lt::diagnose {
namespace {

// lora-train shares AI Toolkit's keys (every `default:` below) and adds its own memory levers.
enum class Vocab { kAiToolkit, kLoraTrain, kKohya, kMusubi, kDiffusionPipe, kDiffusers, kOneTrainer, kSimpleTuner, kComfyUI, kXFlux };

Vocab vocab_for(Trainer t) {
  switch (t) {
    case Trainer::kKohya: return Vocab::kKohya;
    case Trainer::kMusubi: return Vocab::kMusubi;
    case Trainer::kDiffusionPipe: return Vocab::kDiffusionPipe;
    case Trainer::kDiffusers: return Vocab::kDiffusers;
    case Trainer::kOneTrainer: return Vocab::kOneTrainer;
    case Trainer::kSimpleTuner: return Vocab::kSimpleTuner;
    case Trainer::kComfyUI: return Vocab::kComfyUI;
    case Trainer::kXFlux: return Vocab::kXFlux;
    case Trainer::kLoraTrain: return Vocab::kLoraTrain;
    default: return Vocab::kAiToolkit;  // AI Toolkit, unknown
  }
}

std::string join_ints(const std::vector<int>& v) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  o << ']';
  return o.str();
}

// The resolution list without its largest entry; for a single value the next smaller standard one.
std::vector<int> without_largest(const Settings& s) {
  std::vector<int> r = s.resolutions;
  if (r.size() >= 2) {
    r.pop_back();
    return r;
  }
  int top = s.max_resolution.value_or(r.empty() ? 0 : r.back());
  if (top > 1024) return {1024};
  if (top > 768) return {768};
  if (top > 512) return {512};
  return {};
}

struct Ctx {
  const Diagnosis& d;
  Vocab v;
  const Settings& s;
  bool video;
  bool dit;  // transformer family (flux, sd3, wan, ...): block swap / fp8 base apply
};

Fix allocator_fix(const Ctx& c) {
  Fix f;
  f.id = "allocator_config";
  bool modern = c.d.memory.new_format;
  std::string value = modern ? "expandable_segments:True" : "max_split_size_mb:128,garbage_collection_threshold:0.8";
  f.setting = "PYTORCH_CUDA_ALLOC_CONF=" + value;
  f.value = value;
  std::string ru = c.d.memory.reserved_unallocated ? format_bytes(*c.d.memory.reserved_unallocated) : "";
  f.description = "Memory is fragmented (" + ru +
                  " reserved by PyTorch but unallocated): set the allocator environment variable before launching; "
                  "the config can stay as it is.";
  return f;
}

Fix free_gpu_fix(const Ctx&) {
  Fix f;
  f.id = "free_gpu";
  f.setting = "nvidia-smi: stop other processes on the GPU, or start on a clean worker/GPU";
  f.description = "The GPU is held by something else (other processes or a dirty worker): stop retrying the same "
                  "run, free the GPU or move to a clean worker; escalate if a config that worked before now fails "
                  "at once.";
  return f;
}

Fix pin_memory_fix(const Ctx& c) {
  Fix f;
  f.id = "disable_pin_memory";
  switch (c.v) {
    case Vocab::kMusubi: f.setting = "remove --use_pinned_memory_for_block_swap"; break;
    case Vocab::kOneTrainer: f.setting = "lower \"layer_offload_fraction\" (offloaded layers are pinned)"; break;
    default: f.setting = "turn off pinned memory (DataLoader pin_memory, pinned offloading), or raise memory= in .wslconfig"; break;
  }
  f.description = "The failed allocation was pinned host memory, which WSL/Windows cap: pin less, or give WSL more "
                  "memory. GPU memory is not the problem.";
  return f;
}

Fix gc_fix(const Ctx& c, bool with_resolution) {
  Fix f;
  f.id = with_resolution ? "checkpointing_and_resolution" : "gradient_checkpointing";
  f.config_key = "train.gradient_checkpointing";
  f.value = "true";
  switch (c.v) {
    case Vocab::kKohya:
    case Vocab::kMusubi:
    case Vocab::kDiffusers:
    case Vocab::kSimpleTuner: f.setting = "--gradient_checkpointing"; break;
    case Vocab::kDiffusionPipe: f.setting = "activation_checkpointing = true"; break;
    case Vocab::kOneTrainer: f.setting = "\"gradient_checkpointing\": \"ON\" (training tab: Gradient checkpointing ON)"; break;
    case Vocab::kComfyUI: f.setting = "training node input gradient_checkpointing = true"; break;
    // x-flux: src/flux/model.py supports it, train_flux_lora_deepspeed.py never turns it on.
    case Vocab::kXFlux: f.setting = "dit.gradient_checkpointing = True after get_models() in train_flux_lora_deepspeed.py (no config key)"; break;
    default: f.setting = "train.gradient_checkpointing: true"; break;
  }
  f.description = "Recompute activations in the backward pass instead of storing them (-60..70% activation memory, "
                  "+20..30% time).";
  if (with_resolution) {
    std::vector<int> lower = without_largest(c.s);
    std::string res = lower.empty() ? "512" : std::to_string(lower.back());
    f.setting += c.v == Vocab::kAiToolkit || c.v == Vocab::kLoraTrain ? "  and  datasets[].resolution: " + (lower.empty() ? "[512]" : join_ints(lower))
                                         : "  and a lower resolution (" + res + ")";
    f.description = "It died on step 1: the forward pass fits, the gradients do not. Turn on gradient checkpointing "
                    "and lower the resolution together.";
  }
  return f;
}

Fix batch_fix(const Ctx& c) {
  Fix f;
  f.id = "batch_size_1";
  int old = c.s.batch_size.value_or(0);
  int accum = old > 1 ? old * c.s.gradient_accumulation.value_or(1) : 4;
  std::string n = std::to_string(accum);
  f.config_key = "train.batch_size";
  f.value = "1";
  switch (c.v) {
    case Vocab::kKohya: f.setting = "--train_batch_size 1 --gradient_accumulation_steps " + n + " (or batch_size = 1 in the dataset TOML)"; break;
    case Vocab::kMusubi: f.setting = "dataset config: batch_size = 1, and --gradient_accumulation_steps " + n; break;
    case Vocab::kDiffusers:
    case Vocab::kSimpleTuner: f.setting = "--train_batch_size 1 --gradient_accumulation_steps " + n; break;
    case Vocab::kDiffusionPipe: f.setting = "micro_batch_size_per_gpu = 1, gradient_accumulation_steps = " + n; break;
    case Vocab::kOneTrainer: f.setting = "\"batch_size\": 1, \"gradient_accumulation_steps\": " + n; break;
    case Vocab::kComfyUI: f.setting = "training node inputs batch_size = 1, grad_accumulation_steps = " + n; break;
    case Vocab::kXFlux: f.setting = "train_batch_size: 1 (and data_config.train_batch_size: 1), gradient_accumulation_steps: " + n; break;
    default: f.setting = "train.batch_size: 1, train.gradient_accumulation_steps: " + n; break;
  }
  f.description = "Batch size multiplies activation memory; batch 1 with gradient accumulation " + n +
                  " keeps the effective batch.";
  return f;
}

Fix bucket_fix(const Ctx& c) {
  Fix f;
  f.id = "remove_largest_bucket";
  std::vector<int> lower = without_largest(c.s);
  std::string list = lower.empty() ? "[512, 768]" : join_ints(lower);
  std::string top = lower.empty() ? "768" : std::to_string(lower.back());
  f.config_key = "datasets[].resolution";
  f.value = list;
  switch (c.v) {
    case Vocab::kKohya: f.setting = "--max_bucket_reso " + top + " (or --resolution " + top + "," + top + " / resolution = " + top + " in the dataset TOML)"; break;
    case Vocab::kMusubi: f.setting = "dataset config: resolution = [" + top + ", " + top + "] (a smaller bucket area)"; break;
    case Vocab::kDiffusers:
    case Vocab::kSimpleTuner: f.setting = "--resolution " + top; break;
    case Vocab::kDiffusionPipe: f.setting = "dataset.toml: resolutions = " + list; break;
    case Vocab::kOneTrainer: f.setting = "\"resolution\": \"" + top + "\""; break;
    case Vocab::kComfyUI: f.setting = "feed images of at most " + top + " px to the training node"; break;
    case Vocab::kXFlux: f.setting = "data_config.img_size: " + top; break;
    default: f.setting = "datasets[].resolution: " + list; break;
  }
  f.description = "Remove the largest resolution bucket (1536/1024 first, keep 512/768): activation memory grows "
                  "with pixel count (512 -> 1024 is x4).";
  return f;
}

Fix frames_fix(const Ctx& c) {
  Fix f;
  f.id = "num_frames";
  int cur = c.s.num_frames.value_or(0);
  int next = cur > 1 ? lower_frames(cur) : 0;
  std::string n = next > 0 ? std::to_string(next) : "fewer (e.g. 81 -> 41)";
  f.config_key = "datasets[].num_frames";
  f.value = next > 0 ? std::to_string(next) : "";
  switch (c.v) {
    case Vocab::kMusubi: f.setting = "dataset config: target_frames / max_frames <= " + n + " (keep 4k+1)"; break;
    case Vocab::kDiffusionPipe: f.setting = "dataset.toml: frame_buckets with at most " + n + " frames"; break;
    case Vocab::kOneTrainer: f.setting = "\"frames\": " + n; break;
    default: f.setting = "datasets[].num_frames: " + n + " (and sample.num_frames)"; break;
  }
  f.description = "For video models the number of frames is the biggest memory lever: lower it first (dataset and "
                  "sample), then batch, then resolution.";
  return f;
}

Fix skip_baseline_fix(const Ctx& c) {
  Fix f;
  f.id = "skip_baseline_sample";
  f.config_key = "train.skip_first_sample";
  f.value = "true";
  switch (c.v) {
    case Vocab::kKohya:
    case Vocab::kMusubi: f.setting = "remove --sample_at_first"; break;
    case Vocab::kSimpleTuner: f.setting = "do not validate on startup (remove --validation_on_startup)"; break;
    case Vocab::kDiffusers: f.setting = "drop --validation_prompt for the first run"; break;
    case Vocab::kOneTrainer: f.setting = "disable \"sample on start\" / remove the samples"; break;
    default: f.setting = "train.skip_first_sample: true"; break;
  }
  f.description = "Skip the preview generated before training: it already does not fit with the model loaded.";
  return f;
}

Fix shrink_sampling_fix(const Ctx& c) {
  Fix f;
  f.id = "shrink_sampling";
  int w = c.s.sample_width.value_or(1024), h = c.s.sample_height.value_or(1024);
  int nw = std::min(w, 512), nh = std::min(h, 512);
  int steps = std::min(c.s.sample_steps.value_or(20), 20);
  int every = c.s.sample_every.value_or(250) * 2;
  f.config_key = "sample.width";
  f.value = std::to_string(nw);
  switch (c.v) {
    case Vocab::kKohya:
    case Vocab::kMusubi:
      f.setting = "--sample_every_n_steps " + std::to_string(every) + ", and --w " + std::to_string(nw) + " --h " +
                  std::to_string(nh) + (c.video ? " --f 17" : "") + " --s " + std::to_string(steps) + " in the prompt file";
      break;
    case Vocab::kDiffusers: f.setting = "--num_validation_images 1 and a larger --validation_epochs"; break;
    case Vocab::kSimpleTuner:
      f.setting = "--validation_resolution " + std::to_string(nw) + " --validation_num_inference_steps " +
                  std::to_string(steps) + " and a larger --validation_steps";
      break;
    case Vocab::kOneTrainer: f.setting = "smaller sample width/height, larger \"sample_after\""; break;
    case Vocab::kXFlux:
      f.setting = "sample_width: " + std::to_string(nw) + ", sample_height: " + std::to_string(nh) +
                  ", sample_steps: " + std::to_string(steps) + ", sample_every: " + std::to_string(every);
      break;
    default:
      f.setting = "sample.width: " + std::to_string(nw) + ", sample.height: " + std::to_string(nh) +
                  ", sample.sample_steps: " + std::to_string(steps) + ", sample.sample_every: " + std::to_string(every) +
                  (c.video ? ", sample.num_frames: 17" : "");
      break;
  }
  f.description = "Make previews cheaper: smaller width/height, fewer sample steps (and frames), less often.";
  return f;
}

Fix disable_sampling_fix(const Ctx& c) {
  Fix f;
  f.id = "disable_sampling";
  f.config_key = "train.disable_sampling";
  f.value = "true";
  switch (c.v) {
    case Vocab::kKohya:
    case Vocab::kMusubi: f.setting = "remove --sample_prompts / --sample_every_n_steps"; break;
    case Vocab::kDiffusers: f.setting = "drop --validation_prompt"; break;
    case Vocab::kSimpleTuner: f.setting = "--validation_disable"; break;
    case Vocab::kOneTrainer: f.setting = "remove the sample definitions"; break;
    case Vocab::kXFlux: f.setting = "disable_sampling: true"; break;
    default: f.setting = "train.disable_sampling: true"; break;
  }
  f.description = "Train without previews to prove the run fits; re-enable smaller previews afterwards.";
  return f;
}

Fix low_vram_fix(const Ctx& c) {
  Fix f;
  f.id = "low_vram";
  f.config_key = "model.low_vram";
  f.value = "true";
  bool q = c.s.quantize.value_or(false);
  switch (c.v) {
    case Vocab::kKohya:
      f.setting = c.dit ? "--fp8_base --blocks_to_swap 18 --cache_text_encoder_outputs --cache_latents"
                        : "--cache_latents --cache_text_encoder_outputs --network_train_unet_only";
      break;
    case Vocab::kMusubi: f.setting = "--fp8_base --fp8_scaled --blocks_to_swap 20 (and --fp8_llm / --fp8_t5 when caching)"; break;
    case Vocab::kDiffusers: f.setting = "--cache_latents --offload (or a 4-bit base with --bnb_quantization_config_path)"; break;
    case Vocab::kSimpleTuner: f.setting = "--base_model_precision int8-quanto --quantize_via cpu"; break;
    case Vocab::kDiffusionPipe: f.setting = "[model] transformer_dtype = 'float8' and blocks_to_swap = 20"; break;
    case Vocab::kOneTrainer: f.setting = "\"layer_offload_fraction\": 0.5 and a float8 transformer/unet weight data type"; break;
    case Vocab::kComfyUI: f.setting = "load the model in fp8 (weight_dtype fp8_e4m3fn) and enable offloading in the training node"; break;
    case Vocab::kXFlux: f.setting = "accelerate config: DeepSpeed ZeRO-2 with offload_optimizer_device cpu (x-flux has no fp8/offload option of its own)"; break;
    default:
      f.setting = q ? "model.low_vram: true" : "model.low_vram: true, model.quantize: true, model.quantize_te: true";
      break;
  }
  f.description = "The model's low-memory path: quantized/fp8 base, text encoder and VAE off the GPU, block "
                  "offloading.";
  // Caching latents / text embeddings runs the VAE and text encoders alone: their batch and tiling.
  if (c.d.stage == Stage::kCaching) {
    switch (c.v) {
      // sd-scripts: library/train_util.py --vae_batch_size, --text_encoder_batch_size.
      case Vocab::kKohya:
        f.setting = std::string(c.dit ? "--fp8_base (text encoders in fp8 too) " : "") +
                    "--vae_batch_size 1 --text_encoder_batch_size 1 (and --cache_latents_to_disk)";
        break;
      // musubi-tuner: cache_latents.py --batch_size, --vae_tiling, --vae_chunk_size;
      // cache_text_encoder_outputs.py --batch_size and the fp8 text encoder flags.
      case Vocab::kMusubi:
        f.setting = "cache_latents.py --batch_size 1 --vae_tiling --vae_chunk_size 32; cache_text_encoder_outputs.py "
                    "--batch_size 1 with --fp8_llm / --fp8_t5";
        break;
      // lora-train's cache ladder: the VAE alone on the device; the denoiser is never quantized for
      // an encoder's failure (src/memory/ladder.cpp).
      case Vocab::kLoraTrain:
        f.setting = "model.low_vram: true";
        f.description = "The VAE alone on the device while it encodes (text encoder off it); exact.";
        break;
      default: break;
    }
    if (c.v == Vocab::kKohya || c.v == Vocab::kMusubi)
      f.description = "Caching runs the VAE and text encoders on the GPU: encode one item at a time, tile the VAE, "
                      "keep the text encoders in fp8.";
  }
  return f;
}

// lora-train's attention is always memory-efficient (train.sdp / train.xformers are accepted and
// do nothing); its lever is computing it in query chunks, exact, the guard's first rung
// (src/memory/ladder.cpp kGuardAttentionChunk). sd-scripts: --sdpa / --xformers / --mem_eff_attn
// (library/train_util.py replace_unet_modules; the DiT scripts always use SDPA).
Fix attention_fix(const Ctx& c) {
  Fix f;
  f.id = "memory_efficient_attention";
  switch (c.v) {
    case Vocab::kLoraTrain: f.setting = "memory.attention_chunk: 1024"; break;
    case Vocab::kKohya: f.setting = "--sdpa (or --xformers / --mem_eff_attn)"; break;
    case Vocab::kMusubi: f.setting = "--sdpa (or --xformers --split_attn)"; break;
    case Vocab::kDiffusers: f.setting = "--enable_xformers_memory_efficient_attention"; break;
    default: f.setting = "train.sdp: true (or train.xformers: true)"; break;
  }
  f.config_key = "memory.attention_chunk";
  f.value = "1024";
  f.description = c.v == Vocab::kLoraTrain
                      ? "Compute attention 1024 query rows at a time (recomputed per chunk in backward): only one "
                        "chunk's scores exist at a time, and the results do not change."
                      : "Memory-efficient attention (SDPA/flash/xformers) cuts attention memory by about 80% and "
                        "changes nothing in the results: the cheapest lever.";
  return f;
}

// Tiled VAE encode/decode, where the trainer has a switch for it: lora-train memory.vae_tiling;
// musubi-tuner cache_latents.py / hv_train_network.py --vae_tiling --vae_chunk_size (HunyuanVideo),
// wan_cache_latents.py / wan_train_network.py --vae_cache_cpu (Wan); SimpleTuner --vae_enable_tiling /
// --vae_enable_slicing (VAE caching); diffusers' CogVideoX scripts --enable_tiling --enable_slicing;
// ComfyUI's tiled VAE nodes. Images keep their size.
std::optional<Fix> vae_tiling_fix(const Ctx& c) {
  Fix f;
  f.id = "vae_tiling";
  f.config_key = "memory.vae_tiling";
  f.value = "true";
  const bool caching = c.d.stage == Stage::kCaching;
  const ModelFamily fam = c.d.family;
  switch (c.v) {
    case Vocab::kLoraTrain: f.setting = "memory.vae_tiling: true"; break;
    case Vocab::kMusubi:
      if (fam == ModelFamily::kHunyuan)
        f.setting = std::string(caching ? "cache_latents.py" : "hv_train_network.py") + " --vae_tiling --vae_chunk_size 32";
      else if (fam == ModelFamily::kWan)
        f.setting = std::string(caching ? "wan_cache_latents.py" : "wan_train_network.py") + " --vae_cache_cpu";
      else return std::nullopt;
      break;
    case Vocab::kSimpleTuner:
      if (!caching) return std::nullopt;
      f.setting = "--vae_enable_tiling (and --vae_enable_slicing for video, --vae_batch_size 1)";
      break;
    case Vocab::kDiffusers:
      if (fam != ModelFamily::kCogVideo) return std::nullopt;
      f.setting = "--enable_tiling --enable_slicing";
      break;
    case Vocab::kComfyUI:
      f.setting = caching ? "encode with the VAE Encode (Tiled) node" : "decode with the VAE Decode (Tiled) node";
      break;
    default: return std::nullopt;
  }
  f.description = "Run the VAE in tiles (and slices): its memory no longer grows with the whole image or clip, and "
                  "the images keep their size; the cheapest lever for caching and previews.";
  return f;
}

Fix optimizer_fix(const Ctx& c) {
  Fix f;
  f.id = "optimizer_8bit";
  switch (c.v) {
    case Vocab::kKohya:
    case Vocab::kMusubi: f.setting = "--optimizer_type AdamW8bit"; break;
    case Vocab::kDiffusers: f.setting = "--use_8bit_adam"; break;
    case Vocab::kSimpleTuner: f.setting = "--optimizer bnb-adamw8bit"; break;
    case Vocab::kDiffusionPipe: f.setting = "[optimizer] type = 'AdamW8bitKahan'"; break;
    case Vocab::kOneTrainer: f.setting = "\"optimizer\": \"ADAMW_8BIT\""; break;
    default: f.setting = "train.optimizer: adamw8bit"; break;
  }
  f.config_key = "train.optimizer";
  f.value = "adamw8bit";
  f.description = "An 8-bit AdamW keeps optimizer state at a quarter of the memory (not a learning-rate change).";
  return f;
}

bool is_dit(ModelFamily f) {
  return f != ModelFamily::kSd15 && f != ModelFamily::kSdxl && f != ModelFamily::kUnknown;
}

// lora-train's chunk is in effect when it is at most the guard's chunk.
bool chunk_on(const Settings& s) { return s.attention_chunk && *s.attention_chunk > 0 && *s.attention_chunk <= kGuardAttentionChunk; }

// Caching text-encoder outputs runs no VAE: tiling it would not help.
bool text_encoder_caching(const Diagnosis& d) {
  for (const Evidence& e : d.evidence) {
    if (e.why.rfind("phase", 0) != 0) continue;  // the lines that placed the failure
    std::string t = e.text;
    for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (t.find("text_encoder") != std::string::npos || t.find("text encoder") != std::string::npos ||
        t.find("embedding") != std::string::npos || t.find("encode_prompt") != std::string::npos)
      return true;
  }
  return false;
}

}  // namespace

std::vector<TriedLever> tried_levers(const Diagnosis& d) {
  std::vector<TriedLever> out;
  const Settings& s = d.settings;
  const bool lora_train = d.trainer == Trainer::kLoraTrain;
  // The guard's summary names each change by its ActionKind (src/memory/ladder.cpp to_string).
  auto price_of = [&](const char* action) {
    for (const std::string& p : d.guard_prices)
      if (p.find(action) != std::string::npos) return p;
    return std::string();
  };
  if (lora_train && chunk_on(s))
    out.push_back({"memory_efficient_attention", "memory.attention_chunk: " + std::to_string(*s.attention_chunk),
                   price_of("chunk_attention")});
  else if (!lora_train && s.memory_efficient_attention.value_or(false))
    out.push_back({"memory_efficient_attention", "memory-efficient attention (xformers / SDPA) on", ""});
  if (s.vae_tiling.value_or(false))
    out.push_back({"vae_tiling", lora_train ? "memory.vae_tiling: true" : "VAE tiling on", lora_train ? price_of("tile_vae") : ""});
  return out;
}

std::vector<Fix> plan_fixes(const Diagnosis& d) {
  std::vector<Fix> out;
  if (!d.oom) return out;
  const Settings& s = d.settings;
  Ctx c{d, vocab_for(d.trainer), s, d.kind == ModelKind::kVideo, is_dit(d.family)};

  // What the log shows is already done (playbook §3: skip it).
  const bool gc_done = s.gradient_checkpointing.value_or(false);
  const bool batch_done = s.batch_size && *s.batch_size <= 1;
  const bool bucket_done = s.max_resolution && *s.max_resolution <= 512;
  const bool frames_done = s.num_frames && *s.num_frames <= 1;
  const bool sampling_off = s.disable_sampling.value_or(false);
  const bool baseline_off = sampling_off || s.skip_first_sample.value_or(false) ||
                            ((c.v == Vocab::kKohya || c.v == Vocab::kMusubi) && s.sample_at_first.has_value() && !*s.sample_at_first);
  const bool lowvram_done = s.low_vram.value_or(false) && s.quantize.value_or(false);
  const bool diffusion_pipe = c.v == Vocab::kDiffusionPipe;  // it has no preview sampling

  auto push = [&](Fix f) {
    for (const Fix& e : out)
      if (e.id == f.id) return;
    out.push_back(std::move(f));
  };
  auto sampling_fixes = [&] {
    if (sampling_off || diffusion_pipe) return;
    push(shrink_sampling_fix(c));
    push(disable_sampling_fix(c));
  };
  // The levers that change nothing in the results come first where the trainer has them (the guard's
  // ladders, src/memory/ladder.cpp, start the same way): attention for training steps, the VAE's
  // tiling for caching and previews.
  const bool attention_first = c.v == Vocab::kLoraTrain ? !chunk_on(s)
                               : c.v == Vocab::kKohya  ? !c.dit && s.memory_efficient_attention == false
                                                       : false;
  auto free_attention = [&] {
    if (attention_first) push(attention_fix(c));
  };
  auto free_vae_tiling = [&] {
    // Not when the traceback shows the failure elsewhere (the denoiser of a preview, a text encoder).
    if (s.vae_tiling.value_or(false) || d.in_vae == false) return;
    if (auto f = vae_tiling_fix(c)) push(std::move(*f));
  };
  auto training_tail = [&] {
    if (!lowvram_done) push(low_vram_fix(c));
    if (c.v != Vocab::kLoraTrain && s.memory_efficient_attention == false) push(attention_fix(c));
    if (s.optimizer && s.optimizer->find("8bit") == std::string::npos && s.optimizer->find("8_bit") == std::string::npos &&
        s.optimizer->find("adafactor") == std::string::npos)
      push(optimizer_fix(c));
  };

  if (d.environment == "pinned_memory") push(pin_memory_fix(c));
  else if (d.phase == Phase::kEnvironment) push(free_gpu_fix(c));
  if (d.memory.fragmentation) push(allocator_fix(c));

  // The underlying phase for environment: what the run was doing.
  Phase p = d.phase;
  if (p == Phase::kEnvironment) {
    switch (d.stage) {
      case Stage::kBaselineSample: p = Phase::kBaselineSample; break;
      case Stage::kSampling: p = Phase::kSampling; break;
      case Stage::kTrainingStep: p = c.video ? Phase::kVideoSpike : Phase::kEarlySteps; break;
      default: p = Phase::kLoad; break;
    }
  }

  switch (p) {
    case Phase::kLoad:
      // Caching latents runs the VAE alone: its tiling first (lora-train: as its guard's cache ladder,
      // chunked attention and the VAE alone on the device, both exact, then tiling).
      if (d.stage == Stage::kCaching && !text_encoder_caching(d)) {
        if (c.v == Vocab::kLoraTrain) {
          free_attention();
          if (!lowvram_done) push(low_vram_fix(c));
        }
        free_vae_tiling();
      }
      // The model does not fit as loaded: previews are not running yet, so the low-memory path first,
      // then make sure the baseline preview will not be the next wall.
      if (!lowvram_done) push(low_vram_fix(c));
      if (!baseline_off && !diffusion_pipe) push(skip_baseline_fix(c));
      if (!gc_done) push(gc_fix(c, false));
      if (!batch_done) push(batch_fix(c));
      break;
    case Phase::kBaselineSample:
      if (c.v == Vocab::kLoraTrain) free_attention();
      free_vae_tiling();
      if (!baseline_off && !diffusion_pipe) push(skip_baseline_fix(c));
      sampling_fixes();
      if (!lowvram_done) push(low_vram_fix(c));
      break;
    case Phase::kSampling:
      if (c.v == Vocab::kLoraTrain) free_attention();
      free_vae_tiling();
      sampling_fixes();
      if (!lowvram_done) push(low_vram_fix(c));
      break;
    case Phase::kVideoSpike:
      free_attention();
      if (!frames_done) push(frames_fix(c));
      if (!gc_done && s.gradient_checkpointing.has_value()) push(gc_fix(c, false));
      if (!batch_done) push(batch_fix(c));
      if (!bucket_done) push(bucket_fix(c));
      sampling_fixes();
      training_tail();
      if (!gc_done) push(gc_fix(c, false));
      break;
    case Phase::kLaterSteps:
      // "Sometimes": a borderline config that dies on the biggest bucket or clip.
      free_attention();
      if (c.video && !frames_done) push(frames_fix(c));
      if (!bucket_done) push(bucket_fix(c));
      if (!gc_done) push(gc_fix(c, false));
      if (!batch_done) push(batch_fix(c));
      sampling_fixes();
      training_tail();
      break;
    case Phase::kEarlySteps:
    default:
      free_attention();
      if (c.video) {
        if (!frames_done) push(frames_fix(c));
        if (!batch_done) push(batch_fix(c));
        if (!bucket_done) push(bucket_fix(c));
        if (!gc_done) push(gc_fix(c, false));
      } else {
        bool step1 = d.step && *d.step == 1;
        if (!gc_done) push(gc_fix(c, step1 && !bucket_done));
        else if (step1 && !bucket_done) push(bucket_fix(c));
        if (!batch_done) push(batch_fix(c));
        if (!bucket_done) push(bucket_fix(c));
      }
      sampling_fixes();
      training_tail();
      break;
  }
  return out;
}

}  // namespace lt::diagnose
