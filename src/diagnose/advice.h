// Notes beside the fixes: short advice for the look-alikes (host RAM, NaN, GPU faults, ...), the
// free levers the run already had on, the playbook's step-1 rule, and what a recovered lora-train run changed and should start with.
#pragma once

#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose::detail {

void add_advice(Diagnosis& d);

// The "Already tried: ..." notes for d.tried (replacing earlier ones: --config can add levers).
void add_tried_notes(Diagnosis& d);

}  // namespace lt::diagnose::detail
