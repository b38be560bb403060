// The planner against real peaks: tiny SD1, Flux and Wan 2.1 runs on the CPU with the counting allocator
// across batch, bucket, checkpointing, dtype, rank, optimizer, attention chunking, the 8-bit base and
// the encoders' release; every phase a run's report.json has must be predicted within +-15%.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/plan/plan.h"
#include "loratrain/train/demo_base.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/strings.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace {

constexpr double kTolerance = 0.15;

const std::string kPreviews =
    "      sample:\n        sample_every: 10\n        width: 64\n        height: 64\n        sample_steps: 2\n"
    "        prompts:\n          - a red square\n";

const std::string kFluxPreviews =
    "      sample:\n        sample_every: 10\n        width: 64\n        height: 64\n        sample_steps: 2\n"
    "        sampler: flowmatch\n        guidance_scale: 3.5\n        prompts:\n          - a red square\n";

struct Case {
  std::string name;
  std::vector<std::string> overrides;
};

// Runs each case (ten steps: an epoch of every case, so the run meets its largest bucket, as the
// plan assumes) and checks every phase of its report.json against the prediction; prints the table.
void check_cases(const fs::path& root, const std::vector<Case>& cases, const std::vector<std::string>& common,
                 const std::string& previews) {
  std::string table = fmt::format("{:<18} {:<16} {:>12} {:>12} {:>8}\n", "case", "phase", "measured", "predicted", "error");
  int checked = 0;
  for (const Case& c : cases) {
    const fs::path config = lt::test::write_tiny_config(root, c.name, 10, "", "", previews);
    std::vector<std::string> overrides = common;
    overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
    overrides.push_back("train.disable_sampling=false");
    lt::train::RunRequest request;
    request.config_path = config;
    request.overrides = overrides;
    request.fresh = true;
    const auto result = lt::train::run_training(request);
    CATCH_REQUIRE(result.exit_code == 0);
    std::ifstream in(root / c.name / "report.json");
    const auto report = nlohmann::json::parse(in);

    const auto job = lt::config::load_config(config, overrides);
    std::optional<int> bytes;
    if (lt::config::canonical_dtype(lt::config::the_process(job).train.dtype) == "bf16" &&
        lt::train::cpu_bf16_instructions().empty()) {
      bytes = 4;  // the trainer computes in fp32 here
    }
    const auto planner = lt::plan::Planner::from_config(job, bytes);
    const auto prediction = planner->predict(planner->configured());
    for (const auto& [phase, measured_json] : report.at("peaks").items()) {
      const int64_t measured = measured_json.at("peak_allocated").get<int64_t>();
      const auto p = lt::playbook::phase_from_string(phase);
      CATCH_REQUIRE(p);
      const int64_t predicted = prediction.at(*p).peak();
      const double error = double(predicted - measured) / double(measured);
      table += fmt::format("{:<18} {:<16} {:>12} {:>12} {:>+7.1f}%\n", c.name, phase, lt::format_bytes(measured),
                           lt::format_bytes(predicted), 100 * error);
      CATCH_INFO(c.name << " " << phase << ": measured " << measured << ", predicted " << predicted);
      CATCH_CHECK(std::abs(error) <= kTolerance);
      ++checked;
    }
  }
  std::cout << table;
  CATCH_CHECK(checked == 6 * static_cast<int>(cases.size()));  // every phase of every case
}

}  // namespace

CATCH_TEST_CASE("predicted peaks are within 15% of the measured ones on tiny CPU runs", "[plan][e2e]") {
  const fs::path root = lt::test::scratch_dir("plan_accuracy");
  const std::vector<Case> cases = {
      {"base", {}},
      {"batch4", {"train.batch_size=4"}},
      {"bucket128", {"datasets.0.resolution=[64, 128]"}},
      {"checkpointing", {"train.gradient_checkpointing=true", "train.batch_size=4"}},
      {"rank32", {"network.linear=32", "network.linear_alpha=32"}},
      // batch 1: the optimizer's all-or-nothing update, not the activations, makes the step's peak
      {"rank32_batch1", {"network.linear=32", "network.linear_alpha=32", "train.batch_size=1"}},
      {"bf16", {"train.dtype=bf16"}},  // fp32 on a CPU without bf16 instructions
      {"bf16_checkpointing", {"train.dtype=bf16", "train.gradient_checkpointing=true", "datasets.0.resolution=[64, 128]"}},
      {"attention_chunk", {"memory.attention_chunk=16", "datasets.0.resolution=[128]", "train.batch_size=4"}},
      {"low_vram", {"model.low_vram=true"}},
      {"adafactor", {"train.optimizer=adafactor"}},
      {"adamw8bit", {"train.optimizer=adamw8bit"}},
      {"int8_base", {"model.quantize=true", "model.qtype=qint8"}},
  };
  check_cases(root, cases, {}, kPreviews);
}

CATCH_TEST_CASE("predicted Flux peaks are within 15% of the measured ones on tiny CPU runs", "[plan][e2e][flux]") {
  const fs::path root = lt::test::scratch_dir("plan_accuracy_flux");
  lt::train::DemoBaseOptions base;
  base.arch = lt::train::DemoArch::kFluxDev;
  lt::train::write_demo_base(root / "dev", base);
  base.arch = lt::train::DemoArch::kFluxSchnell;
  lt::train::write_demo_base(root / "schnell", base);
  const std::string dev = "model.name_or_path=" + (root / "dev" / "model.safetensors").string();
  const std::vector<Case> cases = {
      {"flux_base", {dev}},
      {"flux_batch4_bucket128", {dev, "train.batch_size=4", "datasets.0.resolution=[64, 128]"}},
      {"flux_checkpointing", {dev, "train.gradient_checkpointing=true", "train.batch_size=4"}},
      {"flux_bf16", {dev, "train.dtype=bf16"}},
      {"flux_bf16_ckpt_chunk", {dev, "train.dtype=bf16", "train.gradient_checkpointing=true", "memory.attention_chunk=64"}},
      {"flux_attention_chunk", {dev, "memory.attention_chunk=64", "train.batch_size=4"}},
      {"flux_rank32", {dev, "network.linear=32", "network.linear_alpha=32"}},
      {"flux_fp8_base", {dev, "model.quantize=true", "model.qtype=qfloat8"}},
      {"flux_unload_te", {dev, "train.unload_text_encoder=true"}},
      {"flux_low_vram", {dev, "model.low_vram=true"}},
      {"schnell", {"model.name_or_path=" + (root / "schnell" / "model.safetensors").string()}},
  };
  check_cases(root, cases, {"model.arch=flux"}, kFluxPreviews);
}

CATCH_TEST_CASE("predicted Wan 2.1 peaks are within 15% of the measured ones on tiny CPU runs", "[plan][e2e][wan]") {
  const fs::path root = lt::test::scratch_dir("plan_accuracy_wan");
  lt::train::DemoBaseOptions base;
  base.arch = lt::train::DemoArch::kWan21;
  lt::train::write_demo_base(root / "wan", base);
  // Four clips of 9..17 frames (one of them 2:1 landscape), 64 px and up.
  lt::data::DemoVideoOptions clips;
  clips.count = 4;
  clips.min_frames = 9;
  clips.max_frames = 17;
  lt::data::make_demo_video_dataset(root / "clips", clips);
  const std::string video = "datasets.0.folder_path=" + (root / "clips").string();
  const std::string frames9 = "datasets.0.num_frames=9";
  const std::vector<Case> cases = {
      {"wan_clips9", {video, frames9}},
      {"wan_clips17", {video, "datasets.0.num_frames=17"}},
      {"wan_images", {}},  // the tiny image dataset: 1-frame clips
      {"wan_bucket128", {video, frames9, "datasets.0.resolution=[64, 128]"}},
      {"wan_checkpointing", {video, frames9, "train.gradient_checkpointing=true", "datasets.0.resolution=[64, 128]"}},
      {"wan_bf16", {video, frames9, "train.dtype=bf16"}},  // fp32 on a CPU without bf16 instructions
      {"wan_attention_chunk", {video, frames9, "memory.attention_chunk=16", "datasets.0.resolution=[128]"}},
      {"wan_rank32", {video, frames9, "network.linear=32", "network.linear_alpha=32"}},
      {"wan_int8_base", {video, frames9, "model.quantize=true", "model.qtype=qint8"}},
      // qfloat8: the transformer's codes made on the host right after building it, umT5's as it loads
      {"wan_fp8_base", {video, frames9, "model.quantize=true", "model.qtype=qfloat8"}},
      {"wan_unload_te", {video, frames9, "train.unload_text_encoder=true"}},
      {"wan_low_vram", {video, frames9, "model.low_vram=true"}},
      // quantize_te (on with quantize): the deferred umT5 comes quantized when the cache phase uses it
      {"wan_low_vram_int8", {video, frames9, "model.low_vram=true", "model.quantize=true", "model.qtype=qint8"}},
  };
  const std::string previews =
      "      sample:\n        sample_every: 10\n        width: 64\n        height: 64\n        num_frames: 5\n"
      "        sample_steps: 2\n        sampler: flowmatch\n        guidance_scale: 5\n        prompts:\n          - a red circle\n";
  check_cases(root, cases,
              {"model.name_or_path=" + (root / "wan" / "wan2.1_t2v_tiny.safetensors").string(), "model.arch=wan21",
               "train.timestep_type=sigmoid"},
              previews);
}
