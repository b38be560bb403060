// The memory planner (`lora-train plan`, and the guard's first rung at the start of `run`): peak
// device memory per phase for a config, predicted without loading weights. Parameter shapes come
// from the checkpoint's safetensors header (or the family's standard config when the checkpoint is
// not on this machine); activations from the family's architecture at the largest bucket, batch,
// dtype and memory settings. `fit()` walks the OOM guard's own ladder (memory/ladder.h) one change
// at a time until the prediction fits. No LibTorch here: the CLI and the trainer include it.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loratrain/playbook/settings.h"
#include "loratrain/playbook/vocabulary.h"

namespace lt::config {
struct JobConfig;
}

namespace lt::plan {

using playbook::MemorySettings;
using playbook::Phase;

inline constexpr size_t kPhases = 6;  // playbook::Phase, load .. save

// What a phase's peak is made of.
enum class Part { weights, adapter_optimizer, activations, workspace };
const char* to_string(Part p);

struct PhaseMemory {
  bool runs = true;               // false: the phase does not happen with these settings
  int64_t weights = 0;            // frozen base weights resident on the device
  int64_t adapter_optimizer = 0;  // LoRA parameters, their gradients and the optimizer state
  int64_t activations = 0;        // what the forward (and backward) of the phase's largest shape holds
  int64_t workspace = 0;          // transient buffers: conversions, caches, the save's copies
  int64_t peak() const { return weights + adapter_optimizer + activations + workspace; }
  Part dominant() const;
};

struct Prediction {
  std::array<PhaseMemory, kPhases> phases{};
  const PhaseMemory& at(Phase p) const { return phases[static_cast<size_t>(p)]; }
  PhaseMemory& at(Phase p) { return phases[static_cast<size_t>(p)]; }
  int64_t peak() const;                       // over the phases that run
  std::optional<Phase> first_over(int64_t budget) const;  // the first phase whose peak exceeds it
  bool fits(int64_t budget) const { return !first_over(budget); }
};

// What a config trains, as far as memory goes; built once per config (reads headers only).
class Planner {
 public:
  // Throws lt::ConfigError / lt::InputError for a config it cannot plan (a family without an
  // activation model names the family). `compute_bytes`: bytes per activation element when the
  // caller knows better than the config (the trainer's CPU fallback from fp16/bf16 to fp32).
  static std::unique_ptr<Planner> from_config(const config::JobConfig& job,
                                              std::optional<int> compute_bytes = std::nullopt);
  virtual ~Planner() = default;

  virtual Prediction predict(const MemorySettings& settings) const = 0;
  virtual const MemorySettings& configured() const = 0;  // the settings the config asks for
  virtual std::string family() const = 0;                // "sd1", "sdxl", ...
  // Where the shapes came from: "header of /models/x.safetensors" or "sd1's standard config
  // (checkpoint not found: ...)".
  virtual const std::string& shapes_source() const = 0;
  virtual std::string describe() const = 0;  // "sd1, fp32, rank 4 adamw, 8.6e8 + 1.2e8 + 8.4e7 parameters"
};

// One change of the ladder, as the guard would make it.
struct PlannedChange {
  std::string kind;         // memory::ActionKind name, e.g. "enable_checkpointing"
  std::string description;  // in the config's keys
  Phase phase;              // the phase predicted not to fit, that asked for it
  int64_t peak_before = 0;  // that phase's predicted peak before and after the change
  int64_t peak_after = 0;
};

struct FitResult {
  bool fits = false;        // the final settings' prediction fits the budget
  MemorySettings settings;  // the first settings that fit (or the last tried when nothing fits)
  std::vector<PlannedChange> changes;
  std::vector<PlannedChange> skipped;  // rungs predicted to lower nothing in their phase: not taken
  Prediction prediction;    // of `settings`
};

// The guard's ladder in the planner: while a phase is predicted over `budget`, the one next
// change memory::next_action() gives for an OOM in that phase (as at step 1, largest bucket);
// a change predicted not to lower that phase's peak is skipped (FitResult::skipped).
FitResult fit(const Planner& planner, const MemorySettings& start, int64_t budget);

// The per-phase table `lora-train plan` prints; with a budget, "fits" / "over" per phase.
std::string format_table(const Prediction& p, std::optional<int64_t> budget);
// {"phases": {"load": {"peak_bytes": N, "weights": .., "dominant": ".."}, ...}, "peak_bytes": N,
//  "fits": bool (with a budget), "vram_bytes": N}
nlohmann::json to_json(const Prediction& p, std::optional<int64_t> budget);

}  // namespace lt::plan
