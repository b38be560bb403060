// The OOM playbook's vocabulary (OOM_PLAYBOOK.md), named once for the OOM guard (memory) and the
// log doctor (diagnose): where a run is (Phase), which kind of OOM it is (Classification), and the
// model families both speak of. No LibTorch: diagnose builds without it.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

namespace lt::playbook {

// Where a run is (DESIGN.md principle 4): the trainer enters each phase through the guard; a
// log's activity maps onto the same names.
enum class Phase { load, cache, baseline_sample, train_step, sample, save };

const char* to_string(Phase phase);
std::ostream& operator<<(std::ostream& os, Phase phase);
std::optional<Phase> phase_from_string(std::string_view name);

// What was being done inside the phase. Zero means "not applicable / unknown".
struct PhaseContext {
  int64_t step = 0;     // 1-based training step (train_step, sample and save at a step)
  int width = 0;        // bucket of the batch (train_step), image being encoded (cache), preview (sample)
  int height = 0;
  int frames = 0;       // frames per sample (video), 0 or 1 for images
  int batch = 0;        // samples in the batch (train_step, cache) or previews at once (sample)
  int resolution = 0;   // the configured base resolution this bucket belongs to (e.g. 1024), 0 = infer
};

// "train_step(step 3, bucket 512x512, batch 4)": the part of the guard's log line that names the
// phase. Every field is always printed so the line has one fixed shape (diagnose reads it).
std::string describe(Phase phase, const PhaseContext& where);

// The playbook's §2 classes: when it happened decides the first change.
enum class Classification {
  load,           // A: loading, caching, baseline sample: before training starts
  early_steps,    // B: steps 1-10 (and later steps not explained by the largest bucket)
  sometimes,      // D: a later step, on the largest bucket (a borderline config)
  sampling,       // C: periodic previews
  video_spike,    // a video model's training step: frames are the lever
  environment,    // E: conservative settings failing before training, memory held elsewhere
  fragmentation,  // the request would fit: free or cached-but-unallocated memory is large
};
const char* to_string(Classification c);
std::ostream& operator<<(std::ostream& os, Classification c);
std::optional<Classification> classification_from_string(std::string_view name);

// Model families, those lora-train trains and those only diagnose meets in logs.
enum class ModelFamily {
  kUnknown,
  kSD1,      // Stable Diffusion 1.x
  kSD2,      // Stable Diffusion 2.x
  kSDXL,     // SDXL 1.0 and its fine-tunes
  kSD3,
  kFlux,     // Flux.1 dev / schnell
  kChroma,
  kWan,      // Wan 2.x video
  kHunyuan,  // HunyuanVideo
  kLtx,
  kQwen,
  kLumina,
  kHiDream,
  kZImage,
  kCogVideo,
  kMochi,
};
// "sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "wan", "hunyuan", ...; "unknown".
const char* to_string(ModelFamily f);
std::optional<ModelFamily> family_from_string(std::string_view name);
bool is_video(ModelFamily f);
// The config's model.arch (canonical names: sd1, sdxl, flux, wan21, ...) -> the family; nullopt
// for an empty arch (detect it), kUnknown for an arch of a family not listed here.
std::optional<ModelFamily> family_from_arch(std::string_view arch);

}  // namespace lt::playbook
