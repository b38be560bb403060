// `lora-train run CONFIG --smoke [N]`: what a CI job on one GPU wants to know about a config. N
// steps of the real config at its largest resolution, one preview at the configured size, one save,
// all into a fresh temporary folder; then a verdict: it fits as written (exit 0), it fits only
// after the guard changed something (exit 3, fixed.yaml written), or the usual 2 / 4. The run's
// report.json gains a "smoke" section (peak memory per phase, s/step, the changes) and a JUnit XML
// file says the same for the CI system.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace lt::train {

inline constexpr int kDefaultSmokeSteps = 10;

struct SmokeRequest {
  std::filesystem::path config_path;
  std::vector<std::string> overrides;       // --set KEY=VALUE, applied before the smoke's own
  int steps = kDefaultSmokeSteps;
  std::optional<std::filesystem::path> junit;  // --junit PATH
  // Where the temporary run folder is made (default: the system's temporary directory).
  std::optional<std::filesystem::path> temp_root;
};

struct SmokeResult {
  int exit_code = 0;                     // 0 fits unchanged, 3 fits after changes; else the run's
  std::filesystem::path run_dir;         // the temporary run folder (kept: report.json, fixed.yaml)
  std::vector<std::string> changes;      // planned and OOM-guard changes, in order
  double seconds_per_step = 0;
  std::optional<std::filesystem::path> fixed_yaml;
};

// The --set overrides that turn a config into its smoke run (exposed for tests).
std::vector<std::string> smoke_overrides(const std::filesystem::path& config_path,
                                         const std::vector<std::string>& overrides, int steps,
                                         const std::filesystem::path& run_root);

SmokeResult run_smoke(const SmokeRequest& request);

}  // namespace lt::train
