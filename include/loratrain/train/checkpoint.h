// The resumable training state: one safetensors file (atomic) holding the adapter weights in fp32,
// the optimizer state, the RNG states, and a JSON record (step, data position, memory settings) in
// its metadata. Restoring it continues a run bit-identically on CPU.
#pragma once
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lt::train {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct TrainingState {
  int64_t step = 0;              // optimizer steps completed
  std::string data_position;     // BatchIterator::state_json()
  std::string settings_json;     // the memory settings in effect (the guard's changes survive resume)
  std::string config_name;       // config.name, checked on resume
  NamedTensors adapter;          // LoRA network parameters by kohya name, fp32
  NamedTensors optimizer;        // Optimizer::state_dict()
  NamedTensors ema;              // AdapterEMA::state_dict() (train.ema_config.use_ema), else empty
  at::Tensor noise_rng;          // the trainer's noise generator state
  at::Tensor global_rng;         // the default CPU generator (dropout)
  int world_size = 1;            // ranks of the run that saved it (data parallel)
};

// <run dir>/state/training_state.safetensors
std::filesystem::path state_path(const std::filesystem::path& run_dir);
// Data-parallel runs: rank r > 0 keeps its own generator states beside it (its step and RNG only).
std::filesystem::path rank_state_path(const std::filesystem::path& run_dir, int rank);

void save_training_state(const std::filesystem::path& path, const TrainingState& state);
// nullopt when there is no state file; lt::InputError when it is broken.
std::optional<TrainingState> load_training_state(const std::filesystem::path& path);

}  // namespace lt::train
