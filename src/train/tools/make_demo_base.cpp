// lt-make-demo-base OUT_DIR [--seed N]: writes the embedded demo's tiny SD-architecture base model
// (random weights) and its vocabulary; see train/demo_base.h.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "loratrain/train/demo_base.h"

int main(int argc, char** argv) {
  CLI::App app{"Writes the embedded demo's tiny SD-architecture base model (random weights)"};
  std::string out_dir;
  uint64_t seed = 1234;
  app.add_option("out_dir", out_dir, "folder for model.safetensors and tokenizer/")->required();
  bool full_size = false;
  app.add_option("--seed", seed, "weight seed")->capture_default_str();
  app.add_flag("--full-size", full_size, "SD1.5's real shapes (about 4 GiB in fp32) instead of the tiny demo model");
  CLI11_PARSE(app, argc, argv);
  try {
    lt::train::write_demo_base(out_dir, seed, full_size);
    return 0;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
