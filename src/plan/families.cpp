// The planner's one place that names families: each family's architecture model lives in its own
// file (family_<name>.cpp).
#include <algorithm>
#include <string>

#include "architecture.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::plan {

void count_weights(const io::SafetensorsFile& file, const std::string& prefix, int64_t& total, int64_t& largest,
                   int64_t* linear) {
  for (const auto& t : file.tensors()) {
    if (!starts_with(t.name, prefix) || ends_with(t.name, "spiece_model") || ends_with(t.name, "scale_weight") ||
        ends_with(t.name, "scaled_fp8")) {
      continue;
    }
    int64_t n = 1;
    for (int64_t v : t.shape) n *= v;
    total += n;
    largest = std::max(largest, n);
    if (linear && t.shape.size() == 2 && ends_with(t.name, ".weight")) *linear += n;
  }
}

std::unique_ptr<Architecture> make_architecture(const ModelSource& source) {
  switch (source.family) {
    case playbook::ModelFamily::kSD1:
    case playbook::ModelFamily::kSD2:
    case playbook::ModelFamily::kSDXL:
      return make_sd_architecture(source);
    case playbook::ModelFamily::kFlux:
      return make_flux_architecture(source);
    case playbook::ModelFamily::kWan:
      return make_wan_architecture(source);
    default:
      break;
  }
  throw InputError(std::string("plan: the ") + playbook::to_string(source.family) +
                   " family has no memory model yet (sd1, sd2, sdxl, flux and wan21 are planned)");
}

}  // namespace lt::plan
