// A tiny SD1-architecture base and a generated dataset in a scratch folder, and a config for them.
#pragma once
#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "loratrain/data/demo_data.h"
#include "loratrain/train/demo_base.h"
#include "test_paths.h"

namespace lt::test {

// The memory settings of a guard test's calibration runs: they stand for the same GPU as the
// guarded run (memory.simulate_vram, so that attention takes the configured path there too, not
// the CPU's faster blocks: models/attention_blocks.h, and the frozen convolutions the stock kernels,
// not packed weights: models/packed_conv.h), with a budget no step comes near.
inline constexpr const char* kCalibrationMemory = "        simulate_vram: 64GiB\n";

// One scratch folder per test process: ctest runs several of them at once (several of one executable
// when it is registered in shards: LT_TEST_NAME, tests/CMakeLists.txt), and each makes its assets on
// first use (scratch_dir empties the folder first).
inline std::string per_program(const std::string& name) {
  const char* test = std::getenv("LT_TEST_NAME");
  return name + "_" + (test != nullptr && *test != '\0' ? test : program_invocation_short_name);
}

// Built once per test process (the base and the images do not change between tests).
inline const std::filesystem::path& tiny_assets() {
  static const std::filesystem::path dir = [] {
    auto d = scratch_dir(per_program("train_assets"));
    train::write_demo_base(d / "base");
    data::DemoDataOptions options;
    options.count = 8;
    options.size = 64;
    data::make_demo_dataset(d / "data", options);
    return d;
  }();
  return dir;
}

// A tiny SDXL base as a single file (sdxl/model.safetensors) and as a diffusers folder
// (sdxl-diffusers/), built once per test process, beside the tiny assets' dataset.
inline const std::filesystem::path& tiny_sdxl() {
  static const std::filesystem::path dir = [] {
    auto d = scratch_dir(per_program("train_sdxl"));
    train::DemoBaseOptions options;
    options.arch = train::DemoArch::kSDXL;
    train::write_demo_base(d / "sdxl", options);
    options.diffusers = true;
    train::write_demo_base(d / "sdxl-diffusers", options);
    return d;
  }();
  return dir;
}

// HF_HUB_CACHE/models--org--name/{refs/main, snapshots/<rev>/} holding a tiny base of `arch` as a
// diffusers folder, as AI Toolkit's repo ids resolve in the local Hugging Face cache.
inline void put_in_hub_cache(const std::filesystem::path& hub, const std::string& repo, train::DemoArch arch) {
  std::string folder = "models--" + repo;
  folder.replace(folder.find('/'), 1, "--");
  const std::filesystem::path dir = hub / folder;
  std::filesystem::create_directories(dir / "refs");
  std::ofstream(dir / "refs" / "main") << "5f2c1a";
  train::DemoBaseOptions options;
  options.arch = arch;
  options.diffusers = true;
  train::write_demo_base(dir / "snapshots" / "5f2c1a", options);
}

// A run config over the tiny assets; `extra_train` / `extra_memory` are YAML lines (indented by
// the caller) added to the train: and memory: sections.
inline std::filesystem::path write_tiny_config(const std::filesystem::path& run_root, const std::string& name,
                                               int steps, const std::string& extra_train = "",
                                               const std::string& extra_memory = "",
                                               const std::string& sample_section = "      sample:\n        sample_every: 1000\n        prompts: []\n") {
  const auto assets = tiny_assets();
  std::filesystem::create_directories(run_root);
  auto path = run_root / (name + ".yaml");
  std::ofstream out(path);
  out << "job: extension\nconfig:\n  name: " << name << "\n  process:\n    - type: sd_trainer\n"
      << "      training_folder: " << run_root.string() << "\n      device: cpu\n      training_seed: 7\n"
      << "      network:\n        linear: 4\n        linear_alpha: 4\n"
      << "      save:\n        dtype: float32\n        save_every: 1000\n"
      << "      datasets:\n        - folder_path: " << (assets / "data").string() << "\n          resolution: [64]\n"
      << "          cache_latents: true\n"
      << "      train:\n        steps: " << steps << "\n        lr: 1e-3\n        optimizer: adamw\n"
      << "        gradient_checkpointing: false\n        batch_size: 2\n        disable_sampling: true\n" << extra_train
      << "      model:\n        name_or_path: " << (assets / "base" / "model.safetensors").string() << "\n"
      << sample_section
      << "      memory:\n" << (extra_memory.empty() ? "        simulate_vram: 0\n" : extra_memory);
  return path;
}

}  // namespace lt::test
