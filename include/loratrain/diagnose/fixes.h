// The playbook's ordered fixes (OOM_PLAYBOOK.md §2-§3) for a diagnosis, written in the detected
// trainer's own vocabulary (AI Toolkit YAML keys, kohya/musubi flags, diffusers flags, ...).
#pragma once
#include <vector>

#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose {

// Ordered, safest first; skips what the settings show is already done. Empty when there is nothing
// memory-related to change (e.g. a missing file); look-alikes get their own short advice.
std::vector<Fix> plan_fixes(const Diagnosis& d);

// The free levers (chunked / memory-efficient attention, tiled VAE) the settings show are already on,
// with lora-train's guard price for each when the log has one.
std::vector<TriedLever> tried_levers(const Diagnosis& d);

}  // namespace lt::diagnose
