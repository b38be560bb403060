// The memory-relevant part of a run's configuration: what the rollback ladder may change, in the
// config's own keys. One mapping to and from the config and one JSON form, used by the trainer,
// effective.yaml, fixed.yaml and the resumable state (a round trip is tested).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lt::config {
struct JobConfig;
struct ProcessConfig;
}  // namespace lt::config

namespace lt::playbook {

enum class Quantize { none, fp8, int8 };
const char* to_string(Quantize q);

struct MemorySettings {
  bool gradient_checkpointing = false;  // train.gradient_checkpointing
  int batch_size = 1;                   // train.batch_size
  int grad_accumulation = 1;            // train.gradient_accumulation
  std::vector<int> resolutions;         // datasets[].resolution, ascending, unique
  int dropped_largest = 0;              // how many of the largest resolutions are removed; their
                                        // images are re-bucketed to the largest one kept
  int sample_width = 512;               // sample.width
  int sample_height = 512;              // sample.height
  int sample_steps = 20;                // sample.sample_steps
  int sample_every = 0;                 // sample.sample_every (not a memory lever; kept for reports)
  bool disable_sampling = false;        // train.disable_sampling
  bool skip_first_sample = false;       // train.skip_first_sample (the baseline sample)
  bool low_vram = false;                // model.low_vram
  Quantize quantize = Quantize::none;   // model.quantize / model.qtype
  int num_frames = 1;                   // datasets[].num_frames
  int sample_num_frames = 1;            // sample.num_frames
  bool is_video = false;                // the model trains on clips (frames are a lever)
  // Levers that change nothing in the results (or stay within the VAE's own tiling tolerance).
  int attention_chunk = 0;              // memory.attention_chunk: query rows at a time, 0 = all
  bool vae_tiling = false;              // memory.vae_tiling: VAE encode/decode in overlapping tiles

  // The resolutions still in use (the configured ones minus the dropped largest).
  std::vector<int> active_resolutions() const;
  int largest_resolution() const;  // 0 when no resolution is configured
  int effective_batch() const { return batch_size * grad_accumulation; }
  bool operator==(const MemorySettings& other) const;
  bool operator!=(const MemorySettings& other) const { return !(*this == other); }
};

// What moving from one settings to the next asks of the trainer (the guard decides the settings;
// the trainer does this work in its loop).
struct SettingsChange {
  bool checkpointing = false;  // gradient checkpointing switched on the denoiser
  bool batch_size = false;     // the batch iterator takes the new batch size
  bool buckets = false;        // the largest resolution dropped or back: re-plan, re-cache latents
  bool frames = false;         // clip length changed: re-plan, re-cache latents
  bool quantize = false;       // the frozen base goes to 8 bits
  bool low_vram = false;       // encoders leave the device until used
  bool attention = false;      // the attention chunk size changed on every model
  bool vae_tiling = false;     // the VAE tiles (or stops tiling)
  bool any() const {
    return checkpointing || batch_size || buckets || frames || quantize || low_vram || attention || vae_tiling;
  }
};
SettingsChange changes(const MemorySettings& before, const MemorySettings& after);

// "checkpointing on, batch 1 x accumulation 4, buckets [256], samples 256x256/10 steps, ..."
std::string summarize(const MemorySettings& s);

void to_json(nlohmann::json& j, const MemorySettings& s);
// Reads what to_json writes; a missing key keeps the value already in `s`.
void from_json(const nlohmann::json& j, MemorySettings& s);

// The settings a process config asks for; `is_video` comes from the model family.
MemorySettings settings_from_config(const config::ProcessConfig& p, bool is_video);
// The job with `s` written back into its keys (effective.yaml, fixed.yaml); validated.
config::JobConfig config_with_settings(const config::JobConfig& job, const MemorySettings& s);

// Frame counts on the video VAEs' 4k+1 grid (Wan: 81 -> 41 -> 21 -> 9 -> 5): k is halved, so the
// count stays on the grid; counts off the grid are halved. Never below 1.
int reduced_frames(int frames);
// The inverse step, capped at `cap`.
int increased_frames(int frames, int cap);

// A frame count put on the 4k+1 grid as diffusers' WanPipeline rounds num_frames: 4 * (frames / 4)
// + 1 (40 -> 41, 34 -> 33, 2 -> 1); past the config's bound of 1024 it rounds down (1024 -> 1021).
int frames_on_video_grid(int frames);
// A video model's datasets[].num_frames and sample.num_frames put on that grid. A dataset's count
// above 1 stays a clip count (2 or 3 -> 5, not 1). Returns one line per key it changed, for the log.
std::vector<std::string> put_frames_on_video_grid(config::ProcessConfig& p);

}  // namespace lt::playbook
