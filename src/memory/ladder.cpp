#include "loratrain/memory/ladder.h"

#include <algorithm>
#include <functional>
#include <ostream>

#include <fmt/format.h>

#include "loratrain/util/strings.h"

namespace lt::memory {

const char* to_string(ActionKind k) {
  switch (k) {
    case ActionKind::empty_cache_retry: return "empty_cache_retry";
    case ActionKind::chunk_attention: return "chunk_attention";
    case ActionKind::tile_vae: return "tile_vae";
    case ActionKind::enable_checkpointing: return "enable_checkpointing";
    case ActionKind::batch_to_one: return "batch_to_one";
    case ActionKind::drop_largest_bucket: return "drop_largest_bucket";
    case ActionKind::checkpointing_and_lower_resolution: return "checkpointing_and_lower_resolution";
    case ActionKind::shrink_samples: return "shrink_samples";
    case ActionKind::disable_sampling: return "disable_sampling";
    case ActionKind::skip_baseline_sample: return "skip_baseline_sample";
    case ActionKind::enable_low_vram: return "enable_low_vram";
    case ActionKind::quantize_base: return "quantize_base";
    case ActionKind::reduce_frames: return "reduce_frames";
    case ActionKind::give_up_exhausted: return "give_up_exhausted";
    case ActionKind::give_up_environment: return "give_up_environment";
    case ActionKind::give_up_host_memory: return "give_up_host_memory";
    case ActionKind::scale_up: return "scale_up";
    case ActionKind::revert_scale_up: return "revert_scale_up";
  }
  return "unknown";
}

const char* to_string(ScaleLever l) {
  switch (l) {
    case ScaleLever::larger_bucket: return "larger_bucket";
    case ScaleLever::richer_sampling: return "richer_sampling";
    case ScaleLever::larger_batch: return "larger_batch";
    case ScaleLever::more_frames: return "more_frames";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& os, ActionKind k) { return os << to_string(k); }
std::ostream& operator<<(std::ostream& os, ScaleLever l) { return os << to_string(l); }

int Action::exit_code() const {
  if (kind == ActionKind::give_up_exhausted) return 3;
  if (kind == ActionKind::give_up_environment) return 4;
  if (kind == ActionKind::give_up_host_memory) return 1;
  return 0;
}

bool LadderHistory::tried(const MemorySettings& s) const {
  return std::find(failed.begin(), failed.end(), s) != failed.end();
}

int LadderHistory::quick_retries_at(Phase phase, int64_t step) const {
  return static_cast<int>(std::count_if(quick_retries.begin(), quick_retries.end(), [&](const QuickRetry& q) {
    return q.phase == phase && q.step == step;
  }));
}

namespace {

constexpr int kSampleSizeFloor = 256;
constexpr int kSampleStepsFloor = 10;
constexpr int kMinVideoFrames = 5;

std::string bucket_list(const std::vector<int>& r) {
  std::string out;
  for (int v : r) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return "[" + out + "]";
}

using Rung = std::function<std::optional<Action>(const MemorySettings&)>;

std::optional<Action> chunk_attention(const MemorySettings& s) {
  if (s.attention_chunk > 0 && s.attention_chunk <= kGuardAttentionChunk) return std::nullopt;
  Action a{ActionKind::chunk_attention, "", s};
  a.settings.attention_chunk = kGuardAttentionChunk;
  a.description = fmt::format("memory.attention_chunk: {} -> {} (attention {} query rows at a time; same results)",
                              s.attention_chunk, kGuardAttentionChunk, kGuardAttentionChunk);
  return a;
}

std::optional<Action> tile_vae(const MemorySettings& s) {
  if (s.vae_tiling) return std::nullopt;
  Action a{ActionKind::tile_vae,
           "memory.vae_tiling: false -> true (VAE encode/decode in blended tiles; images at their size)", s};
  a.settings.vae_tiling = true;
  return a;
}

std::optional<Action> enable_checkpointing(const MemorySettings& s) {
  if (s.gradient_checkpointing) return std::nullopt;
  Action a{ActionKind::enable_checkpointing, "train.gradient_checkpointing: false -> true", s};
  a.settings.gradient_checkpointing = true;
  return a;
}

std::optional<Action> batch_to_one(const MemorySettings& s) {
  if (s.batch_size <= 1) return std::nullopt;
  Action a{ActionKind::batch_to_one, "", s};
  a.settings.batch_size = 1;
  a.settings.grad_accumulation = s.grad_accumulation * s.batch_size;
  a.description = fmt::format(
      "train.batch_size: {} -> 1, train.gradient_accumulation: {} -> {} (effective batch {} kept)",
      s.batch_size, s.grad_accumulation, a.settings.grad_accumulation, s.effective_batch());
  return a;
}

std::optional<Action> drop_largest_bucket(const MemorySettings& s) {
  const auto active = s.active_resolutions();
  if (active.size() < 2) return std::nullopt;
  Action a{ActionKind::drop_largest_bucket, "", s};
  a.settings.dropped_largest += 1;
  a.description = fmt::format(
      "datasets.resolution: drop {} (its images are re-bucketed to {}); buckets {}", active.back(),
      active[active.size() - 2], bucket_list(a.settings.active_resolutions()));
  return a;
}

std::optional<Action> checkpointing_and_lower_resolution(const MemorySettings& s) {
  if (s.gradient_checkpointing || s.active_resolutions().size() < 2) return std::nullopt;
  auto drop = drop_largest_bucket(s);
  Action a{ActionKind::checkpointing_and_lower_resolution, "", drop->settings};
  a.settings.gradient_checkpointing = true;
  a.description = "train.gradient_checkpointing: false -> true together with " + drop->description +
                  " (the first step fails in backward: both at once)";
  return a;
}

int round_down_16(int64_t v) { return static_cast<int>(std::max<int64_t>(16, v / 16 * 16)); }

std::optional<Action> shrink_samples(const MemorySettings& s) {
  if (s.disable_sampling) return std::nullopt;
  const int smaller = std::min(s.sample_width, s.sample_height);
  if (smaller <= kSampleSizeFloor) return std::nullopt;
  // Halve both sides, but not below the floor on the smaller side (aspect ratio kept).
  const int target = std::max(kSampleSizeFloor, smaller / 2);
  Action a{ActionKind::shrink_samples, "", s};
  a.settings.sample_width = round_down_16(int64_t(s.sample_width) * target / smaller);
  a.settings.sample_height = round_down_16(int64_t(s.sample_height) * target / smaller);
  a.settings.sample_steps = std::max(std::min(s.sample_steps, kSampleStepsFloor), s.sample_steps / 2);
  a.description = fmt::format("sample.width/height: {}x{} -> {}x{}, sample.sample_steps: {} -> {}",
                              s.sample_width, s.sample_height, a.settings.sample_width,
                              a.settings.sample_height, s.sample_steps, a.settings.sample_steps);
  if (s.is_video && s.sample_num_frames > 1) {
    a.settings.sample_num_frames = reduced_frames(s.sample_num_frames);
    a.description += fmt::format(", sample.num_frames: {} -> {}", s.sample_num_frames,
                                 a.settings.sample_num_frames);
  }
  return a;
}

std::optional<Action> disable_sampling(const MemorySettings& s) {
  if (s.disable_sampling) return std::nullopt;
  Action a{ActionKind::disable_sampling, "train.disable_sampling: false -> true (no previews)", s};
  a.settings.disable_sampling = true;
  a.settings.skip_first_sample = true;
  return a;
}

std::optional<Action> skip_baseline_sample(const MemorySettings& s) {
  if (s.disable_sampling || s.skip_first_sample) return std::nullopt;
  Action a{ActionKind::skip_baseline_sample,
           "train.skip_first_sample: false -> true (no baseline sample before training)", s};
  a.settings.skip_first_sample = true;
  return a;
}

std::optional<Action> enable_low_vram(const MemorySettings& s) {
  if (s.low_vram) return std::nullopt;
  Action a{ActionKind::enable_low_vram,
           "model.low_vram: false -> true (text encoder and VAE on the CPU except while used)", s};
  a.settings.low_vram = true;
  return a;
}

std::optional<Action> quantize_base(const MemorySettings& s) {
  if (s.quantize != Quantize::none) return std::nullopt;
  Action a{ActionKind::quantize_base,
           "model.quantize: false -> true (frozen base weights stored as int8, per-channel scales)",
           s};
  a.settings.quantize = Quantize::int8;
  return a;
}

// Frames down to `floor` (exclusive): dataset clips and sample clips together.
Rung reduce_frames_to(int floor) {
  return [floor](const MemorySettings& s) -> std::optional<Action> {
    if (!s.is_video || s.num_frames <= std::max(1, floor)) return std::nullopt;
    Action a{ActionKind::reduce_frames, "", s};
    a.settings.num_frames = std::max(reduced_frames(s.num_frames), 1);
    a.settings.sample_num_frames =
        s.sample_num_frames > 1 ? reduced_frames(s.sample_num_frames) : s.sample_num_frames;
    a.description = fmt::format("datasets.num_frames: {} -> {}", s.num_frames, a.settings.num_frames);
    if (a.settings.sample_num_frames != s.sample_num_frames) {
      a.description += fmt::format(", sample.num_frames: {} -> {}", s.sample_num_frames,
                                   a.settings.sample_num_frames);
    }
    return a;
  };
}

// The rungs for a failure, safest first: the levers that change no result, then playbook §2's
// first change and §3's order. Before training the phase decides (a VAE failure while caching gets
// every VAE lever before the denoiser is touched); during training the class does.
std::vector<Rung> rungs_for(Phase phase, Classification cls, const Classified& c, const MemorySettings& s,
                            const MemorySettings& initial) {
  switch (cls) {
    case Classification::load:
      // A failure while caching is the VAE's (or the text encoder's): the denoiser is never
      // quantized for it, which would cost training quality; past the VAE's levers the guard gives up.
      if (phase == Phase::cache) return {chunk_attention, enable_low_vram, tile_vae};
      if (phase == Phase::baseline_sample) {
        return {chunk_attention, tile_vae, skip_baseline_sample, enable_low_vram, quantize_base};
      }
      return {enable_low_vram, quantize_base};
    case Classification::sampling:
      return {chunk_attention, tile_vae, shrink_samples, disable_sampling};
    case Classification::environment:
    case Classification::fragmentation:
      return {};
    case Classification::early_steps:
    case Classification::sometimes:
    case Classification::video_spike:
      break;
  }
  const int first_floor = reduced_frames(reduced_frames(initial.num_frames));
  if (phase == Phase::cache) {
    // A clip's encode while caching (video_spike): frames first as in training, then the cache
    // ladder's encoder levers; batch, checkpointing and the denoiser change nothing in the VAE.
    return {chunk_attention, reduce_frames_to(first_floor), enable_low_vram, tile_vae,
            reduce_frames_to(kMinVideoFrames)};
  }
  std::vector<Rung> rungs = {chunk_attention};
  if (s.is_video) {
    // Video (§3): frames first, at most two halvings before the other levers.
    for (const Rung& r : {reduce_frames_to(first_floor), Rung(enable_checkpointing), Rung(batch_to_one),
                          Rung(drop_largest_bucket), reduce_frames_to(kMinVideoFrames), Rung(disable_sampling),
                          Rung(enable_low_vram), Rung(quantize_base)}) {
      rungs.push_back(r);
    }
    return rungs;
  }
  if (cls == Classification::sometimes && c.largest_bucket) rungs.push_back(drop_largest_bucket);
  if (c.first_step && s.batch_size == 1) rungs.push_back(checkpointing_and_lower_resolution);
  for (const Rung& r : {Rung(enable_checkpointing), Rung(batch_to_one), Rung(drop_largest_bucket),
                        Rung(disable_sampling), Rung(enable_low_vram), Rung(quantize_base)}) {
    rungs.push_back(r);
  }
  return rungs;
}

Action exhausted(const FailureContext& ctx) {
  Action a{ActionKind::give_up_exhausted, "", ctx.settings};
  const OomNumbers& n = ctx.error.numbers;
  const int64_t total = n.total.value_or(ctx.at_start.total);
  std::string need;
  if (auto needed = n.needed()) {
    need = fmt::format("this step needs at least {} ({} allocated + {} requested)",
                       format_bytes(*needed), format_bytes(*n.allocated), format_bytes(*n.tried));
    if (total > 0) need += fmt::format(" but the device offers {}", format_bytes(total));
  } else if (total > 0) {
    need = fmt::format("this step needs more than the device's {}", format_bytes(total));
  } else {
    need = "this step needs more memory than the device has";
  }
  if (ctx.phase == Phase::cache) {
    std::string what = "encoding one caption";
    if (ctx.where.frames > 1) {
      what = fmt::format("the VAE's encode of one {}x{} clip of {} frames", ctx.where.width, ctx.where.height,
                         ctx.where.frames);
    } else if (ctx.where.width > 0) {
      what = fmt::format("the VAE's encode of one {}x{} image", ctx.where.width, ctx.where.height);
    }
    a.description = fmt::format(
        "give up: {} does not fit: every encoder lever is used ({}); the denoiser is not quantized for an "
        "encoder's failure (it would cost training quality); {}: free device memory or use a larger device, lower "
        "datasets.resolution, or set model.quantize: true yourself if its cost in quality is acceptable",
        what, summarize(ctx.settings), need);
    return a;
  }
  a.description = "give up: every memory lever is used (" + summarize(ctx.settings) + "); " + need;
  return a;
}

}  // namespace

Action next_action(const FailureContext& ctx, const Classified& c, const LadderHistory& history) {
  const MemorySettings& s = ctx.settings;
  const int64_t step = ctx.where.step;

  if (c.kind == Classification::environment) {
    if (history.environment_failures == 0 && !history.quick_retried(ctx.phase, step)) {
      return {ActionKind::empty_cache_retry,
              "empty the cache and retry once (conservative settings failing before training "
              "point at the environment)",
              s};
    }
    return {ActionKind::give_up_environment,
            "give up: memory is held outside this run (" + c.reason +
                "); free the GPU (other processes, a dirty worker) or use a clean one, then rerun "
                "the same config",
            s};
  }
  if (c.kind == Classification::fragmentation) {
    const int spent = history.quick_retries_at(ctx.phase, step);
    if (spent == 0 || (c.transient && spent < kTransientRetries)) {
      return {ActionKind::empty_cache_retry,
              c.transient ? "retry the same step (the request fits in free memory)"
                          : "empty the allocator cache and retry the same step once",
              s};
    }
  }

  for (const Rung& rung : rungs_for(ctx.phase, c.ladder, c, s, history.initial)) {
    auto a = rung(s);
    if (!a || a->settings == s || history.tried(a->settings)) continue;
    return *a;
  }
  return exhausted(ctx);
}

std::optional<ScaleUp> next_scale_up(const MemorySettings& cur, const MemorySettings& initial,
                                     const std::set<ScaleLever>& blocked) {
  auto open = [&](ScaleLever l) { return blocked.count(l) == 0; };

  if (open(ScaleLever::larger_bucket) && cur.dropped_largest > initial.dropped_largest) {
    Action a{ActionKind::scale_up, "", cur};
    a.settings.dropped_largest -= 1;
    a.description = fmt::format("datasets.resolution: re-enable {}; buckets {}",
                                a.settings.largest_resolution(),
                                bucket_list(a.settings.active_resolutions()));
    return ScaleUp{ScaleLever::larger_bucket, a};
  }
  if (open(ScaleLever::richer_sampling)) {
    Action a{ActionKind::scale_up, "", cur};
    if (cur.disable_sampling && !initial.disable_sampling) {
      a.settings.disable_sampling = false;
      a.settings.skip_first_sample = initial.skip_first_sample;
      a.description = "train.disable_sampling: true -> false";
      return ScaleUp{ScaleLever::richer_sampling, a};
    }
    if (!cur.disable_sampling &&
        (cur.sample_width < initial.sample_width || cur.sample_height < initial.sample_height)) {
      a.settings.sample_width = std::min(initial.sample_width, cur.sample_width * 2);
      a.settings.sample_height = std::min(initial.sample_height, cur.sample_height * 2);
      a.settings.sample_steps = std::min(initial.sample_steps, cur.sample_steps * 2);
      a.settings.sample_num_frames = increased_frames(cur.sample_num_frames, initial.sample_num_frames);
      a.description = fmt::format("sample.width/height: {}x{} -> {}x{}, sample.sample_steps: {} -> {}",
                                  cur.sample_width, cur.sample_height, a.settings.sample_width,
                                  a.settings.sample_height, cur.sample_steps, a.settings.sample_steps);
      return ScaleUp{ScaleLever::richer_sampling, a};
    }
  }
  if (open(ScaleLever::larger_batch) && cur.batch_size < initial.batch_size) {
    Action a{ActionKind::scale_up, "", cur};
    const int batch = std::min(initial.batch_size, cur.batch_size * 2);
    a.settings.batch_size = batch;
    a.settings.grad_accumulation = std::max(1, cur.effective_batch() / batch);
    a.description = fmt::format("train.batch_size: {} -> {}, train.gradient_accumulation: {} -> {}",
                                cur.batch_size, batch, cur.grad_accumulation,
                                a.settings.grad_accumulation);
    return ScaleUp{ScaleLever::larger_batch, a};
  }
  if (open(ScaleLever::more_frames) && cur.is_video && cur.num_frames < initial.num_frames) {
    Action a{ActionKind::scale_up, "", cur};
    a.settings.num_frames = increased_frames(cur.num_frames, initial.num_frames);
    a.settings.sample_num_frames = increased_frames(cur.sample_num_frames, initial.sample_num_frames);
    a.description = fmt::format("datasets.num_frames: {} -> {}", cur.num_frames, a.settings.num_frames);
    return ScaleUp{ScaleLever::more_frames, a};
  }
  return std::nullopt;
}

}  // namespace lt::memory
