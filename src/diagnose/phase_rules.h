// What each trainer's log shows about the activity under way: its own progress messages, the
// descriptions of its tqdm bars, and the functions and calls of its tracebacks. The rows are read
// from the trainers' source code; each names the file it comes from (docs/diagnose.md lists them
// by trainer). A new trainer is rows here, plus its identification markers in identify.cpp.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose::detail {

// A line the trainer prints when an activity starts or runs. `stage` kTrainingStep means "the
// training loop has begun"; kBaselineSample is the preview before step 1.
struct ActivityMessage {
  const char* text;               // lowercase
  Stage stage;
  bool starts_training = true;    // for kTrainingStep rows: the message alone proves the loop began
  bool inside_words = false;      // may match inside a word ("Quantizing" in "dequantizing": no harm)
};
const std::vector<ActivityMessage>& activity_messages();

// What a tqdm bar is, by its description ("Caching latents:  40%|...").
enum class BarKind {
  kActivity,          // marks `stage` as under way
  kBeforeTraining,    // marks `stage` (loading-like work) only before training has started
  kEpochs,            // counts epochs: training has begun, the step is unknown (OneTrainer)
  kTrainingProgress,  // counts training steps
  kIgnore,            // e.g. validation-loss bars: neither training progress nor previews
};
struct BarRule {
  const char* text;   // lowercase part of the description
  BarKind kind;
  Stage stage = Stage::kUnknown;
  bool prefix = false;  // the description starts with `text` (else: contains it)
};
// Ordered: the first rule that matches a description decides.
const std::vector<BarRule>& bar_rules();

// One traceback frame: `File "<path>", line N, in <func>` and the source line under it.
struct Frame {
  std::string func;  // lowercase
  std::string file;  // base name, lowercase
  std::string code;  // the frame's source line, lowercase, trimmed (may be empty)
};

// How sure a frame rule is. Strong rules decide the phase over the log's activity lines; weak
// ones only when the log has no activity line at all.
enum class Strength { kStrong, kWeak };
enum class NameMatch { kExact, kPrefix, kContains };
struct FrameRule {
  const char* name;   // lowercase function name (or part of it)
  NameMatch match;
  Stage stage;
  Strength strength = Strength::kStrong;
  const char* file = nullptr;  // only in a file whose base name contains this
  const char* except = nullptr;  // never a function whose name contains this
};
const std::vector<FrameRule>& frame_rules();

// A call in a frame's source line that tells the activity even when the traceback is cut short
// ("accelerator.prepare(" in a diffusers script's main()).
struct CodeRule {
  const char* text;  // lowercase part of the source line
  Stage stage;
  Strength strength;
};
const std::vector<CodeRule>& code_rules();

// The activity a traceback shows, by priority (previews, training step, caching, quantising,
// loading; strong rules before weak ones). kUnknown when no rule matches.
struct FrameVerdict {
  Stage stage = Stage::kUnknown;
  Strength strength = Strength::kWeak;
  std::string why;  // "in sample_images (train_util.py)" / "calls accelerator.prepare("
};
FrameVerdict stage_from_frames(const std::vector<Frame>& frames);

}  // namespace lt::diagnose::detail
