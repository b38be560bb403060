#include "loratrain/memory/settings.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace lt::memory {

const char* to_string(Quantize q) {
  switch (q) {
    case Quantize::none: return "none";
    case Quantize::fp8: return "fp8";
    case Quantize::int8: return "int8";
  }
  return "none";
}

std::vector<int> MemorySettings::active_resolutions() const {
  const int keep = std::max<int>(0, static_cast<int>(resolutions.size()) - dropped_largest);
  return std::vector<int>(resolutions.begin(), resolutions.begin() + keep);
}

int MemorySettings::largest_resolution() const {
  auto active = active_resolutions();
  return active.empty() ? 0 : active.back();
}

bool MemorySettings::operator==(const MemorySettings& o) const {
  return gradient_checkpointing == o.gradient_checkpointing && batch_size == o.batch_size &&
         grad_accumulation == o.grad_accumulation && resolutions == o.resolutions &&
         dropped_largest == o.dropped_largest && sample_width == o.sample_width &&
         sample_height == o.sample_height && sample_steps == o.sample_steps &&
         sample_every == o.sample_every && disable_sampling == o.disable_sampling &&
         skip_first_sample == o.skip_first_sample && low_vram == o.low_vram &&
         quantize == o.quantize && num_frames == o.num_frames &&
         sample_num_frames == o.sample_num_frames && is_video == o.is_video;
}

std::string summarize(const MemorySettings& s) {
  std::string buckets;
  for (int r : s.active_resolutions()) buckets += (buckets.empty() ? "" : ",") + std::to_string(r);
  std::string out = fmt::format("checkpointing {}, batch {} x accumulation {}, buckets [{}]",
                                s.gradient_checkpointing ? "on" : "off", s.batch_size,
                                s.grad_accumulation, buckets);
  if (s.is_video) out += fmt::format(", frames {}", s.num_frames);
  if (s.disable_sampling) out += ", sampling off";
  else
    out += fmt::format(", samples {}x{}/{} steps{}", s.sample_width, s.sample_height,
                       s.sample_steps, s.skip_first_sample ? " (no baseline)" : "");
  if (s.low_vram) out += ", low_vram";
  if (s.quantize != Quantize::none) out += fmt::format(", base {}", to_string(s.quantize));
  return out;
}

void to_json(nlohmann::json& j, const MemorySettings& s) {
  j = nlohmann::json{{"gradient_checkpointing", s.gradient_checkpointing},
                     {"batch_size", s.batch_size},
                     {"gradient_accumulation", s.grad_accumulation},
                     {"resolutions", s.resolutions},
                     {"active_resolutions", s.active_resolutions()},
                     {"dropped_largest", s.dropped_largest},
                     {"sample_width", s.sample_width},
                     {"sample_height", s.sample_height},
                     {"sample_steps", s.sample_steps},
                     {"sample_every", s.sample_every},
                     {"disable_sampling", s.disable_sampling},
                     {"skip_first_sample", s.skip_first_sample},
                     {"low_vram", s.low_vram},
                     {"quantize", to_string(s.quantize)},
                     {"num_frames", s.num_frames},
                     {"sample_num_frames", s.sample_num_frames},
                     {"is_video", s.is_video}};
}

}  // namespace lt::memory
