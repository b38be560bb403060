// What only a GPU can show: the CUDA memory backend against the caching allocator, real CUDA
// out-of-memory errors read by the guard's classifier, and real runs of the tiny SD1 base on the
// device (fp32 against the CPU, bf16 with checkpointing, a run under memory.vram_limit that the
// guard must rescue from real CUDA OOMs).
#include <catch2/catch.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include "loratrain/data/demo_data.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/memory/device_memory.h"
#include "loratrain/memory/oom.h"
#include "loratrain/train/trainer.h"
#include "train/train_fixture.h"
#include "test_support.h"

using lt::test::MiB;
using lt::test::read_json;

namespace {

// A run of the tiny base on the GPU; `overrides` as `lora-train run --set`.
lt::train::RunResult run_tiny(const std::filesystem::path& root, const std::string& name, int steps,
                              std::vector<std::string> overrides, const std::string& memory = "") {
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, name, steps, "", memory);
  request.overrides = std::move(overrides);
  request.fresh = true;
  return lt::train::run_training(request);
}

// Larger images than the shared tiny assets, so that activations dominate the caching
// allocator's 2 MiB granularity.
const std::filesystem::path& images_256() {
  static const std::filesystem::path dir = [] {
    auto d = lt::test::scratch_dir("cuda_images_256");
    lt::data::DemoDataOptions options;
    options.count = 8;
    options.size = 256;
    lt::data::make_demo_dataset(d, options);
    return d;
  }();
  return dir;
}

}  // namespace

CATCH_TEST_CASE("CUDA memory backend: caching-allocator statistics, a cap, real OOMs", "[cuda]") {
  CATCH_REQUIRE(torch::cuda::is_available());
  {
    auto memory = lt::memory::make_device_memory({"cuda", 0, 0});
    CATCH_CHECK(memory->is_cuda());
    CATCH_CHECK(memory->name().rfind("cuda:0 (", 0) == 0);
    memory->reset_peak();
    const int64_t before = memory->allocated();
    auto t = torch::empty({64 * MiB}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
    CATCH_CHECK(memory->allocated() - before >= 64 * MiB);
    CATCH_CHECK(memory->reserved() >= memory->allocated());
    CATCH_CHECK(memory->peak_allocated() >= memory->allocated());
    t = at::Tensor();
    memory->empty_cache();
    CATCH_CHECK(memory->allocated() == before);
    const auto ft = memory->free_and_total();
    CATCH_CHECK(ft.total > 8 * 1024 * MiB);
    CATCH_CHECK(ft.free > 0);
    CATCH_CHECK(ft.free <= ft.total);
  }
  {
    auto memory = lt::memory::make_device_memory({"cuda:0", 0, 512 * MiB});
    CATCH_CHECK(memory->free_and_total().total == 512 * MiB);
    CATCH_CHECK(memory->name().find("limited to 512.00 MiB") != std::string::npos);
    bool thrown = false;
    try {
      auto big = torch::empty({1024 * MiB}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8));
    } catch (const c10::OutOfMemoryError& e) {
      thrown = true;
      CATCH_INFO(e.what());
      CATCH_CHECK(lt::memory::is_oom(e));
      const auto info = lt::memory::inspect_failure(e);
      CATCH_REQUIRE(info.numbers.tried.has_value());
      CATCH_CHECK(*info.numbers.tried >= 1024 * MiB);
    }
    CATCH_CHECK(thrown);
  }
  // A new backend without a cap lifts the process-wide fraction again.
  auto memory = lt::memory::make_device_memory({"cuda", 0, 0});
  CATCH_CHECK_NOTHROW(torch::empty({1024 * MiB}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kUInt8)));
  memory->empty_cache();
}

CATCH_TEST_CASE("the tiny SD1 base trains on the GPU in fp32 with the CPU's losses", "[cuda][train]") {
  auto root = lt::test::scratch_dir("cuda_fp32");
  auto cpu = run_tiny(root, "cpu", 3, {"device=cpu"});
  auto gpu = run_tiny(root, "gpu", 3, {"device=cuda"});
  CATCH_REQUIRE(cpu.exit_code == 0);
  CATCH_REQUIRE(gpu.exit_code == 0);
  CATCH_REQUIRE(gpu.steps_completed == 3);
  CATCH_REQUIRE(gpu.losses.size() == 3);
  // The same seeded batches, noise and timesteps (drawn on the CPU either way): the first step,
  // before any update, differs only by the GPU's arithmetic (TF32 convolutions at most).
  CATCH_INFO("cpu loss " << cpu.losses[0] << ", gpu loss " << gpu.losses[0]);
  CATCH_CHECK(std::abs(gpu.losses[0] - cpu.losses[0]) <= 1e-2 * std::abs(cpu.losses[0]));
  for (double loss : gpu.losses) CATCH_CHECK(std::isfinite(loss));
  CATCH_REQUIRE(std::filesystem::exists(gpu.lora_path));
  auto file = lt::io::SafetensorsFile::open(gpu.lora_path);
  CATCH_CHECK(file->tensors().size() > 0);
  for (const auto& t : file->tensors()) CATCH_CHECK(torch::isfinite(file->load(t.name)).all().item<bool>());
  auto report = read_json(root / "gpu" / "report.json");
  CATCH_INFO(report.dump(1));
  CATCH_CHECK(report.at("peaks").at("train_step").at("peak_allocated").get<int64_t>() > 0);
}

CATCH_TEST_CASE("bf16 with gradient checkpointing on the GPU", "[cuda][train]") {
  auto root = lt::test::scratch_dir("cuda_bf16");
  auto result = run_tiny(root, "bf16", 6, {"device=cuda", "train.dtype=bf16", "train.gradient_checkpointing=true"});
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 6);
  for (double loss : result.losses) CATCH_CHECK(std::isfinite(loss));
}

CATCH_TEST_CASE("real CUDA OOMs under memory.vram_limit: the guard recovers and the run completes", "[cuda][guard]") {
  auto root = lt::test::scratch_dir("cuda_guard");
  const std::vector<std::string> heavy = {"device=cuda", "train.batch_size=4",
                                          "datasets.0.folder_path=" + images_256().string(),
                                          "datasets.0.resolution=[256]"};
  // Calibration: the same shape without a cap, and the lightest training shape.
  auto big = run_tiny(root, "calib_big", 1, heavy);
  CATCH_REQUIRE(big.exit_code == 0);
  auto light_overrides = heavy;
  light_overrides.push_back("train.gradient_checkpointing=true");
  light_overrides[1] = "train.batch_size=1";
  auto small = run_tiny(root, "calib_small", 1, light_overrides);
  CATCH_REQUIRE(small.exit_code == 0);
  auto peaks = [&](const std::string& name, const std::string& phase) {
    return read_json(root / name / "report.json").at("peaks").at(phase).at("peak_allocated").get<int64_t>();
  };
  const int64_t heavy_peak = peaks("calib_big", "train_step");
  const int64_t light_peak = peaks("calib_small", "train_step");
  CATCH_INFO("train_step peak heavy " << heavy_peak << ", light " << light_peak);
  CATCH_REQUIRE(heavy_peak > light_peak + 64 * MiB);
  // Between the two, with room for the allocator's rounding and the cached blocks.
  const int64_t cap = light_peak + (heavy_peak - light_peak) / 3 + 64 * MiB;
  // The planner would start from a fitting rung: off, to watch the guard react to real OOMs.
  auto capped = heavy;
  capped.push_back("memory.oom_guard.plan=false");
  auto result = run_tiny(root, "capped", 4, capped, "        vram_limit: " + std::to_string(cap) + "\n");
  auto report = read_json(root / "capped" / "report.json");
  CATCH_INFO("cap " << cap << "\n" << report.dump(1));
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 4);
  const auto& attempts = report.at("attempts");
  CATCH_REQUIRE(attempts.size() >= 1);
  for (const auto& a : attempts) {
    CATCH_CHECK(a.at("classification").is_string());
    CATCH_CHECK(a.at("classification").get<std::string>() != "environment");
  }
}
