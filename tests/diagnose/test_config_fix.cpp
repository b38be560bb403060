// --config / --write-fix on a lora-train (AI Toolkit schema) YAML config.
#include <catch2/catch.hpp>

#include <yaml-cpp/yaml.h>

#include <fstream>

#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/report.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using namespace lt::diagnose;

namespace {
const char* kConfig = R"(job: extension
config:
  name: my_lora
  process:
    - type: sd_trainer
      train:
        batch_size: 4
        gradient_accumulation_steps: 1
        gradient_checkpointing: false
        steps: 2000
      model:
        name_or_path: black-forest-labs/FLUX.1-dev
        quantize: true
      datasets:
        - folder_path: /data/images
          resolution: [512, 768, 1024]
      sample:
        width: 1024
        height: 1024
        sample_every: 250
)";
const char* kEarlyOom =
    "steps:   0%|          | 2/1000 [00:01<?, 1.0s/it, avr_loss=0.1]\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n";
}  // namespace

CATCH_TEST_CASE("write-fix applies the first applicable fix to the config", "[diagnose][config]") {
  auto dir = lt::test::scratch_dir("diagnose_config");
  auto cfg = dir / "cfg.yaml";
  std::ofstream(cfg) << kConfig;
  Diagnosis d = diagnose_text(kEarlyOom);
  merge_config_settings(d, cfg);
  CATCH_REQUIRE_FALSE(d.fixes.empty());
  CATCH_CHECK(d.fixes[0].id == "gradient_checkpointing");
  std::string what;
  auto out = dir / "fixed.yaml";
  CATCH_CHECK(write_fixed_config(d, cfg, out, &what) == "gradient_checkpointing");
  YAML::Node fixed = YAML::LoadFile(out.string());
  CATCH_CHECK(fixed["config"]["process"][0]["train"]["gradient_checkpointing"].as<bool>());
  CATCH_CHECK(fixed["config"]["process"][0]["train"]["batch_size"].as<int>() == 4);  // one change at a time

  // Next round: checkpointing is on now, so the batch goes to 1 with accumulation 4.
  Diagnosis d2 = diagnose_text(kEarlyOom);
  merge_config_settings(d2, out);
  auto out2 = dir / "fixed2.yaml";
  CATCH_CHECK(write_fixed_config(d2, out, out2, &what) == "batch_size_1");
  YAML::Node f2 = YAML::LoadFile(out2.string());
  CATCH_CHECK(f2["config"]["process"][0]["train"]["batch_size"].as<int>() == 1);
  CATCH_CHECK(f2["config"]["process"][0]["train"]["gradient_accumulation_steps"].as<int>() == 4);

  // Then the largest bucket goes.
  Diagnosis d3 = diagnose_text(kEarlyOom);
  merge_config_settings(d3, out2);
  auto out3 = dir / "fixed3.yaml";
  CATCH_CHECK(write_fixed_config(d3, out2, out3, &what) == "remove_largest_bucket");
  auto res = YAML::LoadFile(out3.string())["config"]["process"][0]["datasets"][0]["resolution"];
  CATCH_REQUIRE(res.size() == 2);
  CATCH_CHECK(res[1].as<int>() == 768);
}

CATCH_TEST_CASE("write-fix for a sampling OOM shrinks the previews", "[diagnose][config]") {
  auto dir = lt::test::scratch_dir("diagnose_config_sampling");
  auto cfg = dir / "cfg.yaml";
  std::ofstream(cfg) << kConfig;
  Diagnosis d = diagnose_text(
      "steps:  25%|##  | 250/1000 [00:01<?, 1.0s/it, loss=0.1]\nGenerating Images:   0%|  | 0/10 [00:00<?, ?it/s]\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n");
  CATCH_CHECK(d.phase == Phase::kSampling);
  merge_config_settings(d, cfg);
  CATCH_CHECK(write_fixed_config(d, cfg, dir / "fixed.yaml") == "shrink_sampling");
  YAML::Node f = YAML::LoadFile((dir / "fixed.yaml").string());
  CATCH_CHECK(f["config"]["process"][0]["sample"]["width"].as<int>() == 512);
  CATCH_CHECK(f["config"]["process"][0]["sample"]["sample_every"].as<int>() == 500);
}

CATCH_TEST_CASE("write-fix reports config problems as input errors", "[diagnose][config]") {
  auto dir = lt::test::scratch_dir("diagnose_config_bad");
  Diagnosis d = diagnose_text(kEarlyOom);
  CATCH_CHECK_THROWS_AS(merge_config_settings(d, dir / "missing.yaml"), lt::InputError);
  std::ofstream(dir / "bad.yaml") << "config: [unclosed\n";
  CATCH_CHECK_THROWS_AS(merge_config_settings(d, dir / "bad.yaml"), lt::ConfigError);
}
