// The levers that cost nothing in results: lora-train's memory.attention_chunk / memory.vae_tiling
// (src/memory/ladder.cpp puts them first) and the other trainers' memory-efficient attention and VAE
// tiling switches. Recommended first where the trainer has them and the log shows them off; never
// again when the log or the config shows them on (they are listed as tried, with the guard's price).
#include <catch2/catch.hpp>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/report.h"
#include "diagnose/oom_message.h"
#include "test_paths.h"

using namespace lt::diagnose;

using lt::test::kOom;

namespace {

bool has_fix(const Diagnosis& d, const std::string& id) {
  return std::any_of(d.fixes.begin(), d.fixes.end(), [&](const Fix& f) { return f.id == id; });
}

const TriedLever* tried(const Diagnosis& d, const std::string& id) {
  for (const TriedLever& t : d.tried)
    if (t.id == id) return &t;
  return nullptr;
}

bool has_note(const Diagnosis& d, const std::string& start) {
  return std::any_of(d.notes.begin(), d.notes.end(), [&](const std::string& n) { return n.rfind(start, 0) == 0; });
}

// lora-train's own lines (src/train/trainer.cpp run(), src/memory/guard.cpp).
const char* kLoraTrainStart =
    "I 10:15:01 lora-train 0.1.0 (LibTorch 2.5.1): run runs/sdxl_lora in /work\n"
    "I 10:15:09 training 1000 steps from step 1; memory settings: checkpointing off, batch 2 x accumulation 1, "
    "buckets [512,768,1024], samples 1024x1024/20 steps\n"
    "step 2/1000 | loss 0.1311 | lr 1.0e-04 | 2.2 s/it | mem 21.9/23.4 GiB\n";

// sd-scripts as the kohya_ss GUI launches it: every argument on the command line.
std::string kohya_command(const std::string& script, const std::string& extra) {
  return "accelerate launch --num_cpu_threads_per_process=2 \"./sd-scripts/" + script +
         "\" --pretrained_model_name_or_path=\"/models/v1-5-pruned-emaonly.safetensors\" "
         "--train_data_dir=\"/data/img\" --resolution=\"768,768\" --output_dir=\"/data/out\" "
         "--network_module=networks.lora --network_dim=32 --train_batch_size=\"2\" --max_train_steps=\"1600\" "
         "--mixed_precision=\"fp16\" --optimizer_type=\"AdamW8bit\" --gradient_checkpointing" +
         extra + "\n";
}

const char* kKohyaSteps = "steps:   0%|          | 2/1600 [00:05<1:10:00,  2.50s/it, avr_loss=0.1]\n";

}  // namespace

CATCH_TEST_CASE("lora-train: chunked attention the guard already set is not recommended again",
                "[diagnose][levers]") {
  const std::string log = std::string(kLoraTrainStart) +
                          "W 10:15:20 oom-guard: OOM in phase train_step(step 3, bucket 1024x1024, batch 2) \xe2\x80\x94 "
                          "early_steps; action: memory.attention_chunk: 0 -> 1024 (attention 1024 query rows at a time; "
                          "same results)\n"
                          "W 10:15:22 oom-guard: OOM in phase train_step(step 3, bucket 1024x1024, batch 2) \xe2\x80\x94 "
                          "early_steps; action: train.gradient_checkpointing: false -> true\n"
                          "E 10:15:25 oom-guard: OOM in phase train_step(step 3, bucket 1024x1024, batch 2) \xe2\x80\x94 "
                          "early_steps; action: give up: 2 OOM recoveries in this run (guard max_attempts); settings: "
                          "checkpointing on, batch 2 x accumulation 1, buckets [512,768,1024], samples 1024x1024/20 "
                          "steps, attention in chunks of 1024\n";
  Diagnosis d = diagnose_text(log);
  CATCH_CHECK(d.trainer == Trainer::kLoraTrain);
  CATCH_CHECK(d.phase == Phase::kEarlySteps);
  CATCH_CHECK(d.settings.attention_chunk == 1024);
  CATCH_CHECK_FALSE(has_fix(d, "memory_efficient_attention"));
  CATCH_REQUIRE_FALSE(d.fixes.empty());
  CATCH_CHECK(d.fixes[0].id == "batch_size_1");  // checkpointing is on too: the ladder continues
  const TriedLever* t = tried(d, "memory_efficient_attention");
  CATCH_REQUIRE(t != nullptr);
  CATCH_CHECK(t->setting == "memory.attention_chunk: 1024");
  CATCH_CHECK(has_note(d, "Already tried: memory.attention_chunk: 1024"));
  const auto j = to_json(d, "x.log");
  CATCH_CHECK(j["settings"]["attention_chunk"] == 1024);
  CATCH_CHECK(j["tried"][0]["id"] == "memory_efficient_attention");
}

CATCH_TEST_CASE("lora-train: attention in chunks is the first change when the run had it off", "[diagnose][levers]") {
  // The guard disabled: the start line shows the settings, then a plain OOM.
  Diagnosis d = diagnose_text(std::string(kLoraTrainStart) + "E 10:15:20 " + kOom);
  CATCH_CHECK(d.trainer == Trainer::kLoraTrain);
  CATCH_CHECK(d.settings.attention_chunk == 0);
  CATCH_CHECK(d.settings.gradient_checkpointing == false);
  CATCH_REQUIRE(d.fixes.size() >= 2);
  CATCH_CHECK(d.fixes[0].id == "memory_efficient_attention");
  CATCH_CHECK(d.fixes[0].setting == "memory.attention_chunk: 1024");
  CATCH_CHECK(d.fixes[0].config_key == "memory.attention_chunk");
  CATCH_CHECK(d.fixes[1].id == "gradient_checkpointing");
  CATCH_CHECK(d.tried.empty());

  // A chunk coarser than the guard's (4096) still leaves the guard's chunk to try.
  std::string coarse = kLoraTrainStart;
  coarse.replace(coarse.find("samples 1024x1024/20 steps"), 26, "samples 1024x1024/20 steps, attention in chunks of 4096");
  Diagnosis c = diagnose_text(coarse + kOom);
  CATCH_CHECK(c.settings.attention_chunk == 4096);
  CATCH_REQUIRE_FALSE(c.fixes.empty());
  CATCH_CHECK(c.fixes[0].id == "memory_efficient_attention");
}

CATCH_TEST_CASE("lora-train: a caching OOM after every free lever lists them as tried, with their price",
                "[diagnose][levers]") {
  const std::string log =
      "I 09:00:01 lora-train 0.1.0 (LibTorch 2.5.1): run runs/flux in /work\n"
      "W 09:00:40 oom-guard: OOM in phase cache(step 0, bucket 1536x1536, batch 1) \xe2\x80\x94 load; action: "
      "memory.attention_chunk: 0 -> 1024 (attention 1024 query rows at a time; same results)\n"
      "W 09:00:41 oom-guard: OOM in phase cache(step 0, bucket 1536x1536, batch 1) \xe2\x80\x94 load; action: "
      "model.low_vram: false -> true (text encoder and VAE on the CPU except while used)\n"
      "W 09:00:43 oom-guard: OOM in phase cache(step 0, bucket 1536x1536, batch 1) \xe2\x80\x94 load; action: "
      "memory.vae_tiling: false -> true (VAE encode/decode in blended tiles; images at their size)\n"
      "I 09:00:43 oom-guard: OOM handled, summary so far:\n"
      "I 09:00:43 oom-guard:      price of #1-#3 (chunk_attention, enable_low_vram, tile_vae): 0.950 s/step, peak "
      "21.40 GiB in the 5 steps after (none before it)\n"
      "E 09:00:50 oom-guard: OOM in phase cache(step 0, bucket 1536x1536, batch 1) \xe2\x80\x94 load; action: give up: "
      "every memory lever is used (checkpointing on, batch 1 x accumulation 4, buckets [1536], samples 1024x1024/20 "
      "steps, attention in chunks of 1024, VAE tiled, low_vram, base int8); this step needs at least 25.10 GiB "
      "(23.00 GiB allocated + 2.10 GiB requested) but the device offers 23.65 GiB\n";
  Diagnosis d = diagnose_text(log);
  CATCH_CHECK(d.oom);
  CATCH_CHECK(d.stage == Stage::kCaching);
  CATCH_CHECK(d.phase == Phase::kLoad);
  CATCH_CHECK(d.settings.vae_tiling == true);
  CATCH_CHECK_FALSE(has_fix(d, "memory_efficient_attention"));
  CATCH_CHECK_FALSE(has_fix(d, "vae_tiling"));
  CATCH_CHECK_FALSE(has_fix(d, "low_vram"));
  const TriedLever* vae = tried(d, "vae_tiling");
  CATCH_REQUIRE(vae != nullptr);
  CATCH_CHECK(vae->setting == "memory.vae_tiling: true");
  CATCH_CHECK(vae->price.find("tile_vae") != std::string::npos);
  CATCH_REQUIRE(tried(d, "memory_efficient_attention") != nullptr);
  CATCH_CHECK(tried(d, "memory_efficient_attention")->price.find("chunk_attention") != std::string::npos);
  CATCH_CHECK(has_note(d, "Already tried: memory.vae_tiling: true"));
}

CATCH_TEST_CASE("lora-train: a caching OOM without the free levers starts with them, in the guard's order",
                "[diagnose][levers]") {
  Diagnosis d = diagnose_text(
      "I 09:00:01 lora-train 0.1.0 (LibTorch 2.5.1): run runs/sdxl in /work\n"
      // oom_guard.max_attempts: 0 (the guard only reports).
      "E 09:00:40 oom-guard: OOM in phase cache(step 0, bucket 1024x1024, batch 1) \xe2\x80\x94 load; action: give up: "
      "0 OOM recoveries in this run (guard max_attempts); settings: checkpointing on, batch 1 x accumulation 4, "
      "buckets [1024], samples 1024x1024/20 steps\n");
  CATCH_CHECK(d.stage == Stage::kCaching);
  CATCH_REQUIRE(d.fixes.size() >= 3);
  CATCH_CHECK(d.fixes[0].id == "memory_efficient_attention");
  CATCH_CHECK(d.fixes[1].id == "low_vram");
  CATCH_CHECK(d.fixes[2].id == "vae_tiling");
  CATCH_CHECK(d.fixes[2].setting == "memory.vae_tiling: true");
}

CATCH_TEST_CASE("lora-train: a finished run reports each change's price", "[diagnose][levers]") {
  Diagnosis d = diagnose_text(
      std::string(kLoraTrainStart) +
      "W 10:15:20 oom-guard: OOM in phase train_step(step 3, bucket 1024x1024, batch 2) \xe2\x80\x94 early_steps; "
      "action: memory.attention_chunk: 0 -> 1024 (attention 1024 query rows at a time; same results)\n"
      "step 1000/1000 | loss 0.0712 | lr 1.0e-04 | 2.3 s/it | mem 19.1/21.8 GiB\n"
      "I 10:54:02 the settings that worked: runs/sdxl_lora/effective.yaml\n"
      "I 10:54:02 oom-guard: 1 OOM handled, 1 configuration change\n"
      "I 10:54:02 oom-guard:   #1 train_step(step 3, bucket 1024x1024, batch 2) early_steps -> memory.attention_chunk: "
      "0 -> 1024 (attention 1024 query rows at a time; same results)\n"
      "I 10:54:02 oom-guard:      price of #1 (chunk_attention): +5% s/step (2.200 -> 2.310 s), -7% peak (23.40 GiB -> "
      "21.80 GiB)\n"
      "I 10:54:02 oom-guard: settings now: checkpointing off, batch 2 x accumulation 1, buckets [512,768,1024], "
      "samples 1024x1024/20 steps, attention in chunks of 1024\n"
      "I 10:54:03 done: runs/sdxl_lora/sdxl_lora.safetensors (1000 steps)\n");
  CATCH_CHECK(d.recovered);
  CATCH_CHECK(d.fixes.empty());
  CATCH_REQUIRE(d.guard_prices.size() == 1);
  CATCH_CHECK(d.guard_prices[0].rfind("price of #1 (chunk_attention): +5% s/step", 0) == 0);
  const auto j = to_json(d, "x.log");
  CATCH_CHECK(j["recovery"]["prices"][0] == d.guard_prices[0]);
  CATCH_CHECK(format_report(d, "x.log").find("price of #1 (chunk_attention)") != std::string::npos);
}

CATCH_TEST_CASE("kohya: a U-Net run without xformers/SDPA gets memory-efficient attention first", "[diagnose][levers]") {
  Diagnosis d = diagnose_text(kohya_command("train_network.py", "") + kKohyaSteps + kOom);
  CATCH_CHECK(d.trainer == Trainer::kKohya);
  CATCH_CHECK(d.settings.memory_efficient_attention == false);
  CATCH_REQUIRE_FALSE(d.fixes.empty());
  CATCH_CHECK(d.fixes[0].id == "memory_efficient_attention");
  CATCH_CHECK(d.fixes[0].setting.find("--sdpa") != std::string::npos);
  CATCH_CHECK(d.fixes[0].setting.find("--xformers") != std::string::npos);

  // With --xformers it is on: the playbook ladder (batch 1, checkpointing being on already).
  Diagnosis x = diagnose_text(kohya_command("train_network.py", " --xformers") + kKohyaSteps + kOom);
  CATCH_CHECK(x.settings.memory_efficient_attention == true);
  CATCH_CHECK_FALSE(has_fix(x, "memory_efficient_attention"));
  CATCH_REQUIRE(tried(x, "memory_efficient_attention") != nullptr);
  CATCH_CHECK(x.fixes[0].id == "batch_size_1");

  // sd-scripts says so itself (library/train_util.py replace_unet_modules).
  Diagnosis s = diagnose_text(kohya_command("train_network.py", "") +
                              "2025-01-10 10:00:00 INFO     Enable SDPA for U-Net                  train_util.py:3012\n" +
                              kKohyaSteps + kOom);
  CATCH_CHECK_FALSE(has_fix(s, "memory_efficient_attention"));

  // Arguments in a TOML file: the command line does not tell, nothing is assumed.
  Diagnosis toml = diagnose_text(
      "accelerate launch \"./sd-scripts/sdxl_train_network.py\" --pretrained_model_name_or_path=/m/sdxl.safetensors "
      "--config_file=/data/config_lora.toml\n" + std::string(kKohyaSteps) + kOom);
  CATCH_CHECK_FALSE(toml.settings.memory_efficient_attention.has_value());
  CATCH_CHECK_FALSE(has_fix(toml, "memory_efficient_attention"));

  // The DiT scripts always call SDPA: not a lever there.
  Diagnosis flux = diagnose_text(kohya_command("flux_train_network.py", "") + kKohyaSteps + kOom);
  CATCH_CHECK(flux.family == ModelFamily::kFlux);
  CATCH_CHECK_FALSE(has_fix(flux, "memory_efficient_attention"));
}

CATCH_TEST_CASE("caching and preview OOMs in the VAE get the trainer's VAE tiling first", "[diagnose][levers]") {
  // musubi-tuner cache_latents.py (HunyuanVideo) encoding a clip.
  const std::string cache_tb =
      "INFO:musubi_tuner.hunyuan_model.vae:Loading 3D VAE model (884-16c-hy) from: /models/hunyuan/vae/pytorch_model.pt\n"
      "INFO:__main__:Encoding dataset [0]\n"
      "Traceback (most recent call last):\n"
      "  File \"/mt/src/musubi_tuner/cache_latents.py\", line 177, in encode_datasets\n"
      "    encode(batch[i : i + bs])\n"
      "  File \"/mt/src/musubi_tuner/cache_latents.py\", line 67, in encode_and_save_batch\n"
      "    latent = vae.encode(contents).latent_dist.sample()\n";
  Diagnosis c = diagnose_text("python src/musubi_tuner/cache_latents.py --dataset_config /data/video.toml --vae "
                              "/models/hunyuan/vae/pytorch_model.pt --vae_chunk_size 32\n" + cache_tb + kOom);
  CATCH_CHECK(c.trainer == Trainer::kMusubi);
  CATCH_CHECK(c.stage == Stage::kCaching);
  CATCH_CHECK(c.in_vae == true);
  CATCH_REQUIRE_FALSE(c.fixes.empty());
  CATCH_CHECK(c.fixes[0].id == "vae_tiling");
  CATCH_CHECK(c.fixes[0].setting == "cache_latents.py --vae_tiling --vae_chunk_size 32");

  // Already tiling: not again, and said so.
  Diagnosis t = diagnose_text("python src/musubi_tuner/cache_latents.py --dataset_config /data/video.toml --vae "
                              "/models/hunyuan/vae/pytorch_model.pt --vae_chunk_size 32 --vae_tiling\n" + cache_tb + kOom);
  CATCH_CHECK(t.settings.vae_tiling == true);
  CATCH_CHECK_FALSE(has_fix(t, "vae_tiling"));
  CATCH_CHECK(tried(t, "vae_tiling") != nullptr);

  // A preview that dies in the VAE decode (sd-scripts has no tiling switch; musubi's HunyuanVideo does).
  Diagnosis p = diagnose_text(
      "  total optimization steps / 学習ステップ数: 2000\n"
      "steps:  13%|█▎        | 250/2000 [37:30<4:22:30,  9.00s/it, avr_loss=0.07]\n"
      "INFO:musubi_tuner.hv_train_network:generating sample images at step: 250\n"
      "Traceback (most recent call last):\n"
      "  File \"/mt/src/musubi_tuner/hv_train_network.py\", line 1230, in sample_images\n"
      "    self.sample_image_inference(accelerator, args, transformer, dit_dtype, vae, save_dir, prompt_dict, epoch, steps)\n"
      "  File \"/mt/src/musubi_tuner/hv_train_network.py\", line 1342, in sample_image_inference\n"
      "    video = decode_latents(latents, vae)\n"
      "  File \"/mt/src/musubi_tuner/hunyuan_model/vae.py\", line 410, in decode\n"
      "    dec = self.decoder(z)\n" + std::string(kOom));
  CATCH_CHECK(p.phase == Phase::kSampling);
  CATCH_CHECK(p.family == ModelFamily::kHunyuan);
  CATCH_REQUIRE_FALSE(p.fixes.empty());
  CATCH_CHECK(p.fixes[0].id == "vae_tiling");
  CATCH_CHECK(p.fixes[0].setting == "hv_train_network.py --vae_tiling --vae_chunk_size 32");

  // The same preview dying in the denoiser: tiling the VAE would not help, the previews shrink.
  Diagnosis n = diagnose_text(
      "steps:  13%|█▎        | 250/2000 [37:30<4:22:30,  9.00s/it, avr_loss=0.07]\n"
      "INFO:musubi_tuner.hv_train_network:generating sample images at step: 250\n"
      "Traceback (most recent call last):\n"
      "  File \"/mt/src/musubi_tuner/hv_train_network.py\", line 1230, in sample_images\n"
      "    self.sample_image_inference(accelerator, args, transformer, dit_dtype, vae, save_dir, prompt_dict, epoch, steps)\n"
      "  File \"/mt/src/musubi_tuner/hunyuan_model/models.py\", line 1020, in forward\n"
      "    img, txt = block(*double_block_args)\n" + std::string(kOom));
  CATCH_CHECK(n.in_vae == false);
  CATCH_CHECK_FALSE(has_fix(n, "vae_tiling"));
  CATCH_CHECK(n.fixes[0].id == "shrink_sampling");
}

CATCH_TEST_CASE("--config: the free levers a lora-train config has on are tried, the others written", "[diagnose][levers]") {
  auto dir = lt::test::scratch_dir("diagnose_free_levers");
  const std::string base = R"(job: extension
config:
  name: my_lora
  process:
    - type: sd_trainer
      train:
        batch_size: 1
        gradient_checkpointing: true
      datasets:
        - folder_path: /data/images
          resolution: [512, 768]
)";
  std::ofstream(dir / "on.yaml") << base << "      memory:\n        attention_chunk: 512\n        vae_tiling: true\n";
  std::ofstream(dir / "off.yaml") << base;
  const std::string log = std::string(kLoraTrainStart) + kOom;

  Diagnosis on = diagnose_text(log);
  CATCH_REQUIRE_FALSE(on.fixes.empty());
  CATCH_CHECK(on.fixes[0].id == "memory_efficient_attention");  // the log's start line: chunk off
  merge_config_settings(on, dir / "on.yaml");
  CATCH_CHECK_FALSE(has_fix(on, "memory_efficient_attention"));
  CATCH_REQUIRE(tried(on, "memory_efficient_attention") != nullptr);
  CATCH_CHECK(tried(on, "memory_efficient_attention")->setting == "memory.attention_chunk: 512");
  CATCH_CHECK(has_note(on, "Already tried: memory.attention_chunk: 512"));
  CATCH_CHECK(std::count_if(on.notes.begin(), on.notes.end(),
                            [](const std::string& n) { return n.rfind("Already tried", 0) == 0; }) == 2);

  Diagnosis off = diagnose_text(log);
  merge_config_settings(off, dir / "off.yaml");
  CATCH_REQUIRE_FALSE(off.fixes.empty());
  CATCH_CHECK(off.fixes[0].id == "memory_efficient_attention");
  std::string what;
  CATCH_CHECK(write_fixed_config(off, dir / "off.yaml", dir / "fixed.yaml", &what) == "memory_efficient_attention");
  CATCH_CHECK(what == "memory.attention_chunk: 1024");
  YAML::Node f = YAML::LoadFile((dir / "fixed.yaml").string());
  CATCH_CHECK(f["config"]["process"][0]["memory"]["attention_chunk"].as<int>() == 1024);
}

CATCH_TEST_CASE("lora-train: the family comes from the trainer's own load line", "[diagnose][identify]") {
  const std::string tail = "W 10:15:20 oom-guard: OOM in phase train_step(step 1, bucket 512x512, batch 4) \xe2\x80\x94 "
                           "early_steps; action: memory.attention_chunk: 0 -> 1024 (attention 1024 query rows at a time; "
                           "same results)\n";
  const std::pair<const char*, ModelFamily> cases[] = {{"sd1", ModelFamily::kSd15}, {"sd2", ModelFamily::kSd15},
                                                       {"sdxl", ModelFamily::kSdxl}, {"flux", ModelFamily::kFlux},
                                                       {"wan", ModelFamily::kWan}};
  const std::string start = "I 10:15:01 lora-train 0.1.0 (LibTorch 2.11.0): run runs/my_lora in /work\n";
  for (const auto& [name, family] : cases) {
    const std::string log = start + "I 10:15:05 loaded " + name +
                            " base from output/base/model.safetensors\n" + tail;
    Diagnosis d = diagnose_text(log);
    CATCH_INFO(name);
    CATCH_CHECK(d.trainer == Trainer::kLoraTrain);
    CATCH_CHECK(d.family == family);
  }
  // Without the load line nothing names a family.
  CATCH_CHECK(diagnose_text(start + tail).family == ModelFamily::kUnknown);
}
