// The phases of a run (DESIGN.md principle 4). The trainer enters each through
// OomGuard::enter(), so at a failure the guard knows where it was without guessing.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

namespace lt::memory {

enum class Phase { load, cache, baseline_sample, train_step, sample, save };

const char* to_string(Phase phase);
std::ostream& operator<<(std::ostream& os, Phase phase);
std::optional<Phase> phase_from_string(std::string_view name);

// Where inside the phase we are. Zero means "not applicable / unknown" and prints as 0.
struct PhaseContext {
  int64_t step = 0;     // 1-based training step (train_step, sample and save at a step)
  int width = 0;        // bucket resolution of the batch (train_step) or preview size (sample)
  int height = 0;
  int frames = 0;       // frames per sample (video), 0 or 1 for images
  int batch = 0;        // batch size of this step
  int resolution = 0;   // the configured base resolution this bucket belongs to (e.g. 1024), 0 = infer
};

// "train_step(step 3, bucket 512x512, batch 4)": the part of the guard's log line that names the
// phase. Every field is always printed (0 when unknown) so the line has one fixed shape.
std::string describe(Phase phase, const PhaseContext& where);

}  // namespace lt::memory
