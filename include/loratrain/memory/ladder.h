// The rollback ladder (OOM_PLAYBOOK.md §3-§5) as pure functions: given how it failed, the settings
// in effect and what was tried, the one next change. No I/O, no device: tests assert sequences.
// Each phase's ladder starts with the levers that change nothing in the results, then follows the
// playbook's order for the settings it names (docs/oom-guard.md lists every ladder).
#pragma once
#include <iosfwd>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "loratrain/memory/classify.h"

namespace lt::memory {

// The attention chunk the guard sets: small enough that one chunk's scores of a long sequence
// (SDXL's 4096 tokens, a Wan clip's tens of thousands) are a fraction of the whole matrix.
inline constexpr int kGuardAttentionChunk = 1024;

enum class ActionKind {
  empty_cache_retry,       // same settings, caches emptied: once per failing step (a few times
                           // when the request fitted in free memory: transient)
  chunk_attention,         // attention a chunk of query rows at a time: exact, the first lever
  tile_vae,                // VAE encode/decode in blended tiles (within the VAE's tiling tolerance)
  enable_checkpointing,
  batch_to_one,            // gradient accumulation multiplied by the old batch: effective batch kept
  drop_largest_bucket,     // its images are re-bucketed to the next resolution down
  checkpointing_and_lower_resolution,  // "step 1 exactly, every time": both at once
  shrink_samples,          // halve preview width/height (floor 256) and steps (floor 8)
  disable_sampling,        // no previews, baseline included
  skip_baseline_sample,
  enable_low_vram,         // text encoder / VAE on the CPU except while used
  quantize_base,           // frozen base weights stored as int8 with per-channel scales
  reduce_frames,           // halve num_frames (dataset and sample), on the 4k+1 grid when used
  give_up_exhausted,       // exit 3
  give_up_environment,     // exit 4
  give_up_host_memory,     // host RAM exhausted, not the device: exit 1 (the ladder cannot help)
  scale_up,                // §5: one heavier setting back after stable steps
  revert_scale_up,         // the scale-up failed: back to the last stable settings, for good
};
const char* to_string(ActionKind k);
std::ostream& operator<<(std::ostream& os, ActionKind k);
inline bool gives_up(ActionKind k) {
  return k == ActionKind::give_up_exhausted || k == ActionKind::give_up_environment ||
         k == ActionKind::give_up_host_memory;
}

struct Action {
  ActionKind kind = ActionKind::give_up_exhausted;
  std::string description;  // what changed, in the config's keys: "train.batch_size 4 -> 1 (...)"
  MemorySettings settings;  // the settings after the change
  bool gives_up() const { return memory::gives_up(kind); }
  int exit_code() const;    // 3 exhausted, 4 environment, 1 host memory, 0 otherwise
};

// The guard's memory of earlier failures, as far as the ladder needs it.
struct LadderHistory {
  MemorySettings initial;                  // as configured
  std::vector<MemorySettings> failed;      // every settings under which an OOM happened
  struct QuickRetry {
    Phase phase;
    int64_t step;
  };
  std::vector<QuickRetry> quick_retries;   // empty-cache retries already spent
  int environment_failures = 0;            // environment-classified failures so far

  bool tried(const MemorySettings& s) const;
  bool quick_retried(Phase phase, int64_t step) const { return quick_retries_at(phase, step) > 0; }
  int quick_retries_at(Phase phase, int64_t step) const;
};

// The one next change for this failure. Never returns settings that already failed, nor the
// current settings, except empty_cache_retry (once per failing step). Gives up with exit 3 when
// no lever is left, and with exit 4 for an environment failure after at most one retry.
Action next_action(const FailureContext& ctx, const Classified& c, const LadderHistory& history);

// §5 scale-up, opt-in. Levers in playbook order; the stable memory settings (checkpointing,
// low_vram, quantization) are never undone.
enum class ScaleLever { larger_bucket, richer_sampling, larger_batch, more_frames };
const char* to_string(ScaleLever l);
std::ostream& operator<<(std::ostream& os, ScaleLever l);

struct ScaleUp {
  ScaleLever lever;
  Action action;  // kind scale_up
};

// The next heavier setting to re-enable, or nothing when every lever is back at its configured
// value or blocked (it failed once after a scale-up: reverted for good).
std::optional<ScaleUp> next_scale_up(const MemorySettings& current, const MemorySettings& initial,
                                     const std::set<ScaleLever>& blocked);


}  // namespace lt::memory
