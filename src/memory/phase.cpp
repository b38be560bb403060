#include "loratrain/memory/phase.h"

#include <ostream>

#include <fmt/format.h>

namespace lt::memory {

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

std::optional<Phase> phase_from_string(std::string_view name) {
  for (Phase p : {Phase::load, Phase::cache, Phase::baseline_sample, Phase::train_step,
                  Phase::sample, Phase::save}) {
    if (name == to_string(p)) return p;
  }
  return std::nullopt;
}

std::string describe(Phase phase, const PhaseContext& w) {
  return fmt::format("{}(step {}, bucket {}x{}, batch {})", to_string(phase), w.step, w.width,
                     w.height, w.batch);
}

}  // namespace lt::memory
