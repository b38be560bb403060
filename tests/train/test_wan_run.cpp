// `lora-train run` on Wan 2.1 text-to-video, end to end on the tiny ComfyUI-layout base (transformer in
// native names, umT5 with its embedded tokenizer, the causal video VAE): a LoRA trains, saves in the
// musubi/ComfyUI layout and in diffusers/PEFT names whose keys name real modules under each loader's
// rules, and previews decode a clip; the family's video path (5-D pixels and latents) directly.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/fixes.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/io/video.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/memory/budget_allocator.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/registry.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/models/wan/checkpoint.h"
#include "loratrain/plan/plan.h"
#include "loratrain/train/demo_base.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/objective.h"
#include "loratrain/train/preview.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "train_fixture.h"

namespace fs = std::filesystem;

namespace {

const fs::path& tiny_wan() {
  static const fs::path dir = [] {
    auto d = lt::test::scratch_dir(lt::test::per_program("train_wan"));
    lt::train::DemoBaseOptions options;
    options.arch = lt::train::DemoArch::kWan21;
    lt::train::write_demo_base(d / "wan", options);
    return d / "wan";
  }();
  return dir;
}

fs::path transformer_file() { return tiny_wan() / "wan2.1_t2v_tiny.safetensors"; }

const std::string kSample =
    "      sample:\n        sample_every: 2\n        width: 64\n        height: 64\n        num_frames: 5\n"
    "        sample_steps: 2\n        sampler: flowmatch\n        guidance_scale: 5\n        prompts: [\"a red circle\"]\n";

lt::train::RunRequest wan_run(const fs::path& root, const std::string& name, int steps, std::vector<std::string> extra = {}) {
  lt::train::RunRequest request;
  request.config_path = lt::test::write_tiny_config(root, name, steps, "", "", kSample);
  request.overrides = {"model.name_or_path=" + transformer_file().string(), "model.arch=wan21",
                       "train.disable_sampling=false", "train.timestep_type=sigmoid"};
  request.overrides.insert(request.overrides.end(), extra.begin(), extra.end());
  return request;
}

// The stems of a LoRA file's modules (the key before .lora_down.weight / .lora_A.weight).
std::set<std::string> stems(const fs::path& path) {
  std::set<std::string> out;
  auto file = lt::io::SafetensorsFile::open(path);
  for (const auto& m : lt::lora::read_lora_modules(*file)) out.insert(m.stem);
  return out;
}

}  // namespace

CATCH_TEST_CASE("Wan 2.1: the ComfyUI files train a LoRA with previews; musubi/ComfyUI names map to the native weights",
                "[train][e2e][wan]") {
  auto root = lt::test::scratch_dir(lt::test::per_program("wan_run"));
  // Previews with WanPipeline's own UniPC; 6 frames are not 4k+1: rounded to 5 as diffusers does.
  auto result = lt::train::run_training(wan_run(root, "wn", 4, {"sample.sampler=unipc", "sample.num_frames=6"}));
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_REQUIRE(result.losses.size() == 4);
  for (double loss : result.losses) CATCH_CHECK(std::isfinite(loss));
  const auto run = root / "wn";
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000000.png"));
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000002.png"));
  // Each preview is also an animated WebP of its 5 frames.
  size_t webp = 0;
  for (const auto& e : fs::directory_iterator(run / "samples")) {
    if (e.path().extension() != ".webp") continue;
    ++webp;
    CATCH_CHECK(lt::io::probe_video(e.path()).frame_count == 5);
  }
  CATCH_CHECK(webp == 3);
  std::ifstream log_file(run / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), std::istreambuf_iterator<char>());
  CATCH_CHECK_THAT(log, Catch::Contains("sample.num_frames: 6 is not of the form 4k+1"));
  CATCH_CHECK_THAT(log, Catch::Contains("using 5, as diffusers' WanPipeline rounds it"));

  auto file = lt::io::SafetensorsFile::open(run / "wn.safetensors");
  CATCH_CHECK(file->metadata().at("ss_base_model_version") == "wan21");
  CATCH_CHECK(file->metadata().at("modelspec.architecture") == "wan2.1-t2v-1.3b/lora");
  // musubi's and ComfyUI's Wan names: diffusion_model.<native module>.lora_down/up.weight + .alpha.
  CATCH_CHECK(file->contains("diffusion_model.blocks.0.self_attn.q.lora_down.weight"));
  CATCH_CHECK(file->contains("diffusion_model.blocks.0.self_attn.q.alpha"));
  CATCH_CHECK(file->contains("diffusion_model.blocks.1.cross_attn.o.lora_up.weight"));
  CATCH_CHECK(file->contains("diffusion_model.blocks.1.ffn.2.lora_down.weight"));
  size_t moved = 0;
  for (const auto& t : file->tensors()) {
    if (t.name.find("lora_up") != std::string::npos && file->load(t.name).abs().max().item<double>() > 0) ++moved;
  }
  CATCH_CHECK(moved > 0);
  // ComfyUI's Wan LoRA rule: "diffusion_model." + a model weight's key without ".weight". Every
  // stem names a Linear of the native file; 10 per block (q, k, v, o twice, ffn.0, ffn.2).
  auto base = lt::io::SafetensorsFile::open(transformer_file());
  const auto names = stems(run / "wn.safetensors");
  CATCH_CHECK(names.size() == 20);
  for (const auto& stem : names) {
    CATCH_REQUIRE(stem.rfind("diffusion_model.", 0) == 0);
    CATCH_CHECK(base->contains(stem.substr(std::string("diffusion_model.").size()) + ".weight"));
  }
  // And it reads back into the same modules (lora-train sample, resuming from a LoRA).
  CATCH_CHECK(lt::lora::module_dims_from_file(*file, {lt::lora::ComponentSpec::wan_transformer()}).size() == 20);
  // `lora-train inspect` calls the diffusion_model. modules the transformer, as for the PEFT names.
  CATCH_CHECK(lt::lora::inspect_lora(*file).modules_by_component == std::map<std::string, size_t>{{"transformer", 20}});
  CATCH_CHECK_THAT(lt::lora::describe(lt::lora::inspect_lora(*file)), Catch::Contains("20 modules [transformer (20)]"));
  const auto detected = lt::models::detect_checkpoint(*file);
  CATCH_REQUIRE(detected.components.size() == 1);
  CATCH_CHECK(detected.components[0].name == "transformer");
  CATCH_CHECK(detected.components[0].tensors == static_cast<int64_t>(file->tensors().size()));
}

CATCH_TEST_CASE("Wan 2.1: save_format diffusers writes AI Toolkit's PEFT names, which name the diffusers modules",
                "[train][e2e][wan]") {
  auto root = lt::test::scratch_dir(lt::test::per_program("wan_peft"));
  auto result = lt::train::run_training(wan_run(root, "wp", 2, {"save.save_format=diffusers", "train.disable_sampling=true"}));
  CATCH_REQUIRE(result.exit_code == 0);
  const auto path = root / "wp" / "wp.safetensors";
  auto file = lt::io::SafetensorsFile::open(path);
  CATCH_CHECK(file->contains("transformer.blocks.0.attn1.to_q.lora_A.weight"));
  CATCH_CHECK(file->contains("transformer.blocks.1.attn2.to_out.0.lora_B.weight"));
  CATCH_CHECK(file->contains("transformer.blocks.0.ffn.net.0.proj.lora_A.weight"));
  // diffusers' WanPipeline.load_lora_weights: "transformer." + a WanTransformer3DModel module path.
  auto model = lt::models::wan::load_transformer_file(transformer_file());
  const auto keys = lt::models::module_tensors(*model);
  const auto names = stems(path);
  CATCH_CHECK(names.size() == 20);
  for (const auto& stem : names) {
    CATCH_REQUIRE(stem.rfind("transformer.", 0) == 0);
    CATCH_CHECK(keys.count(stem.substr(std::string("transformer.").size()) + ".weight") == 1);
  }
  // Both layouts read back into the same modules.
  const auto spec = lt::lora::ComponentSpec::wan_transformer();
  CATCH_CHECK(lt::lora::module_dims_from_file(*file, {spec}).size() == 20);
  CATCH_CHECK(lt::lora::inspect_lora(*file).modules_by_component == std::map<std::string, size_t>{{"transformer", 20}});
}

CATCH_TEST_CASE("Wan 2.1: clips [B, 3, F, H, W] encode to 5-D latents, predict and train; images are 1-frame clips",
                "[train][wan]") {
  lt::train::ModelLoadOptions options;
  options.name_or_path = transformer_file();
  auto model = lt::train::load_diffusion_model(options);
  const auto& traits = model->traits();
  CATCH_CHECK(traits.is_video);
  CATCH_CHECK(traits.family == lt::playbook::ModelFamily::kWan);
  CATCH_CHECK(traits.latent_channels == 16);
  CATCH_CHECK(traits.bucket_divisibility == 16);

  torch::manual_seed(3);
  const at::Tensor clip = torch::rand({1, 3, 9, 32, 48}) * 2 - 1;
  const at::Tensor z = model->encode_pixels(clip, std::nullopt);
  CATCH_CHECK(z.sizes().vec() == std::vector<int64_t>{1, 16, 3, 4, 6});  // 1 + (9 - 1) / 4 latent frames
  const at::Tensor image_z = model->encode_pixels(clip.select(2, 0), std::nullopt);
  CATCH_CHECK(image_z.sizes().vec() == std::vector<int64_t>{1, 16, 1, 4, 6});
  // Causal: the first frame alone encodes as the clip's first latent frame.
  CATCH_CHECK(torch::allclose(image_z, z.narrow(2, 0, 1), 1e-4, 1e-5));
  CATCH_CHECK(model->decode_latents(z).sizes().vec() == std::vector<int64_t>{1, 3, 9, 32, 48});

  lt::train::Conditioning c;
  c.text = model->encode_text({"a red circle"});
  const at::Tensor& text = c.text.front().second;
  CATCH_CHECK(text.sizes().vec() == std::vector<int64_t>{1, 512, 64});
  // The rows past the prompt are zero (Wan's pipeline trims and zero-pads to 512).
  CATCH_CHECK(text.narrow(1, 100, 412).abs().max().item<double>() == 0.0);
  CATCH_CHECK(text.narrow(1, 0, 1).abs().max().item<double>() > 0.0);

  lt::train::ObjectiveOptions objective_options;
  objective_options.timestep_type = "sigmoid";
  lt::train::TrainingObjective objective(traits, objective_options);
  auto rng = lt::sample::make_generator(5);
  const at::Tensor loss = lt::train::training_loss(*model, objective, z, c, rng);
  CATCH_CHECK(std::isfinite(loss.item<double>()));
}

CATCH_TEST_CASE("preview samplers: unipc samples Wan; a family whose scheduler config has no flow sigmas refuses it",
                "[train][wan]") {
  lt::train::ModelTraits traits;
  traits.objective = lt::train::Objective::flow_matching;
  traits.family = lt::playbook::ModelFamily::kWan;
  traits.scheduler_config = "wan";
  CATCH_CHECK(lt::train::sampler_for_model(traits, "unipc") == "unipc");
  CATCH_CHECK(lt::train::sampler_for_model(traits, "flowmatch") == "flowmatch");
  traits.family = lt::playbook::ModelFamily::kFlux;
  traits.scheduler_config = "flux";
  CATCH_CHECK_THROWS_WITH(lt::train::sampler_for_model(traits, "unipc"),
                          Catch::Contains("sample.sampler: unipc cannot sample flux") &&
                              Catch::Contains("use_flow_sigmas: true"));
  traits.objective = lt::train::Objective::ddpm;
  traits.family = lt::playbook::ModelFamily::kSD1;
  traits.scheduler_config = "sd15";
  CATCH_CHECK_THROWS_WITH(lt::train::sampler_for_model(traits, "unipc"),
                          Catch::Contains("unipc samples flow-matching models"));
}

namespace {

// The tiny Wan with every denoiser call's timestep recorded: the schedule a preview really runs.
class RecordingModel final : public lt::train::DiffusionModel {
 public:
  explicit RecordingModel(std::unique_ptr<lt::train::DiffusionModel> model) : model_(std::move(model)) {}
  std::vector<double> timesteps;

  const lt::train::ModelTraits& traits() const override { return model_->traits(); }
  const std::string& model_id() const override { return model_->model_id(); }
  lt::train::TextEmbedding encode_text(const std::vector<std::string>& captions) override { return model_->encode_text(captions); }
  at::Tensor encode_pixels(const at::Tensor& pixels, std::optional<at::Generator> g) override { return model_->encode_pixels(pixels, g); }
  at::Tensor decode_latents(const at::Tensor& latents) override { return model_->decode_latents(latents); }
  at::Tensor predict(const at::Tensor& noisy, const at::Tensor& t, const lt::train::Conditioning& c) override {
    timesteps.push_back(t.reshape({-1})[0].item<double>());
    return model_->predict(noisy, t, c);
  }
  std::vector<lt::train::LoRATarget> lora_targets() override { return model_->lora_targets(); }
  std::map<std::string, std::string> lora_metadata() const override { return model_->lora_metadata(); }
  void set_gradient_checkpointing(bool enabled) override { model_->set_gradient_checkpointing(enabled); }
  void set_compute_mode(const lt::train::ComputeMode& mode) override { model_->set_compute_mode(mode); }
  void set_training(bool training) override { model_->set_training(training); }
  int64_t quantize_base(bool text_encoders, lt::models::WeightQuantization format) override {
    return model_->quantize_base(text_encoders, format);
  }
  void release(lt::train::Encoder which) override { model_->release(which); }

 private:
  std::unique_ptr<lt::train::DiffusionModel> model_;
};

}  // namespace

CATCH_TEST_CASE("Wan 2.1 flow-match Euler previews take the Flux pipelines' explicit sigmas, shifted by Wan's 3.0",
                "[train][wan][sample]") {
  lt::train::ModelLoadOptions options;
  options.name_or_path = transformer_file();
  RecordingModel model(lt::train::load_diffusion_model(options));
  lt::sample::SamplePrompt prompt;
  prompt.text = "a red circle";
  prompt.width = prompt.height = 32;
  prompt.steps = 4;
  prompt.guidance_scale = 1.0;  // the conditional branch alone: one call per step
  lt::train::PreviewOptions preview;
  preview.sampler = "flowmatch";
  preview.num_frames = 5;
  const auto text = model.encode_text({prompt.text});
  const at::Tensor clip = lt::train::render_preview(model, prompt, text, text, preview);
  CATCH_CHECK(clip.sizes().vec() == std::vector<int64_t>{3, 5, 32, 32});
  // sigmas = linspace(1, 1/N, N) (as FluxPipeline passes them), then 3 s / (1 + 2 s), as 1000 s.
  CATCH_REQUIRE(model.timesteps.size() == 4);
  for (int k = 0; k < 4; ++k) {
    const double sigma = 1.0 + k * (1.0 / 4 - 1.0) / 3, shifted = 3 * sigma / (1 + 2 * sigma);
    CATCH_INFO("step " << k);
    CATCH_CHECK(model.timesteps[k] == Approx(1000 * shifted).epsilon(1e-5));
  }
}

CATCH_TEST_CASE("Wan 2.1: incomplete ComfyUI setups get one error naming each missing file", "[train][wan]") {
  auto dir = lt::test::scratch_dir(lt::test::per_program("wan_incomplete"));
  fs::copy_file(transformer_file(), dir / "wan2.1_t2v_tiny.safetensors");
  lt::train::ModelLoadOptions options;
  options.name_or_path = dir / "wan2.1_t2v_tiny.safetensors";
  try {
    lt::train::load_diffusion_model(options);
    CATCH_FAIL("loaded without its umT5 and VAE");
  } catch (const lt::InputError& e) {
    const std::string what = e.what();
    CATCH_CHECK(what.find("umt5_xxl_fp16.safetensors") != std::string::npos);
    CATCH_CHECK(what.find("wan_2.1_vae.safetensors") != std::string::npos);
  }
  // The VAE given as model.vae_path, and the umT5 beside it: complete.
  fs::copy_file(tiny_wan() / "umt5_xxl_fp16.safetensors", dir / "umt5_xxl_fp16.safetensors");
  options.vae_path = tiny_wan() / "wan_2.1_vae.safetensors";
  CATCH_CHECK(lt::train::load_diffusion_model(options)->traits().is_video);
}

CATCH_TEST_CASE("AI Toolkit's Wan 2.1 examples (1.3B; 14B with quantize and low_vram) run on a tiny WanPipeline in the "
                "Hugging Face cache",
                "[train][e2e][aitk][wan]") {
  const auto [job, repo] = GENERATE(
      std::make_tuple(std::string("example_wan21_1b_24gb.yaml"), std::string("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")),
      std::make_tuple(std::string("example_wan21_14b_24gb.yaml"), std::string("Wan-AI/Wan2.1-T2V-14B-Diffusers")));
  CATCH_INFO(job);
  const fs::path root = lt::test::scratch_dir(lt::test::per_program("aitk_" + job.substr(0, job.find('.'))));
  lt::test::put_in_hub_cache(root / "hub", repo, lt::train::DemoArch::kWan21);
  lt::data::DemoDataOptions images;
  images.count = 4;
  images.size = 64;
  lt::data::make_demo_dataset(root / "images", images);
  ::setenv("HF_HUB_CACHE", (root / "hub").string().c_str(), 1);

  lt::train::RunRequest request;
  request.config_path = lt::test::source_dir() / "tests" / "config" / "data" / "aitk" / job;
  // The paths and the device, as a user changes them; the rest keeps the test short (the
  // example's 632 px buckets and 832x480x40 previews become 64 px and 64x64x5).
  request.overrides = {"datasets.0.folder_path=" + (root / "images").string(),
                       "device=cpu",
                       "training_folder=" + root.string(),
                       "datasets.0.resolution=[64]",
                       "train.steps=3",
                       "save.save_every=2",
                       "sample.sample_every=3",
                       "sample.sample_steps=2",
                       "sample.width=64",
                       "sample.height=64",
                       "sample.num_frames=5"};
  const auto result = lt::train::run_training(request);
  ::unsetenv("HF_HUB_CACHE");
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 3);
  const std::string name = job.find("14b") != std::string::npos ? "my_first_wan21_14b_lora_v1" : "my_first_wan21_1b_lora_v1";
  const fs::path run = root / name;
  CATCH_CHECK(fs::exists(run / (name + "_000000002.safetensors")));
  CATCH_CHECK(fs::exists(run / "samples" / "grid_000000003.png"));
  auto lora = lt::io::SafetensorsFile::open(run / (name + ".safetensors"));
  // The examples save in the default layout: musubi/ComfyUI names, rank 32.
  CATCH_CHECK(lora->contains("diffusion_model.blocks.0.self_attn.q.lora_down.weight"));
  CATCH_CHECK(lora->info("diffusion_model.blocks.0.self_attn.q.lora_down.weight").shape[0] == 32);
}

namespace {

nlohmann::json read_report(const fs::path& run) {
  std::ifstream in(run / "report.json");
  return nlohmann::json::parse(in);
}

int64_t phase_peak(const nlohmann::json& report, const std::string& phase) {
  return report.at("peaks").at(phase).at("peak_allocated").get<int64_t>();
}

// A run on the clips under `root`/clips at their size, `frames` per clip (dataset and previews),
// with the guard's memory section `memory` (attention already chunked: the guard's first, exact
// lever, so the frames are the next one).
lt::train::RunRequest clip_run(const fs::path& root, const std::string& name, int steps, int frames, int size,
                               const std::string& memory, std::vector<std::string> extra) {
  lt::train::RunRequest r;
  r.config_path = lt::test::write_tiny_config(
      root, name, steps, "", "        attention_chunk: 256\n        oom_guard:\n          plan: false\n" + memory);
  r.overrides = {"model.name_or_path=" + transformer_file().string(), "model.arch=wan21",
                 "datasets.0.folder_path=" + (root / "clips").string(), "datasets.0.num_frames=" + std::to_string(frames),
                 "datasets.0.resolution=[" + std::to_string(size) + "]", "train.batch_size=1",
                 "sample.num_frames=" + std::to_string(frames)};
  r.overrides.insert(r.overrides.end(), extra.begin(), extra.end());
  return r;
}

void make_clips(const fs::path& dir, int count, int size, int frames) {
  lt::data::DemoVideoOptions clips;
  clips.count = count;
  clips.size = size;
  clips.min_frames = frames;
  clips.max_frames = frames;
  lt::data::make_demo_video_dataset(dir, clips);
}

}  // namespace

CATCH_TEST_CASE("Wan 2.1 under simulated VRAM: 33 frames at 256x256 exceed it, the guard reduces the frames first and the "
                "run completes; diagnose reads the video spike and names the same next step",
                "[train][e2e][guard][wan][slow]") {
  const auto root = lt::test::scratch_dir(lt::test::per_program("wan_guard"));
  make_clips(root / "clips", 2, 256, 33);
  // Clips encoded in the step (the tiny VAE's peak would otherwise be the cache phase's).
  auto request = [&](const std::string& name, int steps, int frames, const std::string& budget) {
    return clip_run(root, name, steps, frames, 256, budget, {"datasets.0.cache_latents=false"});
  };
  // One step of each length with the guard on and no budget: the peaks per phase.
  CATCH_REQUIRE(lt::train::run_training(request("calib33", 1, 33, "")).exit_code == 0);
  CATCH_REQUIRE(lt::train::run_training(request("calib17", 1, 17, "")).exit_code == 0);
  const auto long_clips = read_report(root / "calib33"), short_clips = read_report(root / "calib17");
  const int64_t peak33 = phase_peak(long_clips, "train_step");
  const int64_t floor = std::max(phase_peak(long_clips, "load"), phase_peak(short_clips, "train_step"));
  CATCH_INFO("train_step peak 33 frames " << peak33 << ", floor (load, 17-frame step) " << floor);
  CATCH_REQUIRE(peak33 > floor);
  const int64_t budget = floor + (peak33 - floor) / 2;

  auto result = lt::train::run_training(request("spike", 2, 33, "        simulate_vram: " + std::to_string(budget) + "\n"));
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 2);
  const auto report = read_report(root / "spike");
  CATCH_INFO(report.at("attempts").dump(1));
  CATCH_REQUIRE(report.at("attempts").size() >= 1);
  CATCH_CHECK(report.at("attempts")[0].at("action").get<std::string>() == "reduce_frames");
  CATCH_REQUIRE(!result.actions.empty());
  CATCH_CHECK(result.actions[0].find("33 -> 17") != std::string::npos);

  // diagnose on the run's log: lora-train's own video spike, and frames as the next lever.
  const auto diagnosis = lt::diagnose::diagnose_path((root / "spike" / "log.txt").string());
  CATCH_CHECK(diagnosis.phase == lt::diagnose::Phase::kVideoSpike);
  const auto fixes = lt::diagnose::plan_fixes(diagnosis);
  CATCH_REQUIRE_FALSE(fixes.empty());
  CATCH_CHECK(fixes.front().id == "num_frames");
}

CATCH_TEST_CASE("Wan 2.1 under simulated VRAM: a clip's encode while caching latents exceeds it, the guard takes the video "
                "rung (frames first) and the run completes",
                "[train][e2e][guard][wan]") {
  const auto root = lt::test::scratch_dir(lt::test::per_program("wan_cache_guard"));
  make_clips(root / "clips", 1, 128, 33);
  // Latents cached in memory only, so every run encodes its clips.
  auto request = [&](const std::string& name, int frames, const std::string& budget) {
    return clip_run(root, name, 1, frames, 128, budget,
                    {"datasets.0.cache_latents=true", "datasets.0.cache_latents_to_disk=false"});
  };
  // The peaks per phase of each clip length with no budget: caching 33 frames is the run's peak.
  CATCH_REQUIRE(lt::train::run_training(request("calib33", 33, "")).exit_code == 0);
  CATCH_REQUIRE(lt::train::run_training(request("calib17", 17, "")).exit_code == 0);
  const auto long_clips = read_report(root / "calib33"), short_clips = read_report(root / "calib17");
  const int64_t cache33 = phase_peak(long_clips, "cache");
  int64_t floor = phase_peak(short_clips, "cache");
  for (const char* phase : {"load", "train_step"}) floor = std::max(floor, phase_peak(long_clips, phase));
  CATCH_INFO("cache peak 33 frames " << cache33 << ", floor (load, step, 17-frame cache) " << floor);
  CATCH_REQUIRE(cache33 > floor);
  const int64_t budget = floor + (cache33 - floor) / 2;

  const auto result = lt::train::run_training(request("cache_spike", 33, "        simulate_vram: " + std::to_string(budget) + "\n"));
  CATCH_REQUIRE(result.exit_code == 0);
  CATCH_CHECK(result.steps_completed == 1);
  const auto report = read_report(root / "cache_spike");
  CATCH_INFO(report.at("attempts").dump(1));
  CATCH_REQUIRE(report.at("attempts").size() == 1);
  const auto& attempt = report.at("attempts")[0];
  CATCH_CHECK(attempt.at("phase").get<std::string>() == "cache");
  CATCH_CHECK(attempt.at("classification").get<std::string>() == "video_spike");
  CATCH_CHECK(attempt.at("action").get<std::string>() == "reduce_frames");
  CATCH_REQUIRE(result.actions.size() == 1);
  CATCH_CHECK(result.actions[0] == "datasets.num_frames: 33 -> 17, sample.num_frames: 33 -> 17");
  CATCH_CHECK(attempt.at("frames").get<int>() == 33);
  CATCH_CHECK(report.at("final_settings").at("num_frames").get<int>() == 17);
  std::ifstream log(root / "cache_spike" / "log.txt");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  CATCH_CHECK_THAT(text, Catch::Contains("OOM in phase cache("));
  CATCH_CHECK_THAT(text, Catch::Contains("video_spike"));
  const auto diagnosis = lt::diagnose::diagnose_path((root / "cache_spike" / "log.txt").string());
  CATCH_CHECK(diagnosis.phase == lt::diagnose::Phase::kVideoSpike);
}

CATCH_TEST_CASE("Wan 2.1 with model.quantize (qfloat8): the transformer and umT5 become codes on the host before they are "
                "placed, so loading peaks below the unquantized load, as the planner predicts",
                "[train][e2e][wan][quantize]") {
  const auto root = lt::test::scratch_dir(lt::test::per_program("wan_quantized_load"));
  // One step each on the tiny image dataset (1-frame clips); the report's load phase is the loader's peak.
  const std::vector<std::string> common = {"model.name_or_path=" + transformer_file().string(), "model.arch=wan21",
                                           "train.timestep_type=sigmoid", "memory.oom_guard.plan=false"};
  struct Run {
    std::string name;
    std::vector<std::string> overrides;
  };
  const std::vector<Run> runs = {
      {"unquantized", {"model.quantize=false"}},
      {"fp8", {"model.quantize=true", "model.qtype=qfloat8", "model.quantize_te=true", "model.qtype_te=qfloat8"}},
      // quantize_te under low_vram: umT5 is not loaded (nor quantized) until the cache phase uses it.
      {"fp8_low_vram", {"model.quantize=true", "model.qtype=qfloat8", "model.quantize_te=true", "model.low_vram=true"}},
  };
  std::map<std::string, int64_t> measured, predicted, measured_cache, predicted_cache;
  for (const Run& r : runs) {
    CATCH_INFO(r.name);
    lt::train::RunRequest request;
    request.config_path = lt::test::write_tiny_config(root, r.name, 1);
    request.overrides = common;
    request.overrides.insert(request.overrides.end(), r.overrides.begin(), r.overrides.end());
    request.fresh = true;
    const auto result = lt::train::run_training(request);
    CATCH_REQUIRE(result.exit_code == 0);
    for (double loss : result.losses) CATCH_CHECK(std::isfinite(loss));
    measured[r.name] = phase_peak(read_report(root / r.name), "load");
    measured_cache[r.name] = phase_peak(read_report(root / r.name), "cache");

    const auto job = lt::config::load_config(request.config_path, request.overrides);
    std::optional<int> bytes;
    if (lt::config::canonical_dtype(lt::config::the_process(job).train.dtype) == "bf16" &&
        lt::train::cpu_bf16_instructions().empty()) {
      bytes = 4;  // the trainer computes in fp32 here
    }
    const auto planner = lt::plan::Planner::from_config(job, bytes);
    const auto prediction = planner->predict(planner->configured());
    predicted[r.name] = prediction.at(lt::playbook::Phase::load).peak();
    predicted_cache[r.name] = prediction.at(lt::playbook::Phase::cache).peak();
  }
  for (const Run& r : runs) {
    CATCH_INFO(r.name << ": load peak measured " << measured[r.name] << " B, predicted " << predicted[r.name] << " B");
    CATCH_CHECK(std::abs(double(predicted[r.name] - measured[r.name])) <= 0.15 * double(measured[r.name]));
    // (the cache phase: under low_vram umT5 arrives quantized for the captions, after the VAE left)
    CATCH_INFO("cache peak measured " << measured_cache[r.name] << " B, predicted " << predicted_cache[r.name] << " B");
    CATCH_CHECK(std::abs(double(predicted_cache[r.name] - measured_cache[r.name])) <= 0.15 * double(measured_cache[r.name]));
  }
  CATCH_INFO("measured " << nlohmann::json(measured).dump() << ", predicted " << nlohmann::json(predicted).dump());
  // The unquantized load holds the transformer, umT5 and the VAE at full width; the quantized one
  // never holds the widened transformer beside them (its peak is the transformer's quantization,
  // one Linear at a time); under low_vram umT5 waits for the cache phase.
  CATCH_CHECK(measured["fp8"] < measured["unquantized"]);
  CATCH_CHECK(predicted["fp8"] < predicted["unquantized"]);
  CATCH_CHECK(measured["fp8_low_vram"] <= measured["fp8"]);
  CATCH_CHECK(predicted["fp8_low_vram"] <= predicted["fp8"]);
  std::ifstream log_file(root / "fp8" / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  CATCH_CHECK_THAT(log, Catch::Contains("base weights quantised to fp8 (e4m3), text encoders to fp8 (e4m3)"));
}

CATCH_TEST_CASE("Wan 2.1 low-VRAM load with quantize_te: umT5 is not loaded to be quantized; it arrives quantized when "
                "first used, and again so after a release",
                "[train][wan][quantize]") {
  auto text_growth = [](std::optional<lt::models::WeightQuantization> text_quantization) {
    lt::memory::CpuMemory memory(0);  // counts every CPU allocation while it lives
    lt::train::ModelLoadOptions options;
    options.name_or_path = transformer_file();
    options.defer_encoders = true;
    if (text_quantization) options.denoiser_quantization = lt::models::WeightQuantization::fp8_e4m3;
    options.text_quantization = text_quantization;
    auto model = lt::train::load_diffusion_model(options);
    const int64_t loaded = memory.allocated();
    torch::NoGradGuard no_grad;
    const auto first = model->encode_text({"a red circle"});
    const int64_t with_text = memory.allocated();
    // The low-VRAM path's release drops umT5 on the CPU; the next use loads it again.
    model->release(lt::train::Encoder::text);
    CATCH_CHECK(memory.allocated() < with_text);
    const auto second = model->encode_text({"a red circle"});
    // (beside the first call's embeddings, the second's)
    CATCH_CHECK(memory.allocated() == with_text + static_cast<int64_t>(second.front().second.nbytes()));
    CATCH_CHECK(torch::equal(first.front().second, second.front().second));
    return std::make_pair(loaded, with_text - loaded);
  };
  const auto [widened_load, widened_text] = text_growth(std::nullopt);
  const auto [quantized_load, quantized_text] = text_growth(lt::models::WeightQuantization::fp8_e4m3);
  CATCH_INFO("after load: " << widened_load << " B / " << quantized_load << " B quantized; umT5 and its embeddings: "
                            << widened_text << " B / " << quantized_text << " B quantized");
  // Nothing of umT5 came with the load, and it comes in 8 bits when it is used (and after a release).
  CATCH_CHECK(quantized_load < widened_load);
  CATCH_CHECK(quantized_text < widened_text);
}
