// The phases from a family's architecture numbers: what is resident in each phase (weights in
// their dtype, int8 after model.quantize, encoders away under model.low_vram), the adapter with
// its gradients and optimizer state, and the largest working set the phase computes.
#include "loratrain/plan/plan.h"

#include <algorithm>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "architecture.h"
#include "loratrain/config/config.h"
#include "loratrain/config/model_path.h"
#include "loratrain/data/dataset.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/lora/network.h"
#include "loratrain/memory/compat.h"
#include "loratrain/models/registry.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::plan {

int64_t adapter_module_parameters(const AdapterShape& adapter, int64_t in, int64_t out, int64_t kernel, int64_t rank) {
  lora::NetworkConfig net;
  net.type = lora::adapter_type_from_name(adapter.type);
  net.lokr_factor = adapter.lokr_factor;
  net.lokr_full_rank = adapter.lokr_full_rank;
  return lora::adapter_parameters(net, out, in, kernel, rank) + 1;
}

namespace fs = std::filesystem;
using playbook::ModelFamily;
using playbook::Quantize;

const char* to_string(Part p) {
  switch (p) {
    case Part::weights: return "weights";
    case Part::adapter_optimizer: return "adapter+optimizer";
    case Part::activations: return "activations";
    case Part::workspace: return "workspace";
  }
  return "unknown";
}

Part PhaseMemory::dominant() const {
  Part best = Part::weights;
  int64_t most = weights;
  for (auto [part, bytes] : {std::pair{Part::adapter_optimizer, adapter_optimizer}, std::pair{Part::activations, activations},
                             std::pair{Part::workspace, workspace}}) {
    if (bytes > most) {
      most = bytes;
      best = part;
    }
  }
  return best;
}

int64_t Prediction::peak() const {
  int64_t p = 0;
  for (const auto& ph : phases) {
    if (ph.runs) p = std::max(p, ph.peak());
  }
  return p;
}

std::optional<Phase> Prediction::first_over(int64_t budget) const {
  for (size_t i = 0; i < kPhases; ++i) {
    if (phases[i].runs && phases[i].peak() > budget) return static_cast<Phase>(i);
  }
  return std::nullopt;
}

namespace {

// Optimizer state bytes per adapter parameter (fp32 state; adamw8bit's codes with a 4-byte absmax
// per 256-value block; adafactor's factored second moment of rank-wide matrices).
double optimizer_bytes_per_param(const std::string& name, int rank) {
  const std::string o = to_lower(name);
  if (o.find("8bit") != std::string::npos) return 2.0 + 8.0 / 256;
  if (o.find("adafactor") != std::string::npos) return 4.0 / std::max(1, rank) + 0.1;
  if (o == "sgd") return 0;
  return 8.0;
}

int compute_bytes_of(const std::string& dtype, const std::string& device) {
  const std::string d = config::canonical_dtype(dtype);
  if (d == "fp16" || d == "float16") return to_lower(device) == "cpu" ? 4 : 2;  // no fp16 kernels on the CPU
  if (d == "bf16" || d == "bfloat16") return 2;
  return 4;
}

class SettingsPlanner final : public Planner {
 public:
  SettingsPlanner(const config::JobConfig& job, std::optional<int> compute_bytes);

  Prediction predict(const MemorySettings& s) const override;
  const MemorySettings& configured() const override { return configured_; }
  std::string family() const override { return playbook::to_string(source_.family); }
  const std::string& shapes_source() const override { return shapes_source_; }
  std::string describe() const override;

 private:
  ModelSource source_;
  std::unique_ptr<Architecture> arch_;
  MemorySettings configured_;
  std::string shapes_source_;
  std::string optimizer_;
  AdapterShape adapter_;
  int compute_bytes_ = 4;
  bool train_text_encoder_ = false;
  bool quantize_text_encoder_ = false;
  bool cache_latents_ = false;
  bool cache_text_ = true;
  bool unload_text_ = false;  // train.unload_text_encoder: the text encoders leave after the cache phase
  bool ema_ = false;
  bool has_prompts_ = false;
  int64_t captions_ = 0;  // what the text cache holds: the dataset's captions and the previews' prompts
  bool on_cpu_ = false;
  bool simulated_device_ = false;  // memory.simulate_vram on the CPU: the run stands for a GPU
  // Training on the CPU outside simulated VRAM packs the frozen convolutions (packed_conv.h).
  bool packs_convolutions_ = false;
  // The largest bucket (by area) of each resolution, from the dataset's image headers when its
  // folder is here: images are never upscaled, so small images make small buckets. Short batches
  // are padded with repeats (AI Toolkit), so every step is a full batch.
  std::map<int, data::Size> largest_bucket_;
  Shape train_shape(const MemorySettings& s) const;
  Shape largest_image(const MemorySettings& s) const;
};

// The heaviest step the settings allow: a full batch of the largest bucket over the active
// resolutions (resolution^2 when the dataset is not here).
Shape SettingsPlanner::train_shape(const MemorySettings& s) const {
  data::Size best{0, 0};
  for (int r : s.active_resolutions()) {
    auto it = largest_bucket_.find(r);
    const data::Size size = it != largest_bucket_.end() ? it->second : data::Size{r, r};
    if (int64_t(size.width) * size.height > int64_t(best.width) * best.height) best = size;
  }
  if (best.width == 0) best = {512, 512};
  return {s.batch_size, best.width, best.height, s.num_frames};
}

Shape SettingsPlanner::largest_image(const MemorySettings& s) const {
  MemorySettings one = s;
  one.batch_size = 1;
  return train_shape(one);
}

SettingsPlanner::SettingsPlanner(const config::JobConfig& job, std::optional<int> compute_bytes) {
  const config::ProcessConfig& p = config::the_process(job);
  std::optional<ModelFamily> family = playbook::family_from_arch(config::effective_arch(p.model));
  try {
    const auto resolved = config::resolve_model_path(p.model.name_or_path, "model.name_or_path");
    if (fs::exists(resolved.path)) source_.checkpoint = resolved.path;
  } catch (const InputError&) {
    // Not on this machine: the family's standard shapes stand in (below).
  }
  if (source_.checkpoint) {
    const models::Detection d = fs::is_directory(*source_.checkpoint)
                                    ? models::detect_diffusers_folder(*source_.checkpoint)
                                    : models::detect_checkpoint(*io::SafetensorsFile::open(*source_.checkpoint));
    if (d.family != ModelFamily::kUnknown) family = d.family;  // the header decides, as in `run`
    shapes_source_ = "shapes from the header of " + source_.checkpoint->string();
  } else {
    if (!family || *family == ModelFamily::kUnknown) {
      throw config::error_at(job, "model.name_or_path",
                             "plan: " + p.model.name_or_path + " is not on this machine and model.arch does not name "
                             "the family: set model.arch (sd1, sd2, sdxl, flux, wan21) to plan with the family's standard shapes");
    }
    shapes_source_ = std::string(playbook::to_string(*family)) + "'s standard shapes (" + p.model.name_or_path +
                     " is not on this machine, nor in the Hugging Face cache)";
  }
  source_.family = family.value_or(ModelFamily::kUnknown);
  source_.name = p.model.name_or_path;
  if (p.model.vae_path) {
    try {
      const auto vae = config::resolve_model_path(*p.model.vae_path, "model.vae_path");
      if (fs::is_regular_file(vae.path)) source_.vae = vae.path;
    } catch (const InputError&) {
      // The bundled VAE's shapes stand in.
    }
  }
  arch_ = make_architecture(source_);
  for (const auto& d : p.datasets) {
    if (!fs::is_directory(d.folder_path)) continue;
    data::DatasetOptions options;
    options.folder_path = d.folder_path;
    options.caption_ext = d.caption_ext;
    options.num_frames = d.num_frames;  // > 1: a video dataset, its clips' sizes from their headers
    options.verify_images = false;
    try {
      const data::Dataset dataset(options);
      captions_ += static_cast<int64_t>(dataset.size());
      data::BucketOptions buckets;
      buckets.resolutions = d.resolution;
      buckets.divisibility = arch_->bucket_divisibility();
      buckets.enabled = d.buckets;
      const data::BucketPlan plan = dataset.make_plan(buckets);
      for (const auto& bucket : plan.buckets()) {
        data::Size& best = largest_bucket_[bucket.resolution];
        if (int64_t(bucket.size.width) * bucket.size.height > int64_t(best.width) * best.height) best = bucket.size;
      }
    } catch (const InputError&) {
      // An empty or unreadable folder: `run` reports it; the plan assumes square buckets.
    }
  }
  // Frame counts on the video grid, as `run` trains them (40 -> 41).
  config::ProcessConfig on_grid = p;
  if (playbook::is_video(source_.family)) playbook::put_frames_on_video_grid(on_grid);
  configured_ = playbook::settings_from_config(on_grid, playbook::is_video(source_.family));
  optimizer_ = p.train.optimizer;
  adapter_.linear_rank = p.network.linear;
  adapter_.conv_rank = p.network.conv.value_or(0);
  adapter_.type = p.network.type;
  adapter_.lokr_factor = p.network.lokr_factor;
  adapter_.lokr_full_rank = p.network.lokr_full_rank;
  on_cpu_ = to_lower(p.device) == "cpu";
  simulated_device_ = on_cpu_ && p.memory.simulate_vram.bytes > 0;
  packs_convolutions_ = on_cpu_ && !simulated_device_;
  compute_bytes_ = compute_bytes.value_or(compute_bytes_of(p.train.dtype, p.device));
  train_text_encoder_ = p.train.train_text_encoder;
  quantize_text_encoder_ = p.model.quantize_te.value_or(false);
  for (const auto& d : p.datasets) cache_latents_ = cache_latents_ || d.cache_latents || d.cache_latents_to_disk;
  cache_text_ = !p.train.train_text_encoder;
  unload_text_ = cache_text_ && p.train.unload_text_encoder;
  ema_ = p.train.ema_config.use_ema;
  has_prompts_ = !p.sample.prompts.empty() || !p.sample.samples.empty();
  captions_ += 2 * static_cast<int64_t>(p.sample.prompts.size() + p.sample.samples.size()) + 1;  // + negatives, trigger
}

std::string SettingsPlanner::describe() const {
  const Parameters params = arch_->parameters(adapter_);
  return fmt::format("{} in {}-bit, LoRA rank {} ({} modules, {:.2f}M parameters) with {}; base {:.0f}M denoiser + "
                     "{:.0f}M text + {:.0f}M VAE parameters",
                     family(), compute_bytes_ * 8, adapter_.linear_rank, params.adapter_modules, params.adapter / 1e6,
                     optimizer_, params.denoiser / 1e6, params.text_encoders / 1e6, params.vae / 1e6);
}

Prediction SettingsPlanner::predict(const MemorySettings& s) const {
  const Parameters params = arch_->parameters(adapter_);
  const int wb = compute_bytes_;
  Compute c;
  c.bytes = wb;
  c.checkpointing = s.gradient_checkpointing;
  c.attention_chunk = s.attention_chunk;
  c.vae_tiling = s.vae_tiling;
  c.threads = std::max(1u, std::thread::hardware_concurrency());
  c.adapter_rank = adapter_.linear_rank;
  c.host = on_cpu_;
  c.simulated_device = simulated_device_;
  c.mean_keeps_input = memory::compat::kMeanKeepsInput;

  const bool quantized = s.quantize != Quantize::none;
  const int64_t denoiser_full = params.denoiser * wb;
  // int8 Linear weights with one fp32 scale per output row (4 bytes per ~1000 weights).
  const int64_t denoiser_resident =
      quantized ? (params.denoiser - params.denoiser_linear) * wb + params.denoiser_linear + params.denoiser_linear / 250
                : denoiser_full;
  const int64_t text_full = params.text_encoders * wb;
  const int64_t text_quantizable = params.text_encoders - params.text_embeddings;
  const int64_t text_resident = quantized && quantize_text_encoder_
                                    ? text_quantizable + text_quantizable / 250 + params.text_embeddings * wb
                                    : text_full;
  const int64_t vae = params.vae * 4;  // the VAE runs in fp32
  const int64_t adapter = params.adapter * 4;
  const int64_t grads = adapter;
  const int64_t optimizer = static_cast<int64_t>(params.adapter * optimizer_bytes_per_param(optimizer_, adapter_.linear_rank)) +
                            (ema_ ? adapter : 0);

  const Shape step_shape = train_shape(s);
  Shape sample_shape{arch_->guidance_doubles_batch() ? 2 : 1, s.sample_width, s.sample_height, s.sample_num_frames};
  Shape decode_shape{1, s.sample_width, s.sample_height, s.sample_num_frames};
  const Shape encode_shape = largest_image(s);

  // Which encoders stay on the device between uses (unload_text_encoder: none after the cache
  // phase, previews included: their prompts were encoded into the cache too).
  const bool text_stays = (!s.low_vram || train_text_encoder_) && !unload_text_;
  const bool vae_stays = !s.low_vram || !cache_latents_;

  // On the CPU the caches' host memory is the device's: the caption embeddings in the compute dtype.
  const int64_t text_cache = on_cpu_ && cache_text_ ? captions_ * arch_->text_embedding_elements() * wb : 0;
  Prediction out;
  // load: each component is built in fp32 on the host, filled one tensor at a time from the file,
  // then converted to the compute dtype on the device (the VAE stays fp32); the adapter comes
  // last. With model.quantize (and quantize_te) each component is quantized on the host right after
  // its build, one Linear at a time, and its codes are placed. On the CPU the fp32 build is on the
  // device too. The peak is the worst of those moments.
  PhaseMemory& load = out.at(Phase::load);
  const int build = on_cpu_ ? 4 : wb;
  const int64_t text_loaded = !s.low_vram || train_text_encoder_ ? params.text_encoders : 0;
  const int64_t vae_loaded = s.low_vram ? 0 : vae;
  struct Moment {
    int64_t weights, workspace, adapter;
  };
  // The encoders load beside the denoiser's codes.
  const int64_t base_loaded = denoiser_resident;
  // quantization converts one weight at a time beside the full build: the fp32 copy of a 16-bit
  // weight, then for int8 (LinearImpl::quantize_int8) w / scale, its rounding and clamping (one
  // expression: all alive until its end) and the int8 codes; for fp8 e4m3 (fp8_e4m3_encode) w / scale,
  // |w / scale|, the two neighbour codes (int64) and their fp32 distances.
  const int quantize_bytes = (s.quantize == Quantize::fp8 ? 32 : 13) + (wb < 4 ? 4 : 0);
  const int64_t quantizing =
      (params.largest_denoiser_linear > 0 ? params.largest_denoiser_linear : params.largest_denoiser_tensor) * quantize_bytes;
  // model.quantize_te: the text encoders' codes are placed (under model.low_vram, when they are
  // first used).
  const bool early_text = quantized && quantize_text_encoder_;
  const int64_t text_quantizing =
      (params.largest_text_linear > 0 ? params.largest_text_linear : params.largest_text_tensor) * quantize_bytes;
  const int64_t text_placed = text_loaded == 0 ? 0 : early_text ? text_resident : text_loaded * wb;
  // (on a GPU the early codes are made on the host: the device never holds the widened weights)
  const bool build_on_device = on_cpu_ || !quantized;
  const bool text_build_on_device = on_cpu_ || !early_text;
  std::vector<Moment> moments = {
      {build_on_device ? params.denoiser * build : 0, build_on_device ? params.largest_denoiser_tensor * build : 0, 0},
      {build_on_device ? params.denoiser * build : 0, build_on_device && quantized ? quantizing : 0, 0},
      {base_loaded + (text_build_on_device ? text_loaded * build : 0),
       text_loaded && text_build_on_device ? params.largest_text_tensor * build : 0, 0},
      {base_loaded + (text_build_on_device ? text_loaded * wb : 0), text_loaded && on_cpu_ && early_text ? text_quantizing : 0, 0},
      {base_loaded + text_placed + vae_loaded, vae_loaded ? params.largest_vae_tensor * 4 : 0, 0},
      {base_loaded + text_placed + vae_loaded, 0, adapter},
  };
  for (const Moment& m : moments) {
    if (m.weights + m.workspace + m.adapter > load.peak()) {
      load.weights = m.weights;
      load.workspace = m.workspace;
      load.adapter_optimizer = m.adapter;
    }
  }

  // A phase's peak is the worst of its moments: what is resident then, and what it computes.
  struct Working {
    int64_t weights, activations;
  };
  auto worst_of = [](PhaseMemory& ph, std::initializer_list<Working> moments) {
    int64_t best = -1;
    for (const Working& m : moments) {
      if (m.weights + m.activations > best) {
        best = m.weights + m.activations;
        ph.weights = m.weights;
        ph.activations = m.activations;
      }
    }
  };

  // cache: latents (VAE encode of one image at the largest bucket), then caption embeddings. On
  // the low-VRAM path the encoders come one at a time: the VAE leaves before the text encoder arrives.
  PhaseMemory& cache = out.at(Phase::cache);
  cache.adapter_optimizer = adapter;
  const int64_t latents_work = cache_latents_ ? arch_->vae_encode(encode_shape, c) : 0;
  const int64_t text_work = cache_text_ ? arch_->text_encode(1, c) : 0;
  if (s.low_vram) {
    worst_of(cache, {{denoiser_resident + (cache_latents_ ? vae : 0), latents_work},
                     {denoiser_resident + text_resident + (cache_latents_ ? 0 : vae), text_work}});
  } else {
    worst_of(cache, {{denoiser_resident + text_resident + vae, std::max(latents_work, text_work)}});
  }
  cache.workspace = text_cache;

  // From the first training step on, two packed copies of the stride-1 convolution weights (1x1 ones
  // run as matrix products on the plain weight).
  const int64_t packed_conv = packs_convolutions_ ? 2 * params.denoiser_packed_conv * wb : 0;
  const int64_t resident_training =
      denoiser_resident + (text_stays || !cache_text_ ? text_resident : 0) + (vae_stays ? vae : 0) + packed_conv;
  const bool baseline_runs = !s.disable_sampling && has_prompts_ && !s.skip_first_sample;
  auto sampling = [&](PhaseMemory& ph, bool trained) {
    ph.adapter_optimizer = adapter + (trained ? optimizer : 0);
    // The prompts are encoded once into the text cache: by the first previews that run (or, with
    // unload_text_encoder, in the cache phase). On the low-VRAM path an encoder comes to the
    // device when it is first used in the phase (the text encoder only to encode, the VAE to
    // decode) and both leave at its end.
    const bool encodes = !unload_text_ && (!cache_text_ || !trained || !baseline_runs);
    const int64_t text_here = unload_text_ || (s.low_vram && !encodes) ? 0 : text_resident;
    const int64_t denoiser_here = denoiser_resident + (trained ? packed_conv : 0);
    const int64_t before_decode = denoiser_here + text_here + (s.low_vram ? 0 : vae);
    worst_of(ph, {{before_decode, encodes ? arch_->text_encode(1, c) : 0},
                  {before_decode, arch_->inference_activations(sample_shape, c)},
                  {denoiser_here + text_here + vae, arch_->vae_decode(decode_shape, c)}});
    ph.workspace = text_cache;
    ph.runs = !s.disable_sampling && has_prompts_;
  };
  sampling(out.at(Phase::baseline_sample), false);
  out.at(Phase::baseline_sample).runs = baseline_runs;

  PhaseMemory& step = out.at(Phase::train_step);
  step.weights = resident_training;
  step.adapter_optimizer = adapter + grads + optimizer;
  step.activations = arch_->training_activations(step_shape, c);
  if (!cache_latents_) step.activations = std::max(step.activations, arch_->vae_encode(step_shape, c));
  // The optimizer's all-or-nothing update computes new parameters and new state for every adapter
  // tensor before committing them; backward has freed the activations by then, so only the
  // excess over them raises the step's peak.
  step.workspace = std::max<int64_t>(0, adapter + optimizer - step.activations) + text_cache;

  sampling(out.at(Phase::sample), true);
  out.at(Phase::sample).runs = out.at(Phase::sample).runs && s.sample_every > 0;

  // save: the adapter converted for the file beside the live one (the training state's copies go
  // to host memory, which on the CPU is the live tensors themselves).
  PhaseMemory& save = out.at(Phase::save);
  save.weights = resident_training;
  save.adapter_optimizer = adapter + optimizer;
  save.workspace = adapter + text_cache;
  return out;
}

}  // namespace

std::unique_ptr<Planner> Planner::from_config(const config::JobConfig& job, std::optional<int> compute_bytes) {
  return std::make_unique<SettingsPlanner>(job, compute_bytes);
}

std::string format_table(const Prediction& p, std::optional<int64_t> budget) {
  std::string out = fmt::format("{:<16} {:>11} {:>11} {:>13} {:>11} {:>11}  {:<18}{}\n", "phase", "peak", "weights",
                                "adapter+opt", "activations", "workspace", "dominated by", budget ? "  fits" : "");
  for (size_t i = 0; i < kPhases; ++i) {
    const PhaseMemory& ph = p.phases[i];
    const char* name = playbook::to_string(static_cast<Phase>(i));
    if (!ph.runs) {
      out += fmt::format("{:<16} {:>11}\n", name, "(skipped)");
      continue;
    }
    out += fmt::format("{:<16} {:>11} {:>11} {:>13} {:>11} {:>11}  {:<18}{}\n", name, format_bytes(ph.peak()),
                       format_bytes(ph.weights), format_bytes(ph.adapter_optimizer), format_bytes(ph.activations),
                       format_bytes(ph.workspace), to_string(ph.dominant()),
                       budget ? (ph.peak() <= *budget ? "  yes" : "  NO") : "");
  }
  return out;
}

nlohmann::json to_json(const Prediction& p, std::optional<int64_t> budget) {
  nlohmann::json phases = nlohmann::json::object();
  for (size_t i = 0; i < kPhases; ++i) {
    const PhaseMemory& ph = p.phases[i];
    if (!ph.runs) continue;
    phases[playbook::to_string(static_cast<Phase>(i))] = {
        {"peak_bytes", ph.peak()},          {"weights", ph.weights},
        {"adapter_optimizer", ph.adapter_optimizer}, {"activations", ph.activations},
        {"workspace", ph.workspace},        {"dominant", to_string(ph.dominant())}};
  }
  nlohmann::json j{{"phases", phases}, {"peak_bytes", p.peak()}};
  if (budget) {
    j["vram_bytes"] = *budget;
    j["fits"] = p.fits(*budget);
  }
  return j;
}

}  // namespace lt::plan
