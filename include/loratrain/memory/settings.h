// The memory-relevant part of a run's configuration: what the rollback ladder may change. The
// trainer maps it to and from its config (keys in the comments are the YAML keys).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lt::memory {

enum class Quantize { none, fp8, int8 };
const char* to_string(Quantize q);

struct MemorySettings {
  bool gradient_checkpointing = false;  // train.gradient_checkpointing
  int batch_size = 1;                   // train.batch_size
  int grad_accumulation = 1;            // train.gradient_accumulation
  std::vector<int> resolutions;         // datasets[].resolution, ascending
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

  // The resolutions still in use (the configured ones minus the dropped largest).
  std::vector<int> active_resolutions() const;
  int largest_resolution() const;  // 0 when no resolution is configured
  int effective_batch() const { return batch_size * grad_accumulation; }
  bool operator==(const MemorySettings& other) const;
  bool operator!=(const MemorySettings& other) const { return !(*this == other); }
};

// "checkpointing on, batch 1 x accumulation 4, buckets [256], samples 256x256/10 steps, ..."
std::string summarize(const MemorySettings& s);

void to_json(nlohmann::json& j, const MemorySettings& s);

}  // namespace lt::memory
