#include "loratrain/playbook/vocabulary.h"

#include <ostream>

#include <fmt/format.h>

namespace lt::playbook {

namespace {

template <class Enum, size_t N>
std::optional<Enum> lookup(std::string_view name, const Enum (&all)[N]) {
  for (Enum e : all) {
    if (name == to_string(e)) return e;
  }
  return std::nullopt;
}

constexpr Phase kPhases[] = {Phase::load, Phase::cache, Phase::baseline_sample, Phase::train_step, Phase::sample,
                             Phase::save};
constexpr Classification kClassifications[] = {Classification::load,        Classification::early_steps,
                                               Classification::sometimes,   Classification::sampling,
                                               Classification::video_spike, Classification::environment,
                                               Classification::fragmentation};
constexpr ModelFamily kFamilies[] = {ModelFamily::kSD1,     ModelFamily::kSD2,      ModelFamily::kSDXL,
                                     ModelFamily::kSD3,     ModelFamily::kFlux,     ModelFamily::kChroma,
                                     ModelFamily::kWan,     ModelFamily::kHunyuan,  ModelFamily::kLtx,
                                     ModelFamily::kQwen,    ModelFamily::kLumina,   ModelFamily::kHiDream,
                                     ModelFamily::kZImage,  ModelFamily::kCogVideo, ModelFamily::kMochi};

}  // namespace

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::load: return "load";
    case Phase::cache: return "cache";
    case Phase::baseline_sample: return "baseline_sample";
    case Phase::train_step: return "train_step";
    case Phase::sample: return "sample";
    case Phase::save: return "save";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, Phase phase) { return os << to_string(phase); }

std::optional<Phase> phase_from_string(std::string_view name) { return lookup(name, kPhases); }

std::string describe(Phase phase, const PhaseContext& w) {
  return fmt::format("{}(step {}, bucket {}x{}, batch {})", to_string(phase), w.step, w.width, w.height, w.batch);
}

const char* to_string(Classification c) {
  switch (c) {
    case Classification::load: return "load";
    case Classification::early_steps: return "early_steps";
    case Classification::sometimes: return "sometimes";
    case Classification::sampling: return "sampling";
    case Classification::video_spike: return "video_spike";
    case Classification::environment: return "environment";
    case Classification::fragmentation: return "fragmentation";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, Classification c) { return os << to_string(c); }

std::optional<Classification> classification_from_string(std::string_view name) {
  return lookup(name, kClassifications);
}

const char* to_string(ModelFamily f) {
  switch (f) {
    case ModelFamily::kUnknown: return "unknown";
    case ModelFamily::kSD1: return "sd1";
    case ModelFamily::kSD2: return "sd2";
    case ModelFamily::kSDXL: return "sdxl";
    case ModelFamily::kSD3: return "sd3";
    case ModelFamily::kFlux: return "flux";
    case ModelFamily::kChroma: return "chroma";
    case ModelFamily::kWan: return "wan";
    case ModelFamily::kHunyuan: return "hunyuan";
    case ModelFamily::kLtx: return "ltx";
    case ModelFamily::kQwen: return "qwen";
    case ModelFamily::kLumina: return "lumina";
    case ModelFamily::kHiDream: return "hidream";
    case ModelFamily::kZImage: return "zimage";
    case ModelFamily::kCogVideo: return "cogvideo";
    case ModelFamily::kMochi: return "mochi";
  }
  return "unknown";
}

std::optional<ModelFamily> family_from_string(std::string_view name) { return lookup(name, kFamilies); }

bool is_video(ModelFamily f) {
  return f == ModelFamily::kWan || f == ModelFamily::kHunyuan || f == ModelFamily::kLtx ||
         f == ModelFamily::kCogVideo || f == ModelFamily::kMochi;
}

std::optional<ModelFamily> family_from_arch(std::string_view arch) {
  if (arch.empty()) return std::nullopt;
  if (arch == "wan21") return ModelFamily::kWan;
  if (auto family = family_from_string(arch)) return family;
  return ModelFamily::kUnknown;
}

}  // namespace lt::playbook
