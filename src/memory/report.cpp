#include "loratrain/memory/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loratrain/util/strings.h"

namespace lt::memory {

MemorySnapshot snapshot(const DeviceMemory& memory) {
  return {memory.allocated(), memory.reserved(), memory.peak_allocated()};
}

void PhasePeaks::record(Phase phase, const MemorySnapshot& s) {
  Entry& e = entries_[index(phase)];
  e.peak.allocated = std::max(e.peak.allocated, s.allocated);
  e.peak.reserved = std::max(e.peak.reserved, s.reserved);
  e.peak.peak = std::max(e.peak.peak, std::max(s.peak, s.allocated));
  e.count += 1;
}

int64_t PhasePeaks::overall_peak() const {
  int64_t p = 0;
  for (const Entry& e : entries_) p = std::max(p, e.peak.peak);
  return p;
}

std::string PhasePeaks::table() const {
  std::string out;
  for (size_t i = 0; i < kPhases; ++i) {
    const Entry& e = entries_[i];
    if (e.count == 0) continue;
    out += fmt::format("  {:<16} peak {:>10}  reserved {:>10}  ({} time{})\n",
                       to_string(static_cast<Phase>(i)), format_bytes(e.peak.peak),
                       format_bytes(e.peak.reserved), e.count, e.count == 1 ? "" : "s");
  }
  return out;
}

void to_json(nlohmann::json& j, const PhasePeaks& p) {
  j = nlohmann::json::object();
  for (size_t i = 0; i < PhasePeaks::kPhases; ++i) {
    const auto& e = p.entries_[i];
    if (e.count == 0) continue;
    j[to_string(static_cast<Phase>(i))] = {{"peak_allocated", e.peak.peak},
                                           {"peak_reserved", e.peak.reserved},
                                           {"entered", e.count}};
  }
}

std::string format_progress(const MemorySnapshot& s) {
  const int64_t top = std::max(s.allocated, s.peak);
  const char* unit = "MiB";
  double scale = 1048576.0;
  if (top >= (int64_t(1) << 30)) {
    unit = "GiB";
    scale = 1073741824.0;
  }
  return fmt::format("mem {:.1f}/{:.1f} {}", s.allocated / scale, s.peak / scale, unit);
}

void to_json(nlohmann::json& j, const MemorySnapshot& s) {
  j = nlohmann::json{{"allocated", s.allocated}, {"reserved", s.reserved}, {"peak", s.peak}};
}

}  // namespace lt::memory
