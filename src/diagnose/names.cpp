// Stable names (the JSON schema in docs/diagnose.md) and display names.
#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose {

const char* trainer_name(Trainer t) {
  switch (t) {
    case Trainer::kAiToolkit: return "ai_toolkit";
    case Trainer::kKohya: return "kohya_sd_scripts";
    case Trainer::kMusubi: return "musubi_tuner";
    case Trainer::kDiffusionPipe: return "diffusion_pipe";
    case Trainer::kDiffusers: return "diffusers";
    case Trainer::kOneTrainer: return "onetrainer";
    case Trainer::kSimpleTuner: return "simpletuner";
    case Trainer::kComfyUI: return "comfyui";
    case Trainer::kXFlux: return "x_flux";
    case Trainer::kLoraTrain: return "lora_train";
    default: return "unknown";
  }
}

const char* trainer_display_name(Trainer t) {
  switch (t) {
    case Trainer::kAiToolkit: return "ostris AI Toolkit";
    case Trainer::kKohya: return "kohya-ss sd-scripts";
    case Trainer::kMusubi: return "musubi-tuner";
    case Trainer::kDiffusionPipe: return "diffusion-pipe";
    case Trainer::kDiffusers: return "diffusers example script";
    case Trainer::kOneTrainer: return "OneTrainer";
    case Trainer::kSimpleTuner: return "SimpleTuner";
    case Trainer::kComfyUI: return "ComfyUI training nodes";
    case Trainer::kXFlux: return "XLabs x-flux";
    case Trainer::kLoraTrain: return "lora-train";
    default: return "unknown trainer";
  }
}

const char* family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kFlux: return "flux";
    case ModelFamily::kSdxl: return "sdxl";
    case ModelFamily::kSd15: return "sd15";
    case ModelFamily::kSd3: return "sd3";
    case ModelFamily::kWan: return "wan";
    case ModelFamily::kHunyuan: return "hunyuan";
    case ModelFamily::kLtx: return "ltx";
    case ModelFamily::kQwen: return "qwen";
    case ModelFamily::kLumina: return "lumina";
    case ModelFamily::kHiDream: return "hidream";
    case ModelFamily::kChroma: return "chroma";
    case ModelFamily::kZImage: return "zimage";
    case ModelFamily::kCogVideo: return "cogvideo";
    case ModelFamily::kMochi: return "mochi";
    default: return "unknown";
  }
}

const char* cause_name(Cause c) {
  switch (c) {
    case Cause::kGpuOom: return "gpu_oom";
    case Cause::kHostOom: return "host_oom";
    case Cause::kDataLoaderWorker: return "dataloader_worker";
    case Cause::kNanLoss: return "nan_loss";
    case Cause::kGpuFault: return "gpu_fault";
    case Cause::kMissingFile: return "missing_file";
    case Cause::kVersionMismatch: return "version_mismatch";
    case Cause::kOther: return "other";
    default: return "none";
  }
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kLoad: return "load";
    case Phase::kBaselineSample: return "baseline_sample";
    case Phase::kEarlySteps: return "early_steps";
    case Phase::kLaterSteps: return "later_steps";
    case Phase::kSampling: return "sampling";
    case Phase::kVideoSpike: return "video_spike";
    case Phase::kEnvironment: return "environment";
    default: return "unknown";
  }
}

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::kModelLoad: return "model_load";
    case Stage::kQuantize: return "quantize";
    case Stage::kCaching: return "caching";
    case Stage::kBaselineSample: return "baseline_sample";
    case Stage::kTrainingStep: return "training_step";
    case Stage::kSampling: return "sampling";
    case Stage::kSaving: return "saving";
    default: return "unknown";
  }
}

const char* kind_name(ModelKind k) {
  switch (k) {
    case ModelKind::kImage: return "image";
    case ModelKind::kVideo: return "video";
    default: return "unknown";
  }
}

bool is_video_family(ModelFamily f) {
  return f == ModelFamily::kWan || f == ModelFamily::kHunyuan || f == ModelFamily::kLtx ||
         f == ModelFamily::kCogVideo || f == ModelFamily::kMochi;
}

}  // namespace lt::diagnose
