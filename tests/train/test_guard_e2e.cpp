// The OOM guard inside real runs, on the CPU with simulated VRAM: real allocation failures from
// real allocation sites, never mocks.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <fstream>

#include <fmt/format.h>

#include "loratrain/config/config.h"
#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/fixes.h"
#include "loratrain/data/demo_data.h"
#include "loratrain/io/image.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/memory/budget_allocator.h"
#include "loratrain/train/trainer.h"
#include "train_fixture.h"

namespace {

// These tests watch the guard react to real OOMs: the planner's start from a fitting rung is off.
const std::string kReactive = "        oom_guard:\n          plan: false\n";

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<std::string> actions_of(const nlohmann::json& report) {
  std::vector<std::string> out;
  for (const auto& a : report.at("attempts")) out.push_back(a.at("action").get<std::string>());
  return out;
}

int64_t phase_peak(const nlohmann::json& report, const std::string& phase) {
  return report.at("peaks").at(phase).at("peak_allocated").get<int64_t>();
}

std::map<std::string, at::Tensor> read_all(const std::filesystem::path& path) {
  auto file = lt::io::SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : file->tensors()) out[t.name] = file->load(t.name);
  return out;
}

// Calibration and reference runs use simulated VRAM too, with a budget nothing reaches: on the host
// the frozen convolutions run on packed weights (models/packed_conv.h; more memory, bits that differ
// at 1e-6), under simulated VRAM, as on a GPU, they do not.
const std::string kUnreachedBudget = "memory.simulate_vram=64GiB";

// One step of the given shape with the guard on but an unlimited budget: its per-phase peaks.
nlohmann::json measure(const std::filesystem::path& root, const std::string& name, std::vector<std::string> overrides) {
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, name, 1);
  request.overrides = std::move(overrides);
  request.overrides.push_back(kUnreachedBudget);
  auto result = lt::train::run_training(request);
  if (result.exit_code != 0) throw std::runtime_error("calibration run failed");
  return read_json(root / name / "report.json");
}

}  // namespace

CATCH_TEST_CASE("early-step OOM: checkpointing, then batch 1 with accumulation, and the run completes", "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_early");
  const std::vector<std::string> heavy = {"train.batch_size=4", "datasets.0.resolution=[64, 128]"};
  auto big = measure(root, "calib_big", heavy);
  auto small = measure(root, "calib_small", {"train.batch_size=1", "train.gradient_checkpointing=true",
                                             "datasets.0.resolution=[64, 128]"});
  const int64_t heavy_peak = phase_peak(big, "train_step");
  const int64_t light_peak = phase_peak(small, "train_step");
  const int64_t floor_peak = std::max({phase_peak(big, "load"), phase_peak(big, "cache"), light_peak});
  CATCH_INFO("train_step peak heavy " << heavy_peak << ", light " << light_peak << ", floor " << floor_peak);
  CATCH_REQUIRE(heavy_peak > floor_peak * 11 / 10);
  const int64_t budget = floor_peak + (heavy_peak - floor_peak) / 4;

  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, "early", 4, "",
                                                    kReactive + "        simulate_vram: " + std::to_string(budget) + "\n");
  request.overrides = heavy;
  auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 4);
  auto report = read_json(root / "early" / "report.json");
  auto actions = actions_of(report);
  CATCH_INFO(report.dump(1));
  // Chunked attention first: exact, but no help on these short sequences; then the playbook.
  CATCH_REQUIRE(actions.size() >= 2);
  CATCH_CHECK(actions[0] == "chunk_attention");
  CATCH_CHECK(actions[1] == "enable_checkpointing");
  CATCH_REQUIRE(result.actions.size() == actions.size());
  CATCH_CHECK(result.actions[1] == "train.gradient_checkpointing: false -> true");
  if (actions.size() >= 3) CATCH_CHECK(actions[2] == "batch_to_one");
  // The price of the recovery: measured on the steps that ran with it.
  const auto& price = report.at("attempts").back().at("price");
  CATCH_CHECK(price.at("steps_after").get<int>() >= 3);
  CATCH_CHECK(price.at("peak_after").get<int64_t>() <= budget);
  // report.html puts every action on the loss chart's timeline and in its table.
  std::ifstream html_file(root / "early" / "report.html");
  const std::string html((std::istreambuf_iterator<char>(html_file)), {});
  size_t marks = 0, rows = 0;
  for (size_t at = html.find("<g class=\"guard-mark oom\""); at != std::string::npos; at = html.find("<g class=\"guard-mark oom\"", at + 1)) ++marks;
  for (size_t at = html.find("<tr class=\"guard-row oom\""); at != std::string::npos; at = html.find("<tr class=\"guard-row oom\"", at + 1)) ++rows;
  CATCH_CHECK(marks == actions.size());
  CATCH_CHECK(rows == actions.size());
  CATCH_CHECK(html.find("train.gradient_checkpointing: false -&gt; true") != std::string::npos);
  // Round trip: diagnose reads the guard's own log as an early-step OOM of lora-train, knows the
  // guard already turned checkpointing on, and names the guard's next lever first.
  auto diagnosis = lt::diagnose::diagnose_path((root / "early" / "log.txt").string());
  CATCH_CHECK(diagnosis.oom);
  CATCH_CHECK(diagnosis.phase == lt::diagnose::Phase::kEarlySteps);
  auto fixes = lt::diagnose::plan_fixes(diagnosis);
  CATCH_REQUIRE_FALSE(fixes.empty());
  for (const auto& fix : fixes) CATCH_CHECK(fix.id != "gradient_checkpointing");
  if (actions.size() == 2) CATCH_CHECK(fixes.front().config_key.find("batch_size") != std::string::npos);
  // The working settings are written down, and they keep the effective batch.
  auto effective = lt::config::load_config(root / "early" / "effective.yaml");
  const auto& p = lt::config::the_process(effective);
  CATCH_CHECK(p.train.gradient_checkpointing);
  CATCH_CHECK(p.train.batch_size * p.train.gradient_accumulation == 4);
}

CATCH_TEST_CASE("guard recovery, then an interruption: the resumed run keeps the guard's settings and ends bit-identical",
                "[guard][e2e][resume]") {
  auto root = lt::test::scratch_dir("guard_resume");
  const std::vector<std::string> batch4 = {"train.batch_size=4", "datasets.0.resolution=[64]"};
  auto heavy = measure(root, "calib_heavy", batch4);
  auto mid = measure(root, "calib_mid", {"train.batch_size=4", "train.gradient_checkpointing=true", "datasets.0.resolution=[64]"});
  auto light = measure(root, "calib_light", {"train.batch_size=1", "train.gradient_checkpointing=true", "datasets.0.resolution=[64]"});
  const int64_t floor_peak = std::max({phase_peak(heavy, "load"), phase_peak(heavy, "cache"), phase_peak(light, "train_step")});
  const int64_t mid_peak = phase_peak(mid, "train_step");
  CATCH_INFO("train_step peaks: heavy " << phase_peak(heavy, "train_step") << ", checkpointing " << mid_peak
                                        << ", batch 1 " << phase_peak(light, "train_step") << "; floor " << floor_peak);
  CATCH_REQUIRE(mid_peak > floor_peak * 21 / 20);
  // Checkpointing alone does not fit; batch 1 x accumulation 4 does.
  const std::string budget = kReactive + "        simulate_vram: " + std::to_string(floor_peak + (mid_peak - floor_peak) / 2) + "\n";

  lt::train::RunRequest straight;
  straight.config_path = lt::test::write_tiny_config(root / "a", "recover", 6, "", budget);
  straight.overrides = batch4;
  auto whole = lt::train::run_training(straight);
  CATCH_REQUIRE(whole.exit_code == 0);
  CATCH_REQUIRE(whole.actions.size() == 3);
  CATCH_CHECK(whole.actions[0].find("memory.attention_chunk: 0 -> 1024") == 0);
  CATCH_CHECK(whole.actions[1] == "train.gradient_checkpointing: false -> true");
  CATCH_CHECK(whole.actions[2].find("train.batch_size: 4 -> 1") != std::string::npos);

  lt::train::RunRequest first_half = straight;
  first_half.config_path = lt::test::write_tiny_config(root / "b", "recover", 6, "", budget);
  first_half.stop_after_steps = 3;
  auto interrupted = lt::train::run_training(first_half);
  CATCH_REQUIRE(interrupted.exit_code == 130);
  CATCH_CHECK(interrupted.actions == whole.actions);

  lt::train::RunRequest second_half = straight;
  second_half.config_path = first_half.config_path;
  auto resumed = lt::train::run_training(second_half);
  CATCH_REQUIRE(resumed.exit_code == 0);
  CATCH_CHECK(resumed.actions.empty());  // nothing failed again: the settings came with the state
  CATCH_REQUIRE(resumed.losses.size() == 3);
  for (size_t i = 0; i < 3; ++i) CATCH_CHECK(resumed.losses[i] == whole.losses[3 + i]);
  auto a = read_all(root / "a" / "recover" / "recover.safetensors");
  auto b = read_all(root / "b" / "recover" / "recover.safetensors");
  CATCH_REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) CATCH_CHECK(torch::equal(t, b.at(name)));
  auto report = read_json(root / "b" / "recover" / "report.json");
  CATCH_CHECK(report.at("final_settings").at("batch_size") == 1);
  CATCH_CHECK(report.at("final_settings").at("gradient_accumulation") == 4);
  CATCH_CHECK(report.at("final_settings").at("gradient_checkpointing") == true);
}

CATCH_TEST_CASE("injected allocation failures lose nothing: the LoRA is bit-identical", "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_faults");
  lt::train::RunRequest clean;
  clean.config_path = lt::test::write_tiny_config(root / "clean", "faults", 20, "", kReactive + "        simulate_vram: 2GiB\n");
  auto a = lt::train::run_training(clean);
  CATCH_REQUIRE(a.exit_code == 0);

  lt::train::RunRequest faulty;
  faulty.config_path = lt::test::write_tiny_config(root / "faulty", "faults", 20, "", kReactive + "        simulate_vram: 2GiB\n");
  int injected = 0;
  lt::memory::CpuMemory* cpu = nullptr;
  faulty.on_training_start = [&](lt::memory::DeviceMemory& memory) {
    cpu = dynamic_cast<lt::memory::CpuMemory*>(&memory);
    if (cpu) cpu->allocator().fail_randomly(0.0004, 99, 4, 4096);
  };
  auto b = lt::train::run_training(faulty);
  CATCH_REQUIRE(b.exit_code == 0);
  auto report = read_json(root / "faulty" / "faults" / "report.json");
  injected = static_cast<int>(report.at("attempts").size());
  CATCH_INFO("recoveries: " << injected << "\n" << report.at("attempts").dump(1));
  CATCH_CHECK(injected >= 1);
  for (const auto& action : actions_of(report)) CATCH_CHECK(action == "empty_cache_retry");
  CATCH_CHECK(b.steps_completed == 20);
  CATCH_CHECK(a.images_seen == b.images_seen);
  CATCH_CHECK(a.losses == b.losses);
  auto la = read_all(root / "clean" / "faults" / "faults.safetensors");
  auto lb = read_all(root / "faulty" / "faults" / "faults.safetensors");
  CATCH_REQUIRE(la.size() == lb.size());
  for (const auto& [name, t] : la) CATCH_CHECK(torch::equal(t, lb.at(name)));
}

CATCH_TEST_CASE("a step that fails twice is reported in its own bucket both times, not in the next batch's",
                "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_context");
  auto metrics_buckets = [](const std::filesystem::path& run) {
    std::vector<nlohmann::json> buckets;  // [width, height] per completed step
    std::ifstream in(run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      buckets.push_back(nlohmann::json::array({j.at("width"), j.at("height")}));
    }
    return buckets;
  };
  const int steps = 6;
  lt::train::RunRequest clean;
  clean.config_path = lt::test::write_tiny_config(root / "clean", "context", steps, "", kReactive + "        simulate_vram: 2GiB\n");
  auto a = lt::train::run_training(clean);
  CATCH_REQUIRE(a.exit_code == 0);
  const auto buckets = metrics_buckets(root / "clean" / "context");
  CATCH_REQUIRE(buckets.size() == static_cast<size_t>(steps));
  // A step whose next batch lies in another bucket (the tiny data set's wide and square images).
  int failing = 0;
  for (int s = 1; s < steps && failing == 0; ++s) {
    if (buckets[s - 1] != buckets[s]) failing = s;
  }
  CATCH_REQUIRE(failing > 0);

  // The same run with that step's first two attempts failing (two allocation failures in a row).
  lt::train::RunRequest faulty;
  faulty.config_path = lt::test::write_tiny_config(root / "faulty", "context", steps, "", kReactive + "        simulate_vram: 2GiB\n");
  faulty.on_step_start = [&](int64_t step, lt::memory::DeviceMemory& memory) {
    auto* cpu = dynamic_cast<lt::memory::CpuMemory*>(&memory);
    if (cpu != nullptr && step == failing) cpu->allocator().fail_next_allocations(2, 8192);
  };
  auto b = lt::train::run_training(faulty);
  CATCH_REQUIRE(b.exit_code == 0);
  const auto report = read_json(root / "faulty" / "context" / "report.json");
  CATCH_INFO("failing step " << failing << ", buckets " << nlohmann::json(buckets).dump() << "\n"
                             << report.at("attempts").dump(1));
  CATCH_REQUIRE(report.at("attempts").size() == 2);
  for (const auto& attempt : report.at("attempts")) {
    CATCH_CHECK(attempt.at("phase") == "train_step");
    CATCH_CHECK(attempt.at("step") == failing);
    CATCH_CHECK(attempt.at("bucket") == buckets[failing - 1]);
  }
  // The log line of each retry names that bucket too.
  std::ifstream log_file(root / "faulty" / "context" / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  const std::string where = fmt::format("OOM in phase train_step(step {}, bucket {}x{}", failing, buckets[failing - 1][0].get<int>(),
                                        buckets[failing - 1][1].get<int>());
  size_t lines = 0;
  for (size_t at = log.find(where); at != std::string::npos; at = log.find(where, at + 1)) ++lines;
  CATCH_CHECK(lines == 2);
  CATCH_CHECK(a.losses == b.losses);
}

CATCH_TEST_CASE("memory held by something else: warned, classified environment, exit 4 fast", "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_environment");
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, "env", 4, "", kReactive + "        simulate_vram: 256MiB\n");
  request.overrides = {"train.batch_size=1", "train.gradient_checkpointing=true"};
  request.on_memory_ready = [](lt::memory::DeviceMemory& memory) {
    if (auto* cpu = dynamic_cast<lt::memory::CpuMemory*>(&memory)) cpu->allocator().occupy(250ll * 1024 * 1024);
  };
  const auto started = std::chrono::steady_clock::now();
  auto result = lt::train::run_training(request);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  CATCH_CHECK(result.exit_code == 4);
  CATCH_CHECK(seconds < 20);
  auto report = read_json(root / "env" / "report.json");
  CATCH_CHECK(report.at("start").at("warned").get<bool>());
  CATCH_CHECK(report.at("attempts").size() <= 2);
  CATCH_CHECK(std::filesystem::exists(root / "env" / "fixed.yaml"));
}

CATCH_TEST_CASE("a base larger than the budget: ladder exhausted, exit 3, fixed.yaml accepted by run", "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_exhausted");
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, "tight", 4, "", kReactive + "        simulate_vram: 4MiB\n");
  auto result = lt::train::run_training(request);
  CATCH_CHECK(result.exit_code == 3);
  auto report = read_json(root / "tight" / "report.json");
  auto actions = actions_of(report);
  CATCH_INFO(report.dump(1));
  CATCH_REQUIRE_FALSE(actions.empty());
  CATCH_CHECK(actions.back() == "give_up_exhausted");
  CATCH_REQUIRE(std::filesystem::exists(root / "tight" / "fixed.yaml"));
  auto fixed = lt::config::load_config(root / "tight" / "fixed.yaml");
  const auto& p = lt::config::the_process(fixed);
  CATCH_CHECK(p.model.low_vram);
}

CATCH_TEST_CASE("OOM only while sampling: tiled decode, previews at their configured size; training untouched",
                "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_sampling");
  const std::string previews =
      "      sample:\n        sample_every: 2\n        width: 256\n        height: 256\n        sample_steps: 2\n"
      "        sampler: ddim\n        prompts: [\"a red circle\"]\n";
  // Attention is already chunked as the guard would: the ladder starts at the VAE.
  const std::vector<std::string> with_sampling = {"train.disable_sampling=false", "train.skip_first_sample=true",
                                                  "memory.attention_chunk=1024"};
  auto calibrate = [&](const std::string& name, bool tiled) {
    lt::train::RunRequest request;
    request.config_path = lt::test::write_tiny_config(root / name, name, 2, "", "", previews);
    request.overrides = with_sampling;
    request.overrides.push_back(std::string("memory.vae_tiling=") + (tiled ? "true" : "false"));
    request.overrides.push_back(kUnreachedBudget);
    CATCH_REQUIRE(lt::train::run_training(request).exit_code == 0);
    return read_json(root / name / name / "report.json");
  };
  const auto plain = calibrate("plain", false);
  const auto tiled = calibrate("tiled", true);
  const int64_t plain_peak = phase_peak(plain, "sample"), tiled_peak = phase_peak(tiled, "sample");
  const int64_t training_peak = std::max({phase_peak(plain, "load"), phase_peak(plain, "cache"),
                                          phase_peak(plain, "train_step"), phase_peak(plain, "save")});
  CATCH_INFO("sample peak " << plain_peak << ", tiled " << tiled_peak << ", training peak " << training_peak);
  CATCH_REQUIRE(tiled_peak < plain_peak * 9 / 10);
  const int64_t budget = std::max(tiled_peak, training_peak) + (plain_peak - std::max(tiled_peak, training_peak)) / 2;
  CATCH_REQUIRE(budget < plain_peak);

  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root / "run", "sampling", 6, "",
                                                    kReactive + "        simulate_vram: " + std::to_string(budget) + "\n", previews);
  request.overrides = with_sampling;
  auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  auto report = read_json(root / "run" / "sampling" / "report.json");
  CATCH_INFO(report.at("attempts").dump(1));
  CATCH_CHECK(actions_of(report) == std::vector<std::string>{"tile_vae"});
  const auto& attempt = report.at("attempts").at(0);
  CATCH_CHECK(attempt.at("phase") == "sample");
  CATCH_CHECK(attempt.at("step") == 2);
  CATCH_CHECK(attempt.at("bucket") == nlohmann::json::array({256, 256}));  // the preview being made
  CATCH_CHECK(report.at("final_settings").at("sample_width") == 256);
  CATCH_CHECK(report.at("final_settings").at("disable_sampling") == false);
  // Every preview was made, at the configured size.
  int previews_made = 0;
  for (const auto& e : std::filesystem::directory_iterator(root / "run" / "sampling" / "samples")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("grid_", 0) == 0 || name == "progress.png") continue;  // the grids, not previews
    auto image = lt::io::read_image(e.path());
    CATCH_CHECK(image.width == 256);
    CATCH_CHECK(image.height == 256);
    ++previews_made;
  }
  CATCH_CHECK(previews_made >= 3);

  lt::train::RunRequest quiet;
  quiet.config_path = lt::test::write_tiny_config(root / "quiet", "sampling", 6, "", "", previews);
  quiet.overrides = {kUnreachedBudget};  // the same convolution kernels as the guarded run
  auto reference = lt::train::run_training(quiet);  // disable_sampling: true (the fixture's default)
  CATCH_REQUIRE(reference.exit_code == 0);
  CATCH_CHECK(result.losses == reference.losses);
}

CATCH_TEST_CASE("OOM while caching latents: the VAE alone on the device, the UNet never quantized, the LoRA bit-identical",
                "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_cache");
  lt::data::DemoDataOptions images;
  images.count = 4;
  images.size = 160;
  lt::data::make_demo_dataset(root / "large", images);
  const std::vector<std::string> buckets = {"datasets.0.folder_path=" + (root / "large").string(),
                                            "datasets.0.resolution=[64, 96, 128]", "train.batch_size=1",
                                            "train.gradient_checkpointing=true"};
  auto run = [&](const std::string& name, const std::string& memory, std::vector<std::string> extra = {}) {
    lt::train::RunRequest request;
    request.config_path = lt::test::write_tiny_config(root / name, "cache", 3, "", memory);
    request.overrides = buckets;
    request.overrides.insert(request.overrides.end(), extra.begin(), extra.end());
    return lt::train::run_training(request);
  };
  auto clean = run("clean", "", {kUnreachedBudget});
  CATCH_REQUIRE(clean.exit_code == 0);
  CATCH_REQUIRE(run("lowvram", "", {"model.low_vram=true", kUnreachedBudget}).exit_code == 0);
  const auto full = read_json(root / "clean" / "cache" / "report.json");
  const auto low = read_json(root / "lowvram" / "cache" / "report.json");
  int64_t others = 0;
  for (const char* phase : {"load", "train_step", "save"}) others = std::max(others, phase_peak(low, phase));
  const int64_t floor_peak = std::max(others, phase_peak(low, "cache"));
  const int64_t cache_peak = phase_peak(full, "cache");
  CATCH_INFO("cache peak " << cache_peak << ", with the VAE alone " << phase_peak(low, "cache") << ", other phases "
                           << others);
  CATCH_REQUIRE(cache_peak > floor_peak);
  const int64_t budget = floor_peak + (cache_peak - floor_peak) / 2;

  auto guarded = run("guarded", kReactive + "        simulate_vram: " + std::to_string(budget) + "\n");
  CATCH_REQUIRE(guarded.exit_code == 0);
  const auto report = read_json(root / "guarded" / "cache" / "report.json");
  CATCH_INFO(report.at("attempts").dump(1));
  CATCH_CHECK(actions_of(report) == std::vector<std::string>{"chunk_attention", "enable_low_vram"});
  for (const auto& attempt : report.at("attempts")) {
    CATCH_CHECK(attempt.at("phase") == "cache");
    CATCH_CHECK(attempt.at("batch") == 1);
    CATCH_CHECK(attempt.at("bucket").at(0).get<int>() >= 96);  // the image being encoded, never 0x0
  }
  CATCH_CHECK(report.at("final_settings").at("quantize") == "none");
  CATCH_CHECK(report.at("final_settings").at("vae_tiling") == false);
  CATCH_CHECK(guarded.losses == clean.losses);
  auto a = read_all(root / "clean" / "cache" / "cache.safetensors");
  auto b = read_all(root / "guarded" / "cache" / "cache.safetensors");
  CATCH_REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) CATCH_CHECK(torch::equal(t, b.at(name)));
  // Round trip: diagnose reads the guard's line as a before-training OOM of lora-train.
  auto diagnosis = lt::diagnose::diagnose_path((root / "guarded" / "cache" / "log.txt").string());
  CATCH_CHECK(diagnosis.oom);
  CATCH_CHECK(diagnosis.trainer == lt::diagnose::Trainer::kLoraTrain);
  CATCH_CHECK(diagnosis.phase == lt::diagnose::Phase::kLoad);
}

CATCH_TEST_CASE("OOM at load: the low-VRAM path; caching then gets the VAE's levers and a clear give-up, never the quantized base",
                "[guard][e2e]") {
  auto root = lt::test::scratch_dir("guard_load");
  const std::string previews =
      "      sample:\n        sample_every: 1000\n        width: 64\n        height: 64\n        sample_steps: 2\n"
      "        sampler: ddim\n        prompts: [\"a red circle\"]\n";
  lt::train::RunRequest request;
  // 20 MiB: the tiny base (UNet + VAE + text encoder, about 21 MiB in fp32) does not load whole.
  request.config_path = lt::test::write_tiny_config(root, "load", 3, "", kReactive + "        simulate_vram: 20MiB\n", previews);
  request.overrides = {"train.disable_sampling=false", "train.gradient_checkpointing=true", "train.batch_size=1"};
  auto result = lt::train::run_training(request);
  auto report = read_json(root / "load" / "report.json");
  auto actions = actions_of(report);
  CATCH_INFO(report.at("attempts").dump(1));
  // Loading fits with the encoders deferred; caching then needs the VAE beside the whole UNet: the
  // VAE's levers, then the guard stops (exit 3) rather than quantize the UNet for the VAE's failure.
  CATCH_CHECK(result.exit_code == 3);
  CATCH_CHECK(result.steps_completed == 0);
  CATCH_CHECK(actions == std::vector<std::string>{"enable_low_vram", "chunk_attention", "tile_vae", "give_up_exhausted"});
  CATCH_REQUIRE(actions.size() == 4);
  CATCH_CHECK(report.at("attempts")[0].at("phase") == "load");
  for (int i = 1; i < 4; ++i) CATCH_CHECK(report.at("attempts")[i].at("phase") == "cache");
  const std::string give_up = report.at("attempts")[3].at("description").get<std::string>();
  CATCH_CHECK(give_up.find("the VAE's encode of one") != std::string::npos);
  CATCH_CHECK(give_up.find("the denoiser is not quantized") != std::string::npos);
  CATCH_CHECK(report.at("final_settings").at("quantize") == "none");
  CATCH_REQUIRE(std::filesystem::exists(root / "load" / "fixed.yaml"));
  auto fixed = lt::config::load_config(root / "load" / "fixed.yaml");
  CATCH_CHECK(lt::config::the_process(fixed).model.low_vram);
  CATCH_CHECK_FALSE(lt::config::the_process(fixed).model.quantize);
}
