// Sample prompts: the `sample:` section's defaults, per-item overrides, and the inline flags of
// AI Toolkit (GenerateImageConfig._process_prompt_string) and kohya sd-scripts, e.g.
//   "a photo of [trigger] --w 512 --h 768 --seed 42 --cfg 7 --steps 20 --n blurry, lowres"
// Resolution order for every field: sample config default < item field < inline flag.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lt::sample {

// AI Toolkit SampleConfig defaults.
struct SampleDefaults {
  int64_t width = 512;
  int64_t height = 512;
  int64_t seed = 0;          // -1: a random seed per image (AI Toolkit)
  bool walk_seed = false;    // prompt i uses seed + i
  double guidance_scale = 7.0;
  int64_t sample_steps = 20;
  std::string neg;           // default negative prompt
  double network_multiplier = 1.0;
  double guidance_rescale = 0.0;
  int64_t num_frames = 1;
  int64_t fps = 16;
  std::optional<std::string> trigger_word;  // replaces [trigger] and [name]; absent removes them
};

// One `samples:` entry (or a legacy `prompts:` string: only `prompt` set).
struct SampleItem {
  std::string prompt;
  std::optional<int64_t> width, height, seed, sample_steps, num_frames, fps;
  std::optional<double> guidance_scale, network_multiplier;
  std::optional<std::string> neg;
  std::optional<std::string> ctrl_img;
};

// A fully resolved preview to render.
struct SamplePrompt {
  std::string text;      // prompt without flags, trigger substituted
  std::string negative;  // "" = unconditional (empty prompt)
  std::string text_2;    // --p2 (SDXL second encoder); empty = same as text
  std::string negative_2;  // --n2; empty = same as negative
  int64_t width = 512;
  int64_t height = 512;
  int64_t seed = 0;      // >= 0
  double guidance_scale = 7.0;
  int64_t steps = 20;
  double network_multiplier = 1.0;
  double guidance_rescale = 0.0;
  int64_t num_frames = 1;
  int64_t fps = 16;
  std::optional<std::string> ctrl_img;
  int64_t ctrl_idx = 0;
};

// Replaces "[trigger]" and "[name]" with `trigger` (or removes them), AI Toolkit
// inject_trigger_into_prompt with add_if_not_present = false.
std::string inject_trigger(std::string_view prompt, const std::optional<std::string>& trigger);

// Applies the inline flags of `prompt` to `out` (whose fields hold the defaults) and sets
// out.text. Flags start with "--" (the text is split on every "--", as AI Toolkit does); the flag
// name runs to the first space, its value is the rest up to the next flag, trimmed.
// Flags: --w --h, --seed/--d, --cfg/--l, --steps/--s, --n, --n2, --p2, --m/--network_multiplier,
// --gr, --frames/--num_frames, --fps, --ctrl_img, --ctrl_idx. An unknown flag or a malformed value
// throws lt::InputError naming the prompt (AI Toolkit ignores unknown flags silently).
void apply_prompt_flags(std::string_view prompt, SamplePrompt& out);

// Resolves prompt `index` of a sampling round: defaults, then the item's fields, then the seed
// (item seed, else seed + index with walk_seed, else seed; -1 draws a random seed), then the
// trigger word, then the inline flags.
SamplePrompt resolve_sample_prompt(const SampleItem& item, const SampleDefaults& defaults, int64_t index);
std::vector<SamplePrompt> resolve_sample_prompts(const std::vector<SampleItem>& items,
                                                 const SampleDefaults& defaults);

}  // namespace lt::sample
