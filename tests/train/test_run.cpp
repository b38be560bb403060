// `lora-train run` end to end on the tiny SD1-architecture base: files, resume, checkpointing.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/io/image.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/train/trainer.h"
#include "train_fixture.h"
#include "tensor_support.h"
#include "test_support.h"

using lt::test::read_tensors;
using lt::test::same_tensors;

namespace {

}  // namespace

CATCH_TEST_CASE("run trains a LoRA and leaves every output in the run folder", "[train][e2e]") {
  auto root = lt::test::scratch_dir("run_outputs");
  auto config = lt::test::write_tiny_config(root, "outputs", 6, "",
                                            "        simulate_vram: 0\n",
                                            "      sample:\n        sample_every: 3\n        width: 64\n        height: 64\n"
                                            "        sample_steps: 2\n        sampler: ddim\n        prompts: [\"a red circle\"]\n");
  lt::train::RunRequest request;
  request.config_path = config;
  request.overrides = {"train.disable_sampling=false", "save.save_every=3"};
  auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 6);
  const auto run = root / "outputs";
  CATCH_CHECK(std::filesystem::exists(run / "outputs.safetensors"));
  CATCH_CHECK(std::filesystem::exists(run / "outputs_000000003.safetensors"));
  CATCH_CHECK(std::filesystem::exists(run / "config.yaml"));
  CATCH_CHECK(std::filesystem::exists(run / "report.json"));
  CATCH_CHECK(std::filesystem::exists(run / "samples" / "grid_000000003.png"));
  CATCH_CHECK(std::filesystem::exists(run / "samples" / "grid_000000000.png"));  // baseline
  {
    // progress.png: the step grids (0, 3, 6) stacked, one row per preview step.
    const auto grid = lt::io::read_image(run / "samples" / "grid_000000003.png");
    const auto progress = lt::io::read_image(run / "samples" / "progress.png");
    CATCH_CHECK(progress.width == grid.width);
    CATCH_CHECK(progress.height == 3 * grid.height);
  }
  // The effective config parses back.
  CATCH_CHECK_NOTHROW(lt::config::load_config(run / "config.yaml"));
  // metrics.jsonl: one line per step, with the step's real bucket (the demo images at 64: buckets
  // on the 16-pixel grid within 64x64).
  std::ifstream metrics(run / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    ++lines;
    const auto j = nlohmann::json::parse(line);
    const int64_t w = j.at("width").get<int64_t>(), h = j.at("height").get<int64_t>();
    CATCH_CHECK(w > 0);
    CATCH_CHECK(h > 0);
    CATCH_CHECK(w % 16 == 0);
    CATCH_CHECK(h % 16 == 0);
    CATCH_CHECK(w * h <= 64 * 64);
  }
  CATCH_CHECK(lines == 6);
  // A kohya file: every module has down, up and alpha; the up weights moved away from zero.
  auto lora = read_tensors(run / "outputs.safetensors");
  size_t ups = 0, moved = 0;
  for (const auto& [name, t] : lora) {
    if (name.find(".lora_up.weight") == std::string::npos) continue;
    ++ups;
    CATCH_CHECK(lora.count(name.substr(0, name.size() - std::string(".lora_up.weight").size()) + ".alpha") == 1);
    if (t.abs().max().item<float>() > 0) ++moved;
  }
  CATCH_CHECK(ups > 0);
  CATCH_CHECK(moved == ups);
  auto file = lt::io::SafetensorsFile::open(run / "outputs.safetensors");
  CATCH_CHECK(file->metadata().at("ss_network_dim") == "4");
}

CATCH_TEST_CASE("an interrupted run resumes bit-identically on the CPU", "[train][e2e][resume]") {
  auto root = lt::test::scratch_dir("run_resume");
  const std::string extra = "        gradient_accumulation: 2\n        noise_offset: 0.05\n";
  lt::train::RunRequest straight;
  straight.config_path = lt::test::write_tiny_config(root / "a", "resume", 8, extra);
  auto whole = lt::train::run_training(straight);
  CATCH_REQUIRE(whole.exit_code == 0);

  lt::train::RunRequest first_half;
  first_half.config_path = lt::test::write_tiny_config(root / "b", "resume", 8, extra);
  first_half.stop_after_steps = 3;
  auto interrupted = lt::train::run_training(first_half);
  CATCH_REQUIRE(interrupted.exit_code == 130);
  CATCH_REQUIRE(std::filesystem::exists(root / "b" / "resume" / "state" / "training_state.safetensors"));

  lt::train::RunRequest second_half;
  second_half.config_path = first_half.config_path;
  auto resumed = lt::train::run_training(second_half);
  CATCH_REQUIRE(resumed.exit_code == 0);
  CATCH_CHECK(resumed.steps_completed == 8);
  CATCH_REQUIRE(resumed.losses.size() == 5);
  for (size_t i = 0; i < 5; ++i) CATCH_CHECK(resumed.losses[i] == whole.losses[3 + i]);
  CATCH_CHECK(same_tensors(read_tensors(root / "a" / "resume" / "resume.safetensors"),
                           read_tensors(root / "b" / "resume" / "resume.safetensors")));
}

CATCH_TEST_CASE("gradient checkpointing changes memory, not the training", "[train][e2e]") {
  auto root = lt::test::scratch_dir("run_checkpointing");
  lt::train::RunRequest off;
  off.config_path = lt::test::write_tiny_config(root / "off", "ckpt", 3);
  lt::train::RunRequest on;
  on.config_path = lt::test::write_tiny_config(root / "on", "ckpt", 3);
  on.overrides = {"train.gradient_checkpointing=true"};
  auto a = lt::train::run_training(off);
  auto b = lt::train::run_training(on);
  CATCH_REQUIRE(a.exit_code == 0);
  CATCH_REQUIRE(b.exit_code == 0);
  auto la = read_tensors(root / "off" / "ckpt" / "ckpt.safetensors");
  auto lb = read_tensors(root / "on" / "ckpt" / "ckpt.safetensors");
  CATCH_REQUIRE(la.size() == lb.size());
  // Recomputation reorders no arithmetic that matters: the losses agree to float precision and
  // the adapters to well within what three Adam steps of lr 1e-3 could move them.
  for (size_t i = 0; i < a.losses.size(); ++i) CATCH_CHECK(a.losses[i] == Approx(b.losses[i]).epsilon(1e-5));
  for (const auto& [name, t] : la) CATCH_CHECK(torch::allclose(t, lb.at(name), 1e-3, 1e-5));
}

CATCH_TEST_CASE("bad runs fail with one clear error and no partial LoRA", "[train][e2e]") {
  auto root = lt::test::scratch_dir("run_bad");
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, "bad", 2);
  request.overrides = {"model.name_or_path=" + (root / "missing.safetensors").string()};
  try {
    lt::train::run_training(request);
    CATCH_FAIL("expected an error");
  } catch (const lt::Error& e) {
    CATCH_CHECK(static_cast<int>(e.code()) == 2);
    CATCH_CHECK_THAT(std::string(e.what()), Catch::Contains("missing.safetensors"));
  }
  CATCH_CHECK_FALSE(std::filesystem::exists(root / "bad" / "bad.safetensors"));
}

CATCH_TEST_CASE("EMA: the saved LoRA is the average, training goes on with the live weights, resume is exact",
                "[train][e2e][resume]") {
  auto root = lt::test::scratch_dir("run_ema");
  const std::string ema = "        ema_config:\n          use_ema: true\n          ema_decay: 0.5\n";
  lt::train::RunRequest plain;
  plain.config_path = lt::test::write_tiny_config(root / "plain", "ema", 6);
  lt::train::RunRequest straight;
  straight.config_path = lt::test::write_tiny_config(root / "a", "ema", 6, ema);
  auto without = lt::train::run_training(plain);
  auto whole = lt::train::run_training(straight);
  CATCH_REQUIRE(without.exit_code == 0);
  CATCH_REQUIRE(whole.exit_code == 0);
  // The average does not feed back into training: the same losses as without EMA.
  CATCH_CHECK(whole.losses == without.losses);
  auto live = read_tensors(root / "plain" / "ema" / "ema.safetensors");
  auto average = read_tensors(root / "a" / "ema" / "ema.safetensors");
  CATCH_REQUIRE(live.size() == average.size());
  size_t differ = 0;
  for (const auto& [name, t] : live) differ += torch::equal(t, average.at(name)) ? 0 : 1;
  CATCH_CHECK(differ > 0);
  CATCH_CHECK(lt::io::SafetensorsFile::open(root / "a" / "ema" / "ema.safetensors")->metadata().at("ss_ema_decay") == "0.5");

  lt::train::RunRequest first_half;
  first_half.config_path = lt::test::write_tiny_config(root / "b", "ema", 6, ema);
  first_half.stop_after_steps = 3;
  CATCH_REQUIRE(lt::train::run_training(first_half).exit_code == 130);
  lt::train::RunRequest second_half;
  second_half.config_path = first_half.config_path;
  auto resumed = lt::train::run_training(second_half);
  CATCH_REQUIRE(resumed.exit_code == 0);
  CATCH_CHECK(same_tensors(average, read_tensors(root / "b" / "ema" / "ema.safetensors")));
}
