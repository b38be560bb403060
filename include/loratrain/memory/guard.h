// The OOM guard (OOM_PLAYBOOK.md): phases entered through scopes, and on an allocation failure
// one documented change at a time, retrying the same step. The trainer loop reads:
//
//   while (auto next = guard.attempt(Phase::train_step, {step, w, h, frames, batch}, body)) {
//     apply(*next);    // one change, done by the caller in plain sight; then the same step again
//   }
//
// attempt() runs body once inside the phase: nothing on success; the settings to retry with
// after a recoverable OOM; OomGiveUp (exit 3 / 4, fixed.yaml from its settings) when nothing is
// left; any other error propagates.
#pragma once
#include <chrono>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loratrain/memory/classify.h"
#include "loratrain/memory/device_memory.h"
#include "loratrain/memory/ladder.h"
#include "loratrain/memory/report.h"
#include "loratrain/util/error.h"

namespace lt::memory {

struct GuardOptions {
  bool enabled = true;       // off: OOMs propagate unchanged (recover() says rethrow)
  int max_attempts = 20;     // OOM recoveries per run before giving up with exit 3
  bool scale_up = false;     // §5: after stable steps, re-enable one heavier setting at a time
  int scale_up_after = 100;  // stable training steps before each scale-up (and to keep one)
};

// One successful training step as the guard timed it: its own attempt only (not the failed ones
// before it), and the step's peak memory.
struct StepCost {
  int64_t step = 0;
  double seconds = 0;
  int64_t peak = 0;
};

// What a change cost: s/step and peak memory over up to kPriceWindow steps before it (since the
// previous change) and after it (until the next one). Changes made before the same step (one OOM
// answered by several levers in turn) share one price. Empty windows are nullopt (a change before
// training has no "before").
inline constexpr size_t kPriceWindow = 5;
struct Price {
  std::vector<int> attempts;  // the attempt numbers sharing this price
  int steps_before = 0;
  int steps_after = 0;
  std::optional<double> seconds_before, seconds_after;  // mean s/step
  std::optional<int64_t> peak_before, peak_after;       // max peak bytes
  std::optional<double> time_change() const;   // +0.24 = 24% slower
  std::optional<double> peak_change() const;   // -0.38 = 38% less peak
  // "+24% s/step (0.110 -> 0.136 s), -38% peak (24.5 -> 15.2 MiB)", or the after-only figures.
  std::string describe() const;
};

// One OOM and what the guard did about it (report.json "attempts").
struct AttemptRecord {
  int attempt = 0;  // 1-based, in order
  Phase phase = Phase::load;
  PhaseContext where;
  std::optional<Classification> classification;  // none for host RAM exhaustion
  std::string reason;
  ActionKind action = ActionKind::give_up_exhausted;
  std::string description;
  std::string error;        // first line of the error message
  OomNumbers numbers;
  MemorySnapshot before;    // at the failure
  MemorySnapshot after;     // after the step unwound and the cache was emptied
  MemorySettings settings;  // in effect after the action
  double at_seconds = 0;    // since the guard was created
  double recover_seconds = 0;  // time spent inside recover()
  size_t steps_before = 0;     // training steps timed before this attempt (index into step costs)
};

struct ScaleUpRecord {
  int64_t step = 0;
  ScaleLever lever = ScaleLever::larger_bucket;
  std::string description;
  bool reverted = false;
};

// A change the planner made before anything was loaded, because the configured settings were
// predicted not to fit the device (report.json "planned_changes"; not an OOM, not an attempt).
struct PlannedChangeRecord {
  std::string action;        // the ladder's ActionKind name
  std::string description;   // in the config's keys
  Phase phase = Phase::load;  // the phase predicted over the budget
  int64_t predicted_before = 0;  // that phase's predicted peak before and after the change
  int64_t predicted_after = 0;
};

struct StartCheck {
  FreeTotal at_start;
  int64_t foreign = 0;  // held by something else: total - free - ours
  bool warned = false;
};

struct Decision {
  enum class Kind { retry, give_up, rethrow };
  Kind kind = Kind::rethrow;
  Action action;             // the change (retry) or the reason (give up)
  MemorySettings settings;   // apply before retrying; for give_up: what fixed.yaml should hold
  ExitCode exit_code = ExitCode::kOk;  // give_up: kOomExhausted, kEnvironment, or kRuntime (host RAM)
  std::string message;       // the log line (without the "oom-guard: " prefix for give-ups too)
  std::optional<Classification> classification;  // the failure's, when it was classified
  bool retry() const { return kind == Kind::retry; }
  bool give_up() const { return kind == Kind::give_up; }
  bool rethrow() const { return kind == Kind::rethrow; }
};

// Thrown by OomGuard::run() when the guard gives up; carries the decision and its exit code.
class OomGiveUp : public Error {
 public:
  explicit OomGiveUp(Decision d) : Error(d.exit_code, d.message), decision_(std::move(d)) {}
  const Decision& decision() const { return decision_; }

 private:
  Decision decision_;
};

// Data-parallel runs (docs/distributed.md): thrown on a rank that did not fail itself when another
// rank ran out of memory in the same attempt; the guard recovers with that rank's decision.
class PeerOutOfMemory : public Error {
 public:
  explicit PeerOutOfMemory(std::vector<int> ranks);
  const std::vector<int>& ranks() const { return ranks_; }  // the ranks that ran out of memory

 private:
  std::vector<int> ranks_;
};

// How the ranks of a data-parallel run agree, so that every rank retries the same attempt with the
// same change (or gives up together) and none waits in a collective while another recovers.
class RankAgreement {
 public:
  virtual ~RankAgreement() = default;
  // On every rank after each attempt (and wherever the attempt must agree before a collective):
  // `failure` is this rank's memory failure, null when it did not fail. Returns when no rank
  // failed; otherwise throws this rank's own failure, or PeerOutOfMemory.
  virtual void agree(std::exception_ptr failure) = 0;
  // On every rank after a failed attempt: `own` is this rank's decision (nullopt when it follows
  // another's failure). Returns the decision of the lowest rank that failed, for all to apply.
  virtual Decision decide(const std::optional<Decision>& own) = 0;
};

// A decision as text, for the ranks to exchange.
std::string decision_to_text(const Decision& d);
Decision decision_from_text(const std::string& text);
// A memory failure (device or host) or a peer's (PeerOutOfMemory): what the ranks agree on.
bool is_memory_failure(std::exception_ptr error);

class OomGuard;

// RAII: the guard knows the phase while this lives; on exit it records the phase's peak memory,
// and on exit by exception it remembers where the failure happened for recover().
class PhaseScope {
 public:
  PhaseScope(PhaseScope&& other) noexcept;
  PhaseScope& operator=(PhaseScope&&) = delete;
  PhaseScope(const PhaseScope&) = delete;
  ~PhaseScope();

 private:
  friend class OomGuard;
  PhaseScope(OomGuard* guard, size_t depth);
  OomGuard* guard_;
  size_t depth_;
  int uncaught_;
};

class OomGuard {
 public:
  OomGuard(DeviceMemory& memory, GuardOptions options, MemorySettings initial);

  // Free vs total at start; warns when something else holds much of the device.
  StartCheck check_start();

  PhaseScope enter(Phase phase, PhaseContext where = {});
  PhaseScope phase(Phase p, PhaseContext where = {}) { return enter(p, where); }
  // What the innermost phase is doing now (the image being encoded, the preview being made): an
  // OOM is reported and classified with it.
  void set_context(const PhaseContext& where);

  // Call from a catch block after the failed scope unwound. Not a memory failure (or guard
  // disabled): rethrow. Otherwise logs one line, empties caches and returns the retry with one
  // change, or gives up (exit 3 ladder exhausted, 4 environment, 1 host RAM).
  Decision recover(std::exception_ptr error);

  // After each successful training step (optimizer step done): counts stable steps and, with
  // options.scale_up, returns a heavier setting to apply from the next step on.
  std::optional<Action> step_completed(int64_t step);

  // Runs `body` once in `phase`. Success: nullopt. A recoverable OOM: the settings to apply
  // before running it again. Giving up throws OomGiveUp; a non-memory error propagates.
  template <class Body>
  std::optional<MemorySettings> attempt(Phase phase, const PhaseContext& where, Body&& body) {
    try {
      auto scope = enter(phase, where);
      if (ranks_ == nullptr) {
        body();
      } else {
        // Every rank says how its attempt went before going on: a failure on one is a retry on all.
        std::exception_ptr failure;
        try {
          body();
        } catch (...) {
          failure = std::current_exception();
          if (!is_memory_failure(failure)) throw;
        }
        ranks_->agree(failure);
      }
      return std::nullopt;
    } catch (...) {
      Decision d = recover(std::current_exception());
      if (d.rethrow()) throw;
      if (d.give_up()) throw OomGiveUp(std::move(d));
      return d.settings;
    }
  }

  // Data-parallel runs: the ranks agree after every attempt (nullptr: one rank, the default).
  void set_rank_agreement(RankAgreement* ranks) { ranks_ = ranks; }
  RankAgreement* rank_agreement() const { return ranks_; }

  const MemorySettings& settings() const { return settings_; }
  // A resumed run continues from the settings the interrupted run had reached (the configured
  // ones stay the initial settings that scale-up returns to).
  void adopt(const MemorySettings& settings) { settings_ = settings; }
  // The run starts from the planner's settings: the ones it replaced count as failed for the
  // ladder (they were predicted not to fit); the changes are reported, apart from OOM attempts.
  void adopt_planned(const MemorySettings& settings, std::vector<PlannedChangeRecord> changes);
  const std::vector<PlannedChangeRecord>& planned_changes() const { return planned_; }
  const MemorySettings& initial_settings() const { return history_.initial; }
  const std::vector<AttemptRecord>& attempts() const { return attempts_; }
  const std::vector<ScaleUpRecord>& scale_ups() const { return scale_ups_; }
  const PhasePeaks& peaks() const { return peaks_; }
  const std::vector<StepCost>& step_costs() const { return step_costs_; }
  // The price of attempts()[index]: nullopt for retries without a change and for give-ups.
  std::optional<Price> price(size_t index) const;
  int64_t steps_completed() const { return steps_completed_; }
  std::optional<Phase> current_phase() const;
  DeviceMemory& memory() { return memory_; }
  const GuardOptions& options() const { return options_; }

  // The end-of-run summary (console): every change, final settings, peak per phase.
  std::string summary() const;
  // For report.json: options, start check, attempts, scale-ups, settings, peaks, outcome.
  nlohmann::json to_json() const;

 private:
  friend class PhaseScope;
  struct Frame {
    Phase phase;
    PhaseContext where;
    int64_t running_peak = 0;
    std::chrono::steady_clock::time_point started;
  };
  struct Failure {
    Phase phase;
    PhaseContext where;
    MemorySnapshot at_exit;
  };
  struct PendingScaleUp {
    ScaleLever lever;
    MemorySettings before;
  };

  void exit_phase(size_t depth, bool failed);
  Decision recover_here(std::exception_ptr error);
  Failure take_failure();
  // Applies another rank's decision to this rank's state; `own` when this rank failed too.
  Decision follow(const Decision& agreed, const std::optional<Decision>& own, std::chrono::steady_clock::time_point t0);
  bool is_largest_bucket(const PhaseContext& where) const;
  Decision finish(Decision d, AttemptRecord rec, std::chrono::steady_clock::time_point t0);
  double seconds_since_start() const;

  DeviceMemory& memory_;
  GuardOptions options_;
  MemorySettings settings_;
  LadderHistory history_;
  std::vector<Frame> frames_;
  std::optional<Failure> last_failure_;
  std::vector<std::pair<Phase, int64_t>> failed_steps_;
  std::vector<AttemptRecord> attempts_;
  std::vector<StepCost> step_costs_;
  std::vector<ScaleUpRecord> scale_ups_;
  std::vector<PlannedChangeRecord> planned_;
  std::set<ScaleLever> blocked_;
  std::optional<PendingScaleUp> pending_;
  PhasePeaks peaks_;
  StartCheck start_;
  bool start_checked_ = false;
  int64_t steps_completed_ = 0;
  int64_t stable_steps_ = 0;
  std::string outcome_ = "ok";
  std::chrono::steady_clock::time_point created_;
  RankAgreement* ranks_ = nullptr;
};

}  // namespace lt::memory
