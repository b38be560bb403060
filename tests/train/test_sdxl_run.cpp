// `lora-train run` on SDXL, end to end on the tiny SDXL base: single file and diffusers folder,
// previews, kohya SDXL naming, resume, and the errors a wrong checkpoint gets.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>

#include "loratrain/io/safetensors.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "train_fixture.h"
#include "tensor_support.h"
#include "test_support.h"

using lt::test::read_tensors;

namespace {

const std::string kSample =
    "      sample:\n        sample_every: 2\n        width: 64\n        height: 64\n"
    "        sample_steps: 2\n        sampler: euler\n        prompts: [\"a red circle\"]\n";

lt::train::RunRequest sdxl_run(const std::filesystem::path& root, const std::string& name, int steps,
                               const std::filesystem::path& model) {
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, name, steps, "", "", kSample);
  request.overrides = {"model.name_or_path=" + model.string(), "model.arch=sdxl", "train.disable_sampling=false"};
  return request;
}

}  // namespace

CATCH_TEST_CASE("SDXL single file and diffusers folder train the same LoRA, with previews and kohya SDXL names",
                "[train][e2e][sdxl]") {
  auto root = lt::test::scratch_dir("sdxl_run");
  auto single = lt::train::run_training(sdxl_run(root / "single", "xl", 4, lt::test::tiny_sdxl() / "sdxl" / "model.safetensors"));
  auto folder = lt::train::run_training(sdxl_run(root / "folder", "xl", 4, lt::test::tiny_sdxl() / "sdxl-diffusers"));
  CATCH_REQUIRE(single.exit_code == 0);
  CATCH_REQUIRE(folder.exit_code == 0);
  // Same weights in two layouts: the same training.
  CATCH_CHECK(single.losses == folder.losses);
  const auto run = root / "single" / "xl";
  CATCH_CHECK(std::filesystem::exists(run / "samples" / "grid_000000000.png"));
  CATCH_CHECK(std::filesystem::exists(run / "samples" / "grid_000000002.png"));
  auto file = lt::io::SafetensorsFile::open(run / "xl.safetensors");
  CATCH_CHECK(file->metadata().at("ss_base_model_version") == "sdxl_base_v1-0");
  // kohya's SDXL names: LDM module paths (the tiny base's first attention level is input_blocks 4).
  bool ldm_named = false;
  for (const auto& t : file->tensors()) ldm_named = ldm_named || t.name.rfind("lora_unet_input_blocks_", 0) == 0;
  CATCH_CHECK(ldm_named);
  size_t moved = 0;
  for (const auto& [name, t] : read_tensors(run / "xl.safetensors")) {
    CATCH_CHECK(name.rfind("lora_unet_", 0) == 0);
    if (name.find("lora_up") != std::string::npos && t.abs().max().item<double>() > 0) ++moved;
  }
  CATCH_CHECK(moved > 0);
}

CATCH_TEST_CASE("SDXL: an interrupted run resumes bit-identically", "[train][e2e][sdxl][resume]") {
  auto root = lt::test::scratch_dir("sdxl_resume");
  const auto model = lt::test::tiny_sdxl() / "sdxl" / "model.safetensors";
  auto whole = lt::train::run_training(sdxl_run(root / "a", "xl", 5, model));
  CATCH_REQUIRE(whole.exit_code == 0);
  auto first = sdxl_run(root / "b", "xl", 5, model);
  first.stop_after_steps = 2;
  CATCH_REQUIRE(lt::train::run_training(first).exit_code == 130);
  auto second = sdxl_run(root / "b", "xl", 5, model);
  auto resumed = lt::train::run_training(second);
  CATCH_REQUIRE(resumed.exit_code == 0);
  CATCH_REQUIRE(resumed.losses.size() == 3);
  for (size_t i = 0; i < 3; ++i) CATCH_CHECK(resumed.losses[i] == whole.losses[2 + i]);
  auto a = read_tensors(root / "a" / "xl" / "xl.safetensors");
  auto b = read_tensors(root / "b" / "xl" / "xl.safetensors");
  CATCH_REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) CATCH_CHECK(torch::equal(t, b.at(name)));
}

namespace {

// The run fails with exit 2 and a message containing `expected`, and writes no LoRA.
void check_rejected(const std::filesystem::path& root, const std::string& name, std::vector<std::string> overrides,
                    const std::string& expected) {
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, name, 2);
  request.overrides = std::move(overrides);
  try {
    lt::train::run_training(request);
    CATCH_FAIL("expected an error for " << name);
  } catch (const lt::Error& e) {
    CATCH_INFO(e.what());
    CATCH_CHECK(static_cast<int>(e.code()) == 2);
    CATCH_CHECK_THAT(std::string(e.what()), Catch::Contains(expected));
  }
  CATCH_CHECK_FALSE(std::filesystem::exists(root / name / (name + ".safetensors")));
  CATCH_CHECK_FALSE(std::filesystem::exists(root / name / "state"));
}

}  // namespace

CATCH_TEST_CASE("SDXL: wrong, incomplete and truncated checkpoints get one clear error", "[train][e2e][sdxl]") {
  auto root = lt::test::scratch_dir("sdxl_bad");
  const auto sd1 = lt::test::tiny_assets() / "base" / "model.safetensors";
  const auto sdxl = lt::test::tiny_sdxl() / "sdxl" / "model.safetensors";
  check_rejected(root, "sd1_as_sdxl", {"model.name_or_path=" + sd1.string(), "model.arch=sdxl"},
                 "the config says model.arch sdxl, but this is a sd1 checkpoint");
  check_rejected(root, "sdxl_as_sd1", {"model.name_or_path=" + sdxl.string(), "model.arch=sd1"},
                 "the config says model.arch sd1, but this is a sdxl checkpoint");

  // Without the second text encoder, and cut short.
  auto file = lt::io::SafetensorsFile::open(sdxl);
  std::vector<std::pair<std::string, at::Tensor>> kept;
  for (const auto& t : file->tensors()) {
    if (t.name.rfind("conditioner.embedders.1.", 0) != 0) kept.emplace_back(t.name, file->load(t.name));
  }
  const auto incomplete = root / "no_te2.safetensors";
  lt::io::save_safetensors(incomplete, kept, {});
  check_rejected(root, "no_te2", {"model.name_or_path=" + incomplete.string()}, "conditioner.embedders.1");

  const auto truncated = root / "truncated.safetensors";
  std::filesystem::copy_file(sdxl, truncated);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(sdxl) / 2);
  check_rejected(root, "truncated", {"model.name_or_path=" + truncated.string()}, "truncated.safetensors");
}
