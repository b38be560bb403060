// AI Toolkit's own files: its example configs and the jobs its UI writes (mirrored in
// tests/config/data/aitk/) validate with only folder_path and device changed; the values AI Toolkit
// writes mean what they mean there; UI-only keys are accepted and listed; --set wins over the file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <set>

#include "loratrain/config/config.h"
#include "loratrain/config/schema.h"
#include "scoped_env.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace lt::config;

using lt::test::write_file;
using lt::test::config_error_of;

namespace {

fs::path aitk_dir() { return lt::test::source_dir() / "tests" / "config" / "data" / "aitk"; }

// A Hugging Face cache holding every repo the mirrored files name, as huggingface-cli leaves it.
fs::path make_hub_cache(const fs::path& root) {
  for (const char* repo : {"black-forest-labs--FLUX.1-dev", "black-forest-labs--FLUX.1-schnell",
                           "Wan-AI--Wan2.1-T2V-1.3B-Diffusers", "Wan-AI--Wan2.1-T2V-14B-Diffusers",
                           "stable-diffusion-v1-5--stable-diffusion-v1-5",
                           "stabilityai--stable-diffusion-xl-base-1.0"}) {
    const fs::path dir = root / (std::string("models--") + repo);
    write_file(dir / "refs" / "main", "0123abcd");
    write_file(dir / "snapshots" / "0123abcd" / "model_index.json", "{}");
  }
  const fs::path adapter = root / "models--ostris--FLUX.1-schnell-training-adapter";
  write_file(adapter / "refs" / "main", "feed");
  write_file(adapter / "snapshots" / "feed" / "pytorch_lora_weights.safetensors", "x");
  return root;
}

std::vector<fs::path> mirrored_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(aitk_dir()))
    if (entry.path().extension() == ".yaml" || entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

// What each mirrored file must come out as.
struct Expect {
  const char* arch;          // "" = detected from the checkpoint (legacy is_flux sets flux)
  bool use_ema;
  bool unload_text_encoder;
  bool assistant_lora;
  const char* save_format;
  bool ui;                   // written by the UI: carries its bookkeeping keys
};
const std::map<std::string, Expect>& expectations() {
  static const std::map<std::string, Expect> m = {
      {"example_flux_24gb.yaml", {"flux", true, false, false, "safetensors", false}},
      {"example_flux_schnell_24gb.yaml", {"flux", true, false, true, "safetensors", false}},
      {"example_wan21_1b_24gb.yaml", {"wan21", true, false, false, "safetensors", false}},
      {"example_wan21_14b_24gb.yaml", {"wan21", true, true, false, "safetensors", false}},
      {"ui_sd15.yaml", {"sd1", false, false, false, "peft", true}},
      {"ui_sdxl.yaml", {"sdxl", false, false, false, "peft", true}},
      {"ui_flux.yaml", {"flux", false, false, false, "peft", true}},
      {"ui_flux.job_config.json", {"flux", false, false, false, "peft", true}},
      {"ui_wan21_1b.yaml", {"wan21", false, false, false, "peft", true}},
      {"ui_wan21_14b.yaml", {"wan21", false, false, false, "peft", true}},
  };
  return m;
}

const char* kMinimalExtension = R"(job: extension
config:
  name: unit
  process:
    - type: sd_trainer
      datasets:
        - folder_path: /data/images
      train:
        lr: 1e-4
      model:
        name_or_path: /models/base.safetensors
meta:
  name: "[name]"
)";

std::string with_train(const std::string& lines) {
  std::string text = kMinimalExtension;
  text.replace(text.find("        lr: 1e-4\n"), 0, lines);
  return text;
}

}  // namespace

CATCH_TEST_CASE("AI Toolkit's example configs and UI jobs validate with only folder_path and device changed",
                "[config][aitk]") {
  const fs::path dir = lt::test::scratch_dir("config_aitk");
  write_file(dir / "images" / "a.png", "not really a png");
  write_file(dir / "images" / "a.txt", "a caption");
  lt::test::ScopedEnv env;
  env.set("HF_HUB_CACHE", make_hub_cache(dir / "hub").string());
  const std::vector<std::string> changes = {"datasets.0.folder_path=" + (dir / "images").string(), "device=cpu"};

  std::set<std::string> seen;
  for (const fs::path& file : mirrored_files()) {
    const std::string name = file.filename().string();
    CATCH_INFO(name);
    seen.insert(name);
    JobConfig job;
    CATCH_REQUIRE_NOTHROW(job = load_config(file, changes));
    CATCH_REQUIRE_NOTHROW(validate_paths(job));  // the repo ids resolve in the local cache
    const ProcessConfig& p = the_process(job);
    CATCH_CHECK(p.device == "cpu");

    auto it = expectations().find(name);
    CATCH_REQUIRE(it != expectations().end());  // every mirrored file has its expectations
    const Expect& want = it->second;
    CATCH_CHECK(effective_arch(p.model) == want.arch);
    CATCH_CHECK(p.train.ema_config.use_ema == want.use_ema);
    CATCH_CHECK(p.train.ema_config.ema_decay == Approx(0.99));
    CATCH_CHECK(p.train.unload_text_encoder == want.unload_text_encoder);
    CATCH_CHECK(p.model.assistant_lora_path.has_value() == want.assistant_lora);
    CATCH_CHECK(p.save.save_format == want.save_format);
    CATCH_CHECK_FALSE(p.train.bypass_guidance_embedding);

    const std::vector<std::string>& ignored = job.ignored_keys;
    auto listed = [&](const std::string& k) { return std::count(ignored.begin(), ignored.end(), k) == 1; };
    CATCH_CHECK(listed("meta"));
    if (want.ui) {
      for (const char* k : {"sqlite_db_path", "performance_log_every", "logging.use_ui_logger",
                            "datasets.0.mask_min_value", "train.diff_output_preservation_multiplier",
                            "train.diff_output_preservation_class", "model.compile"})
        CATCH_CHECK(listed(k));
      CATCH_CHECK(ignored_keys_summary(job).find("sqlite_db_path, performance_log_every") != std::string::npos);
      CATCH_CHECK(ignored.back() == "meta");  // file order
      CATCH_CHECK(p.network.conv == 16);      // the UI always writes conv 16 (LoCon on SD UNets)
    }
    for (const auto& k : ignored) CATCH_CHECK(changes_nothing(*find_key(k)));

    // The effective config of each loads back to the same config.
    const std::string once = dump_effective_yaml(job);
    CATCH_CHECK(dump_effective_yaml(parse_config_text(once, "effective.yaml")) == once);
  }
  CATCH_CHECK(seen.size() == expectations().size());
}

CATCH_TEST_CASE("the UI's arch names map to lora-train's families; others are rejected clearly", "[config][aitk]") {
  auto arch_of = [](const std::string& ui) {
    std::string text = kMinimalExtension;
    text.replace(text.find("/models/base.safetensors"), 24, "/models/base.safetensors\n        arch: " + ui);
    return effective_arch(the_process(parse_config_text(text, "arch.yaml")).model);
  };
  CATCH_CHECK(arch_of("sd15") == "sd1");
  CATCH_CHECK(arch_of("sd1") == "sd1");
  CATCH_CHECK(arch_of("sd2") == "sd2");
  CATCH_CHECK(arch_of("sdxl") == "sdxl");
  CATCH_CHECK(arch_of("flux") == "flux");
  CATCH_CHECK(arch_of("flex1") == "flux");
  CATCH_CHECK(arch_of("flux:dev") == "flux");
  CATCH_CHECK(arch_of("'wan21:1b'") == "wan21");
  CATCH_CHECK(arch_of("wan21:14b") == "wan21");
  CATCH_CHECK(arch_of("SDXL") == "sdxl");

  auto error_for = [](const std::string& ui) {
    std::string text = kMinimalExtension;
    text.replace(text.find("/models/base.safetensors"), 24, "/models/base.safetensors\n        arch: " + ui);
    return config_error_of([&] { parse_config_text(text, "arch.yaml"); });
  };
  for (const char* other : {"qwen_image:2512", "flux_kontext", "wan22_14b:t2v", "wan21_i2v:14b480p", "krea2:turbo",
                            "zimage:turbo", "chroma", "flex2", "ltx2.3", "sd3"}) {
    CATCH_INFO(other);
    const std::string msg = error_for(other);
    CATCH_CHECK(msg.find("arch.yaml:12:15: model.arch: '" + std::string(other) +
                         "' is an AI Toolkit model family that lora-train does not support yet (supported: sd1") == 0);
  }
  CATCH_CHECK(error_for("sdxk").find("is not an allowed value (allowed: sd1, sd2, sdxl, flux, wan21; did you mean "
                                     "'sdxl'?)") != std::string::npos);
  // Legacy flags of families lora-train does not know are rejected where they are set.
  std::string text = kMinimalExtension;
  text.replace(text.find("/models/base.safetensors"), 24, "/models/base.safetensors\n        is_v3: true");
  CATCH_CHECK(config_error_of([&] { parse_config_text(text, "flags.yaml"); })
                  .find("flags.yaml:12:16: model.is_v3: 'true' means arch sd3, an AI Toolkit model family") == 0);
}

CATCH_TEST_CASE("values AI Toolkit writes mean what they mean there", "[config][aitk]") {
  CATCH_SECTION("save_format: diffusers is the PEFT/diffusers key layout") {
    std::string text = kMinimalExtension;
    text.replace(text.find("      train:"), 0, "      save: {save_format: diffusers}\n");
    CATCH_CHECK(the_process(parse_config_text(text, "s.yaml")).save.save_format == "peft");
    CATCH_CHECK(the_process(parse_config_text(kMinimalExtension, "s.yaml", {"save.save_format=peft"})).save.save_format == "peft");
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimalExtension, "s.yaml", {"save.save_format=kohya"}); })
                    .find("'kohya' is not an allowed value (allowed: safetensors, peft") != std::string::npos);
  }
  CATCH_SECTION("keys used only by a not-yet feature accept any value while that feature is off") {
    CATCH_CHECK_NOTHROW(parse_config_text(with_train("        diff_output_preservation: false\n"
                                                     "        diff_output_preservation_multiplier: 0.5\n"
                                                     "        diff_output_preservation_class: woman\n"
                                                     "        switch_boundary_every: 10\n"),
                                          "dop.yaml"));
    const std::string msg = config_error_of([] {
      parse_config_text(with_train("        diff_output_preservation: true\n"), "dop.yaml");
    });
    CATCH_CHECK(msg == "dop.yaml:9:35: key 'train.diff_output_preservation' is an AI Toolkit setting that "
                       "lora-train does not support yet; remove it or leave it at false");
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimalExtension, "m.yaml", {"datasets.0.mask_path=/masks"}); })
                    .find("key 'datasets.0.mask_path' is an AI Toolkit setting that lora-train does not support yet") !=
                std::string::npos);
    CATCH_CHECK(the_process(parse_config_text(kMinimalExtension, "m.yaml", {"datasets.0.mask_min_value=0.1"}))
                    .datasets[0]
                    .mask_min_value == Approx(0.1));
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimalExtension, "m.yaml", {"datasets.0.mask_min_value=2"}); })
                    .find("out of range: must be between 0 and 1") != std::string::npos);
  }
  CATCH_SECTION("unload_text_encoder, bypass_guidance_embedding, the EMA keys and assistant adapters") {
    JobConfig job = parse_config_text(with_train("        unload_text_encoder: true\n"
                                                 "        bypass_guidance_embedding: true\n"
                                                 "        ema_config: {use_ema: true, ema_decay: 0.99, use_feedback: "
                                                 "true, param_multiplier: 0.999}\n"),
                                      "t.yaml");
    const TrainConfig& t = the_process(job).train;
    CATCH_CHECK(t.unload_text_encoder);
    CATCH_CHECK(t.bypass_guidance_embedding);
    CATCH_CHECK(t.ema_config.use_ema);
    CATCH_CHECK(t.ema_config.use_feedback);
    CATCH_CHECK(t.ema_config.param_multiplier == Approx(0.999));
    CATCH_CHECK(config_error_of([] {
      parse_config_text(with_train("        unload_text_encoder: true\n        train_text_encoder: true\n"), "t.yaml");
    }) == "t.yaml:9:9: train.unload_text_encoder: cannot unload the text encoders while training them "
          "(train.train_text_encoder is true)");
    CATCH_CHECK(config_error_of([] { parse_config_text(kMinimalExtension, "e.yaml", {"train.ema_config.ema_decay=1.5"}); }) ==
                "--set train.ema_config.ema_decay=1.5: out of range: must be between 0 and 1, got 1.5");
    CATCH_CHECK(
        config_error_of([] { parse_config_text(kMinimalExtension, "a.yaml", {"model.arch=sd15", "model.assistant_lora_path=o/a"}); }) ==
        "--set model.assistant_lora_path=o/a: assistant adapters are for Flux models only (as in AI Toolkit), but "
        "arch is sd1");
    CATCH_CHECK_NOTHROW(parse_config_text(kMinimalExtension, "a.yaml", {"model.arch=flux", "model.assistant_lora_path=o/a"}));
  }
  CATCH_SECTION("UI bookkeeping keys take any value and are listed once, in file order") {
    std::string text = kMinimalExtension;
    text.replace(text.find("      datasets:"), 0,
                 "      sqlite_db_path: {not: [a, path]}\n      performance_log_every: ten\n"
                 "      logging: {use_ui_logger: maybe, log_every: 5}\n");
    text.replace(text.find("meta:\n  name: \"[name]\"\n"), std::string("meta:\n  name: \"[name]\"\n").size(),
                 "meta: just a note\n");
    JobConfig job = parse_config_text(text, "ui.yaml", {"train.xformers=true"});
    CATCH_CHECK(job.ignored_keys == std::vector<std::string>{"sqlite_db_path", "performance_log_every",
                                                             "logging.use_ui_logger", "meta", "train.xformers"});
    CATCH_CHECK(ignored_keys_summary(job) ==
                "accepted for AI Toolkit compatibility, no effect in lora-train (docs/config.md): sqlite_db_path, "
                "performance_log_every, logging.use_ui_logger, meta, train.xformers");
    CATCH_CHECK(the_process(job).logging.log_every == 5);
    std::string no_meta = kMinimalExtension;
    no_meta.resize(no_meta.find("meta:"));
    CATCH_CHECK(ignored_keys_summary(parse_config_text(no_meta, "m.yaml")) == "");
  }
}

CATCH_TEST_CASE("--set replaces the file's value before it is checked", "[config][aitk]") {
  // Values the file gets wrong (or that lora-train does not support) are fixed from the command line.
  const std::string bad = with_train("        diff_output_preservation: true\n        batch_size: lots\n");
  CATCH_CHECK(config_error_of([&] { parse_config_text(bad, "b.yaml"); }).find("b.yaml:9:35: key 'train.diff_output") == 0);
  JobConfig job;
  CATCH_REQUIRE_NOTHROW(job = parse_config_text(bad, "b.yaml",
                                                {"train.diff_output_preservation=false", "train.batch_size=2"}));
  CATCH_CHECK(the_process(job).train.batch_size == 2);
  CATCH_CHECK(job.origins.at("train.batch_size").file == "--set train.batch_size=2");

  // The issue's case: a file's EMA settings replaced (ema_decay out of range in the file).
  const std::string ema = with_train("        ema_config:\n          use_ema: true\n          ema_decay: 7\n");
  CATCH_CHECK(config_error_of([&] { parse_config_text(ema, "e.yaml"); }).find("e.yaml:11:22: train.ema_config.ema_decay") == 0);
  job = parse_config_text(ema, "e.yaml", {"train.ema_config.use_ema=false", "train.ema_config.ema_decay=0.9"});
  CATCH_CHECK_FALSE(the_process(job).train.ema_config.use_ema);
  CATCH_CHECK(the_process(job).train.ema_config.ema_decay == 0.9);

  // An error in the overridden value names the --set, not the file.
  CATCH_CHECK(config_error_of([&] { parse_config_text(bad, "b.yaml", {"train.diff_output_preservation=false",
                                                               "train.batch_size=0"}); }) ==
              "--set train.batch_size=0: out of range: must be between 1 and 1024, got 0");
  CATCH_CHECK(config_error_of([] { parse_config_text(kMinimalExtension, "b.yaml", {"train.diff_output_preservation=true"}); }) ==
              "--set train.diff_output_preservation=true: key 'train.diff_output_preservation' is an AI Toolkit "
              "setting that lora-train does not support yet; remove it or leave it at false");
  // ... also when a rule across keys fails because of it.
  CATCH_CHECK(config_error_of([] {
    parse_config_text(with_train("        unload_text_encoder: true\n"), "u.yaml", {"train.train_text_encoder=true"});
  }) == "u.yaml:9:9: train.unload_text_encoder: cannot unload the text encoders while training them "
        "(train.train_text_encoder is true)");
  CATCH_CHECK(config_error_of([] { parse_config_text(kMinimalExtension, "u.yaml", {"train.unload_text_encoder=true",
                                                                  "train.train_text_encoder=true"}); })
                  .find("--set train.unload_text_encoder=true: cannot unload") == 0);
  // Other mistakes in the file are still reported: an override replaces one key only.
  CATCH_CHECK(config_error_of([&] { parse_config_text(bad, "b.yaml", {"train.batch_size=2"}); })
                  .find("b.yaml:9:35: key 'train.diff_output_preservation'") == 0);
  CATCH_CHECK(config_error_of([] { parse_config_text(kMinimalExtension, "b.yaml", {"train.batch_size"}); }) ==
              "--set train.batch_size: expected KEY=VALUE, e.g. --set train.batch_size=2");
}

CATCH_TEST_CASE("docs/config.md lists the ignored and the not-yet AI Toolkit keys", "[config][aitk][docs]") {
  const std::string doc = render_config_reference();
  const size_t ignored = doc.find("## AI Toolkit keys that change nothing here");
  const size_t not_yet = doc.find("## AI Toolkit keys not supported yet");
  CATCH_REQUIRE(ignored != std::string::npos);
  CATCH_REQUIRE(not_yet != std::string::npos);
  for (const auto& k : all_keys()) {
    CATCH_INFO(k.path);
    if (changes_nothing(k)) CATCH_CHECK(doc.find("- `" + k.path + "`", ignored) < not_yet);
    if (k.support == Support::kNotYet) CATCH_CHECK(doc.find("`" + k.path + "`", not_yet) != std::string::npos);
  }
  CATCH_CHECK(find_key("sqlite_db_path")->support == Support::kIgnored);
  CATCH_CHECK(find_key("logging.use_ui_logger")->support == Support::kIgnored);
  CATCH_CHECK(find_key("meta")->support == Support::kIgnored);
  CATCH_CHECK(find_key("train.diff_output_preservation")->support == Support::kNotYet);
  CATCH_CHECK(find_key("train.ema_config.use_ema")->support == Support::kSupported);
}
