// lt-make-demo-data OUT_DIR [--count N] [--size S] [--seed K] [--concept-every N] [--concept-word W]
// lt-make-demo-data --video OUT_DIR [--count N] [--size S] [--frames MIN MAX] [--fps F] [--seed K]
// Writes the embedded demo's dataset, or the video demo's clips (see loratrain/data/demo_data.h).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "loratrain/data/demo_data.h"
#include "loratrain/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Generate the lora-train demo dataset (coloured shapes with captions, or moving shapes as clips)"};
  std::string out_dir;
  lt::data::DemoDataOptions o;
  lt::data::DemoVideoOptions v;
  bool video = false;
  std::vector<int> frames = {v.min_frames, v.max_frames};
  app.add_option("out_dir", out_dir, "folder to write images (or clips) and captions into")->required();
  app.add_flag("--video", video, "write short video clips (.webm, .mp4, animated .webp) instead of images");
  app.add_option("--count", o.count, "number of images (clips: default 8)")->capture_default_str();
  app.add_option("--size", o.size, "base size in pixels (squares of size..1.5*size, some 2:1)")->capture_default_str();
  app.add_option("--frames", frames, "clips: least and most frames (4k+1 counts between them)")
      ->expected(2)->capture_default_str();
  app.add_option("--fps", v.fps, "clips: frame rate")->capture_default_str();
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  app.add_option("--concept-every", o.concept_every,
                 "make every N-th image a concept image: a cyan shape (a colour the pretrained demo base never saw) "
                 "captioned with the concept word in the colour's place (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--concept-word", o.concept_word, "the concept images' word (the demo's trigger word)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (video) {
      if (app.count("--count")) v.count = o.count;
      v.size = o.size;
      v.seed = o.seed;
      v.min_frames = frames[0];
      v.max_frames = frames[1];
      auto clips = lt::data::make_demo_video_dataset(out_dir, v);
      for (const auto& c : clips)
        spdlog::info("{}: {}x{}, {} frames: {}", c.file, c.width, c.height, c.frames, c.caption);
      spdlog::info("wrote {} clips with captions to {}", clips.size(), out_dir);
      return 0;
    }
    auto items = lt::data::make_demo_dataset(out_dir, o);
    spdlog::info("wrote {} images with captions to {}", items.size(), out_dir);
  } catch (const lt::Error& e) {
    spdlog::error("{}", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
