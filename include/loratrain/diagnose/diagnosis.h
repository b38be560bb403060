// What `lora-train diagnose` concludes from a failed training log (docs/diagnose.md has the JSON
// schema; the names returned by the *_name() functions are that schema's stable strings).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lt::diagnose {

enum class Trainer {
  kUnknown,
  kAiToolkit,       // ostris AI Toolkit (run.py, UI)
  kKohya,           // kohya-ss sd-scripts, also run by the kohya_ss GUI
  kMusubi,          // kohya-ss musubi-tuner
  kDiffusionPipe,   // tdrussell diffusion-pipe (DeepSpeed)
  kDiffusers,       // huggingface/diffusers example scripts under accelerate
  kOneTrainer,
  kSimpleTuner,
  kComfyUI,         // ComfyUI training nodes (built-in TrainLoraNode, FluxTrainer, ...)
  kXFlux,           // XLabs-AI x-flux (train_flux_lora_deepspeed.py)
  kLoraTrain,       // this project
};

enum class ModelFamily {
  kUnknown, kFlux, kSdxl, kSd15, kSd3, kWan, kHunyuan, kLtx, kQwen, kLumina, kHiDream, kChroma,
  kZImage, kCogVideo, kMochi,
};

// Why the run died.
enum class Cause {
  kNone,              // no failure signature found
  kGpuOom,            // GPU out of memory (any signature of playbook §1)
  kHostOom,           // system RAM: OOM killer (Killed, exit 137/-9), paging file, CPU allocator
  kDataLoaderWorker,  // a DataLoader worker died (often /dev/shm or host RAM)
  kNanLoss,           // loss became NaN/inf
  kGpuFault,          // illegal memory access, unspecified launch failure, Xid, GPU fell off the bus
  kMissingFile,       // file, model or dataset not found / unreadable
  kVersionMismatch,   // import errors, API/version incompatibility, wrong checkpoint variant
  kOther,             // an error, but none of the above
};

// Playbook §2 phases.
enum class Phase {
  kUnknown,
  kLoad,            // model load, quantisation, moving to the GPU, caching: before step 1
  kBaselineSample,  // the preview generated before training
  kEarlySteps,      // training steps 1-10
  kLaterSteps,      // later steps: a borderline config ("sometimes", largest bucket)
  kSampling,        // previews during training
  kVideoSpike,      // video model on training steps: frames/buckets
  kEnvironment,     // GPU/worker state, other processes holding memory
};

// Finer-grained activity at the moment of failure (informative, not a playbook phase).
enum class Stage { kUnknown, kModelLoad, kQuantize, kCaching, kBaselineSample, kTrainingStep, kSampling, kSaving };

enum class ModelKind { kUnknown, kImage, kVideo };

const char* trainer_name(Trainer t);
const char* trainer_display_name(Trainer t);
const char* family_name(ModelFamily f);
const char* cause_name(Cause c);
const char* phase_name(Phase p);
const char* stage_name(Stage s);
const char* kind_name(ModelKind k);
bool is_video_family(ModelFamily f);

// Numbers from PyTorch's allocator message (bytes); absent when the log does not state them.
struct MemoryNumbers {
  std::optional<int64_t> tried_to_allocate;
  std::optional<int64_t> total;
  std::optional<int64_t> free;
  std::optional<int64_t> process_in_use;        // "this process has X memory in use"
  std::optional<int64_t> allocated_by_pytorch;
  std::optional<int64_t> reserved_unallocated;  // reserved by PyTorch but unallocated
  std::optional<int64_t> other_processes;       // listed other processes, or total-free-this process
  bool new_format = false;                      // PyTorch >= 2.1 wording (expandable_segments exists)
  bool fragmentation = false;                   // reserved-unallocated is large: allocator setting first
};

// Training settings the log (or its printed config / command line) shows.
struct Settings {
  std::optional<int> batch_size;
  std::optional<int> gradient_accumulation;
  std::optional<int> rank;
  std::optional<int> max_resolution;   // largest bucket / resolution side, pixels
  std::optional<int> num_frames;       // largest frame count in the dataset config / buckets
  std::optional<int> sample_width;
  std::optional<int> sample_height;
  std::optional<int> sample_steps;
  std::optional<int> sample_every;
  std::optional<int> blocks_to_swap;
  std::optional<bool> gradient_checkpointing;
  std::optional<bool> low_vram;
  std::optional<bool> quantize;        // quantized/fp8 base (AI Toolkit quantize, kohya --fp8_base)
  std::optional<bool> disable_sampling;
  std::optional<bool> skip_first_sample;
  std::optional<bool> sample_at_first;
  std::optional<bool> memory_efficient_attention;  // xformers / sdpa
  std::optional<int> attention_chunk;   // lora-train memory.attention_chunk (query rows per chunk; 0 = off)
  std::optional<bool> vae_tiling;       // tiled VAE encode/decode (lora-train memory.vae_tiling, musubi --vae_tiling, ...)
  std::optional<bool> cache_latents;
  std::optional<std::string> precision;
  std::optional<std::string> optimizer;
  std::vector<int> resolutions;        // bucket / resolution list when printed (sorted, unique)
};

struct Evidence {
  int64_t line = 0;
  std::string text;  // valid UTF-8, at most ~400 bytes
  std::string why;
};

// One change to make, in the detected trainer's own vocabulary.
struct Fix {
  std::string id;           // stable: allocator_config, free_gpu, gradient_checkpointing, ...
  std::string setting;      // e.g. "train.gradient_checkpointing: true" or "--gradient_checkpointing"
  std::string config_key;   // lora-train / AI Toolkit YAML key under config.process[0] ("" if none)
  std::string value;        // value for config_key ("" if none)
  std::string description;  // one sentence: what and why
};

// A lora-train run whose OOM guard handled every OOM and that then finished (src/memory/guard.cpp
// writes the events and the summary, src/train/trainer.cpp the end of the run).
struct Recovery {
  int oom_events = 0;                // OOMs the guard handled
  std::vector<std::string> changes;  // what it changed, in order (its "action:" texts)
  std::string final_settings;        // the settings it ended on ("oom-guard: settings now: ...")
  std::string effective_config;      // the config with those settings ("the settings that worked: ...")
  std::optional<int64_t> steps;      // steps the run completed
};

// A lever that costs nothing in results (chunked / memory-efficient attention, tiled VAE) that the
// run already had on: it is not recommended again, and the report says it was tried.
struct TriedLever {
  std::string id;       // fix id it would have been: memory_efficient_attention, vae_tiling
  std::string setting;  // what is on, in the trainer's words ("memory.attention_chunk: 1024")
  std::string price;    // lora-train: the guard's price line for that change ("" when none)
};

struct Diagnosis {
  bool oom = false;
  Cause cause = Cause::kNone;
  double confidence = 0.0;
  Phase phase = Phase::kUnknown;
  double phase_confidence = 0.0;
  Stage stage = Stage::kUnknown;
  std::optional<int64_t> step;  // training step at which it died (1-based), when known
  Trainer trainer = Trainer::kUnknown;
  std::string trainer_detail;   // e.g. "kohya_ss GUI"
  ModelFamily family = ModelFamily::kUnknown;
  ModelKind kind = ModelKind::kUnknown;
  MemoryNumbers memory;
  Settings settings;
  std::string error_line;       // the decisive error message (valid UTF-8)
  std::vector<Evidence> evidence;
  std::vector<Fix> fixes;
  std::vector<std::string> notes;  // extra advice (step-1 rule, environment, host RAM...)
  // Why the phase is `environment` (stable ids: cuda_context, other_processes, little_pytorch, free_but_failed,
  // pinned_memory, one_rank, full_before_training, cublas_before_training, guard); "" otherwise.
  std::string environment;
  bool recovered = false;       // the OOMs were handled and the run finished: no fixes, see recovery
  Recovery recovery;
  // Whether the failing traceback runs through the VAE (encode/decode); null without a traceback.
  // Tiling the VAE helps a preview or a caching pass only there.
  std::optional<bool> in_vae;
  std::vector<TriedLever> tried;           // free levers already on (not among the fixes)
  std::vector<std::string> guard_prices;   // lora-train: the guard's "price of #N (...): ..." lines
  int64_t lines = 0;
  int64_t bytes = 0;
};

}  // namespace lt::diagnose
