// The training run, top to bottom: config -> run folder -> device memory and the OOM guard ->
// load (phase load) -> dataset and buckets -> caches (phase cache) -> optimizer and resume ->
// baseline previews -> steps (phase train_step; sample and save phases between them) -> final
// save and report. Every phase runs under the guard: an OOM gives the loop one change to make,
// which it makes in apply(), and the phase runs again from the same start.
#include "loratrain/train/trainer.h"

#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>

#include "loratrain/config/config.h"
#include "loratrain/config/model_path.h"
#include "loratrain/data/batches.h"
#include "loratrain/data/cache.h"
#include "loratrain/data/dataset.h"
#include "loratrain/io/image.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/io/video.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/memory/device_memory.h"
#include "loratrain/memory/guard.h"
#include "loratrain/models/attention_blocks.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/packed_conv.h"
#include "loratrain/optim/ema.h"
#include "loratrain/optim/lr_schedule.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/plan/plan.h"
#include "loratrain/playbook/settings.h"
#include "loratrain/report/run_report.h"
#include "loratrain/sample/noise.h"
#include "loratrain/sample/prompt.h"
#include "loratrain/sample/sampler.h"
#include "loratrain/sample/scheduler.h"
#include "loratrain/train/checkpoint.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/objective.h"
#include "loratrain/train/preview.h"
#include "loratrain/train/progress.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/blas_threads.h"
#include "loratrain/util/error.h"
#include "loratrain/util/log.h"
#include "loratrain/util/strings.h"
#include "loratrain/version.h"
#include "data_parallel.h"

namespace lt::train {

namespace fs = std::filesystem;
using playbook::MemorySettings;
using playbook::Phase;
using playbook::PhaseContext;

std::string cpu_bf16_instructions() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::string found;
    for (const char* flag : {"avx512_bf16", "amx_bf16"}) {
      if ((" " + line + " ").find(std::string(" ") + flag + " ") != std::string::npos) {
        found += (found.empty() ? "" : ", ") + std::string(flag);
      }
    }
    return found;
  }
  return "";
}

void configure_cpu_threads() {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* env = std::getenv("LT_NUM_THREADS")) threads = std::max(1, std::atoi(env));
  if (threads > 0) at::set_num_threads(threads);
  // LibTorch 1.13 does not parallelise around a BLAS call: a matrix product (every Linear) runs on
  // OpenBLAS's own threads or on one core. OpenBLAS gets as many threads as LibTorch; the two
  // pools take turns (chunked attention, which would make them overlap, holds OpenBLAS at one
  // thread while it spreads heads over LibTorch's threads). Looked up at run time so the build
  // does not depend on which BLAS Debian's alternatives select.
  int blas_threads = std::max(1, threads);
  if (const char* env = std::getenv("LT_BLAS_THREADS")) blas_threads = std::max(1, std::atoi(env));
  util::set_openblas_threads(blas_threads);
}

namespace {

// SIGINT (Ctrl-C) and SIGTERM (kill, a job scheduler's stop) during a run: the handler only notes
// the signal (async-signal-safe: two sig_atomic_t stores). The loop finishes the step in progress,
// saves the resumable state and returns 128 + the signal (130, 143). Signals that arrive during the
// save are counted and change nothing: the state file is written whole (atomic file) or not at all.
volatile std::sig_atomic_t g_stop_signal = 0;   // the first stop signal received; 0 when none
volatile std::sig_atomic_t g_stop_signals = 0;  // how many arrived

const char* quantization_name(models::WeightQuantization format) {
  return format == models::WeightQuantization::int8 ? "int8" : "fp8 (e4m3)";
}

extern "C" void on_stop_signal(int signal) {
  if (g_stop_signal == 0) g_stop_signal = signal;
  g_stop_signals = g_stop_signals + 1;
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    g_stop_signals = 0;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // reads and writes in flight go on instead of failing with EINTR
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  static int received() { return g_stop_signal; }
  static int count() { return g_stop_signals; }
  static std::string name(int signal) { return signal == SIGTERM ? "SIGTERM" : signal == SIGINT ? "Ctrl-C (SIGINT)" : "signal " + std::to_string(signal); }

 private:
  static constexpr std::array<int, 2> kSignals = {SIGINT, SIGTERM};
  std::array<struct sigaction, 2> previous_{};
};

at::Tensor global_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_global_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::string timestamp_ms() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
}

std::string step_tag(int64_t step) { return fmt::format("{:09d}", step); }

class Trainer {
 public:
  explicit Trainer(const RunRequest& request) : request_(request) {}
  RunResult run();
  SampleResult sample(const SampleRequest& request);

 private:
  RunResult stop(int signal);
  // setup
  void read_config();     // the config, device, dtype, model options and memory settings
  void settle_cpu_dtype();  // fp16 / emulated bf16 on the CPU train in fp32
  void open_run_folder();
  void load_sampling_model(const std::vector<SampleLoRA>& loras);
  void open_device_memory();
  void plan_memory();
  void load_model();
  void quantize_base();
  models::WeightQuantization base_quantization() const;          // model.qtype (with model.quantize)
  models::WeightQuantization text_encoder_quantization() const;  // model.qtype_te
  void prepare_data();
  void build_caches();
  void create_optimizer();
  void restore_state();
  // work
  void train_step();
  double accumulate_gradients();
  std::vector<sample::SamplePrompt> preview_prompts() const;
  void sample_previews(int64_t step);
  void save_checkpoint(int64_t step, bool final);
  void save_state();
  void save_phase(const std::function<void()>& body);
  // the guard's changes, made here in plain sight
  void apply(const MemorySettings& next);
  void rebucket(const MemorySettings& previous);
  void cache_latents();
  void release_encoders();
  void write_report(int exit_code, const std::string& outcome);
  void refresh_report();
  int give_up(const memory::OomGiveUp& g);

  at::Tensor latents_for(const data::Batch& batch);
  Conditioning conditioning_for(const data::Batch& batch);
  TextEmbedding cached_text(const std::string& caption);
  TextEmbedding text_on_device(const std::vector<std::string>& captions);
  bool trains_on_trigger_only() const;
  PhaseContext step_context(const data::Batch& batch) const;
  ComputeMode compute_mode() const {
    return {settings_.attention_chunk, settings_.vae_tiling, device_.is_cpu() && p_->memory.simulate_vram.bytes > 0};
  }
  uint64_t seed() const { return static_cast<uint64_t>(p_->training_seed.value_or(42)); }
  // Frames per loaded sample: the guard's num_frames for a video model, 0 (images) otherwise.
  int clip_frames() const { return model_ && model_->traits().is_video ? settings_.num_frames : 0; }
  // Data parallel: rank 0 writes the run's files; every rank trains on its rows of a global batch.
  bool is_main() const { return !dp_ || dp_->is_main(); }
  int world_size() const { return dp_ ? dp_->size() : 1; }
  int stop_agreed();
  bool sampling_due(int64_t step) const;
  bool unscale_gradients();

  RunRequest request_;
  RunResult result_;
  config::JobConfig job_;
  config::ProcessConfig* p_ = nullptr;
  fs::path run_dir_;
  c10::Device device_ = c10::Device(c10::kCPU);
  at::ScalarType dtype_ = at::kFloat;
  ModelLoadOptions model_options_;
  std::string base_note_;  // how model.name_or_path was resolved, when worth saying
  std::vector<std::string> frame_notes_;  // frame counts read_config put on the video grid, for the log

  std::unique_ptr<memory::DeviceMemory> memory_;
  std::unique_ptr<memory::OomGuard> guard_;
  MemorySettings settings_;
  std::unique_ptr<DataParallel> dp_;  // null on one device

  std::unique_ptr<DiffusionModel> model_;
  lora::LoRANetwork network_{nullptr};
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::AdapterEMA> ema_;  // train.ema_config.use_ema: saves and previews use it
  optim::LRSchedule lr_schedule_;
  std::unique_ptr<TrainingObjective> objective_;

  std::unique_ptr<data::Dataset> dataset_;
  std::unique_ptr<data::BatchIterator> batches_;
  data::BucketOptions bucket_options_;
  data::BatchOptions batch_options_;
  std::unique_ptr<data::LatentCache> latent_cache_;
  std::unique_ptr<data::TextEmbeddingCache> text_cache_;

  at::Generator noise_rng_;
  int64_t step_ = 0;          // optimizer steps completed
  int64_t total_steps_ = 0;
  bool resumed_ = false;
  std::optional<int64_t> saved_step_;  // the step of the newest resumable state on disk

  // The state a step starts from, restored before each attempt (same batch, same noise).
  struct StepStart {
    data::BatchPosition position;
    at::Tensor noise_rng;
    at::Tensor global_rng;
    bool optimizer_stepped = false;  // the step's update is done; only the EMA's is left
    bool ema_updated = false;        // data parallel: this rank's step is done; another rank's failed
  } step_start_;
  bool in_train_step_ = false;
  double loss_scale_ = 65536.0;  // fp16 only
  int64_t clean_steps_ = 0;
  double last_loss_ = 0;
  std::vector<size_t> step_images_;  // images of the step in progress
  data::Size step_bucket_;           // the bucket of the step's first batch (metrics.jsonl)
};

RunResult Trainer::run() {
  StopSignals stop_signals;
  open_run_folder();
  open_device_memory();
  plan_memory();
  if (dp_) dp_->adopt_main_settings(*guard_, settings_);
  // One seed for everything random in the run (adapter init, noise, data order): runs repeat
  // exactly, and a resumed run restores every generator's state on top.
  torch::manual_seed(seed());
  try {
    while (auto next = guard_->attempt(Phase::load, {}, [this] { load_model(); })) apply(*next);
    prepare_data();
    // Rank 0 encodes; the others then read its cache files (no image is encoded twice).
    for (bool main_turn : {true, false}) {
      while (auto next = guard_->attempt(Phase::cache, {}, [&] {
               if (is_main() == main_turn) build_caches();
             })) {
        // The retry builds the cache again under the new settings (shorter clips, say); apply()
        // must not re-encode it outside the guard.
        if (is_main() == main_turn) latent_cache_.reset();
        apply(*next);
      }
    }
    create_optimizer();
    restore_state();

    const bool baseline = !settings_.disable_sampling && (!settings_.skip_first_sample || p_->train.force_first_sample) &&
                          (!resumed_ || p_->train.force_first_sample);
    if (baseline) {
      spdlog::info("Generating baseline samples before training");
      while (auto next = guard_->attempt(Phase::baseline_sample, {0, settings_.sample_width, settings_.sample_height}, [this] {
               if (is_main() && !settings_.disable_sampling && !settings_.skip_first_sample) sample_previews(0);
             })) {
        apply(*next);
      }
    }

    if (request_.on_training_start) request_.on_training_start(*memory_);
    ProgressLine progress;
    std::optional<MetricsFile> metrics;
    if (is_main()) metrics.emplace(run_dir_ / "metrics.jsonl", resumed_);
    refresh_report();
    spdlog::info("training {} steps from step {}; memory settings: {}", total_steps_, step_ + 1, summarize(settings_));
    if (const int signal = stop_agreed(); signal != 0 && step_ < total_steps_) return stop(signal);
    while (step_ < total_steps_) {
      if (request_.on_step_start) request_.on_step_start(step_ + 1, *memory_);
      step_start_ = {batches_->position(), sample::generator_state(noise_rng_), global_rng_state(), false, false};
      const auto started = std::chrono::steady_clock::now();
      in_train_step_ = true;
      // The step's first batch (a failed attempt has moved the data on; a change may have re-bucketed it).
      while (auto next = guard_->attempt(Phase::train_step, step_context(batches_->at(step_start_.position)),
                                         [this] { train_step(); })) {
        apply(*next);
      }
      in_train_step_ = false;
      ++step_;
      for (size_t image : step_images_) result_.images_seen[image] += 1;
      result_.losses.push_back(last_loss_);
      result_.steps_completed = step_;

      StepStats stats;
      stats.step = step_;
      stats.total_steps = total_steps_;
      stats.loss = last_loss_;
      stats.lr = lr_schedule_.lr_at(step_ - 1);
      stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      stats.mem_allocated = memory_->allocated();
      stats.mem_peak = memory_->peak_allocated();
      stats.batch_size = settings_.batch_size * world_size();
      stats.width = step_bucket_.width;
      stats.height = step_bucket_.height;
      if (metrics) {
        progress.update(stats);
        metrics->write(stats, progress.smoothed_loss());
      }

      if (auto heavier = guard_->step_completed(step_)) {
        progress.finish();
        apply(heavier->settings);
      }
      const int stop_signal = stop_agreed();
      if (sampling_due(step_) && !stop_signal) {
        progress.finish();
        while (auto next = guard_->attempt(Phase::sample, {step_, settings_.sample_width, settings_.sample_height}, [this] {
                 if (is_main() && !settings_.disable_sampling) sample_previews(step_);
               })) {
          apply(*next);
        }
        refresh_report();
      }
      const bool save_due = p_->save.save_every > 0 && step_ % p_->save.save_every == 0 && step_ < total_steps_;
      if (save_due) {
        progress.finish();
        save_phase([this] { save_checkpoint(step_, false); });
        refresh_report();
      }
      const bool stop_requested = request_.stop_after_steps && step_ >= *request_.stop_after_steps;
      if ((stop_signal || stop_requested) && step_ < total_steps_) {
        progress.finish();
        return stop(stop_signal != 0 ? stop_signal : SIGINT);
      }
    }
    progress.finish();
    save_phase([this] { save_checkpoint(step_, true); });
    if (!settings_.disable_sampling && p_->sample.sample_every > 0 && step_ % p_->sample.sample_every != 0) {
      while (auto next = guard_->attempt(Phase::sample, {step_, settings_.sample_width, settings_.sample_height}, [this] {
               if (is_main() && !settings_.disable_sampling) sample_previews(step_);
             })) {
        apply(*next);
      }
    }
  } catch (const memory::OomGiveUp& g) {
    result_.exit_code = give_up(g);
    if (dp_) dp_->finish();
    return result_;
  }
  if (dp_) dp_->finish();
  if (is_main() && (!guard_->attempts().empty() || !guard_->planned_changes().empty())) {
    config::write_effective_yaml(playbook::config_with_settings(job_, settings_), run_dir_ / "effective.yaml");
    spdlog::info("the settings that worked: {}", (run_dir_ / "effective.yaml").string());
  }
  // One log line per summary line, each marked as the guard's (diagnose reads them as such).
  for (const auto& line : split(guard_->summary(), '\n')) {
    if (trim(line).empty()) continue;
    spdlog::info("{}{}", starts_with(line, "oom-guard:") ? "" : "oom-guard: ", line);
  }
  write_report(0, "completed");
  if (is_main()) spdlog::info("done: {} ({} steps)", result_.lora_path.string(), step_);
  return result_;
}

// After a stop signal, between steps: the resumable state is saved (unless the step's save just
// wrote it) and the run returns 128 + signal.
RunResult Trainer::stop(int signal) {
  spdlog::warn("{} at step {}: saving the resumable state", StopSignals::name(signal), step_);
  const int signals_before = StopSignals::count();
  if (saved_step_ != step_) save_phase([this] { save_state(); });
  if (StopSignals::count() > signals_before) {
    spdlog::warn("{} more stop signal(s) during the save: noted; the save was completed, not cut short",
                 StopSignals::count() - signals_before);
  }
  spdlog::warn("interrupted at step {}: state saved in {}; run the same command again to resume", step_,
               state_path(run_dir_).string());
  result_.exit_code = 128 + signal;
  write_report(result_.exit_code, "interrupted");
  if (dp_) dp_->finish();
  return result_;
}

// A stop signal ends every rank after the same step: the ranks agree on it (the first signal any
// of them received).
int Trainer::stop_agreed() {
  const int here = StopSignals::received();
  return dp_ ? dp_->max_over_ranks(here) : here;
}

void Trainer::read_config() {
  if (job_.process.empty()) {
    job_ = config::load_config(request_.config_path, request_.overrides);
    config::validate_paths(job_);
  }
  p_ = &config::the_process(job_);

  const std::string device = to_lower(p_->device);
  if (device == "auto") {
    device_ = torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  } else {
    try {
      device_ = c10::Device(device);
    } catch (const c10::Error&) {
      throw config::error_at(job_, "device", "unknown device '" + p_->device + "' (auto, cpu, cuda, cuda:N)");
    }
  }
  if (device_.is_cuda() && !torch::cuda::is_available()) {
    throw Error(ExitCode::kEnvironment, "device " + p_->device + " requested, but CUDA is not available in this build or machine");
  }
  dtype_ = dtype_from_name(config::canonical_dtype(p_->train.dtype));
  total_steps_ = p_->train.steps;

  const auto base = config::resolve_model_path(p_->model.name_or_path, "model.name_or_path");
  model_options_.name_or_path = base.path;
  model_options_.expected = playbook::family_from_arch(config::effective_arch(p_->model));
  if (p_->model.tokenizer_path) model_options_.tokenizer_path = *p_->model.tokenizer_path;
  if (p_->model.vae_path) model_options_.vae_path = config::resolve_model_path(*p_->model.vae_path, "model.vae_path").path;
  model_options_.v_prediction = p_->model.is_v_pred;
  model_options_.device = device_;
  model_options_.train_text_encoder = p_->train.train_text_encoder;
  model_options_.bypass_guidance_embedding = p_->train.bypass_guidance_embedding;
  if (p_->model.assistant_lora_path) {
    model_options_.assistant_lora = config::resolve_adapter_file(*p_->model.assistant_lora_path, "model.assistant_lora_path").path;
  }
  if (model_options_.expected == ModelFamily::kUnknown) {
    throw config::error_at(job_, "model.arch", "model.arch " + config::effective_arch(p_->model) +
                                                   " is not supported yet by lora-train");
  }
  // The checkpoint's family from its headers, before anything is written: a wrong or unsupported
  // checkpoint stops here.
  const ModelFamily family = identify_model(model_options_);
  if (playbook::is_video(family)) frame_notes_ = playbook::put_frames_on_video_grid(*p_);
  settings_ = playbook::settings_from_config(*p_, playbook::is_video(family));
  run_dir_ = fs::path(p_->training_folder) / job_.name;
  base_note_ = base.note;
  if (base.from_hub_cache) base_note_ += (base_note_.empty() ? "" : "; ") + ("from the Hugging Face cache: " + base.path.string());
}

void Trainer::open_run_folder() {
  read_config();
  dp_ = DataParallel::from_env(device_);
  if (dp_ && device_.is_cuda()) {
    device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(dist::read_dist_env().local_rank));
    model_options_.device = device_;
  }
  fs::create_directories(run_dir_);
  result_.run_dir = run_dir_;
  // Rank 0 logs to the console and log.txt; the others to logs/rank<r>.txt, and only their warnings
  // and errors to the console, prefixed "[rank<r>]:".
  if (is_main()) {
    log::add_file(run_dir_ / "log.txt");
  } else {
    fs::create_directories(run_dir_ / "logs");
    log::set_rank(dp_->rank(), run_dir_ / "logs" / ("rank" + std::to_string(dp_->rank()) + ".txt"));
  }
  spdlog::info("lora-train {} (LibTorch {}): run {} in {}", kVersion, TORCH_VERSION, job_.name, run_dir_.string());
  if (dp_) {
    spdlog::info("data parallel: rank {} of {}; train.batch_size {} per rank, {} per step", dp_->rank(), dp_->size(),
                 p_->train.batch_size, p_->train.batch_size * dp_->size());
  }
  for (const auto& note : frame_notes_) spdlog::warn("{}", note);
  if (is_main()) config::write_effective_yaml(job_, run_dir_ / "config.yaml");
  if (const std::string ignored = config::ignored_keys_summary(job_); !ignored.empty()) spdlog::info("{}", ignored);
  if (!base_note_.empty()) spdlog::info("model.name_or_path: {}", base_note_);
  settle_cpu_dtype();
}

void Trainer::settle_cpu_dtype() {
  if (device_.is_cpu() && dtype_ == at::kHalf) {
    spdlog::warn("train.dtype fp16 has no CPU kernels in this LibTorch: training in fp32 on the CPU");
    dtype_ = at::kFloat;
  }
  if (device_.is_cpu() && dtype_ == at::kBFloat16) {
    if (const std::string isa = cpu_bf16_instructions(); isa.empty()) {
      // Measured on an AVX2-only EPYC (docs/benchmarks.md): bf16 matmuls and convolutions run
      // emulated, 30-45x slower than fp32.
      spdlog::warn("train.dtype bf16: this CPU has no bf16 instructions (AVX512-BF16 or AMX), LibTorch would "
                   "emulate them at a fraction of fp32's speed: training in fp32 on the CPU");
      dtype_ = at::kFloat;
    } else {
      spdlog::info("train.dtype bf16 on the CPU: native bf16 path ({})", isa);
    }
  }
  const int64_t long_sequence = models::cpu_long_sequence(static_cast<int64_t>(c10::elementSize(dtype_)));
  if (device_.is_cpu() && models::cpu_blocks_long_sequences() && p_->memory.simulate_vram.bytes > 0) {
    spdlog::info("attention as configured: memory.simulate_vram stands for a GPU (this CPU's faster blocks from "
                 "{0}x{0} scores per head are left out)", long_sequence);
  } else if (device_.is_cpu() && models::cpu_blocks_long_sequences()) {
    spdlog::info("attention on this CPU: from {0}x{0} scores per head (queries x keys) in blocks of at most {1} "
                 "query rows (faster than the plain path here)", long_sequence, models::kCpuQueryBlock);
  }
  model_options_.dtype = dtype_;
}

void Trainer::open_device_memory() {
  if (!p_->memory.alloc_conf.empty()) ::setenv("PYTORCH_CUDA_ALLOC_CONF", p_->memory.alloc_conf.c_str(), 1);
  memory::tune_host_allocator();
  memory::DeviceMemoryOptions memory_options;
  memory_options.device = device_.str();
  memory_options.simulate_vram = p_->memory.simulate_vram.bytes;
  memory_options.vram_limit = p_->memory.vram_limit.bytes;
  memory_ = memory::make_device_memory(memory_options);
  if (request_.on_memory_ready) request_.on_memory_ready(*memory_);
  memory::GuardOptions guard_options;
  guard_options.enabled = p_->memory.oom_guard.enabled;
  guard_options.max_attempts = p_->memory.oom_guard.max_attempts;
  guard_options.scale_up = p_->memory.oom_guard.scale_up;
  guard_options.scale_up_after = p_->memory.oom_guard.scale_up_after;
  guard_ = std::make_unique<memory::OomGuard>(*memory_, guard_options, settings_);
  guard_->set_rank_agreement(dp_.get());
  spdlog::info("device: {}", memory_->name());
  guard_->check_start();
}

// With a known budget (simulated VRAM, memory.vram_limit, CUDA's free memory), a config the
// planner predicts not to fit starts from the guard's first rung that does: planned changes, not OOMs.
void Trainer::plan_memory() {
  if (memory_->is_host() || !p_->memory.oom_guard.enabled || !p_->memory.oom_guard.plan) return;
  const int64_t budget = memory_->free_and_total().free;
  try {
    const auto planner = plan::Planner::from_config(job_, static_cast<int>(c10::elementSize(dtype_)));
    const plan::FitResult fitted = plan::fit(*planner, settings_, budget);
    spdlog::info("plan: predicted peak {} of {} available", format_bytes(fitted.prediction.peak()), format_bytes(budget));
    if (fitted.changes.empty() || !fitted.fits) {
      if (!fitted.fits) spdlog::warn("plan: predicted not to fit even with every lever; starting as configured");
      return;
    }
    std::vector<memory::PlannedChangeRecord> records;
    for (const auto& c : fitted.changes) {
      spdlog::info("plan: planned change ({} predicted {} -> {}): {}", playbook::to_string(c.phase),
                   format_bytes(c.peak_before), format_bytes(c.peak_after), c.description);
      records.push_back({c.kind, c.description, c.phase, c.peak_before, c.peak_after});
    }
    guard_->adopt_planned(fitted.settings, std::move(records));
    settings_ = fitted.settings;
  } catch (const std::exception& e) {
    // A prediction is advice: a config the planner cannot read still runs under the guard.
    spdlog::warn("plan: no prediction ({}); starting as configured", e.what());
  }
}

void Trainer::load_model() {
  model_.reset();
  network_ = lora::LoRANetwork(nullptr);
  model_options_.defer_encoders = settings_.low_vram;
  // model.quantize: the denoiser is quantized on the host as it loads, never placed widened; in fp8
  // an fp8 file's Linear weights stay the codes they are stored as (AI Toolkit widens them to the
  // dtype, then quantizes again).
  model_options_.denoiser_quantization.reset();
  if (settings_.quantize != playbook::Quantize::none) model_options_.denoiser_quantization = base_quantization();
  // Text encoders quantized on the host as they load, never placed widened (nor, on the low-VRAM
  // path, loaded just to be quantized).
  model_options_.text_quantization.reset();
  if (settings_.quantize != playbook::Quantize::none && p_->model.quantize_te.value_or(false)) {
    model_options_.text_quantization = text_encoder_quantization();
  }
  model_options_.compute = compute_mode();
  model_ = load_diffusion_model(model_options_);
  spdlog::info("loaded {} base from {}", playbook::to_string(model_->traits().family), p_->model.name_or_path);
  p_->sample.sampler = sampler_for_model(model_->traits(), p_->sample.sampler);

  lora::NetworkConfig net;
  net.type = lora::adapter_type_from_name(p_->network.type);
  net.lokr_factor = p_->network.lokr_factor;
  net.lokr_full_rank = p_->network.lokr_full_rank;
  net.linear = p_->network.linear;
  net.linear_alpha = p_->network.linear_alpha.value_or(p_->network.alpha);
  if (p_->network.conv) net.conv = *p_->network.conv;
  net.conv_alpha = p_->network.conv_alpha;
  net.dropout = p_->network.dropout.value_or(0.0);
  // AI Toolkit's full-rank LoKr adapts the Conv layers too (it sets every rank to its maximum).
  if (net.type == lora::AdapterType::LoKr && net.lokr_full_rank && !net.conv) net.conv = net.linear;
  net.only_if_contains = p_->network.network_kwargs.only_if_contains;
  net.ignore_if_contains = p_->network.network_kwargs.ignore_if_contains;
  net.train_unet = p_->train.train_unet;
  net.train_text_encoder = p_->train.train_text_encoder;
  network_ = lora::LoRANetwork(net);
  for (const auto& target : model_->lora_targets()) network_->add_component(*target.spec, *target.root);
  network_->to(device_);
  network_->apply_to();
  spdlog::info("{}: {} denoiser and {} text-encoder modules, rank {}, alpha {}", lora::to_string(net.type),
               network_->count(true), network_->count(false), net.linear, net.linear_alpha);
  if (network_->trainable_parameters().empty()) {
    throw config::error_at(job_, "network", "no module was selected for training (check train_unet, train_text_encoder and "
                                            "network_kwargs)");
  }
  model_->set_gradient_checkpointing(settings_.gradient_checkpointing);
  model_->set_training(true);
  if (model_options_.denoiser_quantization) {
    spdlog::info("base weights quantised to {}{}, on the host before placing", quantization_name(*model_options_.denoiser_quantization),
                 model_options_.text_quantization
                     ? fmt::format(", text encoders to {}", quantization_name(*model_options_.text_quantization))
                     : std::string());
  }
}

models::WeightQuantization Trainer::base_quantization() const {
  return settings_.quantize == playbook::Quantize::fp8 ? models::WeightQuantization::fp8_e4m3 : models::WeightQuantization::int8;
}

models::WeightQuantization Trainer::text_encoder_quantization() const {
  return to_lower(p_->model.qtype_te).find("int8") != std::string::npos ? models::WeightQuantization::int8
                                                                        : models::WeightQuantization::fp8_e4m3;
}

// The guard's quantize_base rung, on a loaded model: qfloat8 keeps fp8 e4m3 codes, qint8 int8; with
// quantize_te the text encoders follow in model.qtype_te's format.
void Trainer::quantize_base() {
  const models::WeightQuantization format = base_quantization();
  int64_t released = model_->quantize_base(false, format);
  std::string what = fmt::format("base weights quantised to {}", quantization_name(format));
  if (p_->model.quantize_te.value_or(false)) {
    // The denoiser's Linears are quantized already: this pass reaches only the text encoders'.
    released += model_->quantize_base(true, text_encoder_quantization());
    what += fmt::format(", text encoders to {}", quantization_name(text_encoder_quantization()));
  }
  spdlog::info("{}: {} released", what, format_bytes(released));
}

void Trainer::prepare_data() {
  // One dataset folder per run in this version (AI Toolkit allows several).
  if (p_->datasets.size() > 1) throw config::error_at(job_, "datasets.1", "lora-train reads one dataset per run in this version");
  const auto& d = p_->datasets[0];
  data::DatasetOptions options;
  options.folder_path = d.folder_path;
  options.caption_ext = d.caption_ext;
  options.default_caption = d.default_caption;
  options.trigger_word = d.trigger_word.value_or(p_->trigger_word.value_or(""));
  options.caption_dropout_rate = d.caption_dropout_rate;
  options.token_dropout_rate = d.token_dropout_rate;
  options.shuffle_tokens = d.shuffle_tokens;
  options.keep_tokens = d.keep_tokens;
  options.num_repeats = d.num_repeats;
  options.flip_x = d.flip_x;
  options.num_frames = d.num_frames;
  options.shrink_video_to_frames = d.shrink_video_to_frames;
  options.fps = d.fps;
  options.seed = seed();
  dataset_ = std::make_unique<data::Dataset>(options);
  result_.images_seen.assign(dataset_->size(), 0);

  bucket_options_.resolutions = d.resolution;
  bucket_options_.divisibility = static_cast<int>(model_->traits().bucket_divisibility);
  bucket_options_.enabled = d.buckets;
  batch_options_.batch_size = settings_.batch_size * world_size();
  batch_options_.seed = seed();
  batches_ = std::make_unique<data::BatchIterator>(*dataset_, dataset_->make_plan(bucket_options_), batch_options_);
  for (int i = 0; i < settings_.dropped_largest; ++i) batches_->drop_largest_resolution();  // planned before the start
  spdlog::info("dataset: {} images in {}\n{}", dataset_->size(), d.folder_path, batches_->plan().histogram_text());
  noise_rng_ = sample::make_generator(batch_options_.seed);
}

void Trainer::build_caches() {
  const auto& d = p_->datasets[0];
  if (d.cache_latents || d.cache_latents_to_disk) {
    data::CacheOptions options;
    options.in_memory = true;
    options.to_disk = d.cache_latents_to_disk || dp_ != nullptr;  // data parallel: the ranks share rank 0's files
    options.model_id = model_->model_id() + "|vae";
    if (clip_frames() > 0) options.num_frames = clip_frames();
    latent_cache_ = std::make_unique<data::LatentCache>(*dataset_, options);
    cache_latents();
    // On the low-VRAM path the VAE leaves before the text encoder arrives.
    if (settings_.low_vram) model_->release(Encoder::vae);
  }
  if (!p_->train.train_text_encoder) {
    data::CacheOptions options;
    options.in_memory = true;
    options.to_disk = false;
    options.model_id = model_->model_id() + "|te";
    text_cache_ = std::make_unique<data::TextEmbeddingCache>(fs::path(d.folder_path) / "_t_e_cache", options);
    guard_->set_context({0, 0, 0, 0, 1, 0});  // one caption at a time, no image
    if (auto captions = dataset_->fixed_captions()) {
      text_cache_->build(*captions, [this](const std::string& caption) { return cached_text(caption); });
    }
    if (p_->train.unload_text_encoder) {
      // Everything the run will ever encode, then the text encoders leave for good.
      std::vector<std::string> texts = {dataset_->options().trigger_word};
      for (const auto& prompt : preview_prompts()) {
        texts.push_back(prompt.text);
        texts.push_back(prompt.negative);
      }
      text_cache_->build(texts, [this](const std::string& caption) { return cached_text(caption); });
      if (trains_on_trigger_only()) {
        const bool cached = p_->train.cache_text_embeddings || p_->datasets[0].cache_text_embeddings;
        spdlog::warn("train.unload_text_encoder: {}, so every image trains on the trigger word '{}' (the blank prompt "
                     "without one), not its caption, as AI Toolkit does{}",
                     cached ? "captions change from step to step (dropout, shuffling)" : "text embeddings are not cached",
                     dataset_->options().trigger_word,
                     cached ? "" : "; set datasets[].cache_text_embeddings: true to train on the captions");
      }
      model_->release(Encoder::text);
      spdlog::info("train.unload_text_encoder: {} texts encoded, text encoders unloaded", text_cache_->memory_entries());
    }
  }
  // With everything cached, the VAE and text encoder are not needed until sampling.
  if (settings_.low_vram) release_encoders();
}

// Latents are sampled from the VAE's distribution with their own seeded generator, so a rebuilt
// cache (resume, a new bucket) holds the same values.
void Trainer::cache_latents() {
  auto generator = sample::make_generator(seed() + 1);
  auto stats = latent_cache_->build(batches_->plan(), [this, &generator](const at::Tensor& pixels) {
    const int frames = pixels.dim() == 5 ? static_cast<int>(pixels.size(2)) : 1;
    guard_->set_context({0, static_cast<int>(pixels.size(-1)), static_cast<int>(pixels.size(-2)), frames,
                         static_cast<int>(pixels.size(0)), 0});
    return model_->encode_pixels(pixels, generator).to(at::kCPU);
  });
  spdlog::info("latents: {} encoded, {} from disk, {} in memory", stats.encoded, stats.from_disk, stats.in_memory);
}

// One caption's embeddings for the cache: computed without gradients, kept on the CPU.
TextEmbedding Trainer::cached_text(const std::string& caption) {
  torch::NoGradGuard no_grad;
  TextEmbedding embedding = model_->encode_text({caption});
  for (auto& [name, tensor] : embedding) tensor = tensor.to(at::kCPU);
  return embedding;
}

// The low-VRAM path: what is cached needs no encoder until previews are made.
void Trainer::release_encoders() {
  if (latent_cache_) model_->release(Encoder::vae);
  if (text_cache_ && dataset_ && dataset_->fixed_captions()) model_->release(Encoder::text);
}

void Trainer::create_optimizer() {
  // optimizer_params as numbers: scalars become one-element lists, booleans 0/1, betas two values.
  optim::OptimizerParams params;
  for (const auto& [key, value] : p_->train.optimizer_params) {
    const std::string what = "train.optimizer_params";
    const std::string text = to_lower(value.text);
    if (value.collection) {
      params[key] = config::param_number_list(p_->train.optimizer_params, key, what).value_or(std::vector<double>{});
    } else if (text == "true" || text == "false" || text == "yes" || text == "no") {
      params[key] = {config::param_bool(p_->train.optimizer_params, key, what).value_or(false) ? 1.0 : 0.0};
    } else if (auto number = config::param_number(p_->train.optimizer_params, key, what)) {
      params[key] = {*number};
    }
  }
  optimizer_ = optim::make_optimizer(p_->train.optimizer, network_->trainable_parameters(), params);
  // One schedule for both components; text-encoder adapters scale it by text_encoder_lr / unet_lr.
  const double unet_lr = p_->train.unet_lr.value_or(p_->train.lr);
  const double te_lr = p_->train.text_encoder_lr.value_or(p_->train.lr);
  std::vector<double> scales;
  for (size_t m = 0; m < network_->modules().size(); ++m) {
    const bool denoiser = network_->is_denoiser_module(m);
    for (size_t i = 0; i < network_->modules()[m]->parameters().size(); ++i) {
      scales.push_back(denoiser || unet_lr == 0 ? 1.0 : te_lr / unet_lr);
    }
  }
  if (scales.size() == optimizer_->params().size()) optimizer_->set_lr_scales(scales);
  lr_schedule_.type = optim::parse_lr_scheduler(p_->train.lr_scheduler);
  lr_schedule_.lr = unet_lr;
  lr_schedule_.total_steps = total_steps_;
  if (auto warmup = config::param_number(p_->train.lr_scheduler_params, "warmup_steps", "train.lr_scheduler_params.warmup_steps")) {
    lr_schedule_.warmup_steps = static_cast<int64_t>(*warmup);
  }
  ObjectiveOptions objective;
  objective.noise_offset = p_->train.noise_offset;
  objective.min_snr_gamma = p_->train.min_snr_gamma;
  objective.timestep_type = p_->train.timestep_type;
  objective_ = std::make_unique<TrainingObjective>(model_->traits(), objective);
  if (const auto& e = p_->train.ema_config; e.use_ema) {
    ema_ = std::make_unique<optim::AdapterEMA>(optimizer_->params(),
                                                optim::EMAOptions{e.ema_decay, e.use_feedback, e.param_multiplier});
  }
}

void Trainer::restore_state() {
  if (request_.fresh) return;
  fs::path path = state_path(request_.resume.value_or(run_dir_));
  auto state = load_training_state(path);
  if (!state) {
    if (request_.resume) throw InputError(request_.resume->string() + ": no training state to resume from (" + path.string() + ")");
    return;
  }
  if (state->config_name != job_.name) {
    throw InputError(path.string() + ": the saved state belongs to run '" + state->config_name + "', not '" + job_.name + "'");
  }
  {
    torch::NoGradGuard no_grad;
    auto params = network_->named_parameters(true);
    if (static_cast<size_t>(params.size()) != state->adapter.size()) {
      throw InputError(path.string() + ": the saved adapter has " + std::to_string(state->adapter.size()) +
                       " tensors, this network " + std::to_string(params.size()) + " (network settings changed?)");
    }
    for (const auto& [name, value] : state->adapter) {
      auto* target = params.find(name);
      if (!target || target->sizes() != value.sizes()) {
        throw InputError(path.string() + ": adapter tensor '" + name + "' does not match this network");
      }
      target->copy_(value);
    }
  }
  optimizer_->load_state_dict(state->optimizer);
  if (ema_) {
    // A state saved without EMA starts the average from the resumed weights, as AI Toolkit does.
    if (!state->ema.empty()) ema_->load_state_dict(state->ema);
    else ema_ = std::make_unique<optim::AdapterEMA>(optimizer_->params(), ema_->options());
  }
  sample::set_generator_state(noise_rng_, state->noise_rng);
  set_global_rng_state(state->global_rng);
  // The guard's changes from the interrupted run carry over: the saved settings win.
  if (!state->settings_json.empty()) {
    MemorySettings saved = settings_;
    playbook::from_json(nlohmann::json::parse(state->settings_json), saved);
    if (saved != settings_) {
      spdlog::info("settings carried over from the interrupted run: {}", summarize(saved));
      guard_->adopt(saved);
      apply(saved);
    }
  }
  if (state->world_size != world_size()) {
    spdlog::warn("the saved state is from a run on {} rank(s), this one has {}: training continues with {} rows per step "
                 "instead of {}, so it does not repeat the uninterrupted run exactly",
                 state->world_size, world_size(), settings_.batch_size * world_size(), settings_.batch_size * state->world_size);
  } else if (dp_ && !is_main()) {
    // This rank's own generator states (its dropout draws), when it saved them.
    const fs::path own = rank_state_path(request_.resume.value_or(run_dir_), dp_->rank());
    if (auto mine = load_training_state(own); mine && mine->step == state->step) set_global_rng_state(mine->global_rng);
  }
  batches_->restore_state(state->data_position);
  step_ = state->step;
  saved_step_ = state->step;
  resumed_ = true;
  spdlog::info("resumed from {} at step {}", path.string(), step_);
}

PhaseContext Trainer::step_context(const data::Batch& batch) const {
  PhaseContext where;
  where.step = step_ + 1;
  where.width = batch.size.width;
  where.height = batch.size.height;
  where.batch = static_cast<int>(batch.items.size()) / world_size();  // this rank's rows
  where.resolution = batch.resolution;
  where.frames = std::max(clip_frames(), 1);
  return where;
}

at::Tensor Trainer::latents_for(const data::Batch& batch) {
  if (latent_cache_) {
    bool all_cached = true;
    for (const auto& item : batch.items) all_cached = all_cached && latent_cache_->contains(item.image, item.placement, item.flip_x);
    if (all_cached) return latent_cache_->batch(batch).to(device_);
  }
  const bool clips = clip_frames() > 0 && dataset_->is_video();
  return model_->encode_pixels(clips ? batches_->load_clip_pixels(batch, clip_frames()) : batches_->load_pixels(batch),
                               noise_rng_);
}

// AI Toolkit's unload_text_encoder: unless the captions' embeddings are cached (cache_text_embeddings,
// and captions that do not change from step to step), every image trains on the trigger word (blank
// without one), encoded once before the encoders left.
bool Trainer::trains_on_trigger_only() const {
  if (!p_->train.unload_text_encoder) return false;
  const bool cached = p_->train.cache_text_embeddings || p_->datasets[0].cache_text_embeddings;
  return !cached || !dataset_->fixed_captions();
}

// Captions -> embeddings [B, ...] on the device: from the text cache when there is one (a new
// caption is encoded and kept), else encoded now (with gradients when the text encoder trains).
TextEmbedding Trainer::text_on_device(const std::vector<std::string>& captions) {
  if (!text_cache_) return model_->encode_text(captions);
  TextEmbedding text = text_cache_->batch(captions, [this](const std::string& caption) { return cached_text(caption); });
  for (auto& [name, tensor] : text) tensor = tensor.to(device_);
  return text;
}

Conditioning Trainer::conditioning_for(const data::Batch& batch) {
  Conditioning c;
  std::vector<std::string> captions = batch.captions();
  if (trains_on_trigger_only()) captions.assign(captions.size(), dataset_->options().trigger_word);
  c.text = text_on_device(captions);
  c.guidance = p_->train.cfg_scale;
  for (const auto& item : batch.items) {
    const auto& image = dataset_->images()[item.image];
    c.images.push_back({image.width, image.height, item.placement.crop_x, item.placement.crop_y,
                        item.placement.crop_width, item.placement.crop_height});
  }
  return c;
}

// One optimizer step over grad_accumulation batches, then the EMA update. Runs again from the same
// start after an OOM; an OOM in the EMA update (after the optimizer step) retries the update only.
// Data parallel: the ranks agree that every rank's backward went through, then sum the gradients.
void Trainer::train_step() {
  if (step_start_.ema_updated) return;
  if (step_start_.optimizer_stepped) {
    if (!ema_) {
      throw Error(ExitCode::kRuntime, "another rank ran out of memory after this rank's optimizer step: the ranks' adapters "
                                      "no longer agree; run the same command again to resume from the last saved state");
    }
    ema_->update();
    step_start_.ema_updated = true;
    return;
  }
  batches_->seek(step_start_.position);
  sample::set_generator_state(noise_rng_, step_start_.noise_rng);
  set_global_rng_state(step_start_.global_rng);
  optimizer_->zero_grad();
  step_images_.clear();

  last_loss_ = dp_ ? dp_->sum_gradients([this] { return accumulate_gradients(); }, optimizer_->params())
                   : accumulate_gradients();
  if (dtype_ == at::kHalf && !unscale_gradients()) {
    optimizer_->zero_grad();  // overflow: skip this update, halve the scale (dynamic loss scaling)
    return;
  }
  optim::clip_grad_norm(optimizer_->params(), p_->train.max_grad_norm);
  optimizer_->step(lr_schedule_.lr_at(step_));
  optimizer_->zero_grad();
  if (ema_ || dp_) step_start_.optimizer_stepped = true;
  if (ema_) {
    ema_->update();
    step_start_.ema_updated = true;
  }
}

// Forward and backward over the step's grad_accumulation batches; the step's loss. Data parallel:
// each batch is the global one, of which this rank trains on its own rows.
double Trainer::accumulate_gradients() {
  const int accumulation = settings_.grad_accumulation;
  double loss_sum = 0;
  for (int micro = 0; micro < accumulation; ++micro) {
    data::Batch batch = batches_->next();
    if (micro == 0) step_bucket_ = batch.size;
    if (micro > 0) guard_->set_context(step_context(batch));  // an OOM names the batch it happened in
    for (const auto& item : batch.items) step_images_.push_back(item.image);
    BatchShard shard;
    double share = 1.0;  // this rank's part of the global batch's mean
    if (dp_) {
      const double rows = static_cast<double>(batch.items.size());
      batch = dp_->take(batch, shard);
      share = static_cast<double>(batch.items.size()) / rows;
    }
    const Conditioning conditioning = conditioning_for(batch);
    const at::Tensor latents = latents_for(batch);
    at::Tensor loss = training_loss(*model_, *objective_, latents, conditioning, noise_rng_, shard) * (share / accumulation);
    // fp16 activations underflow in backward: scale the loss up, and the gradients back down below.
    (dtype_ == at::kHalf ? loss * loss_scale_ : loss).backward();
    loss_sum += loss.item<double>();
  }
  return loss_sum;
}

// Divides the adapter gradients by the loss scale; false (and the scale halved) when any is inf
// or nan. After 2000 clean steps the scale doubles, as torch.cuda.amp.GradScaler does.
bool Trainer::unscale_gradients() {
  bool finite = true;
  for (auto& p : optimizer_->params()) {
    if (!p.grad().defined()) continue;
    p.mutable_grad().div_(loss_scale_);
    finite = finite && p.grad().isfinite().all().item<bool>();
  }
  if (!finite) {
    loss_scale_ = std::max(1.0, loss_scale_ / 2);
    clean_steps_ = 0;
    spdlog::warn("fp16 gradients overflowed at step {}: update skipped, loss scale now {}", step_ + 1, loss_scale_);
    return false;
  }
  if (++clean_steps_ % 2000 == 0) loss_scale_ *= 2;
  return true;
}

bool Trainer::sampling_due(int64_t step) const {
  if (settings_.disable_sampling || p_->sample.sample_every <= 0) return false;
  return step % p_->sample.sample_every == 0 && step >= p_->sample.sample_start_step;
}

// The previews the config asks for, at the size the guard allows.
std::vector<sample::SamplePrompt> Trainer::preview_prompts() const {
  sample::SampleDefaults defaults;
  defaults.width = settings_.sample_width;
  defaults.height = settings_.sample_height;
  defaults.seed = p_->sample.seed;
  defaults.walk_seed = p_->sample.walk_seed;
  defaults.guidance_scale = p_->sample.guidance_scale;
  defaults.sample_steps = settings_.sample_steps;
  defaults.neg = p_->sample.neg;
  defaults.network_multiplier = p_->sample.network_multiplier;
  defaults.trigger_word = p_->trigger_word;
  std::vector<sample::SampleItem> items;
  for (const auto& prompt : p_->sample.prompts) {
    sample::SampleItem item;
    item.prompt = prompt;
    items.push_back(item);
  }
  for (const auto& s : p_->sample.samples) {
    sample::SampleItem item;
    item.prompt = s.prompt;
    item.width = s.width;
    item.height = s.height;
    item.seed = s.seed;
    item.sample_steps = s.sample_steps;
    item.guidance_scale = s.guidance_scale;
    item.network_multiplier = s.network_multiplier;
    item.neg = s.neg;
    items.push_back(item);
  }
  if (items.empty()) return {};
  auto prompts = sample::resolve_sample_prompts(items, defaults);
  // The guard's shrink applies to per-prompt sizes too.
  for (auto& prompt : prompts) {
    prompt.width = std::min<int64_t>(prompt.width, settings_.sample_width);
    prompt.height = std::min<int64_t>(prompt.height, settings_.sample_height);
    prompt.steps = std::min<int64_t>(prompt.steps, settings_.sample_steps);
  }
  return prompts;
}

namespace {

// samples/progress.png: every step's grid so far, one row per step in step order (a resumed run's
// earlier grids included), so one image shows the base and the LoRA's effect growing.
void write_progress_grid(const fs::path& folder) {
  std::vector<fs::path> grids;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("grid_", 0) == 0 && entry.path().extension() == ".png") grids.push_back(entry.path());
  }
  std::sort(grids.begin(), grids.end());  // step tags are zero-padded
  std::vector<io::Image> rows;
  for (const auto& path : grids) rows.push_back(io::read_image(path));
  io::write_png(folder / "progress.png", io::make_grid(rows, /*columns=*/1, /*padding=*/0));
}

}  // namespace

void Trainer::sample_previews(int64_t step) {
  const auto prompts = preview_prompts();
  if (prompts.empty()) return;

  const ModelTraits& traits = model_->traits();
  const fs::path folder = run_dir_ / "samples";
  fs::create_directories(folder);
  std::vector<io::Image> images;
  const std::string stamp = timestamp_ms();
  {
    EvalScope eval(*model_);
    torch::NoGradGuard no_grad;
    std::optional<optim::AdapterEMA::AverageScope> average;
    if (ema_) average.emplace(*ema_);
    struct MultiplierReset {
      lora::LoRANetwork& network;
      ~MultiplierReset() { network->set_multiplier(1.0); }
    } reset{network_};
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& prompt = prompts[i];
      guard_->set_context({step, static_cast<int>(prompt.width), static_cast<int>(prompt.height), 1, 1, 0});
      network_->set_multiplier(prompt.network_multiplier);
      const TextEmbedding negative = traits.embedded_guidance ? TextEmbedding{} : text_on_device({prompt.negative});
      const at::Tensor image = render_preview(*model_, prompt, text_on_device({prompt.text}), negative,
                                              PreviewOptions{p_->sample.sampler, dtype_, device_, settings_.sample_num_frames});
      // A video preview [3, F, H, W]: an animated WebP, and its first frame in the PNGs and the grid.
      images.push_back(io::tensor_to_image(image.dim() == 4 ? image.select(1, 0) : image));
      io::write_png(folder / fmt::format("{}__{}_{}.png", stamp, step_tag(step), i), images.back());
      if (image.dim() == 4) {
        io::write_animated_webp(folder / fmt::format("{}__{}_{}.webp", stamp, step_tag(step), i),
                                io::video_tensor_to_frames(image), p_->sample.fps);
      }
    }
  }
  io::write_png(folder / fmt::format("grid_{}.png", step_tag(step)), io::make_grid(images));
  write_progress_grid(folder);
  spdlog::info("samples at step {}: {} images in {}", step, images.size(), folder.string());
  if (settings_.low_vram) release_encoders();
}

void Trainer::save_checkpoint(int64_t step, bool final) {
  if (!is_main()) {
    if (final) result_.lora_path = run_dir_ / (job_.name + ".safetensors");  // rank 0 writes it
    save_state();
    return;
  }
  lora::SaveOptions options;
  options.format = p_->save.save_format == "peft" ? lora::LoRAFormat::PEFT : lora::LoRAFormat::Kohya;
  options.dtype = dtype_from_name(config::canonical_dtype(p_->save.dtype));
  options.metadata = {{"ss_output_name", job_.name},
                      {"ss_steps", std::to_string(step)},
                      {"ss_max_train_steps", std::to_string(total_steps_)},
                      {"ss_learning_rate", fmt::format("{}", p_->train.lr)},
                      {"ss_optimizer", p_->train.optimizer},
                      {"ss_lr_scheduler", p_->train.lr_scheduler},
                      {"ss_resolution", flow_list(settings_.active_resolutions())},
                      {"ss_batch_size_per_device", std::to_string(settings_.batch_size)},
                      {"ss_gradient_accumulation_steps", std::to_string(settings_.grad_accumulation)},
                      {"ss_gradient_checkpointing", settings_.gradient_checkpointing ? "True" : "False"},
                      {"ss_mixed_precision", config::canonical_dtype(p_->train.dtype)},
                      {"ss_num_train_images", std::to_string(dataset_->size())},
                      {"ss_noise_offset", fmt::format("{}", p_->train.noise_offset)},
                      {"training_info", nlohmann::json{{"step", step}}.dump()},
                      {"lora_train_version", kVersion}};
  for (const auto& [key, value] : model_->lora_metadata()) options.metadata[key] = value;
  if (ema_) options.metadata["ss_ema_decay"] = fmt::format("{}", ema_->options().decay);
  std::optional<optim::AdapterEMA::AverageScope> average;
  if (ema_) average.emplace(*ema_);  // the saved LoRA is the average; the state keeps the live weights
  if (final) {
    result_.lora_path = run_dir_ / (job_.name + ".safetensors");
    network_->save(result_.lora_path, options);
  } else {
    network_->save(run_dir_ / (job_.name + "_" + step_tag(step) + ".safetensors"), options);
    // Keep the newest max_step_saves_to_keep step files (AI Toolkit prunes the oldest).
    std::vector<fs::path> saves;
    for (const auto& entry : fs::directory_iterator(run_dir_)) {
      const auto name = entry.path().filename().string();
      if (starts_with(name, job_.name + "_") && ends_with(name, ".safetensors")) saves.push_back(entry.path());
    }
    std::sort(saves.begin(), saves.end());
    while (saves.size() > static_cast<size_t>(std::max(1, p_->save.max_step_saves_to_keep))) {
      fs::remove(saves.front());
      saves.erase(saves.begin());
    }
  }
  average.reset();
  save_state();
}

// Rank 0 saves the whole state; another rank its step and its own generator states (its dropout
// draws), beside it.
void Trainer::save_state() {
  TrainingState state;
  state.step = step_;
  state.world_size = world_size();
  state.config_name = job_.name;
  if (!is_main()) {
    state.noise_rng = sample::generator_state(noise_rng_);
    state.global_rng = global_rng_state();
    save_training_state(rank_state_path(run_dir_, dp_->rank()), state);
    saved_step_ = step_;
    return;
  }
  state.data_position = batches_->state_json();
  nlohmann::json settings_json = settings_;
  state.settings_json = settings_json.dump();
  for (const auto& p : network_->named_parameters(true)) state.adapter.emplace_back(p.key(), p.value().detach().to(at::kCPU));
  state.optimizer = optimizer_->state_dict();
  if (ema_) state.ema = ema_->state_dict();
  state.noise_rng = sample::generator_state(noise_rng_);
  state.global_rng = global_rng_state();
  save_training_state(state_path(run_dir_), state);
  saved_step_ = step_;
}

// The save phase under the guard. A save that fails for another reason (a full disk, an I/O
// error, a file-size limit) has replaced nothing (every file is written atomically): the run
// stops with one message that says what is intact and how to go on.
void Trainer::save_phase(const std::function<void()>& body) {
  try {
    while (auto next = guard_->attempt(Phase::save, {step_}, body)) apply(*next);
  } catch (const memory::OomGiveUp&) {
    throw;
  } catch (const Error& e) {
    try {
      write_report(static_cast<int>(ExitCode::kRuntime), "save_failed");
    } catch (const std::exception&) {
      // Most likely the same full disk: the message below is what matters.
    }
    const std::string intact = saved_step_ ? fmt::format("the training state of step {} and the LoRA files saved before are intact", *saved_step_)
                                           : std::string("the files saved before are intact");
    throw Error(ExitCode::kRuntime, fmt::format("saving step {} failed: {}\n{}: make room (or fix the disk) and run the same "
                                                "command again to resume",
                                                step_, e.what(), intact));
  }
}

// The guard's one change (or a scale-up, or the settings a resumed run carries over), made here.
// Inside a training step the step then restarts from step_start_.
void Trainer::apply(const MemorySettings& next) {
  const MemorySettings previous = settings_;
  const playbook::SettingsChange change = playbook::changes(previous, next);
  settings_ = next;
  if (!model_) return;  // failed while loading: load_model() reads settings_ on the retry
  if (change.checkpointing) model_->set_gradient_checkpointing(settings_.gradient_checkpointing);
  if (change.attention || change.vae_tiling) model_->set_compute_mode(compute_mode());
  if (batches_ && (change.batch_size || change.buckets)) rebucket(previous);
  // Shorter clips: the next loads (a retried step's too) and the latent cache use the new length.
  if (latent_cache_ && change.frames && clip_frames() > 0) latent_cache_->set_num_frames(clip_frames());
  if (latent_cache_ && (change.buckets || change.frames)) cache_latents();
  if (change.quantize) {
    quantize_base();
  }
  if (change.low_vram) {
    // Both encoders leave the device now (a failure while caching needs the VAE alone there); each
    // comes back when it is next used.
    model_->release(Encoder::text);
    model_->release(Encoder::vae);
  }
}

// New buckets and/or batch size for the batch iterator. Inside a training step the data goes back
// to the step's start (the step is retried with the same batch); between steps the position stays.
void Trainer::rebucket(const MemorySettings& previous) {
  if (in_train_step_) batches_->seek(step_start_.position);
  if (settings_.dropped_largest < previous.dropped_largest) {
    // A scale-up re-enables a dropped bucket: plan again from the dataset, drop down to the new
    // count, and continue at the same place in the epoch.
    const data::BatchPosition at = batches_->position();
    batch_options_.batch_size = previous.batch_size * world_size();
    batches_ = std::make_unique<data::BatchIterator>(*dataset_, dataset_->make_plan(bucket_options_), batch_options_);
    for (int i = 0; i < settings_.dropped_largest; ++i) batches_->drop_largest_resolution();
    batches_->seek({at.epoch, std::min(at.index, batches_->batches_per_epoch() - 1)});
  }
  if (settings_.batch_size != previous.batch_size) {
    batches_->set_batch_size(settings_.batch_size * world_size());
    batch_options_.batch_size = settings_.batch_size * world_size();
  }
  for (int i = std::max(previous.dropped_largest, 0); i < settings_.dropped_largest; ++i) {
    if (auto drop = batches_->drop_largest_resolution()) {
      spdlog::info("resolution {} dropped: {} entries re-bucketed to {}", drop->from, drop->moved_entries, drop->to);
    }
  }
  if (in_train_step_) step_start_.position = batches_->position();
}

int Trainer::give_up(const memory::OomGiveUp& g) {
  const auto& d = g.decision();
  const int code = static_cast<int>(g.code());  // the guard has logged why
  if (network_ && optimizer_ && batches_) {
    try {
      save_state();
      spdlog::info("resumable state saved in {}", state_path(run_dir_).string());
    } catch (const std::exception& e) {
      spdlog::error("could not save the training state: {}", e.what());
    }
  }
  try {
    if (is_main()) {
      config::write_effective_yaml(playbook::config_with_settings(job_, d.settings), run_dir_ / "fixed.yaml");
      spdlog::info("settings to try next: {}", (run_dir_ / "fixed.yaml").string());
    }
  } catch (const std::exception& e) {
    spdlog::error("could not write fixed.yaml: {}", e.what());
  }
  write_report(code, code == static_cast<int>(ExitCode::kEnvironment) ? "environment" : "oom_exhausted");
  return code;
}

void Trainer::write_report(int exit_code, const std::string& outcome) {
  result_.actions.clear();
  for (const auto& attempt : guard_->attempts()) result_.actions.push_back(attempt.description);
  if (!is_main()) return;  // rank 0 writes the run's report
  nlohmann::json report = guard_->to_json();
  report["outcome"] = outcome;
  if (outcome != "running") report["exit_code"] = exit_code;
  report["steps_completed"] = step_;
  report["total_steps"] = total_steps_;
  report["device"] = memory_->name();
  report["final_settings"] = settings_;
  if (!result_.losses.empty()) {
    report["loss_first"] = result_.losses.front();
    report["loss_last"] = result_.losses.back();
  }
  if (!result_.lora_path.empty()) report["lora"] = result_.lora_path.string();
  write_file_atomic(run_dir_ / "report.json", report.dump(2) + "\n");
  // report.html is a view of the run folder: not being able to write it does not fail the run.
  try {
    report::write_run_report(run_dir_);
  } catch (const std::exception& e) {
    spdlog::warn("report.html not written: {}", e.what());
  }
}

// While training: report.json says "running" and report.html reloads itself.
void Trainer::refresh_report() {
  try {
    write_report(0, "running");
  } catch (const std::exception& e) {
    spdlog::warn("report.json not written: {}", e.what());
  }
}

}  // namespace

RunResult run_training(const RunRequest& request) {
  Trainer trainer(request);
  return trainer.run();
}

// ---------------------------------------------------------------------------------------------
// `lora-train sample`

// The base with the files' adapters: the network each file describes (any adapter type), loaded
// from it. One file stays an adapter, as in training; several are merged into the base weights.
void Trainer::load_sampling_model(const std::vector<SampleLoRA>& loras) {
  model_.reset();
  network_ = lora::LoRANetwork(nullptr);
  model_options_.defer_encoders = settings_.low_vram;
  model_options_.compute = compute_mode();
  model_options_.train_text_encoder = false;
  model_ = load_diffusion_model(model_options_);
  spdlog::info("loaded {} base from {}", playbook::to_string(model_->traits().family), model_options_.name_or_path.string());
  p_->sample.sampler = sampler_for_model(model_->traits(), p_->sample.sampler);
  std::vector<lora::ComponentSpec> specs;
  for (const auto& target : model_->lora_targets()) specs.push_back(*target.spec);
  for (const auto& lora_file : loras) {
    auto file = io::SafetensorsFile::open(lora_file.path);
    const auto dims = lora::module_dims_from_file(*file, specs);
    lora::LoRANetwork network{lora::NetworkConfig{}};
    for (const auto& target : model_->lora_targets()) network->add_component(*target.spec, *target.root, &dims);
    if (network->modules().empty()) {
      throw InputError(lora_file.path.string() + ": none of its modules belongs to this " +
                       playbook::to_string(model_->traits().family) + " base");
    }
    const auto report = network->load_weights(*file, /*strict=*/false);
    if (!report.unexpected.empty()) {
      spdlog::warn("{}: {} module(s) not in this base, left out (first: {})", lora_file.path.string(),
                   report.unexpected.size(), report.unexpected.front());
    }
    network->to(device_);
    spdlog::info("{}: {} modules, multiplier {}", lora_file.path.string(), report.loaded, lora_file.multiplier);
    if (loras.size() == 1) {
      network_ = network;
      network_->apply_to();
    } else {
      network->merge_to(lora_file.multiplier);
    }
  }
  model_->set_training(false);
}

SampleResult Trainer::sample(const SampleRequest& request) {
  if (request.config_path) {
    job_ = config::load_config(*request.config_path, request.overrides);
  } else {
    // Without a config: the defaults of a run on `model_path` (AI Toolkit's sample: defaults).
    // (The dataset is required by the schema and never read here.)
    std::string path = request.model_path.value_or("").string();
    for (size_t at = path.find('\''); at != std::string::npos; at = path.find('\'', at + 2)) path.insert(at, "'");
    const std::string text = "job: extension\nconfig:\n  name: sample\n  process:\n    - type: sd_trainer\n"
                             "      training_folder: output\n      device: auto\n      model:\n        name_or_path: '" +
                             path + "'\n      datasets:\n        - folder_path: unused\n";
    job_ = config::parse_config_text(text, "--model", request.overrides);
  }
  read_config();
  for (const auto& note : frame_notes_) spdlog::warn("{}", note);
  settle_cpu_dtype();
  open_device_memory();
  torch::manual_seed(seed());
  while (auto next = guard_->attempt(Phase::load, {}, [&] { load_sampling_model(request.loras); })) apply(*next);

  // The config's prompts (or --prompt), with --seed / --steps / --multiplier on top.
  if (!request.prompts.empty()) {
    p_->sample.prompts = request.prompts;
    p_->sample.samples.clear();
  }
  if (p_->sample.prompts.empty() && p_->sample.samples.empty()) {
    throw InputError("no prompt to sample: give --prompt or a config with sample.prompts");
  }
  if (request.seed) {
    p_->sample.seed = *request.seed;
    for (auto& item : p_->sample.samples) item.seed.reset();
  }
  if (request.steps) {
    settings_.sample_steps = static_cast<int>(*request.steps);
    for (auto& item : p_->sample.samples) item.sample_steps.reset();
  }
  std::string loras_text;
  for (const auto& l : request.loras) {
    loras_text += fmt::format("{}{} ({})", loras_text.empty() ? "" : ", ", l.path.filename().string(), l.multiplier);
  }
  std::vector<io::Image> images;
  std::vector<sample::SamplePrompt> used;
  std::vector<std::string> parameters;
  // The sampling ladder: a failure shrinks the size and steps (preview_prompts() caps the prompts
  // to the guard's settings) and the whole set is drawn again.
  while (auto next = guard_->attempt(Phase::sample, {0, settings_.sample_width, settings_.sample_height}, [&] {
           images.clear();
           parameters.clear();
           used = preview_prompts();
           EvalScope eval(*model_);
           torch::NoGradGuard no_grad;
           for (auto& prompt : used) {
             if (request.multiplier_given) prompt.network_multiplier = request.loras.front().multiplier;
             guard_->set_context({0, static_cast<int>(prompt.width), static_cast<int>(prompt.height), 1, 1, 0});
             if (network_) network_->set_multiplier(prompt.network_multiplier);
             const TextEmbedding negative =
                 model_->traits().embedded_guidance ? TextEmbedding{} : text_on_device({prompt.negative});
             const at::Tensor image = render_preview(*model_, prompt, text_on_device({prompt.text}), negative,
                                                     PreviewOptions{p_->sample.sampler, dtype_, device_, settings_.sample_num_frames});
             images.push_back(io::tensor_to_image(image.dim() == 4 ? image.select(1, 0) : image));  // a clip's first frame
             // A1111's "parameters" text: the prompt, then the settings that reproduce the image.
             parameters.push_back(fmt::format("{}\nNegative prompt: {}\nSteps: {}, Sampler: {}, CFG scale: {}, Seed: {}, "
                                              "Size: {}x{}, Model: {}, LoRA: {}",
                                              prompt.text, prompt.negative, prompt.steps, p_->sample.sampler,
                                              prompt.guidance_scale, prompt.seed, prompt.width, prompt.height,
                                              model_options_.name_or_path.filename().string(),
                                              loras_text.empty() ? "none" : loras_text));
           }
         })) {
    apply(*next);
  }

  SampleResult result;
  const fs::path folder = request.output_dir.value_or(run_dir_ / "samples_cli");
  fs::create_directories(folder);
  for (size_t i = 0; i < images.size(); ++i) {
    const fs::path path = folder / fmt::format("sample_{:02d}_seed{}.png", i, used[i].seed);
    io::write_png(path, images[i], {{"parameters", parameters[i]}});
    result.images.push_back(path);
  }
  std::string all;
  for (const auto& text : parameters) all += (all.empty() ? "" : "\n\n") + text;
  result.grid = folder / "grid.png";
  io::write_png(result.grid, io::make_grid(images), {{"parameters", all}});
  spdlog::info("{} image(s) and a grid in {}", images.size(), folder.string());
  return result;
}

SampleResult run_sampling(const SampleRequest& request) {
  if (request.loras.empty()) throw InputError("give at least one --lora FILE");
  if (!request.config_path && !request.model_path) throw InputError("give a config (CONFIG.yaml) or --model PATH");
  for (const auto& lora : request.loras) {
    if (!fs::is_regular_file(lora.path)) throw InputError(lora.path.string() + ": no such adapter file");
  }
  RunRequest run;
  if (request.config_path) run.config_path = *request.config_path;
  Trainer trainer(run);
  return trainer.sample(request);
}

}  // namespace lt::train
