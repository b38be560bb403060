// The playbook's shared vocabulary: names, the 4k+1 frame grid, and one mapping of the memory
// settings to JSON and to the config, each a round trip.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/playbook/settings.h"
#include "loratrain/playbook/vocabulary.h"
#include "test_paths.h"

using namespace lt::playbook;

CATCH_TEST_CASE("playbook names read back", "[playbook]") {
  for (Phase p : {Phase::load, Phase::cache, Phase::baseline_sample, Phase::train_step, Phase::sample, Phase::save}) {
    CATCH_CHECK(phase_from_string(to_string(p)) == p);
  }
  for (Classification c : {Classification::load, Classification::early_steps, Classification::sometimes,
                           Classification::sampling, Classification::video_spike, Classification::environment,
                           Classification::fragmentation}) {
    CATCH_CHECK(classification_from_string(to_string(c)) == c);
  }
  for (ModelFamily f : {ModelFamily::kSD1, ModelFamily::kSD2, ModelFamily::kSDXL, ModelFamily::kFlux, ModelFamily::kWan,
                        ModelFamily::kHunyuan, ModelFamily::kMochi}) {
    CATCH_CHECK(family_from_string(to_string(f)) == f);
  }
  CATCH_CHECK_FALSE(family_from_string("unknown").has_value());
  CATCH_CHECK(family_from_arch("sdxl") == ModelFamily::kSDXL);
  CATCH_CHECK(family_from_arch("wan21") == ModelFamily::kWan);
  CATCH_CHECK(family_from_arch("pixart") == ModelFamily::kUnknown);
  CATCH_CHECK_FALSE(family_from_arch("").has_value());
  CATCH_CHECK(is_video(ModelFamily::kWan));
  CATCH_CHECK_FALSE(is_video(ModelFamily::kSDXL));
  CATCH_CHECK(describe(Phase::train_step, {3, 512, 768, 1, 4, 768}) == "train_step(step 3, bucket 512x768, batch 4)");
}

CATCH_TEST_CASE("frames stay on the 4k+1 grid", "[playbook]") {
  CATCH_CHECK(reduced_frames(81) == 41);
  CATCH_CHECK(reduced_frames(41) == 21);
  CATCH_CHECK(reduced_frames(21) == 9);
  CATCH_CHECK(reduced_frames(9) == 5);
  CATCH_CHECK(reduced_frames(5) == 1);
  CATCH_CHECK(reduced_frames(1) == 1);
  CATCH_CHECK(reduced_frames(0) == 1);
  // Off the grid: down onto it.
  CATCH_CHECK(reduced_frames(48) == 21);
  CATCH_CHECK(reduced_frames(50) == 25);
  for (int n = 2; n <= 200; ++n) {
    const int r = reduced_frames(n);
    CATCH_CHECK(r < n);
    CATCH_CHECK((r - 1) % 4 == 0);
  }
  CATCH_CHECK(increased_frames(21, 81) == 41);
  CATCH_CHECK(increased_frames(41, 81) == 81);
  CATCH_CHECK(increased_frames(81, 81) == 81);
  CATCH_CHECK(increased_frames(9, 33) == 17);
}

namespace {

MemorySettings every_field_changed() {
  MemorySettings s;
  s.gradient_checkpointing = true;
  s.batch_size = 1;
  s.grad_accumulation = 4;
  s.resolutions = {256, 512, 768};
  s.dropped_largest = 1;
  s.sample_width = 256;
  s.sample_height = 384;
  s.sample_steps = 10;
  s.sample_every = 50;
  s.disable_sampling = true;
  s.skip_first_sample = true;
  s.low_vram = true;
  s.quantize = Quantize::int8;
  s.num_frames = 21;
  s.sample_num_frames = 9;
  s.is_video = true;
  return s;
}

}  // namespace

CATCH_TEST_CASE("memory settings: JSON round trip", "[playbook]") {
  const MemorySettings s = every_field_changed();
  nlohmann::json j = s;
  MemorySettings back;
  from_json(j, back);
  CATCH_CHECK(back == s);
  // The keys are the config's: the state of a guard that moved batch 4 to batch 1 x 4 says so.
  CATCH_CHECK(j.at("gradient_accumulation") == 4);
  // A missing key keeps what the reader had.
  MemorySettings partial;
  partial.batch_size = 3;
  from_json(nlohmann::json{{"low_vram", true}}, partial);
  CATCH_CHECK(partial.batch_size == 3);
  CATCH_CHECK(partial.low_vram);
}

CATCH_TEST_CASE("frame counts off the 4k+1 grid are rounded as diffusers' WanPipeline does", "[playbook]") {
  // WanPipeline: num_frames // 4 * 4 + 1.
  CATCH_CHECK(frames_on_video_grid(40) == 41);  // AI Toolkit's Wan 2.1 example previews
  CATCH_CHECK(frames_on_video_grid(41) == 41);
  CATCH_CHECK(frames_on_video_grid(34) == 33);
  CATCH_CHECK(frames_on_video_grid(35) == 33);
  CATCH_CHECK(frames_on_video_grid(36) == 37);
  CATCH_CHECK(frames_on_video_grid(3) == 1);
  CATCH_CHECK(frames_on_video_grid(1) == 1);
  CATCH_CHECK(frames_on_video_grid(1024) == 1021);  // the config's bound
  for (int n = 1; n <= 1024; ++n) {
    const int f = frames_on_video_grid(n);
    CATCH_CHECK((f - 1) % 4 == 0);
    CATCH_CHECK(std::abs(f - n) <= 3);
  }

  lt::config::JobConfig job = lt::config::parse_config_text(
      "job: extension\nconfig:\n  name: grid\n  process:\n    - type: sd_trainer\n      training_folder: out\n"
      "      model:\n        name_or_path: /models/wan\n        arch: wan21\n"
      "      datasets:\n        - folder_path: a\n          num_frames: 40\n        - folder_path: b\n"
      "          num_frames: 2\n        - folder_path: c\n          num_frames: 17\n        - folder_path: d\n"
      "      sample:\n        num_frames: 40\n",
      "grid.yaml");
  auto& p = lt::config::the_process(job);
  const auto notes = put_frames_on_video_grid(p);
  CATCH_CHECK(p.datasets[0].num_frames == 41);
  CATCH_CHECK(p.datasets[1].num_frames == 5);  // still a clip dataset
  CATCH_CHECK(p.datasets[2].num_frames == 17);
  CATCH_CHECK(p.datasets[3].num_frames == 1);   // images
  CATCH_CHECK(p.sample.num_frames == 41);
  CATCH_REQUIRE(notes.size() == 3);
  CATCH_CHECK(notes[0].rfind("datasets.0.num_frames: 40 is not of the form 4k+1", 0) == 0);
  CATCH_CHECK(notes[0].find("using 41, as diffusers' WanPipeline rounds it") != std::string::npos);
  CATCH_CHECK(notes[1].rfind("datasets.1.num_frames: 2 ", 0) == 0);
  CATCH_CHECK(notes[2].rfind("sample.num_frames: 40 ", 0) == 0);
  CATCH_CHECK(put_frames_on_video_grid(p).empty());  // on the grid now
}

CATCH_TEST_CASE("memory settings: config round trip", "[playbook]") {
  auto dir = lt::test::scratch_dir("playbook_config");
  std::filesystem::create_directories(dir / "data");
  const auto path = dir / "video.yaml";
  std::ofstream(path) << "job: extension\nconfig:\n  name: rt\n  process:\n    - type: sd_trainer\n"
                      << "      training_folder: " << dir.string() << "\n"
                      << "      model:\n        name_or_path: /models/wan\n        arch: wan21\n"
                      << "      datasets:\n        - folder_path: " << (dir / "data").string() << "\n"
                      << "          resolution: [256, 512, 768]\n          num_frames: 33\n"
                      << "      train:\n        steps: 10\n        batch_size: 2\n        gradient_accumulation: 2\n"
                      << "        gradient_checkpointing: false\n"
                      << "      sample:\n        width: 512\n        height: 512\n        sample_steps: 20\n"
                      << "        num_frames: 33\n        sample_every: 50\n";
  const auto job = lt::config::load_config(path);
  const MemorySettings configured = settings_from_config(lt::config::the_process(job), true);
  CATCH_CHECK(configured.batch_size == 2);
  CATCH_CHECK(configured.grad_accumulation == 2);
  CATCH_CHECK(configured.resolutions == std::vector<int>{256, 512, 768});
  CATCH_CHECK(configured.num_frames == 33);
  CATCH_CHECK(configured.is_video);

  // What the guard may reach, written into the config and read back: the same settings, except
  // the dropped bucket, which the config no longer lists at all.
  MemorySettings reached = every_field_changed();
  reached.num_frames = 21;
  reached.sample_num_frames = 9;
  const auto fixed = config_with_settings(job, reached);
  const MemorySettings back = settings_from_config(lt::config::the_process(fixed), true);
  MemorySettings expected = reached;
  expected.resolutions = {256, 512};
  expected.dropped_largest = 0;
  CATCH_CHECK(back == expected);
  CATCH_CHECK(back.active_resolutions() == reached.active_resolutions());
  // Unchanged settings give the config back unchanged.
  CATCH_CHECK(settings_from_config(lt::config::the_process(config_with_settings(job, configured)), true) == configured);
  CATCH_CHECK_FALSE(changes(configured, configured).any());
  const SettingsChange c = changes(configured, reached);
  CATCH_CHECK(c.checkpointing);
  CATCH_CHECK(c.batch_size);
  CATCH_CHECK(c.buckets);
  CATCH_CHECK(c.frames);
  CATCH_CHECK(c.quantize);
  CATCH_CHECK(c.low_vram);
}
