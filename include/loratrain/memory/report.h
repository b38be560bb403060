// Memory reports: a snapshot at phase boundaries, the peak per phase, and the progress line's
// memory field.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "loratrain/memory/device_memory.h"
#include "loratrain/playbook/vocabulary.h"

namespace lt::memory {

using playbook::Phase;

struct MemorySnapshot {
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t peak = 0;  // peak allocated since the last reset
};

MemorySnapshot snapshot(const DeviceMemory& memory);

// The highest allocated/reserved memory seen in each phase over the whole run.
class PhasePeaks {
 public:
  static constexpr size_t kPhases = 6;
  void record(Phase phase, const MemorySnapshot& at_exit);  // max with what was seen before
  bool seen(Phase phase) const { return entries_[index(phase)].count > 0; }
  const MemorySnapshot& peak(Phase phase) const { return entries_[index(phase)].peak; }
  int64_t overall_peak() const;
  // One line per phase seen: "train_step   peak 1.21 GiB  reserved 1.30 GiB  (60 times)".
  std::string table() const;

  friend void to_json(nlohmann::json& j, const PhasePeaks& p);

 private:
  struct Entry {
    MemorySnapshot peak;
    int64_t count = 0;
  };
  static size_t index(Phase p) { return static_cast<size_t>(p); }
  std::array<Entry, kPhases> entries_{};
};

// The progress line's field: "mem 1.2/1.5 GiB" (allocated / peak, the unit of the larger).
std::string format_progress(const MemorySnapshot& s);

void to_json(nlohmann::json& j, const MemorySnapshot& s);

}  // namespace lt::memory
