// lt-make-demo-data OUT_DIR [--count N] [--size S] [--seed K] [--concept-every N] [--concept-word W]
// Writes the embedded demo's dataset (see loratrain/data/demo_data.h).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "loratrain/data/demo_data.h"
#include "loratrain/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Generate the lora-train demo dataset (coloured shapes with captions)"};
  std::string out_dir;
  lt::data::DemoDataOptions o;
  app.add_option("out_dir", out_dir, "folder to write images and captions into")->required();
  app.add_option("--count", o.count, "number of images")->capture_default_str();
  app.add_option("--size", o.size, "base image size in pixels (squares of size..1.5*size, some size x 2*size)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  app.add_option("--concept-every", o.concept_every,
                 "make every N-th image a concept image: a cyan shape (a colour the pretrained demo base never saw) "
                 "captioned with the concept word in the colour's place (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--concept-word", o.concept_word, "the concept images' word (the demo's trigger word)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
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
