#include "identify.h"

namespace lt::diagnose::detail {

namespace {
// Below this a trainer or family is "unknown": one weak marker is not enough.
constexpr int kMinScore = 4;
}  // namespace

const std::vector<TrainerMarker>& trainer_markers() {
  using T = Trainer;
  static const std::vector<TrainerMarker> table = {
      // ai-toolkit: run.py / toolkit/job.py ("Running 1 job", "Error running job"),
      // jobs/process/BaseSDTrainProcess.py, extensions_built_in/sd_trainer/SDTrainer.py, the UI.
      {"ai-toolkit", T::kAiToolkit, 5}, {"ai_toolkit", T::kAiToolkit, 5}, {"basesdtrainprocess", T::kAiToolkit, 5},
      {"extensions_built_in", T::kAiToolkit, 5}, {"generating baseline samples", T::kAiToolkit, 5},
      {"oom during training step", T::kAiToolkit, 5}, {"error running job", T::kAiToolkit, 5},
      {"# running job:", T::kAiToolkit, 5}, {"sdtrainer.py", T::kAiToolkit, 5}, {"toolkit/", T::kAiToolkit, 5},
      {"toolkit\\", T::kAiToolkit, 5}, {"ostris", T::kAiToolkit, 5}, {"ui_trainer", T::kAiToolkit, 5},
      {"diffusion_trainer", T::kAiToolkit, 5}, {"sd_trainer", T::kAiToolkit, 5},
      {"skipping first sample", T::kAiToolkit, 5},
      {"running 1 job", T::kAiToolkit, 2}, {"running  1 process", T::kAiToolkit, 2},
      {"running 1 process", T::kAiToolkit, 2}, {"lr: ", T::kAiToolkit, 2}, {"job: extension", T::kAiToolkit, 2},
      // sd-scripts: *_train_network.py, library/train_util.py, networks/lora*.py; the kohya_ss GUI.
      {"train_network.py", T::kKohya, 5}, {"sdxl_train_network", T::kKohya, 5}, {"flux_train_network", T::kKohya, 5},
      {"sd3_train_network", T::kKohya, 5}, {"sd-scripts", T::kKohya, 5}, {"sd_scripts", T::kKohya, 5},
      {"library/train_util", T::kKohya, 5}, {"library\\train_util", T::kKohya, 5}, {"networks.lora", T::kKohya, 5},
      {"networks.lora_flux", T::kKohya, 5}, {"import network module", T::kKohya, 5}, {"kohya", T::kKohya, 5},
      {"running training / ", T::kKohya, 2}, {"avr_loss", T::kKohya, 2},
      {"generating sample images at step", T::kKohya, 2},
      {"\xe5\xad\xa6\xe7\xbf\x92\xe9\x96\x8b\xe5\xa7\x8b", T::kKohya, 2},  // 学習開始
      {"network_module", T::kKohya, 2}, {"--network_dim", T::kKohya, 2}, {"enable lora for u-net", T::kKohya, 2},
      {"create lora network", T::kKohya, 2},
      // sd-scripts: library/train_util.py dataset preparation and load_target_model(),
      // library/sdxl_model_util.py; colab wrappers call it as train_network_wrapper.py.
      // sd-scripts: the other training scripts of its top folder.
      {"train_db.py", T::kKohya, 5}, {"fine_tune.py", T::kKohya, 5}, {"sdxl_train.py", T::kKohya, 5},
      {"train_textual_inversion", T::kKohya, 5}, {"flux_train.py", T::kKohya, 5}, {"sd3_train.py", T::kKohya, 5},
      {"lumina_train", T::kKohya, 5}, {"anima_train", T::kKohya, 5}, {"train_control_net", T::kKohya, 5},
      {"make buckets", T::kKohya, 2}, {"mean ar error (without repeats)", T::kKohya, 2},
      {"number of images (including repeats)", T::kKohya, 2}, {"loading model for process", T::kKohya, 2},
      {"noise_offset is set to", T::kKohya, 2}, {"building text encoders", T::kKohya, 2},
      {"loading u-net from checkpoint", T::kKohya, 2}, {"train_network_wrapper", T::kKohya, 5},
      // kohya_ss GUI: setup/setup_common.py and setup/validate_requirements.py start-up banner
      // ("Kohya_ss GUI version", "Torch detected GPU: ...", "Verifying modules from ...", older
      // releases "Verifying modules instalation status from ..."), kohya_gui/lora_gui.py's saved
      // config keys ("LoRA_type", "LyCORIS_preset").
      {"kohya_ss gui version", T::kKohya, 5, true}, {"torch detected gpu:", T::kKohya, 5, true},
      {"verifying modules", T::kKohya, 3, true}, {"instalation status", T::kKohya, 3, true},
      {"lycoris_preset", T::kKohya, 5, true}, {"\"lora_type\"", T::kKohya, 3, true},
      // musubi-tuner: src/musubi_tuner/*_train_network.py, *_cache_*.py, networks/lora_*.py. It prints
      // sd-scripts' messages too, so its own markers weigh more.
      {"musubi", T::kMusubi, 20}, {"hv_train_network", T::kMusubi, 20}, {"wan_train_network", T::kMusubi, 20},
      {"fpack_train_network", T::kMusubi, 20}, {"qwen_image_train_network", T::kMusubi, 20},
      {"flux_kontext_train_network", T::kMusubi, 20}, {"hv_train.py", T::kMusubi, 20},
      {"wan_cache_latents", T::kMusubi, 20}, {"wan_cache_text_encoder", T::kMusubi, 20},
      {"networks.lora_wan", T::kMusubi, 20}, {"hv_generate_video", T::kMusubi, 20},
      {"cache_text_encoder_outputs.py", T::kMusubi, 20}, {"lora_framepack", T::kMusubi, 20},
      {"networks.lora_qwen_image", T::kMusubi, 20}, {"networks.lora_flux_kontext", T::kMusubi, 20},
      {"hunyuan_model/", T::kMusubi, 20}, {"trainer_base.py", T::kMusubi, 20},
      // diffusion-pipe: train.py under deepspeed, its TOML keys and DeepSpeed's step line.
      {"diffusion-pipe", T::kDiffusionPipe, 8}, {"diffusion_pipe", T::kDiffusionPipe, 8},
      {"--deepspeed", T::kDiffusionPipe, 8}, {"iter time (s)", T::kDiffusionPipe, 8},
      {"micro_batch_size_per_gpu", T::kDiffusionPipe, 8}, {"pipeline_stages", T::kDiffusionPipe, 8},
      {"deepspeed --num_gpus", T::kDiffusionPipe, 8},
      {"deepspeed", T::kDiffusionPipe, 2}, {"blocks_to_swap =", T::kDiffusionPipe, 2},
      {"activation_checkpointing", T::kDiffusionPipe, 2},
      // diffusers: examples/{dreambooth,text_to_image,...}/train_*.py under accelerate.
      {"train_dreambooth_lora", T::kDiffusers, 6}, {"train_text_to_image_lora", T::kDiffusers, 6},
      {"train_dreambooth", T::kDiffusers, 6}, {"train_text_to_image", T::kDiffusers, 6},
      {"diffusers/examples", T::kDiffusers, 6}, {"examples/dreambooth", T::kDiffusers, 6},
      {"examples/text_to_image", T::kDiffusers, 6}, {"instantaneous batch size per device", T::kDiffusers, 6},
      {"total train batch size (w. parallel", T::kDiffusers, 6},
      {"***** running training *****", T::kDiffusers, 1}, {"num examples =", T::kDiffusers, 1},
      {"log_validation", T::kDiffusers, 1}, {"running validation...", T::kDiffusers, 1},
      {"accelerate launch", T::kDiffusers, 1},
      // OneTrainer: modules/trainer/GenericTrainer.py, modules/modelSetup, mgds.
      {"onetrainer", T::kOneTrainer, 9}, {"generictrainer", T::kOneTrainer, 9}, {"modules/trainer", T::kOneTrainer, 9},
      {"modules\\trainer", T::kOneTrainer, 9}, {"modules/modelsetup", T::kOneTrainer, 9},
      {"modules\\modelsetup", T::kOneTrainer, 9}, {"mgds", T::kOneTrainer, 9}, {"trainconfig", T::kOneTrainer, 9},
      {"modules/util/", T::kOneTrainer, 9}, {"modules\\util\\", T::kOneTrainer, 9},
      {"scripts/train.py --config-path", T::kOneTrainer, 9},
      // SimpleTuner: simpletuner/helpers/{training,caching,data_backend}.
      {"simpletuner", T::kSimpleTuner, 9}, {"helpers/training", T::kSimpleTuner, 9},
      {"helpers\\training", T::kSimpleTuner, 9}, {"multidatabackend", T::kSimpleTuner, 9},
      {"--model_family", T::kSimpleTuner, 9}, {"model_family", T::kSimpleTuner, 9},
      {"helpers/data_backend", T::kSimpleTuner, 9}, {"helpers/caching", T::kSimpleTuner, 9},
      {"helpers.training", T::kSimpleTuner, 9},
      // ComfyUI: execution.py, comfy_extras/nodes_train.py, custom training nodes (FluxTrainer).
      {"comfyui", T::kComfyUI, 9}, {"comfy_extras", T::kComfyUI, 9}, {"nodes_train", T::kComfyUI, 9},
      {"!!! exception during processing", T::kComfyUI, 9}, {"custom_nodes", T::kComfyUI, 9},
      {"comfy/", T::kComfyUI, 9}, {"comfy\\", T::kComfyUI, 9}, {"fluxtrainer", T::kComfyUI, 9},
      {"prompt executed in", T::kComfyUI, 9}, {"got prompt", T::kComfyUI, 9},
      {"comfy.model_management", T::kComfyUI, 9}, {"execution.py", T::kComfyUI, 9},
      // x-flux: train_flux_lora_deepspeed.py / train_flux_deepspeed.py, src/flux/xflux_pipeline.py.
      {"train_flux_lora_deepspeed", T::kXFlux, 20}, {"train_flux_deepspeed", T::kXFlux, 20},
      {"x-flux", T::kXFlux, 20}, {"xflux", T::kXFlux, 20}, {"xlabs", T::kXFlux, 9},
      {"setting lora processor for", T::kXFlux, 9},
      // lora-train: src/memory/guard.cpp, src/train/trainer.cpp.
      {"oom-guard:", T::kLoraTrain, 20}, {"lora-train", T::kLoraTrain, 20},
      // The A1111 Dreambooth extension runs its own fork of diffusers' train_dreambooth.py: not the
      // diffusers example, and none of the trainers above.
      {"sd_dreambooth_extension", T::kUnknown, 30},
  };
  return table;
}

const std::vector<FamilyMarker>& family_markers() {
  using F = ModelFamily;
  static const std::vector<FamilyMarker> table = {
      {"flux", F::kFlux, 4}, {"kontext", F::kFlux, 4}, {"fluxgym", F::kFlux, 4},
      {"sdxl", F::kSdxl, 4}, {"sd_xl", F::kSdxl, 4}, {"stable-diffusion-xl", F::kSdxl, 4},
      {"stablediffusionxl", F::kSdxl, 4}, {"is_xl", F::kSdxl, 4}, {"sd-xl", F::kSdxl, 4}, {"xl_base", F::kSdxl, 4},
      {"xl-base", F::kSdxl, 4},
      {"illustrious", F::kSdxl, 1}, {"noobai", F::kSdxl, 1}, {"ponydiffusion", F::kSdxl, 1},
      {"pony_diffusion", F::kSdxl, 1}, {"animagine", F::kSdxl, 1},
      {"v1-5", F::kSd15, 4}, {"sd15", F::kSd15, 4}, {"sd1.5", F::kSd15, 4}, {"sd 1.5", F::kSd15, 4},
      {"sd-v1", F::kSd15, 4}, {"stable-diffusion-v1", F::kSd15, 4}, {"runwayml", F::kSd15, 4}, {"sd_v1", F::kSd15, 4},
      {"arch: sd1", F::kSd15, 4}, {"sd1-5", F::kSd15, 4}, {"sd_1_5", F::kSd15, 4}, {"v1_5", F::kSd15, 4},
      // ComfyUI's SD1.x text encoder (comfy/sd1_clip.py) and diffusers' SD1/2 pipeline module.
      {"sd1clipmodel", F::kSd15, 4}, {"pipeline_stable_diffusion.py", F::kSd15, 4},
      {"sd3_", F::kSd3, 4}, {"sd3.", F::kSd3, 4}, {"sd3-", F::kSd3, 4}, {"sd35", F::kSd3, 4}, {"sd3 ", F::kSd3, 4},
      {"stable-diffusion-3", F::kSd3, 4}, {"stablediffusion3", F::kSd3, 4}, {"is_v3", F::kSd3, 4},
      {"sd3_train", F::kSd3, 4}, {"sd3:", F::kSd3, 4},
      {"wan2", F::kWan, 4}, {"wan_", F::kWan, 4}, {"wan-ai", F::kWan, 4}, {"wan21", F::kWan, 4}, {"wan22", F::kWan, 4},
      {"wan 2.", F::kWan, 4}, {"'wan'", F::kWan, 4}, {"\"wan\"", F::kWan, 4}, {"wan2.1", F::kWan, 4},
      {"wantransformer", F::kWan, 4}, {"wan_video", F::kWan, 4}, {"arch: wan", F::kWan, 4},
      {"hunyuan", F::kHunyuan, 4}, {"hv_train", F::kHunyuan, 4}, {"hyvideo", F::kHunyuan, 4},
      {"framepack", F::kHunyuan, 4}, {"fpack_", F::kHunyuan, 4},
      {"ltx-", F::kLtx, 4}, {"ltx_", F::kLtx, 4}, {"ltxv", F::kLtx, 4}, {"ltx2", F::kLtx, 4}, {"ltx ", F::kLtx, 4},
      {"'ltx'", F::kLtx, 4}, {"ltxvideo", F::kLtx, 4}, {"ltx-video", F::kLtx, 4},
      {"qwen_image", F::kQwen, 4}, {"qwen-image", F::kQwen, 4}, {"qwenimage", F::kQwen, 4},
      {"qwen image", F::kQwen, 4}, {"'qwen_image'", F::kQwen, 4},
      {"lumina", F::kLumina, 4}, {"hidream", F::kHiDream, 4}, {"chroma", F::kChroma, 4},
      {"z-image", F::kZImage, 4}, {"zimage", F::kZImage, 4}, {"z_image", F::kZImage, 4},
      {"cogvideo", F::kCogVideo, 4}, {"mochi", F::kMochi, 4},
      // lora-train names the family it loaded (src/train/trainer.cpp: "loaded <family> base from").
      {"loaded sd1 base", F::kSd15, 8}, {"loaded sd2 base", F::kSd15, 8}, {"loaded sdxl base", F::kSdxl, 8},
      {"loaded flux base", F::kFlux, 8}, {"loaded wan base", F::kWan, 8},
  };
  return table;
}

void identify(const IdentityScores& scores, const Settings& settings, Diagnosis& d) {
  int best_t = 0;
  for (int t = 1; t < kTrainerCount; ++t)
    if (scores.trainer[t] > scores.trainer[best_t]) best_t = t;
  if (scores.trainer[best_t] >= kMinScore) d.trainer = static_cast<Trainer>(best_t);
  if (d.trainer == Trainer::kKohya && scores.kohya_gui) d.trainer_detail = "kohya_ss GUI";

  int best_f = 0;
  for (int f = 1; f < kFamilyCount; ++f)
    if (scores.family[f] > scores.family[best_f]) best_f = f;
  if (scores.family[best_f] >= kMinScore) d.family = static_cast<ModelFamily>(best_f);

  if (d.family != ModelFamily::kUnknown) {
    bool video = is_video_family(d.family);
    if (video && settings.num_frames && *settings.num_frames <= 1) video = false;  // image LoRA on a video model
    d.kind = video ? ModelKind::kVideo : ModelKind::kImage;
  } else if (settings.num_frames && *settings.num_frames > 1) {
    d.kind = ModelKind::kVideo;
  }
}

}  // namespace lt::diagnose::detail
