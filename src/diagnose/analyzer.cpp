// Log analysis. One pass over cleaned lines: a keyword automaton (4-byte hashed prefixes) finds the
// few lines that matter, and small handlers parse them into bounded state: failure signatures per
// cause, the latest activity markers (loading, caching, sampling, training progress), traceback
// frames, memory numbers and printed settings. finish() turns that state into a Diagnosis.
#include "loratrain/diagnose/analyzer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "loratrain/diagnose/fixes.h"
#include "loratrain/util/strings.h"

namespace lt::diagnose {
namespace {

// ---------------------------------------------------------------------------------------------
// Small text helpers (ASCII case folding; the logs' interesting words are ASCII).

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string snippet(std::string_view text, size_t max = 400) {
  if (text.size() > max) {
    size_t cut = max;
    // Do not cut inside a UTF-8 sequence.
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    return to_valid_utf8(text.substr(0, cut)) + "...";
  }
  return to_valid_utf8(text);
}

// Parses "<number> <unit>" at `pos` (spaces allowed before the unit): bytes, KiB..TiB, KB..TB.
std::optional<int64_t> parse_size_at(std::string_view s, size_t pos, size_t* end = nullptr) {
  while (pos < s.size() && s[pos] == ' ') ++pos;
  size_t i = pos;
  while (i < s.size() && (is_digit(s[i]) || s[i] == '.' || s[i] == ',')) ++i;
  if (i == pos) return std::nullopt;
  std::string num;
  for (size_t k = pos; k < i; ++k)
    if (s[k] != ',') num.push_back(s[k]);
  char* e = nullptr;
  double v = std::strtod(num.c_str(), &e);
  if (e == num.c_str() || !std::isfinite(v)) return std::nullopt;
  size_t u = i;
  while (u < s.size() && s[u] == ' ') ++u;
  size_t ue = u;
  while (ue < s.size() && std::isalpha(static_cast<unsigned char>(s[ue]))) ++ue;
  std::string unit;
  for (size_t k = u; k < ue; ++k) unit.push_back(lower(s[k]));
  double scale;
  if (unit == "b" || unit == "bytes" || unit == "byte") scale = 1;
  else if (unit == "kib" || unit == "kb" || unit == "k") scale = 1024.0;
  else if (unit == "mib" || unit == "mb" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "gb" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "tb") scale = 1024.0 * 1024 * 1024 * 1024;
  else return std::nullopt;
  // PyTorch's MPS message says GB/MB for binary units too; treat all as binary.
  double bytes = v * scale;
  if (bytes > 9.0e18) return std::nullopt;
  if (end) *end = ue;
  return static_cast<int64_t>(std::llround(bytes));
}

// First integer at or after `pos` within `window` bytes (optional leading '-').
std::optional<int64_t> int_after(std::string_view s, size_t pos, size_t window = 24) {
  size_t lim = std::min(s.size(), pos + window);
  for (size_t i = pos; i < lim; ++i) {
    if (is_digit(s[i])) {
      bool neg = i > 0 && s[i - 1] == '-';
      int64_t v = 0;
      size_t k = i;
      while (k < s.size() && is_digit(s[k]) && v < (int64_t(1) << 40)) v = v * 10 + (s[k++] - '0');
      return neg ? -v : v;
    }
  }
  return std::nullopt;
}

// The line without common log prefixes: "[rank0]: ", "> " quotes, timestamps, "INFO:"-style levels.
std::string_view strip_prefix(std::string_view s) {
  for (int round = 0; round < 4; ++round) {
    size_t before = s.size();
    if (s.rfind("> ", 0) == 0) s.remove_prefix(2);
    if (s.size() > 3 && s[0] == '[' && (s.rfind("[rank", 0) == 0 || s.rfind("[default", 0) == 0)) {
      size_t close = s.find("]:");
      if (close != std::string_view::npos && close < 16) {
        s.remove_prefix(close + 2);
        if (!s.empty() && s[0] == ' ') s.remove_prefix(1);
      }
    }
    // "2024-08-01 12:00:00[,.]123 " / "[2024-08-01 12:00:00,123] " / "12:00:00 "
    size_t i = 0;
    bool bracket = !s.empty() && s[0] == '[';
    if (bracket) i = 1;
    size_t start = i;
    while (i < s.size() && i - start < 32 && (is_digit(s[i]) || s[i] == '-' || s[i] == ':' || s[i] == ' ' ||
                                              s[i] == ',' || s[i] == '.' || s[i] == 'T' || s[i] == '/'))
      ++i;
    if (i - start >= 8 && std::count_if(s.begin() + start, s.begin() + i, [](char c) { return c == ':'; }) >= 2) {
      if (bracket && i < s.size() && s[i] == ']') ++i;
      while (i < s.size() && (s[i] == ' ' || s[i] == '|' || s[i] == '-')) ++i;
      s.remove_prefix(i);
    }
    for (const char* lvl : {"INFO", "WARNING", "WARN", "ERROR", "DEBUG", "CRITICAL"}) {
      size_t n = std::strlen(lvl);
      if (s.size() > n && s.compare(0, n, lvl) == 0 && (s[n] == ':' || s[n] == ' ' || s[n] == ']')) {
        // Keep ERROR lines recognisable: the caller checks `error_level` separately.
        size_t k = n;
        while (k < s.size() && (s[k] == ':' || s[k] == ' ' || s[k] == ']' || s[k] == '|')) ++k;
        if (std::strcmp(lvl, "ERROR") != 0 && std::strcmp(lvl, "CRITICAL") != 0) s.remove_prefix(k);
        break;
      }
    }
    if (s.size() == before) break;
  }
  return s;
}

// "torch.OutOfMemoryError: ...", "RuntimeError: ...", "Killed" -> the exception class, else "".
std::string_view exception_class(std::string_view s) {
  size_t i = 0;
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return {};
  while (i < s.size() && (is_word(s[i]) || s[i] == '.')) ++i;
  std::string_view name = s.substr(0, i);
  if (i < s.size() && s[i] != ':') return {};
  auto ends = [&](std::string_view suf) {
    return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
  };
  if (ends("Error") || ends("Exception") || ends("Interrupt") || ends("Exit") || ends("Failure")) return name;
  return {};
}

// ---------------------------------------------------------------------------------------------
// Keyword automaton over lowercase text: patterns of >= 4 bytes bucketed by a hash of their
// first 4 bytes; a 4096-bit filter rejects almost every position with one table lookup.

enum class K : uint8_t {
  kOom, kOomWeak, kOomRecovered, kOomFatalInARow, kHostOom, kKilled, kExitCode, kDataLoader, kNanWord,
  kLoss, kGpuFault, kXid, kMissingFile, kVersion, kErrorWord, kTraceback, kFrame, kDuringHandling,
  kProgress, kStepsText, kEpoch, kMarker, kSampleAtStep, kGuard, kMem, kTrainer, kFamily, kSetting, kBucket,
  kFramesKey,
};

struct Pattern {
  std::string text;
  K kind;
  int arg = 0;
  int weight = 1;
};

class Matcher {
 public:
  explicit Matcher(std::vector<Pattern> patterns) : patterns_(std::move(patterns)) {
    buckets_.resize(kBuckets);
    for (size_t id = 0; id < patterns_.size(); ++id) {
      const std::string& t = patterns_[id].text;
      uint32_t h = hash(t.data());
      filter_[h >> 6] |= (uint64_t(1) << (h & 63));
      buckets_[h].push_back(static_cast<uint16_t>(id));
    }
  }
  const Pattern& pattern(size_t id) const { return patterns_[id]; }
  size_t size() const { return patterns_.size(); }

  // Calls fn(id, pos) for every occurrence of every pattern in `s` (lowercase).
  template <class Fn>
  void scan(std::string_view s, Fn&& fn) const {
    if (s.size() < 4) return;
    const char* p = s.data();
    const size_t last = s.size() - 4;
    for (size_t i = 0; i <= last; ++i) {
      uint32_t h = hash(p + i);
      if (!(filter_[h >> 6] & (uint64_t(1) << (h & 63)))) continue;
      for (uint16_t id : buckets_[h]) {
        const std::string& t = patterns_[id].text;
        if (t.size() <= s.size() - i && std::memcmp(p + i, t.data(), t.size()) == 0) fn(id, i);
      }
    }
  }

 private:
  static constexpr uint32_t kBits = 12;
  static constexpr uint32_t kBuckets = 1u << kBits;
  static uint32_t hash(const char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return (v * 2654435761u) >> (32 - kBits);
  }
  std::vector<Pattern> patterns_;
  std::array<uint64_t, kBuckets / 64> filter_{};
  std::vector<std::vector<uint16_t>> buckets_;
};

// Settings the handlers recognise (Pattern::arg for K::kSetting).
enum SettingId : int {
  kSetGradCkpt, kSetBatch, kSetAccum, kSetRank, kSetResolution, kSetFrames, kSetPrecision, kSetOptimizer,
  kSetLowVram, kSetQuantize, kSetFp8Base, kSetBlocksToSwap, kSetDisableSampling, kSetSkipFirstSample,
  kSetSampleAtFirst, kSetSampleEvery, kSetSampleSteps, kSetWidth, kSetHeight, kSetXformers, kSetCacheLatents,
  kSetUse8bitAdam,
};

// Pattern::arg for K::kMarker.
enum MarkerId : int { kMarkLoad, kMarkQuantize, kMarkCache, kMarkBaseline, kMarkSample, kMarkTrainStart, kMarkSave, kMarkCount };

void add(std::vector<Pattern>& v, K k, int arg, std::initializer_list<const char*> texts, int weight = 1) {
  for (const char* t : texts) v.push_back({t, k, arg, weight});
}

const Matcher& matcher() {
  static const Matcher m = [] {
    std::vector<Pattern> v;
    // --- GPU OOM (playbook §1 and variants) ---
    add(v, K::kOom, 0, {"cuda out of memory", "outofmemoryerror", "cuda error: out of memory",
                        "cuda_error_out_of_memory", "cudaerrormemoryallocation", "cublas_status_alloc_failed",
                        "cudnn_status_alloc_failed", "hip out of memory", "mps backend out of memory",
                        "xpu out of memory", "allocation on device", "driver error: out of memory",
                        "0 bytes is free", "tried to allocate", "out of memory on device", "cuda oom",
                        "gpu out of memory", "cuda memory error", "out of gpu memory", "ran out of gpu memory",
                        "ran out of vram", "out of vram"});
    add(v, K::kOomWeak, 0, {"cublas_status_not_initialized", "cudnn_status_internal_error",
                            "cudnn_status_not_initialized"});
    add(v, K::kOomRecovered, 0, {"oom during training step, skipping"});
    add(v, K::kOomFatalInARow, 0, {"times in a row"});
    // --- look-alikes ---
    add(v, K::kHostOom, 0, {"the paging file is too small", "winerror 1455", "defaultcpuallocator",
                            "cannot allocate memory", "std::bad_alloc", "out of memory: killed process",
                            "oom-kill", "oom_kill", "oom killer", "oom-killer", "memoryerror", "unable to allocate",
                            "sigkill", "signal 9", "signals.sigkill", "not enough memory: you tried",
                            "out of host memory", "paging file", "killed process", "system ram", "arraymemoryerror"});
    add(v, K::kKilled, 0, {"killed"});
    add(v, K::kExitCode, 0, {"exit status", "exit code", "exitcode", "return code", "returncode",
                             "exited with code", "exit_code", "exit value"});
    add(v, K::kDataLoader, 0, {"dataloader worker", "exited unexpectedly", "insufficient shared memory",
                               "bus error", "/dev/shm", "unable to write to file </torch_", "worker (pid"});
    add(v, K::kNanWord, 0, {"nan detected", "detected nan", "returned nan values", "non-finite loss", "nan loss",
                            "nan in loss", "nan values in", "loss is nan", "loss became nan", "loss is inf",
                            "contains nan", "nan or inf", "nan/inf", "inf or nan", "loss_nan", "nan_loss"});
    add(v, K::kLoss, 0, {"loss"});
    add(v, K::kGpuFault, 0, {"illegal memory access", "unspecified launch failure", "nvrm: xid",
                             "fallen off the bus", "misaligned address", "illegal instruction was encountered",
                             "launch timed out", "uncorrectable ecc", "cudnn_status_execution_failed",
                             "cuda error: unknown error", "gpu is lost", "cudaerrorlaunchfailure",
                             "cuda_error_illegal_address", "cuda error: an illegal", "ecc error",
                             "nvidia-smi has failed", "device-side assert", "cuda error: launch failure",
                             "cublas_status_execution_failed", "cublas_status_internal_error"});
    add(v, K::kXid, 0, {" xid "});
    add(v, K::kMissingFile, 0, {"filenotfounderror", "no such file or directory", "does not appear to have a file",
                                "is not a valid model identifier", "repository not found", "entrynotfounderror",
                                "repositorynotfounderror", "headertoolarge", "safetensorerror",
                                "pytorchstreamreader failed", "invalid load key", "incomplete metadata",
                                "[errno 2]", "no images found", "file not found", "cannot find the file",
                                "could not find the file", "does not exist", "not a directory",
                                "is not a file", "no valid images", "gatedrepoerror", "401 client error",
                                "404 client error", "localentrynotfounderror", "couldn't connect to",
                                "cannot load model", "unable to load weights", "checkpoint not found",
                                "model not found", "path not found", "no such file"});
    add(v, K::kVersion, 0, {"modulenotfounderror", "no module named", "importerror", "cannot import name",
                            "has no attribute", "unexpected keyword argument", "no kernel image is available",
                            "not compiled with cuda", "driver version is insufficient", "undefined symbol",
                            "dll load failed", "size mismatch for", "error(s) in loading state_dict",
                            "version mismatch", "requires torch", "requires a version", "please upgrade",
                            "incompatible", "missing key(s) in state_dict", "unexpected key(s) in state_dict",
                            "is not supported", "not supported on this", "notimplementederror",
                            "deprecated and has been removed", "got an unexpected", "requires python",
                            "procedure could not be found", "was compiled against", "unsupported gpu",
                            "compute capability", "minimum cuda capability"});
    add(v, K::kErrorWord, 0, {"error", "exception", "fatal", "failed", "abort"});
    add(v, K::kTraceback, 0, {"traceback (most recent call last)"});
    add(v, K::kFrame, 0, {"file \""});
    add(v, K::kDuringHandling, 0, {"during handling of the above exception", "the above exception was the direct"});
    // --- progress and activity ---
    add(v, K::kProgress, 0, {"it/s", "s/it"});
    add(v, K::kStepsText, 0, {"steps: ", "step: ", "step ", "global_step"});
    add(v, K::kEpoch, 0, {"epoch "});
    add(v, K::kMarker, kMarkLoad,
        {"loading checkpoint shards", "loading pipeline components", "load stablediffusion checkpoint",
         "load diffusers pretrained", "loading model", "loading transformer", "loading unet", "loading u-net",
         "loading vae", "loading t5", "loading text encoder", "loading clip", "loading dit", "loading flux",
         "loading sd3", "loading sdxl", "loading llm", "loading umt5", "loading weights", "building u-net",
         "building dit", "making pipe", "preparing model", "requested to load", "loading diffusion model",
         "loading base model", "load model", "loading the model", "moving model", "loaded model",
         "loading qwen", "loading wan", "loading hunyuan", "loading ltx", "load_model", "loading tokenizer",
         "from_pretrained", "loading te", "loading lora", "loading network", "model loaded",
         "load the model", "loading encoder", "loading state dict", "loading safetensors", "instantiating",
         "preparing accelerator", "prepare optimizer"});
    add(v, K::kMarker, kMarkQuantize, {"quantiz", "fp8 optimization", "optimizing model weights to fp8",
                                       "converting to fp8", "casting to fp8", "convert to fp8"});
    add(v, K::kMarker, kMarkCache,
        {"caching latents", "cache latents", "caching text", "cache text encoder outputs", "caching embeddings",
         "caching:", "encoding latents", "checking cache validity", "cache_latents", "caching clip",
         "vae cache", "caching t", "cache text", "caching the", "precomputing", "precompute", "encoding images",
         "encoding batch", "caching metadata", "caching: ", "latent cache", "text embed cache",
         "caching validation", "caching sample", "encode latents"});
    add(v, K::kMarker, kMarkBaseline,
        {"generating baseline samples", "generating first sample", "baseline sample", "validation on startup",
         "initial validation", "validation before training", "sample before training"});
    add(v, K::kMarker, kMarkSample,
        {"generating images", "generating samples", "generating sample", "sample_images", "running validation",
         "log_validation", "validation images", "sampling:", "sampling images", "generating validation",
         "generating image", "sample image", "generating video", "generating preview", "preview image",
         "validation prompt", "running inference", "generate_images", "sampling with", "denoising"});
    add(v, K::kMarker, kMarkTrainStart,
        {"running training", "start training", "starting training", "training started", "begin training",
         "beginning training", "train loop", "training loop", "start of training", "starting the training",
         "training lora", "***** running training"});
    add(v, K::kMarker, kMarkSave,
        {"saving checkpoint", "saving model", "saving at step", "saving state", "save trained model",
         "saving lora", "saving the model", "saving weights", "saving to"});
    add(v, K::kSampleAtStep, 0, {"generating sample images at step", "\xe3\x82\xb5\xe3\x83\xb3\xe3\x83\x97\xe3\x83\xab\xe7\x94\xbb\xe5\x83\x8f\xe7\x94\x9f\xe6\x88\x90"});
    add(v, K::kGuard, 0, {"oom-guard:"});
    add(v, K::kMem, 0, {"tried to allocate", "total capacity", "is free", "already allocated",
                        "reserved in total", "allocated by pytorch", "reserved by pytorch but unallocated",
                        "memory in use", "currently allocated", "requested ", "device limit",
                        "free (according to cuda)", "mps allocated", "max allowed", "bytes free", "gib free",
                        "mib free"});
    // --- trainers (weight: how specific the marker is) ---
    auto T = [&](Trainer t, int w, std::initializer_list<const char*> texts) {
      add(v, K::kTrainer, static_cast<int>(t), texts, w);
    };
    T(Trainer::kAiToolkit, 5, {"ai-toolkit", "ai_toolkit", "basesdtrainprocess", "extensions_built_in",
                               "generating baseline samples", "oom during training step", "error running job",
                               "# running job:", "sdtrainer.py", "toolkit/", "toolkit\\", "ostris",
                               "ui_trainer", "diffusion_trainer", "sd_trainer", "skipping first sample"});
    T(Trainer::kAiToolkit, 2, {"running 1 job", "running  1 process", "running 1 process", "lr: ", "job: extension"});
    T(Trainer::kKohya, 5, {"train_network.py", "sdxl_train_network", "flux_train_network", "sd3_train_network",
                           "sd-scripts", "sd_scripts", "library/train_util", "library\\train_util",
                           "networks.lora", "networks.lora_flux", "import network module", "kohya"});
    T(Trainer::kKohya, 2, {"running training / ", "avr_loss", "generating sample images at step",
                           "\xe5\xad\xa6\xe7\xbf\x92\xe9\x96\x8b\xe5\xa7\x8b", "network_module", "--network_dim",
                           "enable lora for u-net", "create lora network"});
    T(Trainer::kMusubi, 20, {"musubi", "hv_train_network", "wan_train_network", "fpack_train_network",
                            "qwen_image_train_network", "flux_kontext_train_network", "hv_train.py",
                            "wan_cache_latents", "wan_cache_text_encoder", "networks.lora_wan",
                            "hv_generate_video", "cache_text_encoder_outputs.py", "lora_framepack",
                            "networks.lora_qwen_image", "networks.lora_flux_kontext", "hunyuan_model/"});
    T(Trainer::kDiffusionPipe, 8, {"diffusion-pipe", "diffusion_pipe", "--deepspeed", "iter time (s)",
                                   "micro_batch_size_per_gpu", "pipeline_stages", "deepspeed --num_gpus"});
    T(Trainer::kDiffusionPipe, 2, {"deepspeed", "blocks_to_swap =", "activation_checkpointing"});
    T(Trainer::kDiffusers, 6, {"train_dreambooth_lora", "train_text_to_image_lora", "train_dreambooth",
                               "train_text_to_image", "diffusers/examples", "examples/dreambooth",
                               "examples/text_to_image", "instantaneous batch size per device",
                               "total train batch size (w. parallel"});
    T(Trainer::kDiffusers, 1, {"***** running training *****", "num examples =", "log_validation",
                               "running validation...", "accelerate launch"});
    T(Trainer::kOneTrainer, 9, {"onetrainer", "generictrainer", "modules/trainer", "modules\\trainer",
                                "modules/modelsetup", "modules\\modelsetup", "mgds", "trainconfig",
                                "modules/util/", "modules\\util\\", "scripts/train.py --config-path"});
    T(Trainer::kSimpleTuner, 9, {"simpletuner", "helpers/training", "helpers\\training", "multidatabackend",
                                 "--model_family", "model_family", "helpers/data_backend", "helpers/caching",
                                 "helpers.training"});
    T(Trainer::kComfyUI, 9, {"comfyui", "comfy_extras", "nodes_train", "!!! exception during processing",
                             "custom_nodes", "comfy/", "comfy\\", "fluxtrainer", "prompt executed in",
                             "got prompt", "comfy.model_management", "execution.py"});
    T(Trainer::kLoraTrain, 20, {"oom-guard:", "lora-train"});
    // --- model families ---
    auto F = [&](ModelFamily f, int w, std::initializer_list<const char*> texts) {
      add(v, K::kFamily, static_cast<int>(f), texts, w);
    };
    F(ModelFamily::kFlux, 4, {"flux", "kontext", "fluxgym"});
    F(ModelFamily::kSdxl, 4, {"sdxl", "sd_xl", "stable-diffusion-xl", "stablediffusionxl", "is_xl", "sd-xl",
                              "xl_base", "xl-base"});
    F(ModelFamily::kSdxl, 1, {"illustrious", "noobai", "ponydiffusion", "pony_diffusion", "animagine"});
    F(ModelFamily::kSd15, 4, {"v1-5", "sd15", "sd1.5", "sd 1.5", "sd-v1", "stable-diffusion-v1",
                              "runwayml", "sd_v1", "arch: sd1", "sd1-5", "sd_1_5", "v1_5"});
    F(ModelFamily::kSd3, 4, {"sd3_", "sd3.", "sd3-", "sd35", "sd3 ", "stable-diffusion-3", "stablediffusion3",
                             "is_v3", "sd3_train", "sd3:"});
    F(ModelFamily::kWan, 4, {"wan2", "wan_", "wan-ai", "wan21", "wan22", "wan 2.", "'wan'", "\"wan\"", "wan2.1",
                             "wantransformer", "wan_video", "arch: wan"});
    F(ModelFamily::kHunyuan, 4, {"hunyuan", "hv_train", "hyvideo", "framepack", "fpack_"});
    F(ModelFamily::kLtx, 4, {"ltx-", "ltx_", "ltxv", "ltx2", "ltx ", "'ltx'", "ltxvideo", "ltx-video"});
    F(ModelFamily::kQwen, 4, {"qwen_image", "qwen-image", "qwenimage", "qwen image", "'qwen_image'"});
    F(ModelFamily::kLumina, 4, {"lumina"});
    F(ModelFamily::kHiDream, 4, {"hidream"});
    F(ModelFamily::kChroma, 4, {"chroma"});
    F(ModelFamily::kZImage, 4, {"z-image", "zimage", "z_image"});
    F(ModelFamily::kCogVideo, 4, {"cogvideo"});
    F(ModelFamily::kMochi, 4, {"mochi"});
    // --- settings ---
    auto S = [&](SettingId id, std::initializer_list<const char*> texts) { add(v, K::kSetting, id, texts); };
    S(kSetGradCkpt, {"gradient_checkpointing", "activation_checkpointing", "gradient checkpointing",
                     "grad_checkpointing", "gradient-checkpointing"});
    S(kSetBatch, {"batch_size", "train_batch_size", "micro_batch_size_per_gpu", "batch size per device",
                  "batch size:", "batch-size"});
    S(kSetAccum, {"gradient_accumulation_steps", "gradient_accumulation", "gradient accumulation steps",
                  "grad_accum"});
    S(kSetRank, {"network_dim", "lora_rank", "network_rank", "base dim (rank)", "linear", "rank", "lora_dim"});
    S(kSetResolution, {"resolution", "resolutions"});
    S(kSetFrames, {"num_frames", "target_frames", "frame_buckets", "video_length", "max_frames", "frame_count"});
    S(kSetPrecision, {"mixed_precision", "dtype", "train_dtype", "transformer_dtype", "weight_dtype"});
    S(kSetOptimizer, {"optimizer_type", "optimizer"});
    S(kSetLowVram, {"low_vram", "lowvram"});
    S(kSetQuantize, {"quantize", "base_model_precision"});
    S(kSetFp8Base, {"fp8_base", "fp8_scaled"});
    S(kSetBlocksToSwap, {"blocks_to_swap"});
    S(kSetDisableSampling, {"disable_sampling"});
    S(kSetSkipFirstSample, {"skip_first_sample"});
    S(kSetSampleAtFirst, {"sample_at_first"});
    S(kSetSampleEvery, {"sample_every", "sample_every_n_steps", "validation_steps"});
    S(kSetSampleSteps, {"sample_steps"});
    S(kSetWidth, {"width"});
    S(kSetHeight, {"height"});
    S(kSetXformers, {"xformers", "sdpa", "mem_eff_attn", "flash_attn", "sage_attn"});
    S(kSetCacheLatents, {"cache_latents"});
    S(kSetUse8bitAdam, {"use_8bit_adam", "use 8-bit adamw"});
    add(v, K::kBucket, 0, {"bucket", " files", " images"});
    return Matcher(std::move(v));
  }();
  return m;
}

// ---------------------------------------------------------------------------------------------
// State

struct Marker {
  int64_t seq = -1;
  int64_t line = 0;
  std::string text;
};

// Where the run was: the latest line of each activity and the training progress.
struct Activity {
  std::array<Marker, kMarkCount> markers;
  Marker progress;                 // latest training progress (bar or step line)
  int64_t completed = -1;          // steps completed per that progress (-1: none seen)
  int64_t total = -1;
  bool training_seen = false;      // a training bar/step line or "running training" was seen
  int64_t sample_at_step = -1;     // "generating sample images at step N" (kohya/musubi)
};

struct Frame {
  std::string func;
  std::string file;
};

struct CauseRecord {
  int count = 0;
  int fatal_count = 0;
  Marker first;       // first event after the latest training progress
  Marker last;
  Marker last_fatal;
  Activity at_first;  // activity snapshot when `first` happened
  bool has_frames = false;
  std::vector<Frame> frames;  // traceback that ended on this cause's exception line
};

struct Guard {
  bool seen = false;
  std::string phase;
  std::optional<int64_t> step;
  std::optional<int> batch;
  std::optional<int> frames;
  std::optional<int> bucket;
  bool exhausted = false;
  bool environment = false;
  bool oom = false;               // an "OOM in phase" / "ladder exhausted" line (not just a warning)
  bool host = false;              // "host RAM exhausted"
  std::string classification;     // the guard's own playbook class after the dash
  std::vector<std::string> actions;  // actions the guard already applied (bounded)
  Marker line;
};

constexpr int kCauseCount = static_cast<int>(Cause::kOther) + 1;
constexpr int kTrainerCount = static_cast<int>(Trainer::kLoraTrain) + 1;
constexpr int kFamilyCount = static_cast<int>(ModelFamily::kMochi) + 1;

}  // namespace

struct LogAnalyzer::State {
  int64_t seq = 0;
  int64_t lines = 0;
  Activity act;
  std::array<CauseRecord, kCauseCount> causes;
  bool oom_recovered_only = true;     // every GPU OOM hit so far was an AI Toolkit "skipping batch"
  int64_t last_oom_recovered_seq = -1;
  int64_t last_oom_hard_seq = -1;
  // Traceback being read.
  bool in_traceback = false;
  std::vector<Frame> frames;
  // Memory numbers from the latest allocator message.
  MemoryNumbers mem;
  int64_t mem_seq = -1;
  std::vector<int64_t> process_uses;  // "Process N has X memory in use" (bounded)
  Settings settings;
  std::array<int, kTrainerCount> trainer_score{};
  std::array<int, kFamilyCount> family_score{};
  std::vector<bool> seen_pattern;     // trainer/family patterns count once
  bool kohya_gui = false;
  Guard guard;
  Marker last_error_line;             // last line that looked like an error at all
  int64_t last_line_seq = -1;
  int oom_hard_count = 0;
  int oom_weak_count = 0;
  std::string low_buf;                // lowercase copy of the current line (reused)
};

namespace {

using State = LogAnalyzer::State;

// Raw text, capped; made valid UTF-8 only when it is reported (this runs for every progress line).
void set_marker(Marker& m, int64_t seq, int64_t line, std::string_view text) {
  m.seq = seq;
  m.line = line;
  m.text.assign(text.data(), std::min<size_t>(text.size(), 400));
}

// Parses the value after a settings key at `end` (position right after the key, in `low`).
// Returns the raw value token (lowercase) or "" when the key is not followed by a value.
struct Value {
  std::string token;        // first token, lowercase, quotes stripped
  std::vector<int> ints;    // all integers in a list/tuple value, or the single int
  bool flag = false;        // "--key" with no value: a switch that is on
};

Value value_after(std::string_view low, size_t key_pos, size_t end, bool loose) {
  Value v;
  bool dashed = key_pos >= 2 && low[key_pos - 1] == '-' && low[key_pos - 2] == '-';
  size_t i = end;
  // JSON keys: closing quote.
  if (i < low.size() && (low[i] == '"' || low[i] == '\'')) ++i;
  size_t sep_start = i;
  while (i < low.size() && low[i] == ' ') ++i;
  bool had_sep = false;
  if (i < low.size() && (low[i] == ':' || low[i] == '=')) {
    had_sep = true;
    ++i;
  } else if (loose) {
    // "batch size per device / バッチサイズ: 1": a separator within a short distance.
    size_t lim = std::min(low.size(), i + 40);
    for (size_t k = i; k < lim; ++k)
      if (low[k] == ':' || low[k] == '=') {
        had_sep = true;
        i = k + 1;
        break;
      }
  }
  if (!had_sep && !dashed) {
    // "Instantaneous batch size per device = 4" has '='; a bare word followed by a space is not a key.
    return v;
  }
  if (!had_sep) i = sep_start;
  while (i < low.size() && low[i] == ' ') ++i;
  if (dashed && !had_sep && (i >= low.size() || (i + 1 < low.size() && low[i] == '-' && low[i + 1] == '-'))) {
    v.flag = true;
    v.token = "true";
    return v;
  }
  if (i >= low.size()) return v;
  // List / tuple value: collect the integers up to the closing bracket.
  if (low[i] == '[' || low[i] == '(') {
    char close = low[i] == '[' ? ']' : ')';
    size_t k = i + 1;
    size_t lim = std::min(low.size(), i + 200);
    while (k < lim && low[k] != close) {
      if (is_digit(low[k]) && (k == 0 || !is_word(low[k - 1]))) {
        int64_t n = 0;
        while (k < low.size() && is_digit(low[k]) && n < 1000000) n = n * 10 + (low[k++] - '0');
        if (k < low.size() && low[k] == '.') {  // a float in the list: not a resolution
          while (k < low.size() && (is_digit(low[k]) || low[k] == '.')) ++k;
          continue;
        }
        v.ints.push_back(static_cast<int>(n));
      } else {
        ++k;
      }
    }
    v.token = "list";
    return v;
  }
  size_t q = i;
  if (low[q] == '"' || low[q] == '\'') ++q;
  size_t e = q;
  while (e < low.size() && low[e] != ' ' && low[e] != ',' && low[e] != '"' && low[e] != '\'' && low[e] != ')' &&
         low[e] != '}' && low[e] != ']' && low[e] != ';' && low[e] != '|')
    ++e;
  v.token = std::string(low.substr(q, e - q));
  if (!v.token.empty() && is_digit(v.token[0])) {
    // "1024,1024" (kohya --resolution) and "512x768" count as lists.
    int64_t n = 0;
    size_t k = q;
    while (k < low.size() && is_digit(low[k]) && n < 1000000) n = n * 10 + (low[k++] - '0');
    v.ints.push_back(static_cast<int>(n));
    if (k < low.size() && (low[k] == ',' || low[k] == 'x') && k + 1 < low.size() && is_digit(low[k + 1])) {
      ++k;
      int64_t m2 = 0;
      while (k < low.size() && is_digit(low[k]) && m2 < 1000000) m2 = m2 * 10 + (low[k++] - '0');
      v.ints.push_back(static_cast<int>(m2));
    }
  }
  return v;
}

std::optional<bool> as_bool(const Value& v) {
  const std::string& t = v.token;
  if (v.flag) return true;
  if (t == "true" || t == "yes" || t == "on" || t == "1" || t == "enabled" || t == "cpu_offloaded") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0" || t == "none" || t == "disabled" || t == "null") return false;
  return std::nullopt;
}

std::optional<int> max_int(const Value& v) {
  if (v.ints.empty()) return std::nullopt;
  return *std::max_element(v.ints.begin(), v.ints.end());
}

void add_resolutions(Settings& s, const std::vector<int>& values) {
  for (int r : values) {
    if (r < 64 || r > 16384) continue;
    if (std::find(s.resolutions.begin(), s.resolutions.end(), r) == s.resolutions.end() && s.resolutions.size() < 32)
      s.resolutions.push_back(r);
    if (!s.max_resolution || r > *s.max_resolution) s.max_resolution = r;
  }
  std::sort(s.resolutions.begin(), s.resolutions.end());
}

// A bucket WxH counts as the square side of the same area (832x1216 is a 1024 bucket), rounded to 64.
void add_bucket(Settings& s, int w, int h) {
  if (w < 64 || h < 64 || w > 16384 || h > 16384) return;
  int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(w) * h) / 64.0)) * 64;
  if (!s.max_resolution || side > *s.max_resolution) s.max_resolution = side;
}

bool printable_ascii(const std::string& t) {
  return std::all_of(t.begin(), t.end(), [](char c) { return c > 0x20 && c < 0x7F; });
}

void handle_setting(State& st, int id, std::string_view low, size_t pos, size_t end) {
  // Whole-word keys only: "vae_batch_size" is not "batch_size", "quantize_te" is not "quantize".
  if (pos > 0 && is_word(low[pos - 1]) && id != kSetUse8bitAdam) return;
  if (end < low.size() && is_word(low[end])) return;
  Settings& s = st.settings;
  if (id == kSetUse8bitAdam) {
    s.optimizer = "AdamW8bit";
    return;
  }
  bool loose = id == kSetBatch || id == kSetAccum || id == kSetRank;
  Value v = value_after(low, pos, end, loose);
  if (v.token.empty() && v.ints.empty()) return;
  switch (id) {
    case kSetGradCkpt:
      if (auto b = as_bool(v)) s.gradient_checkpointing = *b;
      break;
    case kSetBatch:
      if (auto n = max_int(v); n && *n >= 1 && *n <= 4096) s.batch_size = *n;
      break;
    case kSetAccum:
      if (auto n = max_int(v); n && *n >= 1 && *n <= 4096) s.gradient_accumulation = *n;
      break;
    case kSetRank:
      if (auto n = max_int(v); n && *n >= 1 && *n <= 4096) s.rank = *n;
      break;
    case kSetResolution: add_resolutions(s, v.ints); break;
    case kSetFrames:
      if (auto n = max_int(v); n && *n >= 1 && *n <= 10000) s.num_frames = std::max(s.num_frames.value_or(0), *n);
      break;
    case kSetPrecision:
      if (!v.token.empty() && v.token != "list" && v.token.size() < 24 && std::isalpha(static_cast<unsigned char>(v.token[0])) &&
          printable_ascii(v.token))
        s.precision = v.token;
      break;
    case kSetOptimizer:
      if (!v.token.empty() && v.token != "list" && v.token.size() < 48 && std::isalpha(static_cast<unsigned char>(v.token[0])) &&
          printable_ascii(v.token))
        s.optimizer = v.token;
      break;
    case kSetLowVram:
      if (auto b = as_bool(v)) s.low_vram = *b;
      break;
    case kSetQuantize:
      if (auto b = as_bool(v)) s.quantize = *b;
      else if (v.token.find("int8") != std::string::npos || v.token.find("fp8") != std::string::npos ||
               v.token.find("nf4") != std::string::npos || v.token.find("int4") != std::string::npos)
        s.quantize = true;
      break;
    case kSetFp8Base:
      if (auto b = as_bool(v); b && *b) s.quantize = true;
      break;
    case kSetBlocksToSwap:
      if (auto n = max_int(v); n && *n >= 0 && *n < 1000) s.blocks_to_swap = *n;
      break;
    case kSetDisableSampling:
      if (auto b = as_bool(v)) s.disable_sampling = *b;
      break;
    case kSetSkipFirstSample:
      if (auto b = as_bool(v)) s.skip_first_sample = *b;
      break;
    case kSetSampleAtFirst:
      if (auto b = as_bool(v)) s.sample_at_first = *b;
      break;
    case kSetSampleEvery:
      if (auto n = max_int(v); n && *n >= 0) s.sample_every = *n;
      break;
    case kSetSampleSteps:
      if (auto n = max_int(v); n && *n >= 1 && *n < 10000) s.sample_steps = *n;
      break;
    case kSetWidth:
      if (auto n = max_int(v); n && *n >= 64 && *n <= 16384) s.sample_width = *n;
      break;
    case kSetHeight:
      if (auto n = max_int(v); n && *n >= 64 && *n <= 16384) s.sample_height = *n;
      break;
    case kSetXformers:
      if (auto b = as_bool(v)) s.memory_efficient_attention = *b || s.memory_efficient_attention.value_or(false);
      break;
    case kSetCacheLatents:
      if (auto b = as_bool(v)) s.cache_latents = *b;
      break;
    default: break;
  }
}

// tqdm bar: "desc:  12%|#2        | 12/100 [00:10<01:00,  1.50it/s, loss=0.1]".
struct Bar {
  std::string desc;  // lowercase, trimmed, ':' removed
  int64_t n = 0;
  int64_t total = 0;
  std::string postfix;  // lowercase
};

std::optional<Bar> parse_bar(std::string_view low) {
  size_t pct = low.find("%|");
  if (pct == std::string_view::npos) return std::nullopt;
  size_t d = pct;
  while (d > 0 && (is_digit(low[d - 1]) || low[d - 1] == '.')) --d;
  if (d == pct) return std::nullopt;
  Bar b;
  std::string_view desc = low.substr(0, d);
  while (!desc.empty() && (desc.back() == ' ' || desc.back() == ':')) desc.remove_suffix(1);
  // A bar glued after log text: keep only the tail after the last ']' or '|'.
  size_t cut = desc.find_last_of("]|");
  if (cut != std::string_view::npos && desc.size() - cut < 80) desc.remove_prefix(cut + 1);
  while (!desc.empty() && desc.front() == ' ') desc.remove_prefix(1);
  if (desc.size() > 80) desc = desc.substr(desc.size() - 80);
  b.desc = std::string(desc);
  size_t bar_end = low.find('|', pct + 2);
  if (bar_end == std::string_view::npos) return std::nullopt;
  size_t i = bar_end + 1;
  while (i < low.size() && low[i] == ' ') ++i;
  size_t s0 = i;
  while (i < low.size() && is_digit(low[i])) b.n = b.n * 10 + (low[i++] - '0');
  if (i == s0 || i >= low.size() || low[i] != '/') return std::nullopt;
  ++i;
  size_t s1 = i;
  while (i < low.size() && is_digit(low[i]) && b.total < (int64_t(1) << 40)) b.total = b.total * 10 + (low[i++] - '0');
  if (i == s1) return std::nullopt;
  size_t lb = low.find('[', i);
  if (lb != std::string_view::npos) {
    size_t rb = low.find(']', lb);
    b.postfix = std::string(low.substr(lb, (rb == std::string_view::npos ? low.size() : rb) - lb));
  }
  return b;
}

bool contains(std::string_view s, std::string_view w) { return s.find(w) != std::string_view::npos; }

void record_training_progress(State& st, int64_t completed, int64_t total, int64_t line, std::string_view text) {
  Activity& a = st.act;
  a.training_seen = true;
  set_marker(a.progress, st.seq, line, text);
  a.completed = completed;
  if (total > 0) a.total = total;
}

void handle_bar(State& st, std::string_view low, std::string_view text, int64_t line) {
  auto bar = parse_bar(low);
  if (!bar) return;
  const std::string& d = bar->desc;
  Activity& a = st.act;
  bool has_loss = contains(bar->postfix, "loss") || contains(bar->postfix, "lr:") || contains(bar->postfix, "lr=");
  auto mark = [&](int id) { set_marker(a.markers[id], st.seq, line, text); };
  if (has_loss && !contains(d, "validat") && !contains(d, "sampl") && !contains(d, "generat")) {
    record_training_progress(st, bar->n, bar->total, line, text);
    return;
  }
  if (d.rfind("map", 0) == 0 || d.rfind("filter", 0) == 0 || contains(d, "split")) return mark(kMarkCache);
  if (contains(d, "cach") || contains(d, "encod") || contains(d, "latent")) return mark(kMarkCache);
  if (contains(d, "quantiz")) return mark(kMarkQuantize);
  if (contains(d, "load") || contains(d, "shard") || contains(d, "fetch") || contains(d, "download") ||
      contains(d, "prepar") || contains(d, "bucket") || contains(d, "scan") || contains(d, "check") ||
      contains(d, "resiz") || contains(d, "extract") || contains(d, "caption") || contains(d, "process") ||
      contains(d, "convert") || contains(d, "attach"))
    return a.training_seen ? void() : mark(kMarkLoad);
  if (contains(d, "generat") || contains(d, "sampl") || contains(d, "validat") || contains(d, "inference") ||
      contains(d, "denois") || contains(d, "preview")) {
    if (contains(d, "validation step") && has_loss) return;  // kohya validation loss, not images
    return mark(kMarkSample);
  }
  if (contains(d, "sav")) return mark(kMarkSave);
  if (contains(d, "epoch") && !contains(d, "step")) {
    // OneTrainer's epoch bar counts epochs, not steps: training has started, step unknown.
    a.training_seen = true;
    if (a.markers[kMarkTrainStart].seq < 0) mark(kMarkTrainStart);
    return;
  }
  if (contains(d, "step") || contains(d, "train") || contains(d, "epoch") || has_loss ||
      (!d.empty() && bar->total >= 50)) {
    record_training_progress(st, bar->n, bar->total, line, text);
  }
  // A bar without a description belongs to whatever activity is under way (sampling steps,
  // caching batches): it changes nothing.
}

// "steps: 10 loss: 0.1 iter time (s): ..." (DeepSpeed in diffusion-pipe), "step 12/2000 | loss ..."
// (lora-train), "Step 3: loss=..." and similar step lines that carry a loss.
void handle_steps_text(State& st, std::string_view low, size_t pos, size_t end, std::string_view text, int64_t line) {
  if (pos > 0 && is_word(low[pos - 1])) return;
  if (low.find("%|") != std::string_view::npos) return;  // a tqdm bar: handled by handle_bar
  if (!contains(low, "loss") && !contains(low, "s/it") && !contains(low, "it/s")) return;
  size_t i = end;
  while (i < low.size() && (low[i] == ' ' || low[i] == ':' || low[i] == '=' || low[i] == '#')) ++i;
  if (i >= low.size() || !is_digit(low[i])) return;
  int64_t n = 0;
  while (i < low.size() && is_digit(low[i]) && n < (int64_t(1) << 40)) n = n * 10 + (low[i++] - '0');
  int64_t total = -1;
  if (i + 1 < low.size() && low[i] == '/' && is_digit(low[i + 1])) {
    total = 0;
    ++i;
    while (i < low.size() && is_digit(low[i]) && total < (int64_t(1) << 40)) total = total * 10 + (low[i++] - '0');
  }
  record_training_progress(st, n, total, line, text);
}

void handle_mem(State& st, std::string_view low, std::string_view text) {
  MemoryNumbers& m = st.mem;
  auto size_after = [&](std::string_view key) -> std::optional<int64_t> {
    size_t p = low.find(key);
    if (p == std::string_view::npos) return std::nullopt;
    size_t q = p + key.size();
    while (q < low.size() && (low[q] == ' ' || low[q] == ':')) ++q;
    return parse_size_at(low, q);
  };
  // A size right before `key` ("7.25 gib already allocated").
  auto size_before = [&](std::string_view key) -> std::optional<int64_t> {
    size_t p = low.find(key);
    if (p == std::string_view::npos || p == 0) return std::nullopt;
    size_t e = p;
    while (e > 0 && low[e - 1] == ' ') --e;
    size_t b = e;
    while (b > 0 && (std::isalpha(static_cast<unsigned char>(low[b - 1])))) --b;  // unit
    while (b > 0 && low[b - 1] == ' ') --b;
    while (b > 0 && (is_digit(low[b - 1]) || low[b - 1] == '.' || low[b - 1] == ',')) --b;
    return parse_size_at(low, b);
  };
  bool touched = false;
  auto set = [&](std::optional<int64_t>& field, std::optional<int64_t> v) {
    if (v) {
      field = v;
      touched = true;
    }
  };
  if (auto t = size_after("tried to allocate")) {
    // A new allocator message: forget the numbers of the previous one.
    m = MemoryNumbers{};
    st.process_uses.clear();
    set(m.tried_to_allocate, t);
  }
  // New format (PyTorch >= 2.1).
  if (contains(low, "total capacity of")) {
    m.new_format = true;
    set(m.total, size_after("total capacity of"));
    size_t p = low.find("of which");
    if (p != std::string_view::npos) set(m.free, parse_size_at(low, p + 8));
  }
  if (contains(low, "this process has")) set(m.process_in_use, size_after("this process has"));
  set(m.allocated_by_pytorch, size_before("is allocated by pytorch"));
  set(m.reserved_unallocated, size_before("is reserved by pytorch but unallocated"));
  // "Process 1234 has 3.20 GiB memory in use" (other processes on the same GPU).
  for (size_t p = low.find("process "); p != std::string_view::npos; p = low.find("process ", p + 8)) {
    size_t q = p + 8;
    if (q >= low.size() || !is_digit(low[q])) continue;
    while (q < low.size() && is_digit(low[q])) ++q;
    if (low.compare(q, 5, " has ") != 0) continue;
    auto v = parse_size_at(low, q + 5);
    if (v && st.process_uses.size() < 16) {
      st.process_uses.push_back(*v);
      touched = true;
    }
  }
  // Old format: "(GPU 0; 8.00 GiB total capacity; 7.25 GiB already allocated; 0 bytes free; 7.31 GiB
  // reserved in total by PyTorch)".
  if (contains(low, "gib total capacity") || contains(low, "mib total capacity") || contains(low, " total capacity;")) {
    set(m.total, size_before("total capacity"));
  }
  if (contains(low, "already allocated")) set(m.allocated_by_pytorch, size_before("already allocated"));
  if (contains(low, "free;") || contains(low, "free)")) {
    size_t p = low.find(" free");
    if (p != std::string_view::npos && !contains(low, "of which")) set(m.free, size_before(" free"));
  }
  if (auto r = size_before("reserved in total by pytorch")) {
    touched = true;
    if (m.allocated_by_pytorch && *r >= *m.allocated_by_pytorch) m.reserved_unallocated = *r - *m.allocated_by_pytorch;
  }
  // ComfyUI / memory-fraction message, MPS message.
  if (contains(low, "currently allocated")) set(m.allocated_by_pytorch, size_after("currently allocated"));
  if (low.rfind("requested", 0) == 0) set(m.tried_to_allocate, size_after("requested"));
  if (contains(low, "device limit")) set(m.total, size_after("device limit"));
  if (contains(low, "free (according to cuda)")) set(m.free, size_after("free (according to cuda)"));
  if (contains(low, "mps allocated")) {
    set(m.allocated_by_pytorch, size_after("mps allocated"));
    set(m.total, size_after("max allowed"));
  }
  (void)text;
  if (touched) st.mem_seq = st.seq;
}

void handle_guard(State& st, std::string_view text, std::string_view low, int64_t line) {
  Guard& g = st.guard;
  bool failure = contains(low, "oom in phase") || contains(low, "ladder exhausted") || contains(low, "give up") ||
                 contains(low, "host ram exhausted") || contains(low, "oom-guard: environment");
  if (!failure) {
    // "only X of Y is free at start": memory held by something else before the run began.
    if (contains(low, "is free at start")) g.environment = true;
    return;
  }
  g.seen = true;
  if (contains(low, "host ram exhausted")) g.host = true;
  else g.oom = true;
  set_marker(g.line, st.seq, line, text);
  // "oom-guard: OOM in phase train_step(step 3, bucket 512x512, batch 4) — early_steps; action: ..."
  size_t dash = low.find("\xe2\x80\x94 ");
  if (dash != std::string_view::npos) {
    size_t q = dash + 4, e = q;
    while (e < low.size() && is_word(low[e])) ++e;
    g.classification = std::string(low.substr(q, e - q));
  }
  size_t p = low.find("phase ");
  if (p != std::string_view::npos) {
    size_t q = p + 6;
    size_t e = q;
    while (e < low.size() && (is_word(low[e]))) ++e;
    g.phase = std::string(low.substr(q, e - q));
  }
  auto num_after = [&](std::string_view key) -> std::optional<int64_t> {
    size_t k = low.find(key);
    if (k == std::string_view::npos) return std::nullopt;
    return int_after(low, k + key.size(), 4);
  };
  // describe() prints step 0 / bucket 0x0 / batch 0 outside training steps: those are "unknown".
  if (auto s = num_after("step "); s && *s >= 1) g.step = *s;
  if (auto b = num_after("batch "); b && *b >= 1) g.batch = static_cast<int>(*b);
  if (auto f = num_after("frames "); f && *f >= 1) g.frames = static_cast<int>(*f);
  size_t bk = low.find("bucket ");
  if (bk != std::string_view::npos) {
    auto w = int_after(low, bk + 7, 3);
    size_t x = low.find('x', bk + 7);
    if (w && x != std::string_view::npos) {
      auto h = int_after(low, x + 1, 2);
      int side = static_cast<int>(std::max<int64_t>(*w, h.value_or(0)));
      if (side >= 64) g.bucket = side;
    }
  }
  if (contains(low, "ladder exhausted")) g.exhausted = true;
  if (contains(low, "oom-guard: environment")) g.environment = true;
  size_t act = low.find("action: ");
  if (act != std::string_view::npos && g.actions.size() < 16) g.actions.push_back(std::string(low.substr(act + 8, 80)));
  // The guard states what it already changed: those fixes are done.
  // The guard's action lines read "<key>: <old> -> <new>" (src/memory/ladder.cpp).
  if (contains(low, "gradient_checkpointing: false -> true") || contains(low, "gradient_checkpointing=true"))
    st.settings.gradient_checkpointing = true;
  if (g.batch) st.settings.batch_size = *g.batch;
  if (contains(low, "train.batch_size: ") && contains(low, " -> 1")) st.settings.batch_size = 1;
  if (g.frames) st.settings.num_frames = *g.frames;
  if (g.bucket && (!st.settings.max_resolution || *g.bucket > *st.settings.max_resolution)) st.settings.max_resolution = *g.bucket;
}

void handle_bucket(State& st, std::string_view low) {
  // kohya: "bucket 0: resolution (512, 768), count: 10"; musubi: "(960, 544, 45)"; AI Toolkit
  // "Bucket sizes for ...: 832x480x41f: 12 files" / "1024x1024: 20 files".
  size_t p = low.find('(');
  std::vector<int> nums;
  if (p != std::string_view::npos) {
    size_t e = low.find(')', p);
    for (size_t i = p + 1; i < std::min(low.size(), e == std::string_view::npos ? low.size() : e); ++i) {
      if (is_digit(low[i]) && !is_word(low[i - 1])) {
        int n = 0;
        while (i < low.size() && is_digit(low[i]) && n < 100000) n = n * 10 + (low[i++] - '0');
        nums.push_back(n);
      }
    }
    if (nums.size() >= 2) add_bucket(st.settings, nums[0], nums[1]);
    if (nums.size() == 3 && nums[2] >= 1 && nums[2] < 2000)
      st.settings.num_frames = std::max(st.settings.num_frames.value_or(0), nums[2]);
  }
}

// "832x480x41f" / "1024x1024" anywhere in a line that mentions buckets or files.
void handle_wxh(State& st, std::string_view low) {
  for (size_t i = 1; i + 2 < low.size(); ++i) {
    if (low[i] != 'x' || !is_digit(low[i - 1]) || !is_digit(low[i + 1])) continue;
    size_t b = i;
    while (b > 0 && is_digit(low[b - 1])) --b;
    if (b > 0 && is_word(low[b - 1])) continue;
    int w = 0, h = 0;
    for (size_t k = b; k < i; ++k) w = std::min(100000, w * 10 + (low[k] - '0'));
    size_t k = i + 1;
    while (k < low.size() && is_digit(low[k])) h = std::min(100000, h * 10 + (low[k++] - '0'));
    if (w < 64 || h < 64) continue;
    add_bucket(st.settings, w, h);
    if (k + 1 < low.size() && low[k] == 'x' && is_digit(low[k + 1])) {
      int f = 0;
      size_t m = k + 1;
      while (m < low.size() && is_digit(low[m])) f = std::min(100000, f * 10 + (low[m++] - '0'));
      if (m < low.size() && low[m] == 'f' && f >= 1) st.settings.num_frames = std::max(st.settings.num_frames.value_or(0), f);
    }
  }
}

bool killed_line(std::string_view low) {
  // "Killed", "./train.sh: line 3: 1234 Killed  python train.py", "zsh: killed  python ...",
  // "[1]+  Killed   accelerate launch ...". Not "DataLoader worker (pid 1) is killed by signal".
  std::string_view t = low;
  while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
  if (contains(t, "worker")) return false;
  if (t.size() > 400) return false;
  if (t == "killed" || t.rfind("killed ", 0) == 0) return true;
  size_t p = t.find("killed");
  if (p == std::string_view::npos) return false;
  if (p + 6 < t.size() && is_word(t[p + 6])) return false;
  if (p > 0 && is_word(t[p - 1])) return false;
  // Preceded by a pid or a shell prefix.
  size_t b = p;
  while (b > 0 && t[b - 1] == ' ') --b;
  if (b > 0 && (is_digit(t[b - 1]) || t[b - 1] == ':' || t[b - 1] == '+' || t[b - 1] == ']')) return true;
  return contains(t, "process killed") || contains(t, "was killed") || contains(t, "got killed") ||
         contains(t, "been killed") || contains(t, "killed by the") || contains(t, "signal: killed");
}

bool nan_after_loss(std::string_view low, size_t pos) {
  // "loss=nan", "loss: nan", "avr_loss=nan", "loss is nan", "loss = inf", "step_loss=nan".
  size_t i = pos + 4;
  size_t lim = std::min(low.size(), i + 14);
  while (i < lim && (is_word(low[i]) || low[i] == '/')) ++i;  // "loss/current", "loss_avg"
  while (i < lim && (low[i] == ' ' || low[i] == '=' || low[i] == ':' || low[i] == '"' || low[i] == '\'')) ++i;
  if (low.compare(i, 3, "is ") == 0) i += 3;
  for (std::string_view w : {"nan", "inf", "-inf", "+inf"}) {
    if (low.compare(i, w.size(), w) == 0) {
      size_t e = i + w.size();
      if (e >= low.size() || !is_word(low[e])) return true;
    }
  }
  return false;
}

}  // namespace

LogAnalyzer::LogAnalyzer() : s_(std::make_unique<State>()) { s_->seen_pattern.assign(matcher().size(), false); }
LogAnalyzer::~LogAnalyzer() = default;

void LogAnalyzer::feed(const LogLine& line) {
  State& st = *s_;
  ++st.seq;
  st.lines = std::max(st.lines, line.number);
  std::string_view text = line.text;
  std::string& low = st.low_buf;
  low.resize(text.size());
  std::transform(text.begin(), text.end(), low.begin(), lower);
  std::string_view lowv = low;
  const Matcher& m = matcher();

  // Fast path for the bulk of big logs: an overwritten tqdm redraw. Only its progress (and a NaN
  // loss in its postfix) matters; the last redraw of a line goes through the full path.
  if (line.redraw && !st.in_traceback && lowv.find("%|") != std::string_view::npos && lowv.size() < 400) {
    handle_bar(st, lowv, text, line.number);
    return;
  }

  // Collect hits (bounded per line).
  struct Hit {
    uint16_t id;
    uint32_t pos;
  };
  Hit hits[64];
  int nhits = 0;
  m.scan(lowv, [&](size_t id, size_t pos) {
    if (nhits < 64) hits[nhits++] = {static_cast<uint16_t>(id), static_cast<uint32_t>(pos)};
  });
  if (nhits == 0) {
    if (st.in_traceback) {
      std::string_view b = strip_prefix(text);
      if (!b.empty() && b[0] != ' ') st.in_traceback = false;
    }
    return;
  }

  std::string_view body = strip_prefix(text);
  std::string_view exc = exception_class(body);
  bool is_exception = !exc.empty();
  std::string_view body_low = lowv.substr(lowv.size() - body.size());
  bool error_level = body_low.rfind("error", 0) == 0 || body_low.rfind("[error]", 0) == 0 ||
                     body_low.rfind("critical", 0) == 0 || body_low.rfind("fatal", 0) == 0 ||
                     contains(lowv, "!!! exception during processing") || contains(lowv, "error running job") ||
                     contains(lowv, "| error |") || contains(lowv, "[error]") || contains(lowv, " error: ");
  bool fatal_line = is_exception || error_level;

  // Traceback bookkeeping: frames, and the line that ends a traceback.
  bool frame_line = false;
  bool traceback_start = false;
  for (int h = 0; h < nhits; ++h) {
    K k = m.pattern(hits[h].id).kind;
    if (k == K::kTraceback) traceback_start = true;
    if (k == K::kFrame && st.in_traceback) frame_line = true;
  }
  bool traceback_end = st.in_traceback && !frame_line && !traceback_start && !body.empty() && body[0] != ' ' &&
                       !contains(lowv, "during handling of the above") && !contains(lowv, "the above exception");
  // Inside a traceback, file paths and code lines mention "quantize", "sample", "load_model"...:
  // activity comes from the frames there, not from markers.
  bool tb_body = st.in_traceback && !traceback_end;
  // lora-train's guard lines are read by handle_guard alone: their "(step N, bucket WxH, batch B)"
  // must not be taken for other trainers' bucket or settings lines.
  const bool guard_line = contains(lowv, "oom-guard:");
  bool mem_line = false;
  bool bucket_line = false;

  // Per-line cause flags.
  std::array<bool, kCauseCount> line_cause{};
  bool oom_recovered = false;
  bool oom_hard = false;
  bool oom_weak = false;

  for (int h = 0; h < nhits; ++h) {
    const Pattern& p = m.pattern(hits[h].id);
    size_t pos = hits[h].pos;
    size_t end = pos + p.text.size();
    switch (p.kind) {
      case K::kOom:
        if (p.text == "tried to allocate" && !(contains(lowv, "gib") || contains(lowv, "mib") || contains(lowv, "bytes") ||
                                               contains(lowv, " gb") || contains(lowv, " mb") || contains(lowv, "kib")))
          break;
        if (p.text == "allocation on device" && !contains(lowv, "out of memory") && !contains(lowv, "exceed")) break;
        oom_hard = true;
        break;
      case K::kOomWeak: oom_weak = true; break;
      case K::kOomRecovered: oom_recovered = true; break;
      case K::kOomFatalInARow:
        if (contains(lowv, "oom")) oom_hard = true;
        break;
      case K::kHostOom:
        if (p.text == "memoryerror" && (pos > 0 && is_word(lowv[pos - 1])) && !contains(lowv, "arraymemoryerror")) break;
        if (p.text == "signal 9" && contains(lowv, "worker")) break;
        if ((p.text == "paging file" || p.text == "system ram" || p.text == "killed process") && !fatal_line &&
            !contains(lowv, "too small") && !contains(lowv, "out of memory"))
          break;
        if (p.text == "unable to allocate" && !(contains(lowv, "array") || contains(lowv, "gib for"))) break;
        line_cause[static_cast<int>(Cause::kHostOom)] = true;
        break;
      case K::kKilled:
        if (killed_line(lowv)) line_cause[static_cast<int>(Cause::kHostOom)] = true;
        break;
      case K::kExitCode: {
        auto code = int_after(lowv, end, 12);
        if (code && (*code == 137 || *code == -9 || *code == 247)) line_cause[static_cast<int>(Cause::kHostOom)] = true;
        break;
      }
      case K::kDataLoader:
        if (p.text == "exited unexpectedly" && !contains(lowv, "worker")) break;
        if (p.text == "bus error" && !contains(lowv, "worker") && !contains(lowv, "shm") && !contains(lowv, "shared memory"))
          break;
        if (p.text == "/dev/shm" && !(contains(lowv, "no space") || contains(lowv, "error") || contains(lowv, "insufficient")))
          break;
        if (p.text == "worker (pid" && !(contains(lowv, "killed") || contains(lowv, "exited"))) break;
        line_cause[static_cast<int>(Cause::kDataLoaderWorker)] = true;
        break;
      case K::kNanWord: line_cause[static_cast<int>(Cause::kNanLoss)] = true; break;
      case K::kLoss:
        if (nan_after_loss(lowv, pos)) line_cause[static_cast<int>(Cause::kNanLoss)] = true;
        break;
      case K::kGpuFault:
        if (p.text == "device-side assert" && !fatal_line) break;
        if (p.text == "ecc error" && !fatal_line) break;
        line_cause[static_cast<int>(Cause::kGpuFault)] = true;
        break;
      case K::kXid:
        if (end < lowv.size() && (is_digit(lowv[end]) || lowv[end] == '(')) line_cause[static_cast<int>(Cause::kGpuFault)] = true;
        break;
      case K::kMissingFile:
        if (fatal_line) line_cause[static_cast<int>(Cause::kMissingFile)] = true;
        break;
      case K::kVersion:
        if (p.text == "has no attribute" && !contains(lowv, "module ")) break;
        if (is_exception || (error_level && p.text != "is not supported" && p.text != "incompatible"))
          line_cause[static_cast<int>(Cause::kVersionMismatch)] = true;
        break;
      case K::kErrorWord: break;
      case K::kTraceback:
        st.in_traceback = true;
        st.frames.clear();
        break;
      case K::kDuringHandling: st.in_traceback = false; break;
      case K::kFrame:
        if (st.in_traceback) {
          // File "C:\x\train_network.py", line 1234, in train
          size_t q = end;
          size_t qe = lowv.find('"', q);
          if (qe == std::string_view::npos) break;
          std::string_view path = text.substr(q, qe - q);
          size_t slash = path.find_last_of("/\\");
          Frame f;
          f.file = to_valid_utf8(path.substr(slash == std::string_view::npos ? 0 : slash + 1));
          std::transform(f.file.begin(), f.file.end(), f.file.begin(), lower);
          size_t in = lowv.find(", in ", qe);
          if (in != std::string_view::npos) {
            size_t fs = in + 5, fe = fs;
            while (fe < lowv.size() && (is_word(lowv[fe]) || lowv[fe] == '<' || lowv[fe] == '>')) ++fe;
            f.func = std::string(lowv.substr(fs, fe - fs));
          }
          if (st.frames.size() >= 96) st.frames.erase(st.frames.begin() + 48);  // keep outer and inner frames
          st.frames.push_back(std::move(f));
        }
        break;
      case K::kProgress:
        if (!tb_body) handle_bar(st, lowv, text, line.number);
        break;
      case K::kStepsText:
        if (!tb_body) handle_steps_text(st, lowv, pos, end, text, line.number);
        break;
      case K::kEpoch:
        // kohya/musubi "epoch 1/16", SimpleTuner "Epoch 1/10": the training loop has begun.
        if (!tb_body && (pos == 0 || !is_word(lowv[pos - 1])) && lowv.find("%|") == std::string_view::npos) {
          size_t q = end;
          if (q < lowv.size() && is_digit(lowv[q])) {
            while (q < lowv.size() && is_digit(lowv[q])) ++q;
            if (q < lowv.size() && lowv[q] == '/') {
              st.act.training_seen = true;
              set_marker(st.act.markers[kMarkTrainStart], st.seq, line.number, text);
            }
          }
        }
        break;
      case K::kMarker: {
        int id = p.arg;
        if (tb_body) break;
        // Whole words: "loading model" must not be "preloading models"? (prefix ok), "caching t" ok.
        if (pos > 0 && is_word(lowv[pos - 1]) && id != kMarkQuantize) break;
        // After training began, loading/caching lines are rarely what runs at the failure; ignore
        // them unless no step completed yet.
        if ((id == kMarkLoad || id == kMarkCache) && st.act.training_seen && st.act.completed > 0) break;
        if (id == kMarkTrainStart) st.act.training_seen = st.act.training_seen || p.text != "training lora";
        set_marker(st.act.markers[id], st.seq, line.number, text);
        break;
      }
      case K::kSampleAtStep: {
        if (tb_body) break;
        auto n = int_after(lowv, end, 24);
        st.act.sample_at_step = n.value_or(-1);
        set_marker(st.act.markers[(n && *n == 0) ? kMarkBaseline : kMarkSample], st.seq, line.number, text);
        break;
      }
      case K::kGuard:
        handle_guard(st, text, lowv, line.number);
        if (contains(lowv, "host ram exhausted")) line_cause[static_cast<int>(Cause::kHostOom)] = true;
        break;
      case K::kMem: mem_line = true; break;
      case K::kTrainer:
        if (!st.seen_pattern[hits[h].id]) {
          st.seen_pattern[hits[h].id] = true;
          st.trainer_score[p.arg] += p.weight;
        }
        if (p.text == "kohya" && (contains(lowv, "kohya_ss") || contains(lowv, "kohya_gui"))) st.kohya_gui = true;
        break;
      case K::kFamily:
        if (!st.seen_pattern[hits[h].id]) {
          st.seen_pattern[hits[h].id] = true;
          st.family_score[p.arg] += p.weight;
        } else if (st.family_score[p.arg] < 1000) {
          st.family_score[p.arg] += 1;  // repeated mentions add a little
        }
        break;
      case K::kSetting:
        if (!tb_body && !guard_line) handle_setting(st, p.arg, lowv, pos, end);
        break;
      case K::kBucket: bucket_line = !tb_body && !guard_line; break;
      case K::kFramesKey: break;
    }
  }
  if (contains(lowv, "gui") && contains(lowv, "kohya")) st.kohya_gui = true;
  if (mem_line) handle_mem(st, lowv, text);
  if (bucket_line) {
    handle_bucket(st, lowv);
    handle_wxh(st, lowv);
  }

  bool any_oom = oom_hard || oom_recovered || oom_weak;
  if (any_oom) {
    Cause c = Cause::kGpuOom;
    line_cause[static_cast<int>(c)] = true;
    if (oom_hard || oom_weak) {
      st.oom_recovered_only = false;
      st.last_oom_hard_seq = st.seq;
      if (oom_hard) ++st.oom_hard_count;
      else ++st.oom_weak_count;
    } else {
      st.last_oom_recovered_seq = st.seq;
    }
  }
  bool any_cause = false;
  for (int c = 1; c < kCauseCount; ++c) any_cause = any_cause || line_cause[c];
  // An exception of no known kind is "other"; generic wrappers (accelerate's CalledProcessError
  // "returned non-zero exit status 1") carry no cause of their own.
  if (!any_cause && is_exception && !contains(lowv, "non-zero exit status") && !contains(lowv, "calledprocesserror"))
    line_cause[static_cast<int>(Cause::kOther)] = true;

  for (int c = 1; c < kCauseCount; ++c) {
    if (!line_cause[c]) continue;
    CauseRecord& r = st.causes[c];
    ++r.count;
    bool fatal = fatal_line || c == static_cast<int>(Cause::kHostOom) || c == static_cast<int>(Cause::kDataLoaderWorker) ||
                 (c == static_cast<int>(Cause::kGpuOom) && oom_hard);
    if (r.first.seq < 0 || st.act.progress.seq > r.first.seq) {
      set_marker(r.first, st.seq, line.number, text);
      r.at_first = st.act;
    }
    set_marker(r.last, st.seq, line.number, text);
    if (fatal) {
      ++r.fatal_count;
      set_marker(r.last_fatal, st.seq, line.number, text);
    }
    if (traceback_end || (st.in_traceback && is_exception)) {
      r.frames = st.frames;
      r.has_frames = !st.frames.empty();
    }
  }
  if (fatal_line) set_marker(st.last_error_line, st.seq, line.number, text);
  if (traceback_end) st.in_traceback = false;
}

// ---------------------------------------------------------------------------------------------
// finish(): verdict, phase, numbers.

namespace {

bool func_has(const std::string& f, std::string_view w) { return f.find(w) != std::string::npos; }

// What the traceback says was running: a Stage, or kUnknown when its frames are not telling.
Stage stage_from_frames(const std::vector<Frame>& frames, bool* strong) {
  *strong = true;
  for (const Frame& f : frames) {
    const std::string& n = f.func;
    if (func_has(n, "sample_image") || func_has(n, "validation") || n == "generate_images" || n == "generate_image" ||
        n == "log_validations" || n == "sample_images_common" || n == "do_sample" || n == "generate_sample_images" ||
        n == "sample_video" || n == "run_sampling" || n == "_sample_images" || func_has(n, "sample_prompt"))
      return Stage::kSampling;
  }
  for (const Frame& f : frames) {
    const std::string& n = f.func;
    if (func_has(n, "backward") || n == "hook_train_loop" || n == "train_single_accumulation" || n == "fwd_bwd" ||
        n == "training_step" || func_has(n, "train_step") || n == "process_batch" || n == "get_noise_pred_and_target" ||
        n == "call_unet" || n == "call_dit" || n == "calculate_loss" || n == "compute_loss" || n == "train_batch" ||
        func_has(n, "_exec_forward_pass") || n == "predict_noise" || n == "train_one_step" || n == "_train_epoch" ||
        f.file == "nodes_train.py" || n == "loss_fn" || n == "get_loss" || n == "training_loop")
      return Stage::kTrainingStep;
  }
  for (const Frame& f : frames) {
    const std::string& n = f.func;
    if (func_has(n, "cache") || n == "encode_images" || n == "encode_latents" || func_has(n, "precompute"))
      return Stage::kCaching;
  }
  for (const Frame& f : frames)
    if (func_has(f.func, "quantiz") || f.func == "requantize" || f.func == "freeze" || f.func == "optimize_state_dict_with_fp8")
      return Stage::kQuantize;
  for (const Frame& f : frames) {
    const std::string& n = f.func;
    if (n == "load_model" || n == "load_target_model" || n == "load_models" || func_has(n, "from_pretrained") ||
        n == "from_single_file" || n == "load_state_dict" || n == "load_checkpoint" || func_has(n, "load_safetensors") ||
        n == "load_dit_model" || n == "load_transformer" || n == "load_vae" || func_has(n, "load_text_encoder") ||
        n == "_load_pretrained_model" || n == "move_to_device" || n == "load_lora" || n == "load_weights" ||
        n == "load_network" || func_has(n, "load_model") || n == "load_flow_model" || n == "load_ae" ||
        n == "load_t5" || n == "load_clip" || n == "prepare_model" || n == "load_file" || n == "load_sd" ||
        n == "set_device_state" || n == "load_dit" || n.rfind("load", 0) == 0 || n.rfind("_load", 0) == 0)
      return Stage::kModelLoad;
  }
  *strong = false;
  for (const Frame& f : frames)
    if (f.func == "sample" || f.func == "generate" || f.func == "denoise" || f.func == "sample_euler") return Stage::kSampling;
  for (const Frame& f : frames)
    if (f.func == "to" || f.func == "cuda" || f.func == "_apply" || f.func == "prepare" || f.func == "convert")
      return Stage::kModelLoad;
  return Stage::kUnknown;
}

Stage stage_from_activity(const Activity& a, int64_t* at_seq) {
  // The most recent marker wins; training progress counts as a marker.
  Stage best = Stage::kUnknown;
  int64_t best_seq = -1;
  auto consider = [&](int64_t seq, Stage s) {
    if (seq > best_seq) {
      best_seq = seq;
      best = s;
    }
  };
  consider(a.markers[kMarkLoad].seq, Stage::kModelLoad);
  consider(a.markers[kMarkQuantize].seq, Stage::kQuantize);
  consider(a.markers[kMarkCache].seq, Stage::kCaching);
  consider(a.markers[kMarkBaseline].seq, Stage::kBaselineSample);
  consider(a.markers[kMarkSample].seq, Stage::kSampling);
  consider(a.markers[kMarkTrainStart].seq, Stage::kTrainingStep);
  consider(a.progress.seq, Stage::kTrainingStep);
  consider(a.markers[kMarkSave].seq, Stage::kSaving);
  *at_seq = best_seq;
  return best;
}

const Marker* marker_for(const Activity& a, Stage s) {
  switch (s) {
    case Stage::kModelLoad: return &a.markers[kMarkLoad];
    case Stage::kQuantize: return &a.markers[kMarkQuantize];
    case Stage::kCaching: return &a.markers[kMarkCache];
    case Stage::kBaselineSample: return &a.markers[kMarkBaseline];
    case Stage::kSampling: return &a.markers[kMarkSample];
    case Stage::kSaving: return &a.markers[kMarkSave];
    case Stage::kTrainingStep: return a.progress.seq >= 0 ? &a.progress : &a.markers[kMarkTrainStart];
    default: return nullptr;
  }
}

Stage guard_stage(const std::string& p) {
  if (p == "load") return Stage::kModelLoad;
  if (p == "cache") return Stage::kCaching;
  if (p == "baseline_sample") return Stage::kBaselineSample;
  if (p == "sample") return Stage::kSampling;
  if (p == "train_step") return Stage::kTrainingStep;
  if (p == "save") return Stage::kSaving;
  return Stage::kUnknown;
}

}  // namespace

Diagnosis LogAnalyzer::finish(int64_t bytes) const {
  const State& st = *s_;
  Diagnosis d;
  d.lines = st.lines;
  d.bytes = bytes;
  d.settings = st.settings;

  // --- trainer and family ---
  int best_t = 0;
  for (int t = 1; t < kTrainerCount; ++t)
    if (st.trainer_score[t] > st.trainer_score[best_t]) best_t = t;
  if (st.trainer_score[best_t] >= 4) d.trainer = static_cast<Trainer>(best_t);
  // musubi prints kohya's own messages; kohya's GUI runs sd-scripts.
  if (d.trainer == Trainer::kKohya && st.kohya_gui) d.trainer_detail = "kohya_ss GUI";
  int best_f = 0;
  for (int f = 1; f < kFamilyCount; ++f)
    if (st.family_score[f] > st.family_score[best_f]) best_f = f;
  if (st.family_score[best_f] >= 4) d.family = static_cast<ModelFamily>(best_f);
  if (d.family != ModelFamily::kUnknown) {
    bool video = is_video_family(d.family);
    if (video && d.settings.num_frames && *d.settings.num_frames <= 1) video = false;  // image LoRA on a video model
    d.kind = video ? ModelKind::kVideo : ModelKind::kImage;
  } else if (d.settings.num_frames && *d.settings.num_frames > 1) {
    d.kind = ModelKind::kVideo;
  }

  // --- cause ---
  const CauseRecord& oom = st.causes[static_cast<int>(Cause::kGpuOom)];
  // The latest specific fatal event among the look-alikes.
  int other_best = 0;
  int64_t other_seq = -1;
  for (int c = static_cast<int>(Cause::kHostOom); c < kCauseCount; ++c) {
    const CauseRecord& r = st.causes[c];
    int64_t seq = r.last_fatal.seq;
    if (c == static_cast<int>(Cause::kNanLoss) && seq < 0) seq = r.last.seq;  // NaN in a progress bar is enough
    if (seq < 0) continue;
    // "other" only when nothing specific exists.
    if (c == static_cast<int>(Cause::kOther)) continue;
    if (seq > other_seq) {
      other_seq = seq;
      other_best = c;
    }
  }
  bool oom_present = oom.count > 0;
  bool oom_wins = false;
  if (oom_present) {
    oom_wins = true;
    // AI Toolkit skipped the OOM batches and carried on; something else ended the run.
    if (st.oom_recovered_only && other_seq > st.last_oom_recovered_seq) oom_wins = false;
    // A NaN warning long before the OOM does not beat it; a host kill after a recovered OOM does.
  }
  if (st.guard.oom && !oom_present) {
    oom_present = true;
    oom_wins = true;
  }
  const CauseRecord* decisive = nullptr;
  if (oom_wins) {
    d.cause = Cause::kGpuOom;
    d.oom = true;
    decisive = &oom;
    bool explicit_msg = st.mem.tried_to_allocate.has_value() || st.mem.total.has_value();
    d.confidence = explicit_msg ? 0.97 : (st.oom_hard_count > 0 ? 0.93 : 0.85);
    if (st.oom_hard_count == 0 && st.oom_weak_count > 0 && !st.guard.seen) d.confidence = 0.6;  // cuBLAS init etc.
  } else if (other_best != 0) {
    d.cause = static_cast<Cause>(other_best);
    decisive = &st.causes[other_best];
    d.confidence = decisive->fatal_count > 0 ? 0.85 : 0.65;
    if (d.cause == Cause::kHostOom) d.confidence = 0.88;
  } else if (st.causes[static_cast<int>(Cause::kOther)].count > 0) {
    d.cause = Cause::kOther;
    decisive = &st.causes[static_cast<int>(Cause::kOther)];
    d.confidence = 0.6;
  } else {
    d.cause = Cause::kNone;
    d.confidence = 0.5;
  }
  if (decisive) {
    const Marker& m = decisive->last_fatal.seq >= 0 ? decisive->last_fatal : decisive->last;
    d.error_line = snippet(m.text);
  }

  // --- memory numbers ---
  d.memory = st.mem;
  if (d.oom) {
    MemoryNumbers& mm = d.memory;
    if (!st.process_uses.empty()) {
      int64_t sum = 0;
      for (int64_t u : st.process_uses) sum += u;
      // Ours is the process whose use is closest to what PyTorch holds; the rest are others.
      int64_t ours_est = mm.allocated_by_pytorch.value_or(0) + mm.reserved_unallocated.value_or(0);
      int64_t ours = st.process_uses[0];
      for (int64_t u : st.process_uses)
        if (std::llabs(u - ours_est) < std::llabs(ours - ours_est)) ours = u;
      if (st.process_uses.size() >= 2) mm.other_processes = sum - ours;
      if (!mm.process_in_use && st.process_uses.size() == 1) mm.process_in_use = ours;
    } else if (mm.total && mm.free && mm.process_in_use) {
      int64_t others = *mm.total - *mm.free - *mm.process_in_use;
      if (others >= (int64_t(256) << 20)) mm.other_processes = others;  // below that: driver/context noise
    }
    if (mm.reserved_unallocated) {
      const int64_t ru = *mm.reserved_unallocated;
      const int64_t tried = mm.tried_to_allocate.value_or(0);
      const int64_t total = mm.total.value_or(0);
      mm.fragmentation = ru >= (int64_t(512) << 20) && (ru >= tried || (total > 0 && ru * 10 >= total));
    }
  } else {
    d.memory = MemoryNumbers{};
  }

  // --- phase ---
  const Activity* act = decisive ? &decisive->at_first : &st.act;
  if (decisive && decisive->first.seq < 0) act = &st.act;
  bool strong = false;
  Stage from_frames = decisive && decisive->has_frames ? stage_from_frames(decisive->frames, &strong) : Stage::kUnknown;
  int64_t marker_seq = -1;
  Stage from_markers = stage_from_activity(*act, &marker_seq);
  Stage stage = Stage::kUnknown;
  double pconf = 0.3;
  const bool guard_oom = st.guard.oom && d.oom;
  if (guard_oom && !st.guard.phase.empty()) {
    stage = guard_stage(st.guard.phase);
    pconf = 0.99;
  } else if (strong) {
    stage = from_frames;
    pconf = 0.9;
    // Sampling called from the training loop at step 0 is the baseline sample.
  } else if (from_markers != Stage::kUnknown) {
    stage = from_markers;
    pconf = 0.75;
    if (from_frames != Stage::kUnknown && from_frames != stage) {
      // Weak frames (".to()", "sample") disagree: trust the log's activity lines, but less.
      pconf = 0.6;
    }
  } else if (from_frames != Stage::kUnknown) {
    stage = from_frames;
    pconf = 0.55;
  }

  // Training progress tells the step.
  int64_t completed = act->completed;
  std::optional<int64_t> step;
  if (guard_oom && st.guard.step && (stage == Stage::kTrainingStep || stage == Stage::kSaving)) step = *st.guard.step;
  else if (stage == Stage::kTrainingStep || stage == Stage::kSaving) {
    if (completed >= 0) step = completed + 1;
    else if (stage == Stage::kTrainingStep) step = 1;  // training began, no step finished
  }
  // A "sampling" that happens before any training step is the baseline sample.
  if (stage == Stage::kSampling && !guard_oom && (completed <= 0) &&
      (act->sample_at_step <= 0 || act->markers[kMarkBaseline].seq >= act->markers[kMarkSample].seq))
    stage = Stage::kBaselineSample;

  Phase phase = Phase::kUnknown;
  switch (stage) {
    case Stage::kModelLoad:
    case Stage::kQuantize:
    case Stage::kCaching: phase = Phase::kLoad; break;
    case Stage::kBaselineSample: phase = Phase::kBaselineSample; break;
    case Stage::kSampling: phase = Phase::kSampling; break;
    case Stage::kTrainingStep:
    case Stage::kSaving:
      if (d.kind == ModelKind::kVideo && stage == Stage::kTrainingStep) phase = Phase::kVideoSpike;
      else phase = (step && *step > 10) ? Phase::kLaterSteps : Phase::kEarlySteps;
      break;
    case Stage::kUnknown:
      // Nothing tells: a bare traceback paste. Training steps are where most GPU OOMs happen;
      // the host OOM killer mostly strikes while loading or caching.
      if (d.cause == Cause::kHostOom) phase = Phase::kLoad;
      else phase = d.kind == ModelKind::kVideo ? Phase::kVideoSpike : Phase::kEarlySteps;
      pconf = 0.3;
      break;
  }
  // The guard classified the failure itself (memory/classify.cpp): its class is authoritative.
  if (guard_oom) {
    const std::string& c = st.guard.classification;
    if (c == "environment") phase = Phase::kEnvironment;
    else if (c == "sometimes") phase = Phase::kLaterSteps;
    else if (c == "early_steps") phase = Phase::kEarlySteps;
    else if (c == "video_spike") phase = Phase::kVideoSpike;
    else if (c == "sampling") phase = stage == Stage::kBaselineSample ? Phase::kBaselineSample : Phase::kSampling;
    else if (c == "load") phase = stage == Stage::kBaselineSample ? Phase::kBaselineSample : Phase::kLoad;
    else if (c == "fragmentation") d.memory.fragmentation = true;
  }

  // Environment (playbook §2 E, §4): the GPU is full of something other than this run's tensors.
  if (d.oom) {
    const MemoryNumbers& mm = d.memory;
    const int64_t gib = int64_t(1) << 30;
    int64_t total = mm.total.value_or(0);
    bool others = mm.other_processes && *mm.other_processes >= std::max<int64_t>(2 * gib, total / 10);
    bool little_ours = total > 0 && mm.allocated_by_pytorch && mm.free && *mm.allocated_by_pytorch * 4 < total &&
                       *mm.free * 20 < total && mm.tried_to_allocate && *mm.tried_to_allocate * 2 < total;
    bool pre_training = phase == Phase::kLoad || phase == Phase::kBaselineSample ||
                        (phase == Phase::kEarlySteps && step.value_or(1) <= 1);
    bool cublas = st.causes[static_cast<int>(Cause::kGpuOom)].last.text.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string::npos;
    bool zero_free = (mm.free && *mm.free == 0) || cublas;
    bool conservative = d.settings.batch_size.value_or(0) == 1 && d.settings.gradient_checkpointing.value_or(false) &&
                        d.settings.max_resolution.value_or(4096) <= 1024;
    // cuBLAS failing to get its small workspace before training is the environment unless the log
    // shows an ambitious config.
    bool ambitious = d.settings.batch_size.value_or(1) > 1 || !d.settings.gradient_checkpointing.value_or(true);
    // When this run's own tensors fill the card, the model/config is the problem, not the environment.
    bool ours_dominant = total > 0 && mm.allocated_by_pytorch && *mm.allocated_by_pytorch * 4 >= total * 3;
    if (others || little_ours || (pre_training && zero_free && conservative && !ours_dominant) ||
        (pre_training && cublas && !ambitious && !ours_dominant) || st.guard.environment) {
      phase = Phase::kEnvironment;
      pconf = std::max(pconf, others || little_ours ? 0.8 : 0.7);
      if (others)
        d.notes.push_back("Other processes hold " + format_bytes(*mm.other_processes) +
                          " of this GPU: free it (nvidia-smi shows who) before retrying.");
      else if (little_ours)
        d.notes.push_back("PyTorch itself holds little of the GPU while it is full: another process or a dirty "
                          "worker holds the memory.");
      else
        d.notes.push_back("A conservative config (batch 1, gradient checkpointing on) failed before training "
                          "started with the GPU completely full: treat it as the environment, not the config.");
    }
  }

  d.phase = phase;
  d.phase_confidence = pconf;
  d.stage = stage;
  d.step = step;
  if (d.oom && d.phase == Phase::kEarlySteps && step && *step == 1 && d.kind != ModelKind::kVideo)
    d.notes.push_back("It died on step 1: the forward pass fits but the gradients do not. Turn on gradient "
                      "checkpointing AND lower the resolution together, not one at a time.");

  // --- evidence ---
  auto add_ev = [&](const Marker& m, const std::string& why) {
    if (m.seq < 0 || m.text.empty()) return;
    for (const Evidence& e : d.evidence)
      if (e.line == m.line && e.text == snippet(m.text)) return;
    if (d.evidence.size() < 10) d.evidence.push_back({m.line, snippet(m.text), why});
  };
  if (decisive) {
    std::string what = cause_name(d.cause);
    add_ev(decisive->first, what + " signature");
    if (decisive->last_fatal.seq >= 0) add_ev(decisive->last_fatal, what + " (fatal)");
    else add_ev(decisive->last, what);
  }
  if (st.guard.seen) add_ev(st.guard.line, "lora-train OOM guard");
  if (const Marker* pm = marker_for(*act, stage)) add_ev(*pm, std::string("phase: ") + stage_name(stage));
  if (decisive && decisive->has_frames && strong) {
    // The frame that decided.
    for (const Frame& f : decisive->frames) {
      bool dummy = false;
      Stage s1 = stage_from_frames({f}, &dummy);
      if (s1 == from_frames && dummy) {
        d.evidence.push_back({0, "traceback frame: " + f.file + " in " + f.func, "phase from traceback"});
        break;
      }
    }
  }
  // Log lines in order; the traceback-frame summary (line 0) last.
  std::stable_sort(d.evidence.begin(), d.evidence.end(), [](const Evidence& a, const Evidence& b) {
    int64_t la = a.line > 0 ? a.line : INT64_MAX, lb = b.line > 0 ? b.line : INT64_MAX;
    return la < lb;
  });

  // Look-alike advice.
  switch (d.cause) {
    case Cause::kHostOom:
      d.notes.push_back("System RAM ran out (the OS killed the process), not GPU memory: cache latents/text "
                        "embeddings to disk, lower dataloader workers, load fp8/quantized checkpoints, add RAM or swap "
                        "(Windows: enlarge the paging file).");
      break;
    case Cause::kDataLoaderWorker:
      d.notes.push_back("A DataLoader worker died: lower the number of workers (or 0), enlarge /dev/shm "
                        "(docker --shm-size), check host RAM.");
      break;
    case Cause::kNanLoss:
      d.notes.push_back("The loss became NaN/inf: lower the learning rate, use bf16 instead of fp16, keep the VAE "
                        "in fp32 (--no_half_vae for SDXL), check the dataset for broken images.");
      break;
    case Cause::kGpuFault:
      d.notes.push_back("A GPU fault (illegal access, launch failure, Xid): not memory. Check driver, power and "
                        "temperature, update the driver, try without custom kernels (xformers/flash/sage).");
      break;
    case Cause::kMissingFile:
      d.notes.push_back("A file, model or dataset could not be found or read: check the paths in the config and "
                        "that downloads are complete (re-download a truncated .safetensors).");
      break;
    case Cause::kVersionMismatch:
      d.notes.push_back("A package or model version mismatch: reinstall the trainer's pinned requirements "
                        "(torch, diffusers, transformers, bitsandbytes, xformers) and check the model variant.");
      break;
    default: break;
  }
  d.fixes = plan_fixes(d);
  return d;
}

Diagnosis diagnose(std::unique_ptr<ByteSource> source) {
  LineReader reader(std::move(source));
  LogAnalyzer analyzer;
  LogLine line;
  while (reader.next(line)) analyzer.feed(line);
  return analyzer.finish(reader.bytes_read());
}

Diagnosis diagnose_path(const std::string& path) { return diagnose(open_source(path)); }
Diagnosis diagnose_text(const std::string& text) { return diagnose(string_source(text)); }

}  // namespace lt::diagnose
