// The planner's one place that names families: each family's architecture model lives in its own
// file (family_<name>.cpp).
#include <string>

#include "architecture.h"
#include "loratrain/util/error.h"

namespace lt::plan {

std::unique_ptr<Architecture> make_architecture(const ModelSource& source) {
  switch (source.family) {
    case playbook::ModelFamily::kSD1:
    case playbook::ModelFamily::kSD2:
    case playbook::ModelFamily::kSDXL:
      return make_sd_architecture(source);
    case playbook::ModelFamily::kFlux:
      return make_flux_architecture(source);
    case playbook::ModelFamily::kWan:
      // Wan's models load and run (src/models/wan), but `run` does not train them yet; its memory
      // model (frames x tokens, the causal VAE's frame cache) comes with the training family.
      throw InputError("plan: Wan training is not available in lora-train yet, so there is nothing to plan (sd1, sd2, "
                       "sdxl and flux are planned)");
    default:
      break;
  }
  throw InputError(std::string("plan: the ") + playbook::to_string(source.family) +
                   " family has no memory model yet (sd1, sd2, sdxl and flux are planned)");
}

}  // namespace lt::plan
