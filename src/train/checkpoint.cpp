#include "loratrain/train/checkpoint.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstring>

#include "loratrain/io/safetensors.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::train {

namespace {
constexpr const char* kAdapter = "adapter/";
constexpr const char* kOptimizer = "optimizer/";
constexpr const char* kEma = "ema/";
constexpr const char* kNoiseRng = "rng/noise";
constexpr const char* kGlobalRng = "rng/global";
}  // namespace

std::filesystem::path state_path(const std::filesystem::path& run_dir) {
  return run_dir / "state" / "training_state.safetensors";
}

std::filesystem::path rank_state_path(const std::filesystem::path& run_dir, int rank) {
  return run_dir / "state" / ("training_state.rank" + std::to_string(rank) + ".safetensors");
}

void save_training_state(const std::filesystem::path& path, const TrainingState& state) {
  NamedTensors tensors;
  for (const auto& [name, t] : state.adapter) tensors.emplace_back(kAdapter + name, t);
  for (const auto& [name, t] : state.optimizer) tensors.emplace_back(kOptimizer + name, t);
  for (const auto& [name, t] : state.ema) tensors.emplace_back(kEma + name, t);
  tensors.emplace_back(kNoiseRng, state.noise_rng);
  tensors.emplace_back(kGlobalRng, state.global_rng);
  nlohmann::json record = {{"format", "lora-train training state 1"},
                           {"step", state.step},
                           {"data_position", state.data_position},
                           {"settings", state.settings_json},
                           {"config_name", state.config_name},
                           {"world_size", state.world_size}};
  io::save_safetensors(path, tensors, {{"lora_train_state", record.dump()}});
}

std::optional<TrainingState> load_training_state(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  auto file = io::SafetensorsFile::open(path);
  auto it = file->metadata().find("lora_train_state");
  if (it == file->metadata().end()) throw InputError(path.string() + ": not a lora-train training state");
  TrainingState state;
  try {
    auto record = nlohmann::json::parse(it->second);
    state.step = record.at("step").get<int64_t>();
    state.data_position = record.at("data_position").get<std::string>();
    state.settings_json = record.at("settings").get<std::string>();
    state.config_name = record.at("config_name").get<std::string>();
    state.world_size = record.value("world_size", 1);  // states from before data parallelism: one rank
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path.string() + ": broken training state record (" + printable(e.what()) + ")");
  }
  for (const auto& t : file->tensors()) {
    if (starts_with(t.name, kAdapter)) state.adapter.emplace_back(t.name.substr(std::strlen(kAdapter)), file->load(t.name));
    else if (starts_with(t.name, kOptimizer)) state.optimizer.emplace_back(t.name.substr(std::strlen(kOptimizer)), file->load(t.name));
    else if (starts_with(t.name, kEma)) state.ema.emplace_back(t.name.substr(std::strlen(kEma)), file->load(t.name));
  }
  if (!file->contains(kNoiseRng) || !file->contains(kGlobalRng)) throw InputError(path.string() + ": training state lacks RNG states");
  state.noise_rng = file->load(kNoiseRng);
  state.global_rng = file->load(kGlobalRng);
  return state;
}

}  // namespace lt::train
