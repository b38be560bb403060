// `lora-train sample` (run_sampling): the training previews' path from a saved adapter file.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/io/image.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace {

fs::path preview_of_step(const fs::path& samples, const std::string& tag) {
  for (const auto& entry : fs::directory_iterator(samples)) {
    const std::string name = entry.path().filename().string();
    if (name.find("__" + tag + "_0.png") != std::string::npos) return entry.path();
  }
  return {};
}

}  // namespace

CATCH_TEST_CASE("sample reproduces a training preview bit-identically on the CPU", "[train][e2e][sample]") {
  const auto kind = GENERATE(std::string("lora"), std::string("lokr"));
  CATCH_INFO(kind);
  auto root = lt::test::scratch_dir("sample_" + kind);
  auto config = lt::test::write_tiny_config(root, "s", 2, "", "",
                                            "      sample:\n        sample_every: 2\n        width: 64\n        height: 64\n"
                                            "        sample_steps: 3\n        sampler: ddim\n        seed: 5\n"
                                            "        prompts: [\"a red circle\", \"a blue square\"]\n");
  lt::train::RunRequest run;
  run.config_path = config;
  run.overrides = {"train.disable_sampling=false", "train.skip_first_sample=true", "network.type=" + kind,
                   "network.lokr_full_rank=false", "train.lr=0.05"};
  auto trained = lt::train::run_training(run);
  CATCH_REQUIRE(trained.exit_code == 0);
  const fs::path preview = preview_of_step(root / "s" / "samples", "000000002");
  CATCH_REQUIRE_FALSE(preview.empty());

  lt::train::SampleRequest request;
  request.config_path = config;
  request.overrides = run.overrides;
  request.loras = {{trained.lora_path, 1.0}};
  request.output_dir = root / "cli";
  auto result = lt::train::run_sampling(request);
  CATCH_REQUIRE(result.images.size() == 2);
  CATCH_CHECK(fs::exists(result.grid));
  const auto want = lt::io::read_image(preview);
  const auto have = lt::io::read_image(result.images[0]);
  CATCH_CHECK(have.width == want.width);
  CATCH_CHECK(have.pixels == want.pixels);
  // The prompt and the seed travel in the PNG's text.
  const auto text = lt::io::read_png_text(lt::io::read_file_bytes(result.images[0]));
  CATCH_REQUIRE(text.size() == 1);
  CATCH_CHECK(text[0].first == "parameters");
  CATCH_CHECK_THAT(text[0].second, Catch::StartsWith("a red circle\n") && Catch::Contains("Seed: 5") &&
                                       Catch::Contains("Steps: 3") && Catch::Contains("s.safetensors (1)"));

  // The adapter matters: multiplier 0 draws the base, another seed another image.
  request.multiplier_given = true;
  request.loras[0].multiplier = 0.0;
  request.output_dir = root / "cli0";
  auto base_only = lt::train::run_sampling(request);
  CATCH_CHECK(lt::io::read_image(base_only.images[0]).pixels != want.pixels);
  request.multiplier_given = false;
  request.loras[0].multiplier = 1.0;
  request.seed = 6;
  request.prompts = {"a red circle"};
  request.output_dir = root / "cli6";
  auto reseeded = lt::train::run_sampling(request);
  CATCH_REQUIRE(reseeded.images.size() == 1);
  CATCH_CHECK(lt::io::read_image(reseeded.images[0]).pixels != want.pixels);

  // Bad input: one clear error, nothing written.
  lt::train::SampleRequest missing = request;
  missing.loras = {{root / "nothing.safetensors", 1.0}};
  missing.output_dir = root / "bad";
  CATCH_CHECK_THROWS_AS(lt::train::run_sampling(missing), lt::InputError);
  CATCH_CHECK_FALSE(fs::exists(root / "bad"));
}
