// When did it die (OOM_PLAYBOOK.md §2)? The evidence, strongest first: lora-train's guard line,
// the traceback (phase_rules.h frame and code rules), the latest activity line before the error,
// and weak traceback hints. Environment verdicts come later (verdict.h).
#pragma once
#include <optional>
#include <string>

#include "analyzer_state.h"

namespace lt::diagnose::detail {

// How much each kind of evidence is trusted (phase_confidence).
constexpr double kGuardPhaseConfidence = 0.99;     // lora-train's guard names its phase
constexpr double kStrongFrameConfidence = 0.9;     // a function that only runs in that activity
constexpr double kActivityLineConfidence = 0.75;   // the trainer's latest activity line
constexpr double kDisputedActivityConfidence = 0.6;  // ... while a weak traceback hint disagrees
constexpr double kWeakFrameConfidence = 0.55;      // only a weak traceback hint
constexpr double kNoEvidenceConfidence = 0.3;      // nothing tells: the playbook's likeliest phase

struct PhaseDecision {
  Stage stage = Stage::kUnknown;
  Phase phase = Phase::kUnknown;
  double confidence = kNoEvidenceConfidence;
  std::optional<int64_t> step;
  FrameVerdict frames;             // what the traceback said
  const Marker* marker = nullptr;  // the activity line that decided, if any
  Activity activity;               // the activity at the failure
  bool from_guard = false;
};

PhaseDecision decide_phase(const AnalyzerState& st, const Diagnosis& d, const CauseRecord* decisive);

// Stage, phase, step and confidence into the diagnosis, with the step-1 note.
void apply_phase(const PhaseDecision& p, Diagnosis& d);

// Evidence lines: the decisive signature, the guard line, the activity line and traceback frame
// that decided the phase; in log order.
void add_evidence(const AnalyzerState& st, const CauseRecord* decisive, const PhaseDecision& p, Diagnosis& d);

}  // namespace lt::diagnose::detail
