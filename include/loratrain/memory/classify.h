// Classification (OOM_PLAYBOOK.md §2): from the phase and the memory state at the failure, which
// kind of OOM this is. A pure function: everything it reads is in FailureContext.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>

#include "loratrain/memory/device_memory.h"
#include "loratrain/memory/oom.h"
#include "loratrain/playbook/settings.h"
#include "loratrain/playbook/vocabulary.h"

namespace lt::memory {

// The playbook's vocabulary, spoken here unqualified.
using playbook::Classification;
using playbook::MemorySettings;
using playbook::Phase;
using playbook::PhaseContext;
using playbook::Quantize;
using playbook::increased_frames;
using playbook::reduced_frames;

// Thresholds, named once (docs/oom-guard.md explains each).
inline constexpr int64_t kEarlyStepLimit = 10;           // steps 1..10 are "early"
inline constexpr int kConservativeResolution = 512;      // largest bucket <= 512 is conservative
inline constexpr int kConservativeFrames = 33;           // clips of <= 33 frames are conservative
inline constexpr double kForeignFraction = 0.25;         // > 25% of the card held by others
inline constexpr double kFragmentedFraction = 0.25;      // reserved-unallocated > 25% of total
inline constexpr int64_t kFragmentedBytes = int64_t(1) << 30;  // ... or > 1 GiB
inline constexpr int kTransientRetries = 3;              // empty-cache retries per step when it fits

struct FailureContext {
  Phase phase = Phase::train_step;
  PhaseContext where;
  bool largest_bucket = false;     // the failing batch is from the largest active resolution
  MemorySettings settings;         // in effect when it failed
  OomInfo error;                   // detection result and the message's numbers
  FreeTotal at_start;              // free/total when the run started (check_start)
  int64_t foreign_at_start = 0;    // bytes held by something else at start (total - free - ours)
  int64_t steps_completed = 0;     // training steps that succeeded in this run
  bool same_step_failed_before = false;  // this (phase, step) already failed once
};

struct Classified {
  Classification kind = Classification::early_steps;
  // The class whose ladder applies once a quick retry (fragmentation, environment) is used up;
  // equal to `kind` otherwise.
  Classification ladder = Classification::early_steps;
  bool first_step = false;      // a training step before any step succeeded ("step 1 exactly")
  bool largest_bucket = false;
  // The request would have fit in free memory: nothing to shrink, a retry is justified by the
  // evidence itself (an injected fault, memory freed meanwhile). Up to kTransientRetries per step.
  bool transient = false;
  std::string reason;           // one sentence: the evidence
};

// Batch 1, checkpointing on, largest bucket <= 512, clips <= 33 frames: the playbook's
// "already conservative" settings.
bool is_conservative(const MemorySettings& s);

Classified classify(const FailureContext& ctx);

}  // namespace lt::memory
