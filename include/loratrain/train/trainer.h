// `lora-train run`: trains a LoRA on a frozen Stable Diffusion 1.x/2.x base, under the OOM guard.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lt::memory {
class DeviceMemory;
}

namespace lt::train {

struct RunRequest {
  std::filesystem::path config_path;
  std::vector<std::string> overrides;            // --set KEY=VALUE
  std::optional<std::filesystem::path> resume;   // --resume DIR (default: the run folder's own state)
  bool fresh = false;                            // --fresh: ignore a saved state in the run folder
  // Test hook: called once the device memory backend exists, before anything is loaded (e.g. to
  // occupy simulated VRAM as another process would, or to inject allocation failures).
  std::function<void(memory::DeviceMemory&)> on_memory_ready;
  // Test hook: called once right before the first training step (e.g. to inject failures into
  // training steps only).
  std::function<void(memory::DeviceMemory&)> on_training_start;
  // Test hook: called before each training step (1-based), e.g. to inject a failure into one step.
  std::function<void(int64_t step, memory::DeviceMemory&)> on_step_start;
  // Test hook: stop (as if interrupted by SIGINT) after this many completed steps.
  std::optional<int64_t> stop_after_steps;
};

struct RunResult {
  int exit_code = 0;                       // README: exit codes
  std::filesystem::path run_dir;
  std::filesystem::path lora_path;         // the final LoRA file (empty if none was written)
  int64_t steps_completed = 0;
  std::vector<double> losses;              // per completed step, this invocation
  std::vector<std::string> actions;        // the guard's action descriptions, in order
  std::vector<size_t> images_seen;         // per dataset image: times used in a completed step
};

RunResult run_training(const RunRequest& request);

// `lora-train sample`: images from a base with trained adapters, through the previews' own
// sampling path (render_preview), with the config's sampler, size, guidance and prompts.
struct SampleLoRA {
  std::filesystem::path path;
  double multiplier = 1.0;
};
struct SampleRequest {
  std::optional<std::filesystem::path> config_path;  // a run config (its model, sample: section)
  std::optional<std::filesystem::path> model_path;   // --model, without a config
  std::vector<std::string> overrides;                // --set KEY=VALUE
  // One file runs as an adapter (the training previews' path: a preview is reproduced exactly);
  // several are merged into the base weights, each with its multiplier.
  std::vector<SampleLoRA> loras;
  bool multiplier_given = false;                     // else a single LoRA uses the prompts' network_multiplier
  std::vector<std::string> prompts;                  // replace the config's prompts when given
  std::optional<int64_t> seed;
  std::optional<int64_t> steps;
  std::optional<std::filesystem::path> output_dir;   // default: <run folder>/samples_cli
};
struct SampleResult {
  std::vector<std::filesystem::path> images;
  std::filesystem::path grid;
};
SampleResult run_sampling(const SampleRequest& request);

// Sets LibTorch's intra-op threads to the core count (or LT_NUM_THREADS) and OpenBLAS's to the
// same count: LibTorch runs every matrix product on OpenBLAS's threads.
void configure_cpu_threads();

// The CPU's native bf16 instruction sets ("avx512_bf16, amx_bf16"), "" when it has none.
std::string cpu_bf16_instructions();

}  // namespace lt::train
