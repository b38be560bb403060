// The job config: ostris AI Toolkit's YAML schema (job / config{name, process[]} / meta) as typed
// structs with the same key names and AI Toolkit's defaults, plus lora-train's own `memory` section.
//
// Every problem is one lt::ConfigError "path/config.yaml:LINE:COL: message" (or
// "--set KEY=VALUE: message" for a command-line override), exit code 2. The key tables in
// src/config/schema.cpp drive parsing, validation, the effective-config dump and docs/config.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/util/error.h"

namespace lt::config {

// A byte count written as "1.5GiB", "800MiB", "24GB" or a plain integer; 0 means "off".
struct ByteSize {
  int64_t bytes = 0;
  bool operator==(const ByteSize& o) const { return bytes == o.bytes; }
};

// One value of a free-form mapping (optimizer_params, lr_scheduler_params, meta).
struct ParamValue {
  std::string text;         // a scalar's text ("1e-4", "my_run"); a list/mapping as YAML flow text
  bool quoted = false;      // the scalar was quoted in the file: it stays a string when written back
  bool collection = false;  // text is a flow list or mapping ("[0.9, 0.999]")
  bool operator==(const ParamValue& o) const {
    return text == o.text && quoted == o.quoted && collection == o.collection;
  }
};
// Free-form parameters handed to another component; read typed values with param_*().
using ParamMap = std::map<std::string, ParamValue>;

// Where a value came from: a file position, or a command-line override label ("--set k=v").
struct SourceLocation {
  std::string file;  // the config path, or "--set train.batch_size=2" for an override
  int line = 0;      // 1-based; 0 for overrides
  int column = 0;    // 1-based; 0 for overrides
};

// ---- sections (field names are AI Toolkit's key names; defaults are AI Toolkit's) ----------------

// network: the adapter (toolkit/config_modules.py NetworkConfig).
struct NetworkKwargs {
  std::vector<std::string> only_if_contains;    // train only modules whose name contains one of these
  std::vector<std::string> ignore_if_contains;  // skip modules whose name contains one of these (wins)
};
struct NetworkConfig {
  std::string type = "lora";                // lora | locon | lokr | loha
  int linear = 4;                           // rank of Linear adapters (legacy key: rank)
  std::optional<double> linear_alpha;       // resolved by validation: defaults to alpha
  double alpha = 1.0;
  std::optional<int> conv;                  // rank of Conv adapters (locon); unset = no conv adapters
  std::optional<double> conv_alpha;         // resolved by validation: defaults to conv
  std::optional<double> dropout;
  NetworkKwargs network_kwargs;
  bool transformer_only = true;
  bool lokr_full_rank = true;               // lokr: both Kronecker factors full matrices
  int lokr_factor = -1;                     // lokr: w1's side (-1: the most balanced split)
};

// save: checkpoints of the adapter.
struct SaveConfig {
  std::string dtype = "float16";
  int save_every = 1000;
  int max_step_saves_to_keep = 5;
  std::string save_format = "safetensors";  // safetensors (kohya keys) | peft (AI Toolkit: diffusers)
};

// datasets[i]: one folder of images (or clips) with caption sidecars.
struct DatasetConfig {
  std::string folder_path;                   // required
  std::string caption_ext = ".txt";          // a leading dot is added when missing
  std::optional<std::string> default_caption;
  std::optional<std::string> trigger_word;   // per-dataset trigger word
  double caption_dropout_rate = 0.0;
  bool shuffle_tokens = false;
  double token_dropout_rate = 0.0;
  int keep_tokens = 0;
  std::vector<int> resolution = {512};       // `resolution: 512` is read as [512]
  bool buckets = true;
  int bucket_tolerance = 64;                 // as in AI Toolkit, replaced by the model's divisibility
  bool random_crop = false;
  bool square_crop = false;
  bool flip_x = false;
  bool flip_y = false;
  int num_repeats = 1;
  bool cache_latents = false;
  bool cache_latents_to_disk = false;
  bool cache_text_embeddings = false;
  int num_frames = 1;                        // > 1: a video dataset
  bool shrink_video_to_frames = true;
  int fps = 24;
  int num_workers = 2;
  int prefetch_factor = 2;
  int cache_latents_num_workers = 2;
  double mask_min_value = 0.0;               // loss-mask floor; used only with mask_path / alpha_mask
};

// train.ema_config (AI Toolkit's EMAConfig): what lt::optim::AdapterEMA is built with.
struct EmaConfig {
  bool use_ema = false;
  double ema_decay = 0.999;
  bool use_feedback = false;      // after each update, pull the live weights toward the average
  double param_multiplier = 1.0;  // after each update, scale the live weights by this
};

// train: the optimisation.
struct TrainConfig {
  int steps = 1000;
  double lr = 1e-6;
  std::optional<double> unet_lr;            // resolved by validation: defaults to lr
  std::optional<double> text_encoder_lr;    // resolved by validation: defaults to lr
  std::string optimizer = "adamw";
  ParamMap optimizer_params;
  std::string lr_scheduler = "constant";
  ParamMap lr_scheduler_params;
  int batch_size = 1;
  int gradient_accumulation = 1;
  int gradient_accumulation_steps = 1;
  bool gradient_checkpointing = true;
  std::string dtype = "fp32";
  std::string noise_scheduler = "ddpm";
  std::string timestep_type = "sigmoid";
  double max_grad_norm = 1.0;
  bool xformers = false;
  bool sdp = false;
  bool train_unet = true;
  bool train_text_encoder = false;
  bool disable_sampling = false;
  bool skip_first_sample = false;
  bool force_first_sample = false;
  bool unload_text_encoder = false;         // encode "" and the trigger word once; captions are not used
  bool cache_text_embeddings = false;
  bool bypass_guidance_embedding = false;   // Flux: train with the guidance embedder bypassed
  double cfg_scale = 1.0;                   // Flux dev: the guidance value embedded while training
  std::optional<int> start_step;
  EmaConfig ema_config;
  std::string loss_type = "mse";
  std::optional<double> min_snr_gamma;
  double noise_offset = 0.0;
  // Used only with diff_output_preservation (not supported yet); kept so the UI's values load.
  double diff_output_preservation_multiplier = 1.0;
  std::string diff_output_preservation_class;
};

// model: the frozen base.
struct ModelConfig {
  std::string name_or_path;                  // required: a .safetensors file or a diffusers folder
  std::optional<std::string> arch;           // unset: detected from the checkpoint (AI Toolkit: sd1)
  bool is_v_pred = false;
  std::optional<std::string> dtype;          // must agree with train.dtype, which AI Toolkit uses
  bool quantize = false;
  std::string qtype = "qfloat8";
  std::optional<bool> quantize_te;           // resolved by validation: defaults to quantize
  std::string qtype_te = "qfloat8";
  bool low_vram = false;
  std::optional<std::string> vae_path;
  std::optional<std::string> tokenizer_path; // ours: CLIP vocabulary for single-file checkpoints
  // Flux only: an adapter merged into the base for training and taken out for previews, never
  // saved (a file, a folder holding pytorch_lora_weights.safetensors, or a Hugging Face repo id).
  std::optional<std::string> assistant_lora_path;
  // Set from the legacy is_v2/is_xl/is_flux/... flags; used only when `arch` is absent.
  std::optional<std::string> arch_from_flags;
};

// sample.samples[i]: one preview; unset fields take the sample section's value.
struct SampleItem {
  std::string prompt;                        // required
  std::optional<int> width;
  std::optional<int> height;
  std::optional<std::string> neg;
  std::optional<int64_t> seed;               // unset: sample.seed (+ index when walk_seed)
  std::optional<double> guidance_scale;
  std::optional<int> sample_steps;
  std::optional<int> num_frames;
  std::optional<int> fps;
  std::optional<double> network_multiplier;
};

// sample: previews during training.
struct SampleConfig {
  std::string sampler = "ddpm";
  int sample_every = 100;
  int sample_start_step = 0;
  int width = 512;
  int height = 512;
  std::vector<std::string> prompts;          // inline flags (--w --h --seed --cfg --steps --n) kept
  std::vector<SampleItem> samples;
  std::string neg;                           // AI Toolkit's default `false` reads as ""
  int64_t seed = 0;
  bool walk_seed = false;
  double guidance_scale = 7.0;
  int sample_steps = 20;
  double network_multiplier = 1.0;
  std::string format = "jpg";
  int num_frames = 1;
  int fps = 16;
};

struct LoggingConfig {
  int log_every = 100;
  bool verbose = false;
  std::string project_name = "ai-toolkit";
  std::optional<std::string> run_name;
};

// memory (ours): the simulated VRAM budget, the CUDA cap and the OOM guard.
struct OomGuardConfig {
  bool enabled = true;
  int max_attempts = 8;     // rollback actions tried before giving up (exit code 3)
  bool scale_up = false;    // after a stable stretch, add back one heavier setting at a time
  int scale_up_after = 50;  // stable steps before each scale-up
  bool plan = true;         // start from the planner's first fitting rung when predicted not to fit
};
struct MemoryConfig {
  ByteSize simulate_vram;   // CPU only: budgeted allocator throws OOM past this; 0 = off
  ByteSize vram_limit;      // CUDA: cap this process's use (set_per_process_memory_fraction); 0 = off
  std::string alloc_conf;   // PYTORCH_CUDA_ALLOC_CONF for this run ("" = leave as is)
  OomGuardConfig oom_guard;
  int attention_chunk = 0;  // query rows per attention chunk; 0 = whole sequence
  bool vae_tiling = false;  // VAE encode/decode in overlapping tiles
};

// config.process[0]
struct ProcessConfig {
  std::string type;                          // required: sd_trainer | diffusion_trainer | ui_trainer
  std::string training_folder = "output";    // the run folder is training_folder/<name>
  std::string device = "auto";               // auto | cpu | cuda | cuda:N
  std::optional<std::string> trigger_word;
  std::optional<int64_t> training_seed;
  NetworkConfig network;
  SaveConfig save;
  std::vector<DatasetConfig> datasets;       // at least one
  TrainConfig train;
  ModelConfig model;
  SampleConfig sample;
  LoggingConfig logging;
  MemoryConfig memory;
};

struct JobConfig {
  std::string job = "extension";
  std::string name;                          // config.name; replaces [name] in every string
  std::vector<ProcessConfig> process;        // exactly one
  ParamMap meta;
  // Not part of the YAML: where each key came from, by dotted path inside the process
  // ("train.batch_size", "datasets.0.folder_path", "model" for a section), for later errors.
  std::filesystem::path source_file;
  std::map<std::string, SourceLocation> origins;
  // Filled by validate(): the keys present in the file or the overrides that change nothing here
  // (AI Toolkit UI/bookkeeping keys and no-effect keys), as dotted paths in file order.
  std::vector<std::string> ignored_keys;
};

// ---- API ------------------------------------------------------------------------------------------

// Reads, substitutes ([name], ${ENV}), applies `overrides` ("train.batch_size=2", each validated as
// if it were in the file) and validates. An override replaces the file's value before that value is
// checked, so it can fix a value the file gets wrong. Throws lt::ConfigError. Does not touch the
// filesystem beyond reading `path`: call validate_paths() before training.
JobConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

// The same from text; `display_name` is the file name used in error messages.
JobConfig parse_config_text(const std::string& text, const std::string& display_name,
                            const std::vector<std::string>& overrides = {});

// Sets one key inside the (single) process, validated exactly like a file value, e.g.
// set_value(job, "datasets.0.resolution", "[512, 768]"). Errors read "<label>: message", where the
// label defaults to "--set KEY=VALUE". Re-run validate() afterwards to re-check cross-key rules.
void set_value(JobConfig& job, const std::string& dotted_key, const std::string& yaml_value,
               const std::string& label = "");

// "KEY=VALUE" from the command line -> set_value with the label "--set KEY=VALUE".
void apply_override(JobConfig& job, const std::string& assignment);

// Required keys and rules across keys; fills derived defaults (linear_alpha = alpha, ...).
void validate(JobConfig& job);

// Checks what a run reads from disk: each dataset folder exists and holds images (or videos when
// num_frames > 1); model.name_or_path, vae_path and assistant_lora_path exist locally or, given as
// a Hugging Face repo id, in the local Hugging Face cache (model_path.h); tokenizer_path exists.
// Errors point at the key's line.
void validate_paths(const JobConfig& job);

// The config with every default filled in, as AI Toolkit-compatible YAML; parses back to the
// same config.
std::string dump_effective_yaml(const JobConfig& job);

// Writes dump_effective_yaml(job) atomically.
void write_effective_yaml(const JobConfig& job, const std::filesystem::path& path);

// One info line naming job.ignored_keys ("" when there are none), for the run log:
// "accepted for AI Toolkit compatibility, no effect in lora-train: sqlite_db_path, meta".
std::string ignored_keys_summary(const JobConfig& job);

// The one process (lora-train runs one process per config).
ProcessConfig& the_process(JobConfig& job);
const ProcessConfig& the_process(const JobConfig& job);

// An error located where `dotted_key` was set (file:line:col, or the override), e.g. for
// "model.name_or_path: no such file" found at run time. Falls back to the closest parent key.
lt::ConfigError error_at(const JobConfig& job, const std::string& dotted_key, const std::string& message);

// Reads a ParamMap entry (optimizer_params.weight_decay...); throws lt::InputError naming `what`
// when the value has the wrong type. nullopt when absent.
std::optional<double> param_number(const ParamMap& params, const std::string& key, const std::string& what);
std::optional<std::vector<double>> param_number_list(const ParamMap& params, const std::string& key,
                                                     const std::string& what);
std::optional<bool> param_bool(const ParamMap& params, const std::string& key, const std::string& what);

// AI Toolkit accepts fp32/float32, fp16/float16/half, bf16/bfloat16: -> "fp32" | "fp16" | "bf16".
std::string canonical_dtype(const std::string& dtype);

// The `arch` to build: model.arch, else the legacy flags' arch, else "" (detect from the checkpoint).
std::string effective_arch(const ModelConfig& model);

}  // namespace lt::config
