// Caption processing after AI Toolkit (dataloader_mixins.py CaptionProcessingDTOMixin.get_caption):
// caption dropout first (the whole caption, trigger included, becomes ""); `[trigger]` and `[name]`
// are replaced by the trigger word; comma-separated tags are dropped/shuffled; finally a caption
// that lacks the trigger gets it prepended with a space (inject_trigger_into_prompt), so every
// non-dropped caption contains the trigger.
//
// keep_tokens follows kohya (sd-scripts): the first N tags keep their place when shuffling and are
// never dropped. (AI Toolkit's keep_tokens only protects tags from token dropout and its shuffle
// moves every tag, the trigger included; kohya's rule is the one users set keep_tokens for.)
#pragma once
#include <string>

#include "loratrain/data/rng.h"

namespace lt::data {

struct CaptionOptions {
  std::string trigger_word;           // "" = none
  double caption_dropout_rate = 0.0;  // probability of training on the empty caption
  double token_dropout_rate = 0.0;    // per-tag drop probability (tags after keep_tokens)
  bool shuffle_tokens = false;        // shuffle the comma-separated tags after keep_tokens
  int keep_tokens = 0;
};

// Replaces `[trigger]` and `[name]` with `trigger`; when `trigger` is not empty and does not occur
// in the result, prepends "trigger " (AI Toolkit). An empty trigger just removes the placeholders.
std::string inject_trigger(const std::string& caption, const std::string& trigger);

// Applies the options with draws from `rng` (dropout, then trigger, then tags).
// With no dropout, shuffling or token dropout the caption is returned verbatim apart from the
// trigger; tags are otherwise trimmed, empty ones removed, and joined with ", ".
std::string process_caption(const std::string& raw, const CaptionOptions& options, Rng& rng);

// True when process_caption's result depends on the random draws.
bool caption_is_random(const CaptionOptions& options);

}  // namespace lt::data
