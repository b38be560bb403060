// The config: example configs, overrides, substitution, the effective-config dump, on-disk checks.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

#include "loratrain/config/config.h"
#include "loratrain/config/schema.h"
#include "scoped_env.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace lt::config;

using lt::test::write_file;
using lt::test::config_error_of;

namespace {

const char* kMinimal = R"(job: extension
config:
  name: unit
  process:
    - type: sd_trainer
      datasets:
        - folder_path: /data/images
      model:
        name_or_path: /models/base.safetensors
meta:
  name: "[name]"
)";

}  // namespace

CATCH_TEST_CASE("every example config validates", "[config]") {
  const fs::path dir = lt::test::source_dir() / "configs";
  int count = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {  // configs/smoke/ too
    if (entry.path().extension() != ".yaml") continue;
    CATCH_INFO(entry.path().string());
    JobConfig job;
    CATCH_REQUIRE_NOTHROW(job = load_config(entry.path()));
    const ProcessConfig& p = the_process(job);
    CATCH_CHECK_FALSE(p.model.name_or_path.empty());
    CATCH_CHECK_FALSE(p.datasets.empty());
    CATCH_CHECK(job.meta.at("name").text.find(job.name) != std::string::npos);  // [name] substituted
    ++count;
  }
  for (const char* name : {"demo", "sd15-lora", "sdxl-lora", "flux-lora-24gb", "wan21-lora"})
    CATCH_CHECK(fs::exists(dir / (std::string(name) + ".yaml")));
  CATCH_CHECK(count >= 5);
}

CATCH_TEST_CASE("the demo config is the small CPU run", "[config]") {
  JobConfig job = load_config(lt::test::source_dir() / "configs" / "demo.yaml");
  const ProcessConfig& p = the_process(job);
  CATCH_CHECK(p.device == "cpu");
  CATCH_CHECK(p.training_folder == "output");
  CATCH_CHECK(p.model.name_or_path == "output/demo-pretrained-base");  // lt-make-demo-base --pretrain
  CATCH_CHECK(p.datasets.at(0).folder_path == "output/demo-concept-data");
  CATCH_CHECK(p.datasets.at(0).resolution == std::vector<int>{32});
  CATCH_CHECK(p.datasets.at(0).caption_ext == ".txt");  // AI Toolkit adds the dot
  CATCH_CHECK(p.train.batch_size == 2);
  CATCH_CHECK(p.train.steps <= 200);
  CATCH_CHECK(p.network.linear == 4);
  // The cross-attention's keys and values only (docs/benchmarks.md, the demo's LoRA).
  CATCH_CHECK(p.network.network_kwargs.only_if_contains == std::vector<std::string>{"attn2.to_k", "attn2.to_v"});
  CATCH_CHECK(p.sample.width == 32);
  CATCH_CHECK(p.sample.sample_every == 60);
  CATCH_CHECK(p.save.save_every == 60);
}

CATCH_TEST_CASE("the flux example carries the 24 GB settings of the playbook", "[config]") {
  JobConfig job = load_config(lt::test::source_dir() / "configs" / "flux-lora-24gb.yaml");
  const ProcessConfig& p = the_process(job);
  CATCH_CHECK(p.datasets.at(0).resolution == std::vector<int>{512});
  CATCH_CHECK(p.train.batch_size == 1);
  CATCH_CHECK(p.train.gradient_accumulation == 4);
  CATCH_CHECK(canonical_dtype(p.train.dtype) == "bf16");
  CATCH_CHECK(p.train.gradient_checkpointing);
  CATCH_CHECK(p.train.optimizer == "adamw8bit");
  CATCH_CHECK(p.network.linear == 16);
  CATCH_CHECK(p.train.lr == Approx(1e-4));
  CATCH_CHECK(p.model.quantize);
  CATCH_CHECK(*p.model.quantize_te);  // derived from quantize, as in AI Toolkit
  CATCH_CHECK(p.train.noise_scheduler == "flowmatch");
  CATCH_CHECK(p.sample.sampler == "flowmatch");
}

CATCH_TEST_CASE("defaults are AI Toolkit's", "[config]") {
  JobConfig job = parse_config_text(kMinimal, "min.yaml");
  const ProcessConfig& p = the_process(job);
  CATCH_CHECK(p.train.steps == 1000);
  CATCH_CHECK(p.train.lr == Approx(1e-6));
  CATCH_CHECK(p.train.batch_size == 1);
  CATCH_CHECK(p.train.gradient_checkpointing);
  CATCH_CHECK(p.train.dtype == "fp32");
  CATCH_CHECK(p.train.optimizer == "adamw");
  CATCH_CHECK(p.train.noise_scheduler == "ddpm");
  CATCH_CHECK(p.train.timestep_type == "sigmoid");
  CATCH_CHECK(p.train.max_grad_norm == 1.0);
  CATCH_CHECK_FALSE(p.train.train_text_encoder);
  CATCH_CHECK(*p.train.unet_lr == Approx(1e-6));
  CATCH_CHECK(p.train.ema_config.ema_decay == Approx(0.999));
  CATCH_CHECK(p.network.type == "lora");
  CATCH_CHECK(p.network.linear == 4);
  CATCH_CHECK(*p.network.linear_alpha == 1.0);  // = alpha
  CATCH_CHECK(p.save.save_every == 1000);
  CATCH_CHECK(p.save.dtype == "float16");
  CATCH_CHECK(p.save.max_step_saves_to_keep == 5);
  CATCH_CHECK(p.datasets[0].resolution == std::vector<int>{512});
  CATCH_CHECK(p.datasets[0].buckets);
  CATCH_CHECK(p.datasets[0].num_repeats == 1);
  CATCH_CHECK(p.sample.sample_every == 100);
  CATCH_CHECK(p.sample.width == 512);
  CATCH_CHECK(p.sample.guidance_scale == 7.0);
  CATCH_CHECK(p.sample.sample_steps == 20);
  CATCH_CHECK(p.logging.log_every == 100);
  CATCH_CHECK(p.model.qtype == "qfloat8");
  CATCH_CHECK_FALSE(p.model.arch.has_value());
  CATCH_CHECK(p.memory.oom_guard.enabled);
  CATCH_CHECK(p.memory.oom_guard.max_attempts == 8);
  CATCH_CHECK(p.memory.simulate_vram.bytes == 0);
}

CATCH_TEST_CASE("AI Toolkit spellings are understood", "[config]") {
  std::string text = kMinimal;
  text.replace(text.find("      model:\n"), 0,
               "      network: {rank: 8, alpha: 4}\n"
               "      train: {dtype: bfloat16, optimizer: AdamW8bit, gradient_checkpointing: yes}\n"
               "      sample: {neg: false, prompts: ['a --w 640 --seed 3']}\n");
  text.replace(text.find("/models/base.safetensors"), std::string("/models/base.safetensors").size(),
               "/models/flux.safetensors\n        is_flux: true");
  text.replace(text.find("        - folder_path: /data/images"), 0, "");
  text.replace(text.find("- folder_path: /data/images"), std::string("- folder_path: /data/images").size(),
               "- folder_path: /data/images\n          resolution: 768");
  JobConfig job = parse_config_text(text, "spellings.yaml");
  const ProcessConfig& p = the_process(job);
  CATCH_CHECK(p.network.linear == 8);
  CATCH_CHECK(*p.network.linear_alpha == 4.0);
  CATCH_CHECK(p.train.dtype == "bfloat16");
  CATCH_CHECK(canonical_dtype(p.train.dtype) == "bf16");
  CATCH_CHECK(p.train.optimizer == "adamw8bit");
  CATCH_CHECK(p.train.gradient_checkpointing);
  CATCH_CHECK(p.sample.neg.empty());
  CATCH_CHECK(p.sample.prompts.at(0) == "a --w 640 --seed 3");  // inline flags stay
  CATCH_CHECK(*p.model.arch == "flux");
  CATCH_CHECK(p.datasets[0].resolution == std::vector<int>{768});
}

CATCH_TEST_CASE("a not-yet AI Toolkit key is accepted at its default only", "[config]") {
  std::string text = kMinimal;
  text.replace(text.find("      model:\n"), 0, "      logging: {use_wandb: false}\n      save: {push_to_hub: false}\n");
  CATCH_CHECK_NOTHROW(parse_config_text(text, "ok.yaml"));
  text.replace(text.find("use_wandb: false"), 16, "use_wandb: true");
  const std::string msg = config_error_of([&] { parse_config_text(text, "x.yaml"); });
  CATCH_CHECK(msg.find("key 'logging.use_wandb' is an AI Toolkit setting that lora-train does not support yet") !=
              std::string::npos);
}

CATCH_TEST_CASE("overrides set keys inside the process and are validated", "[config]") {
  JobConfig job = parse_config_text(kMinimal, "min.yaml",
                                    {"train.batch_size=2", "datasets.0.resolution=[512, 768]",
                                     "model.name_or_path=/other/model.safetensors", "train.ema_config.ema_decay=0.95",
                                     "memory.simulate_vram=1.5GiB", "trigger_word=sks", "sample.prompts=[a, b]"});
  const ProcessConfig& p = the_process(job);
  CATCH_CHECK(p.train.batch_size == 2);
  CATCH_CHECK(p.datasets[0].resolution == std::vector<int>{512, 768});
  CATCH_CHECK(p.model.name_or_path == "/other/model.safetensors");
  CATCH_CHECK(p.train.ema_config.ema_decay == 0.95);
  CATCH_CHECK(p.memory.simulate_vram.bytes == 1610612736);
  CATCH_CHECK(*p.trigger_word == "sks");
  CATCH_CHECK(p.sample.prompts.size() == 2);
  // The override is where the value came from now.
  CATCH_CHECK(job.origins.at("train.batch_size").file == "--set train.batch_size=2");

  CATCH_SECTION("a bad value names the override") {
    lt::ConfigError* none = nullptr;
    (void)none;
    try {
      parse_config_text(kMinimal, "min.yaml", {"train.batch_size=abc"});
      CATCH_FAIL("no error");
    } catch (const lt::ConfigError& e) {
      CATCH_CHECK(std::string(e.what()) == "--set train.batch_size=abc: expected an integer, got 'abc'");
      CATCH_CHECK(e.code() == lt::ExitCode::kUsage);
    }
  }
  CATCH_SECTION("unknown keys, indices and shapes") {
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimal, "m.yaml", {"train.bach_size=2"}); }) ==
                "--set train.bach_size=2: unknown key 'bach_size' in train (did you mean 'batch_size'?)");
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimal, "m.yaml", {"datasets.3.resolution=512"}); })
                    .find("'3' does not name an item of datasets (the config has 1") != std::string::npos);
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimal, "m.yaml", {"train.batch_size.x=2"}); })
                    .find("not a section") != std::string::npos);
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimal, "m.yaml", {"train.batch_size"}); }) ==
                "--set train.batch_size: expected KEY=VALUE, e.g. --set train.batch_size=2");
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimal, "m.yaml", {"datasets.0.resolution=[512,"}); })
                    .find("the value is not valid YAML") != std::string::npos);
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimal, "m.yaml", {"train.dtype=bf17"}); })
                    .find("did you mean 'bf16'?") != std::string::npos);
  }
  CATCH_SECTION("cross-key rules see the override") {
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimal, "m.yaml", {"model.name_or_path="}); })
                    .find("model: missing required key 'name_or_path'") != std::string::npos);
  }
}

CATCH_TEST_CASE("set_value is the setter the OOM guard uses", "[config]") {
  JobConfig job = parse_config_text(kMinimal, "min.yaml");
  set_value(job, "train.gradient_checkpointing", "true");
  set_value(job, "train.batch_size", "1");
  set_value(job, "train.gradient_accumulation", "4");
  set_value(job, "datasets.0.resolution", "[512]");
  set_value(job, "sample.sample_steps", "10");
  set_value(job, "train.disable_sampling", "true", "oom guard");
  validate(job);
  const ProcessConfig& p = the_process(job);
  CATCH_CHECK(p.train.gradient_accumulation == 4);
  CATCH_CHECK(p.sample.sample_steps == 10);
  CATCH_CHECK(p.train.disable_sampling);
  CATCH_CHECK(config_error_of([&] { set_value(job, "train.batch_size", "0", "oom guard"); }) ==
              "oom guard: out of range: must be between 1 and 1024, got 0");
  // The fixed config round-trips through YAML.
  JobConfig again = parse_config_text(dump_effective_yaml(job), "fixed.yaml");
  CATCH_CHECK(the_process(again).train.gradient_accumulation == 4);
  CATCH_CHECK(the_process(again).train.disable_sampling);
}

CATCH_TEST_CASE("[name] and ${ENV} substitution", "[config]") {
  ::setenv("LT_TEST_DATA_DIR", "/srv/data", 1);
  ::setenv("LT_TEST_STEPS", "321", 1);
  std::string text = kMinimal;
  text.replace(text.find("/data/images"), 12, "${LT_TEST_DATA_DIR}/[name]");
  text.replace(text.find("      model:\n"), 0, "      train: {steps: \"${LT_TEST_STEPS}\"}\n      training_folder: out/[name]\n");
  JobConfig job = parse_config_text(text, "subst.yaml");
  const ProcessConfig& p = the_process(job);
  CATCH_CHECK(p.datasets[0].folder_path == "/srv/data/unit");
  CATCH_CHECK(p.training_folder == "out/unit");
  CATCH_CHECK(p.train.steps == 321);
  CATCH_CHECK(job.meta.at("name").text == "unit");
  CATCH_CHECK(job.meta.at("name").quoted);
}

CATCH_TEST_CASE("the effective config round-trips with defaults filled in", "[config]") {
  for (const char* name : {"demo", "sd15-lora", "sdxl-lora", "flux-lora-24gb", "wan21-lora"}) {
    CATCH_INFO(name);
    JobConfig job = load_config(lt::test::source_dir() / "configs" / (std::string(name) + ".yaml"));
    const std::string once = dump_effective_yaml(job);
    JobConfig again = parse_config_text(once, "effective.yaml");
    const std::string twice = dump_effective_yaml(again);
    CATCH_CHECK(once == twice);
    CATCH_CHECK(once.find("gradient_checkpointing: true") != std::string::npos);
    CATCH_CHECK(once.find("max_attempts: 8") != std::string::npos);
  }
  JobConfig job = parse_config_text(kMinimal, "min.yaml", {"memory.simulate_vram=1536MiB", "train.lr=0.0001"});
  const std::string text = dump_effective_yaml(job);
  CATCH_CHECK(text.find("simulate_vram: 1.5GiB") != std::string::npos);
  CATCH_CHECK(text.find("lr: 0.0001") != std::string::npos);
  CATCH_CHECK(text.find("linear_alpha: 1.0") != std::string::npos);  // derived default written out
  CATCH_CHECK(text.find("steps: 1000") != std::string::npos);

  const fs::path dir = lt::test::scratch_dir("config_effective");
  write_effective_yaml(job, dir / "config.yaml");
  CATCH_CHECK(dump_effective_yaml(load_config(dir / "config.yaml")) == text);
}

CATCH_TEST_CASE("validate_paths checks dataset folders where they are set", "[config]") {
  const fs::path dir = lt::test::scratch_dir("config_paths");
  fs::create_directories(dir / "empty");
  fs::create_directories(dir / "images");
  write_file(dir / "images" / "a.png", "not really a png");
  write_file(dir / "empty" / "notes.txt", "captions only");
  auto config_for = [&](const std::string& folder) {
    std::string text = kMinimal;
    text.replace(text.find("/data/images"), 12, folder);
    return text;
  };
  // The base as a repo id in a (fake) local Hugging Face cache.
  fs::create_directories(dir / "hub" / "models--org--hub-model" / "snapshots" / "c0ffee");
  write_file(dir / "hub" / "models--org--hub-model" / "snapshots" / "c0ffee" / "model_index.json", "{}");
  lt::test::ScopedEnv env;
  env.set("HF_HUB_CACHE", (dir / "hub").string());
  auto check = [&](const std::string& folder) {
    JobConfig job = parse_config_text(config_for(folder), "paths.yaml", {"model.name_or_path=org/hub-model"});
    validate_paths(job);
  };
  CATCH_CHECK_NOTHROW(check((dir / "images").string()));
  CATCH_CHECK(config_error_of([&] { check((dir / "missing").string()); })
                  .find("paths.yaml:7:11: datasets.0.folder_path: dataset folder '") == 0);
  CATCH_CHECK(config_error_of([&] { check((dir / "missing").string()); }).find("does not exist") != std::string::npos);
  CATCH_CHECK(config_error_of([&] { check((dir / "empty").string()); }).find("is empty: it holds no images") !=
              std::string::npos);
  // A missing local checkpoint is reported at model.name_or_path.
  JobConfig job = parse_config_text(config_for((dir / "images").string()), "paths.yaml");
  CATCH_CHECK(config_error_of([&] { validate_paths(job); }) ==
              "paths.yaml:9:9: model.name_or_path: '/models/base.safetensors' does not exist");
  // A repo id missing from the cache is reported at the key too (the resolver's own tests: test_model_path.cpp).
  CATCH_CHECK(config_error_of([&] {
                validate_paths(parse_config_text(config_for((dir / "images").string()), "paths.yaml",
                                                 {"model.name_or_path=org/other"}));
              }).find("--set model.name_or_path=org/other: 'org/other' is not a local path") == 0);
}

CATCH_TEST_CASE("the key table knows memory levers and support status", "[config]") {
  CATCH_CHECK(is_memory_lever("train.gradient_checkpointing"));
  CATCH_CHECK(is_memory_lever("train.batch_size"));
  CATCH_CHECK(is_memory_lever("datasets.0.resolution"));
  CATCH_CHECK(is_memory_lever("datasets.3.num_frames"));
  CATCH_CHECK(is_memory_lever("sample.sample_steps"));
  CATCH_CHECK(is_memory_lever("model.low_vram"));
  CATCH_CHECK(is_memory_lever("memory.attention_chunk"));
  CATCH_CHECK_FALSE(is_memory_lever("train.lr"));
  CATCH_CHECK_FALSE(is_memory_lever("save.dtype"));  // save precision does not change training memory
  const KeyInfo* k = find_key("datasets.0.is_reg");
  CATCH_REQUIRE(k != nullptr);
  CATCH_CHECK(k->support == Support::kNotYet);
  CATCH_CHECK(find_key("memory.oom_guard.max_attempts")->ours);
  CATCH_CHECK(find_key("train.batch_size")->default_value == "1");
  CATCH_CHECK(find_key("train.dtype")->allowed == "fp32, fp16, bf16, float32, float16, bfloat16");
}
