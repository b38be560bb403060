#include "checkpoint_headers.h"

#include <algorithm>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/util/strings.h"

namespace lt::plan {

void count_weights(const io::SafetensorsFile& file, const std::string& prefix, int64_t& total, int64_t& largest,
                   int64_t* linear) {
  for (const auto& t : file.tensors()) {
    if (!starts_with(t.name, prefix) || ends_with(t.name, "spiece_model") || ends_with(t.name, "scale_weight") ||
        ends_with(t.name, "scale_input") || ends_with(t.name, "scaled_fp8")) {
      continue;
    }
    int64_t n = 1;
    for (int64_t v : t.shape) n *= v;
    total += n;
    largest = std::max(largest, n);
    if (linear && t.shape.size() == 2 && ends_with(t.name, ".weight")) *linear += n;
  }
}

bool count_component(const std::filesystem::path& folder, int64_t& total, int64_t& largest, int64_t* linear,
                     const std::function<void(const io::SafetensorsFile&)>& each) {
  if (!std::filesystem::is_directory(folder)) return false;
  for (const auto& file : models::open_component_weights(folder)) {
    count_weights(*file, "", total, largest, linear);
    if (each) each(*file);
  }
  return true;
}

}  // namespace lt::plan
