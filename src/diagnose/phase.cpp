#include "phase.h"

#include <algorithm>
#include <climits>

#include "text.h"

namespace lt::diagnose::detail {
namespace {

// The most recent activity line wins; training progress counts as one.
Stage stage_from_activity(const Activity& a, const Marker** decided) {
  Stage best = Stage::kUnknown;
  int64_t best_seq = -1;
  *decided = nullptr;
  auto consider = [&](const Marker& m, Stage s) {
    if (m.seq > best_seq) {
      best_seq = m.seq;
      best = s;
      *decided = &m;
    }
  };
  for (Stage s : {Stage::kModelLoad, Stage::kQuantize, Stage::kCaching, Stage::kBaselineSample, Stage::kSampling,
                  Stage::kTrainingStep})
    consider(a.marker(s), s);
  consider(a.progress, Stage::kTrainingStep);
  consider(a.marker(Stage::kSaving), Stage::kSaving);
  return best;
}

bool any_activity(const Activity& a) {
  if (a.progress.seen()) return true;
  for (const Marker& m : a.markers)
    if (m.seen()) return true;
  return false;
}

// lora-train's phase names (src/playbook/vocabulary.cpp).
Stage guard_stage(const std::string& p) {
  if (p == "load") return Stage::kModelLoad;
  if (p == "cache") return Stage::kCaching;
  if (p == "baseline_sample") return Stage::kBaselineSample;
  if (p == "sample") return Stage::kSampling;
  if (p == "train_step") return Stage::kTrainingStep;
  if (p == "save") return Stage::kSaving;
  return Stage::kUnknown;
}

Phase phase_of_stage(Stage stage, const Diagnosis& d, std::optional<int64_t> step) {
  switch (stage) {
    case Stage::kModelLoad:
    case Stage::kQuantize:
    case Stage::kCaching: return Phase::kLoad;
    case Stage::kBaselineSample: return Phase::kBaselineSample;
    case Stage::kSampling: return Phase::kSampling;
    case Stage::kTrainingStep:
      if (d.kind == ModelKind::kVideo) return Phase::kVideoSpike;
      return (step && *step > 10) ? Phase::kLaterSteps : Phase::kEarlySteps;
    case Stage::kSaving: return (step && *step > 10) ? Phase::kLaterSteps : Phase::kEarlySteps;
    case Stage::kUnknown: break;
  }
  // Nothing tells (a bare traceback paste): training steps are where most GPU OOMs happen; the
  // host OOM killer mostly strikes while loading or caching.
  if (d.cause == Cause::kHostOom) return Phase::kLoad;
  return d.kind == ModelKind::kVideo ? Phase::kVideoSpike : Phase::kEarlySteps;
}

// The guard classified the failure itself (src/memory/classify.cpp): its class decides.
Phase phase_of_guard_class(const std::string& c, Stage stage, Phase fallback) {
  if (c == "environment") return Phase::kEnvironment;
  if (c == "sometimes") return Phase::kLaterSteps;
  if (c == "early_steps") return Phase::kEarlySteps;
  if (c == "video_spike") return Phase::kVideoSpike;
  if (c == "sampling") return stage == Stage::kBaselineSample ? Phase::kBaselineSample : Phase::kSampling;
  if (c == "load") return stage == Stage::kBaselineSample ? Phase::kBaselineSample : Phase::kLoad;
  return fallback;  // "fragmentation": the phase of the stage, the allocator setting first
}

}  // namespace

PhaseDecision decide_phase(const AnalyzerState& st, const Diagnosis& d, const CauseRecord* decisive) {
  PhaseDecision p;
  // The activity when the decisive failure first showed (a later line may be the shutdown).
  p.activity = decisive && decisive->first.seen() ? decisive->at_first : st.act;
  // tqdm writes a bar's last state when the exception closes it, just after the error message:
  // a progress line right after the failure's last line is the state at the failure.
  if (decisive && st.act.progress.seq > decisive->first.seq && st.act.progress.seq <= decisive->last.seq + 4) {
    p.activity.progress = st.act.progress;
    p.activity.completed = st.act.completed;
    p.activity.total = st.act.total;
    p.activity.training_seen = true;
  }
  const Activity& act = p.activity;
  if (decisive && decisive->has_frames()) p.frames = stage_from_frames(decisive->frames);
  const Marker* marker = nullptr;
  const Stage from_activity = stage_from_activity(act, &marker);
  const bool strong_frames = p.frames.stage != Stage::kUnknown && p.frames.strength == Strength::kStrong;
  p.from_guard = st.guard.oom && d.oom && !st.guard.phase.empty();

  if (p.from_guard) {
    p.stage = guard_stage(st.guard.phase);
    p.confidence = kGuardPhaseConfidence;
  } else if (strong_frames) {
    p.stage = p.frames.stage;
    p.confidence = kStrongFrameConfidence;
  } else if (from_activity != Stage::kUnknown) {
    p.stage = from_activity;
    p.marker = marker;
    const bool disputed = p.frames.stage != Stage::kUnknown && p.frames.stage != from_activity;
    p.confidence = disputed ? kDisputedActivityConfidence : kActivityLineConfidence;
  } else if (p.frames.stage != Stage::kUnknown) {
    p.stage = p.frames.stage;
    p.confidence = kWeakFrameConfidence;
  }

  // The step: the guard's, else the last progress + 1 (training began and no step finished: 1).
  const bool on_steps = p.stage == Stage::kTrainingStep || p.stage == Stage::kSaving;
  if (p.from_guard && st.guard.step && on_steps) p.step = *st.guard.step;
  else if (on_steps && act.completed >= 0) p.step = act.completed + 1;
  else if (p.stage == Stage::kTrainingStep) p.step = 1;

  // Previews before any training step are the baseline: no step completed, and the log either shows
  // work before training (a bare traceback does not say) or a sample at step 0.
  if (p.stage == Stage::kSampling && !p.from_guard && act.completed <= 0 &&
      (act.sample_at_step <= 0 ||
       act.marker(Stage::kBaselineSample).seq >= act.marker(Stage::kSampling).seq) &&
      (any_activity(act) || act.sample_at_step == 0))
    p.stage = Stage::kBaselineSample;

  p.phase = phase_of_stage(p.stage, d, p.step);
  if (p.stage == Stage::kUnknown) p.confidence = kNoEvidenceConfidence;
  if (p.from_guard) p.phase = phase_of_guard_class(st.guard.classification, p.stage, p.phase);
  return p;
}

void apply_phase(const PhaseDecision& p, Diagnosis& d) {
  d.phase = p.phase;
  d.phase_confidence = p.confidence;
  d.stage = p.stage;
  d.step = p.step;
}

void add_evidence(const AnalyzerState& st, const CauseRecord* decisive, const PhaseDecision& p, Diagnosis& d) {
  auto add = [&](const Marker& m, const std::string& why) {
    if (!m.seen() || m.text.empty()) return;
    const std::string text = snippet(m.text);
    for (const Evidence& e : d.evidence)
      if (e.line == m.line && e.text == text) return;
    if (d.evidence.size() < 10) d.evidence.push_back({m.line, text, why});
  };
  if (decisive) {
    const std::string what = cause_name(d.cause);
    add(decisive->first, what + " signature");
    if (decisive->last_fatal.seen()) add(decisive->last_fatal, what + " (fatal)");
    else add(decisive->last, what);
  }
  if (st.guard.seen) add(st.guard.line, "lora-train OOM guard");
  if (st.guard.finished) add(st.guard.done_line, "lora-train: the run finished");
  {
    // The activity line of the stage that was chosen, when the log has one.
    const Activity& a = p.activity;
    const Marker* m = nullptr;
    if (d.stage == Stage::kTrainingStep) m = a.progress.seen() ? &a.progress : &a.marker(Stage::kTrainingStep);
    else if (d.stage != Stage::kUnknown) m = &a.marker(d.stage);
    if (m) add(*m, std::string("phase: ") + stage_name(d.stage));
  }
  if (p.frames.stage != Stage::kUnknown && p.frames.strength == Strength::kStrong && !p.from_guard)
    d.evidence.push_back({0, "traceback: " + p.frames.why, "phase from traceback"});
  // Log lines in order; the traceback summary (line 0) last.
  std::stable_sort(d.evidence.begin(), d.evidence.end(), [](const Evidence& a, const Evidence& b) {
    const int64_t la = a.line > 0 ? a.line : INT64_MAX, lb = b.line > 0 ? b.line : INT64_MAX;
    return la < lb;
  });
}

}  // namespace lt::diagnose::detail
