// Classification and the rollback ladder as pure functions: exact action sequences.
#include <catch2/catch.hpp>

#include <random>

#include "loratrain/memory/classify.h"
#include "loratrain/memory/ladder.h"
#include "test_support.h"

using namespace lt::memory;
using K = ActionKind;

using lt::test::MiB;
using lt::test::GiB;

namespace {

MemorySettings image_job_settings() {
  MemorySettings s;
  s.gradient_checkpointing = false;
  s.batch_size = 4;
  s.grad_accumulation = 1;
  s.resolutions = {256, 512};
  s.sample_width = 512;
  s.sample_height = 512;
  s.sample_steps = 20;
  return s;
}

// A plain budget OOM: the request does not fit in what is free.
OomInfo budget_oom(int64_t total = 2 * GiB) {
  OomInfo info;
  info.kind = FailureKind::gpu_oom;
  info.signature = "CUDA out of memory";
  info.numbers.tried = 300 * MiB;
  info.numbers.total = total;
  info.numbers.free = 100 * MiB;
  info.numbers.allocated = total - 200 * MiB;
  info.numbers.reserved_unallocated = 50 * MiB;
  return info;
}

FailureContext context(Phase phase, int64_t step, const MemorySettings& s) {
  FailureContext ctx;
  ctx.phase = phase;
  ctx.where.step = step;
  ctx.where.width = ctx.where.height = s.largest_resolution();
  ctx.where.batch = s.batch_size;
  ctx.largest_bucket = true;
  ctx.settings = s;
  ctx.error = budget_oom();
  ctx.at_start = {2 * GiB - 100 * MiB, 2 * GiB};
  ctx.steps_completed = step > 0 ? step - 1 : 0;
  return ctx;
}

// Drives the ladder the way OomGuard does: the same failure again after every change, until it
// gives up. Returns the action kinds and the final action.
struct Run {
  std::vector<K> kinds;
  std::vector<Action> actions;
  Action last;
};
Run drive(FailureContext ctx, int limit = 30) {
  LadderHistory h;
  h.initial = ctx.settings;
  Run run;
  for (int i = 0; i < limit; ++i) {
    const Classified c = classify(ctx);
    const Action a = next_action(ctx, c, h);
    run.kinds.push_back(a.kind);
    run.actions.push_back(a);
    run.last = a;
    if (a.gives_up()) break;
    h.failed.push_back(ctx.settings);
    if (a.kind == K::empty_cache_retry) h.quick_retries.push_back({ctx.phase, ctx.where.step});
    if (c.kind == Classification::environment) ++h.environment_failures;
    ctx.settings = a.settings;
    ctx.where.batch = a.settings.batch_size;
  }
  return run;
}
}  // namespace

CATCH_TEST_CASE("classification table (playbook section 2)", "[memory][ladder]") {
  const MemorySettings s = image_job_settings();
  CATCH_CHECK(classify(context(Phase::load, 0, s)).kind == Classification::load);
  CATCH_CHECK(classify(context(Phase::cache, 0, s)).kind == Classification::load);
  CATCH_CHECK(classify(context(Phase::baseline_sample, 0, s)).kind == Classification::load);
  CATCH_CHECK(classify(context(Phase::sample, 100, s)).kind == Classification::sampling);
  CATCH_CHECK(classify(context(Phase::train_step, 1, s)).kind == Classification::early_steps);
  CATCH_CHECK(classify(context(Phase::train_step, 10, s)).kind == Classification::early_steps);
  CATCH_CHECK(classify(context(Phase::train_step, 11, s)).kind == Classification::sometimes);
  auto small_bucket = context(Phase::train_step, 300, s);
  small_bucket.largest_bucket = false;
  CATCH_CHECK(classify(small_bucket).kind == Classification::early_steps);

  MemorySettings video = s;
  video.is_video = true;
  video.num_frames = 81;
  CATCH_CHECK(classify(context(Phase::train_step, 3, video)).kind == Classification::video_spike);
  CATCH_CHECK(classify(context(Phase::train_step, 500, video)).kind == Classification::video_spike);
  CATCH_CHECK(classify(context(Phase::load, 0, video)).kind == Classification::load);
  // Caching: a clip's encode is the video spike; a caption's (frames 0) or an image's stays load.
  auto caching_clip = context(Phase::cache, 0, video);
  caching_clip.where.frames = 81;
  CATCH_CHECK(classify(caching_clip).kind == Classification::video_spike);
  CATCH_CHECK_THAT(classify(caching_clip).reason, Catch::Contains("clip of 81 frames"));
  caching_clip.where.frames = 0;
  CATCH_CHECK(classify(caching_clip).kind == Classification::load);
  caching_clip.where.frames = 1;
  CATCH_CHECK(classify(caching_clip).kind == Classification::load);

  CATCH_CHECK(classify(context(Phase::train_step, 1, s)).first_step);
  CATCH_CHECK_FALSE(classify(context(Phase::train_step, 5, s)).first_step);
}

CATCH_TEST_CASE("classification: fragmentation and environment", "[memory][ladder]") {
  MemorySettings s = image_job_settings();
  // Cached-but-unallocated memory larger than the request and > 1 GiB: fragmentation.
  auto frag = context(Phase::train_step, 20, s);
  frag.error.numbers.total = 24 * GiB;
  frag.error.numbers.tried = 2 * GiB;
  frag.error.numbers.free = 512 * MiB;
  frag.error.numbers.reserved_unallocated = 6 * GiB;
  Classified c = classify(frag);
  CATCH_CHECK(c.kind == Classification::fragmentation);
  CATCH_CHECK(c.ladder == Classification::sometimes);
  // Small cache: not fragmentation.
  frag.error.numbers.reserved_unallocated = 200 * MiB;
  CATCH_CHECK(classify(frag).kind == Classification::sometimes);
  // The request fits in free memory (an injected or transient failure): fragmentation too.
  frag.error.numbers.free = 3 * GiB;
  CATCH_CHECK(classify(frag).kind == Classification::fragmentation);

  // Environment: conservative settings, before training, memory held elsewhere at start.
  MemorySettings conservative = s;
  conservative.gradient_checkpointing = true;
  conservative.batch_size = 1;
  conservative.resolutions = {512};
  CATCH_CHECK(is_conservative(conservative));
  CATCH_CHECK_FALSE(is_conservative(s));
  auto env = context(Phase::load, 0, conservative);
  env.foreign_at_start = GiB + 500 * MiB;
  CATCH_CHECK(classify(env).kind == Classification::environment);
  // Same memory pressure but a heavy config: the ladder first, not the environment.
  auto heavy = context(Phase::load, 0, s);
  heavy.foreign_at_start = env.foreign_at_start;
  CATCH_CHECK(classify(heavy).kind == Classification::load);
  // After training really started: not environment.
  auto later = context(Phase::train_step, 40, conservative);
  later.foreign_at_start = env.foreign_at_start;
  CATCH_CHECK(classify(later).kind != Classification::environment);
  // "0 bytes is free" with conservative settings at the first step: environment.
  auto full = context(Phase::train_step, 1, conservative);
  full.error.numbers.free = 0;
  full.error.numbers.zero_free = true;
  CATCH_CHECK(classify(full).kind == Classification::environment);
  // Conservative, nothing held elsewhere: a model too big for the card, not the environment.
  CATCH_CHECK(classify(context(Phase::load, 0, conservative)).kind == Classification::load);
}

CATCH_TEST_CASE("ladder: early-step OOM, checkpointing off, batch 4, buckets [256, 512]", "[memory][ladder]") {
  const Run run = drive(context(Phase::train_step, 1, image_job_settings()));
  // The exact lever first (chunked attention changes no result), then the playbook's order.
  CATCH_CHECK(run.kinds == std::vector<K>{K::chunk_attention, K::enable_checkpointing, K::batch_to_one,
                                          K::drop_largest_bucket, K::disable_sampling, K::enable_low_vram,
                                          K::quantize_base, K::give_up_exhausted});
  CATCH_CHECK(run.actions[0].settings.attention_chunk == kGuardAttentionChunk);
  CATCH_CHECK(run.actions[0].description ==
              "memory.attention_chunk: 0 -> 1024 (attention 1024 query rows at a time; same results)");
  CATCH_CHECK(run.actions[1].settings.gradient_checkpointing);
  CATCH_CHECK(run.actions[1].settings.batch_size == 4);
  // Batch 1 keeps the effective batch through accumulation.
  CATCH_CHECK(run.actions[2].settings.batch_size == 1);
  CATCH_CHECK(run.actions[2].settings.grad_accumulation == 4);
  CATCH_CHECK(run.actions[2].settings.effective_batch() == 4);
  // The largest bucket is removed, not its images: 512 re-buckets to 256.
  CATCH_CHECK(run.actions[3].settings.active_resolutions() == std::vector<int>{256});
  CATCH_CHECK(run.actions[3].settings.resolutions == std::vector<int>{256, 512});
  CATCH_CHECK(run.actions[4].settings.disable_sampling);
  CATCH_CHECK(run.actions[5].settings.low_vram);
  CATCH_CHECK(run.actions[6].settings.quantize == Quantize::int8);
  // Training never tiles the VAE (latents are cached; tiling would change them).
  for (const Action& a : run.actions) CATCH_CHECK_FALSE(a.settings.vae_tiling);
  CATCH_CHECK(run.last.exit_code() == 3);
  // The exhausted message names the memory the step would need: allocated + requested.
  CATCH_CHECK(run.last.description.find("needs at least 2.10 GiB (1.80 GiB allocated + 300.00 MiB requested)") !=
              std::string::npos);
  CATCH_CHECK(run.actions[2].description ==
              "train.batch_size: 4 -> 1, train.gradient_accumulation: 1 -> 4 (effective batch 4 kept)");
}

CATCH_TEST_CASE("ladder: step 1 exactly with batch 1: checkpointing and lower resolution together", "[memory][ladder]") {
  MemorySettings s = image_job_settings();
  s.batch_size = 1;
  s.resolutions = {512, 1024};
  const Run run = drive(context(Phase::train_step, 1, s));
  CATCH_CHECK(run.kinds == std::vector<K>{K::chunk_attention, K::checkpointing_and_lower_resolution,
                                          K::disable_sampling, K::enable_low_vram, K::quantize_base,
                                          K::give_up_exhausted});
  CATCH_CHECK(run.actions[1].settings.gradient_checkpointing);
  CATCH_CHECK(run.actions[1].settings.active_resolutions() == std::vector<int>{512});
  // Not at the first step: one change at a time.
  auto later = context(Phase::train_step, 5, s);
  later.steps_completed = 4;
  CATCH_CHECK(drive(later).kinds[1] == K::enable_checkpointing);
  // Attention already chunked as small as the guard would: the ladder starts at checkpointing.
  s.attention_chunk = 512;
  CATCH_CHECK(drive(context(Phase::train_step, 1, s)).kinds.front() == K::checkpointing_and_lower_resolution);
}

CATCH_TEST_CASE("ladder: sampling OOM shrinks previews, then disables them; training untouched", "[memory][ladder]") {
  MemorySettings s = image_job_settings();
  s.gradient_checkpointing = true;
  const Run run = drive(context(Phase::sample, 100, s));
  // Chunked attention and tiled decode keep the previews at their size; then they shrink.
  CATCH_CHECK(run.kinds == std::vector<K>{K::chunk_attention, K::tile_vae, K::shrink_samples, K::disable_sampling,
                                          K::give_up_exhausted});
  CATCH_CHECK(run.actions[1].settings.vae_tiling);
  CATCH_CHECK(run.actions[1].settings.sample_width == 512);
  CATCH_CHECK(run.actions[1].description ==
              "memory.vae_tiling: false -> true (VAE encode/decode in blended tiles; images at their size)");
  CATCH_CHECK(run.actions[2].settings.sample_width == 256);
  CATCH_CHECK(run.actions[2].settings.sample_height == 256);
  CATCH_CHECK(run.actions[2].settings.sample_steps == 10);
  CATCH_CHECK(run.actions[2].description ==
              "sample.width/height: 512x512 -> 256x256, sample.sample_steps: 20 -> 10");
  for (const Action& a : run.actions) {
    CATCH_CHECK(a.settings.batch_size == s.batch_size);
    CATCH_CHECK(a.settings.gradient_checkpointing == s.gradient_checkpointing);
    CATCH_CHECK(a.settings.active_resolutions() == s.active_resolutions());
    CATCH_CHECK(a.settings.low_vram == s.low_vram);
  }
  // Large previews shrink in halves down to the floor; non-square ones keep their aspect.
  s.sample_width = 1024;
  s.sample_height = 1024;
  CATCH_CHECK(drive(context(Phase::sample, 100, s)).kinds ==
              std::vector<K>{K::chunk_attention, K::tile_vae, K::shrink_samples, K::shrink_samples,
                             K::disable_sampling, K::give_up_exhausted});
  s.sample_width = 832;
  s.sample_height = 480;
  const Run wide = drive(context(Phase::sample, 100, s));
  CATCH_CHECK(wide.actions[2].settings.sample_height == 256);
  CATCH_CHECK(wide.actions[2].settings.sample_width == 432);
}

CATCH_TEST_CASE("ladder: load, cache and baseline sample each have their own ladder", "[memory][ladder]") {
  MemorySettings s = image_job_settings();
  s.gradient_checkpointing = true;
  s.batch_size = 1;
  s.resolutions = {512};
  // Loading the model: its low-memory path, then the quantized base.
  const Run load = drive(context(Phase::load, 0, s));
  CATCH_CHECK(load.kinds == std::vector<K>{K::enable_low_vram, K::quantize_base, K::give_up_exhausted});
  CATCH_CHECK(load.last.exit_code() == 3);
  // Caching latents: exact levers first (chunked attention, the VAE alone on the device), then
  // tiled encode, then a clear give-up: the denoiser is never quantized for the VAE's failure.
  FailureContext caching = context(Phase::cache, 0, s);
  caching.where.width = 160;
  caching.where.height = 128;
  const Run cache = drive(caching);
  CATCH_CHECK(cache.kinds == std::vector<K>{K::chunk_attention, K::enable_low_vram, K::tile_vae, K::give_up_exhausted});
  for (const Action& a : cache.actions) CATCH_CHECK(a.settings.quantize == Quantize::none);
  CATCH_CHECK(cache.last.exit_code() == 3);
  CATCH_CHECK_THAT(cache.last.description, Catch::Contains("one 160x128 image"));
  CATCH_CHECK_THAT(cache.last.description, Catch::Contains("denoiser is not quantized"));
  // The baseline sample: exact levers, tiled decode, then skip the baseline only, then phase A's
  // low-memory path.
  const Run baseline = drive(context(Phase::baseline_sample, 0, s));
  CATCH_CHECK(baseline.kinds == std::vector<K>{K::chunk_attention, K::tile_vae, K::skip_baseline_sample,
                                               K::enable_low_vram, K::quantize_base, K::give_up_exhausted});
  CATCH_CHECK(baseline.actions[2].settings.skip_first_sample);
  CATCH_CHECK_FALSE(baseline.actions[2].settings.disable_sampling);
}

CATCH_TEST_CASE("ladder: a clip's encode while caching takes the video rung: frames first, then the VAE's levers",
                "[memory][ladder]") {
  MemorySettings s = image_job_settings();
  s.is_video = true;
  s.num_frames = 33;
  s.sample_num_frames = 33;
  s.batch_size = 2;
  FailureContext caching = context(Phase::cache, 0, s);
  caching.where = {0, 256, 256, 33, 1, 0};
  const Run run = drive(caching);
  CATCH_CHECK(run.kinds == std::vector<K>{K::chunk_attention, K::reduce_frames, K::reduce_frames, K::enable_low_vram,
                                          K::tile_vae, K::reduce_frames, K::give_up_exhausted});
  CATCH_CHECK(run.actions[1].description == "datasets.num_frames: 33 -> 17, sample.num_frames: 33 -> 17");
  CATCH_CHECK(run.actions[2].settings.num_frames == 9);
  CATCH_CHECK(run.actions[5].settings.num_frames == 5);
  // Nothing the VAE does not use: batch, checkpointing, buckets and the denoiser stay.
  for (const Action& a : run.actions) {
    CATCH_CHECK(a.settings.batch_size == 2);
    CATCH_CHECK_FALSE(a.settings.gradient_checkpointing);
    CATCH_CHECK(a.settings.dropped_largest == 0);
    CATCH_CHECK(a.settings.quantize == Quantize::none);
  }
  CATCH_CHECK_THAT(run.last.description, Catch::Contains("one 256x256 clip of 33 frames"));
}

CATCH_TEST_CASE("ladder: environment gives up after at most one retry", "[memory][ladder]") {
  MemorySettings s = image_job_settings();
  s.gradient_checkpointing = true;
  s.batch_size = 1;
  s.resolutions = {512};
  auto ctx = context(Phase::load, 0, s);
  ctx.foreign_at_start = GiB + 512 * MiB;
  const Run run = drive(ctx);
  CATCH_CHECK(run.kinds == std::vector<K>{K::empty_cache_retry, K::give_up_environment});
  CATCH_CHECK(run.last.exit_code() == 4);
  CATCH_CHECK(run.actions[0].settings == s);
  CATCH_CHECK(run.last.description.find("held by something else at start") != std::string::npos);
}

CATCH_TEST_CASE("ladder: video lowers frames first", "[memory][ladder]") {
  MemorySettings s = image_job_settings();
  s.is_video = true;
  s.num_frames = 81;
  s.sample_num_frames = 81;
  s.batch_size = 2;
  const Run run = drive(context(Phase::train_step, 3, s));
  CATCH_CHECK(run.kinds == std::vector<K>{K::chunk_attention, K::reduce_frames, K::reduce_frames,
                                          K::enable_checkpointing, K::batch_to_one, K::drop_largest_bucket,
                                          K::reduce_frames, K::reduce_frames, K::disable_sampling,
                                          K::enable_low_vram, K::quantize_base, K::give_up_exhausted});
  CATCH_CHECK(run.actions[1].settings.num_frames == 41);
  CATCH_CHECK(run.actions[1].settings.sample_num_frames == 41);
  CATCH_CHECK(run.actions[2].settings.num_frames == 21);
  CATCH_CHECK(run.actions[6].settings.num_frames == 9);
  CATCH_CHECK(run.actions[7].settings.num_frames == 5);
  CATCH_CHECK(run.actions[1].description == "datasets.num_frames: 81 -> 41, sample.num_frames: 81 -> 41");
}

CATCH_TEST_CASE("ladder: fragmentation empties the cache and retries once, then climbs", "[memory][ladder]") {
  auto ctx = context(Phase::train_step, 20, image_job_settings());
  ctx.error.numbers.total = 24 * GiB;
  ctx.error.numbers.tried = 2 * GiB;
  ctx.error.numbers.reserved_unallocated = 6 * GiB;
  const Run run = drive(ctx);
  CATCH_REQUIRE(run.kinds.size() >= 3);
  CATCH_CHECK(run.kinds[0] == K::empty_cache_retry);
  CATCH_CHECK(run.actions[0].settings == ctx.settings);
  // Once spent for this step, the ladder of the underlying class ("sometimes": largest bucket).
  CATCH_CHECK(run.kinds[1] == K::chunk_attention);
  CATCH_CHECK(run.kinds[2] == K::drop_largest_bucket);
  CATCH_CHECK(run.kinds[3] == K::enable_checkpointing);
  CATCH_CHECK(std::count(run.kinds.begin(), run.kinds.end(), K::empty_cache_retry) == 1);

  // A quick retry is per step: another step gets its own.
  LadderHistory h;
  h.initial = ctx.settings;
  h.quick_retries.push_back({Phase::train_step, 20});
  CATCH_CHECK(next_action(ctx, classify(ctx), h).kind == K::chunk_attention);
  ctx.where.step = 21;
  CATCH_CHECK(next_action(ctx, classify(ctx), h).kind == K::empty_cache_retry);

  // Transient (the request fits in free memory, no big cache): a few retries as is, then the ladder.
  auto transient = context(Phase::train_step, 30, image_job_settings());
  transient.error.numbers.free = GiB;
  const Run t = drive(transient);
  CATCH_CHECK(classify(transient).transient);
  CATCH_REQUIRE(t.kinds.size() > kTransientRetries);
  CATCH_CHECK(std::vector<K>(t.kinds.begin(), t.kinds.begin() + kTransientRetries + 1) ==
              std::vector<K>{K::empty_cache_retry, K::empty_cache_retry, K::empty_cache_retry,
                             K::chunk_attention});
}

CATCH_TEST_CASE("ladder: later steps on the largest bucket drop it first", "[memory][ladder]") {
  const Run run = drive(context(Phase::train_step, 200, image_job_settings()));
  CATCH_CHECK(run.kinds == std::vector<K>{K::chunk_attention, K::drop_largest_bucket, K::enable_checkpointing,
                                          K::batch_to_one, K::disable_sampling, K::enable_low_vram,
                                          K::quantize_base, K::give_up_exhausted});
}

CATCH_TEST_CASE("ladder: never an identical retry, always terminates", "[memory][ladder]") {
  std::mt19937 rng(1234);
  const Phase phases[] = {Phase::load, Phase::cache, Phase::baseline_sample, Phase::train_step,
                          Phase::sample, Phase::save};
  for (int trial = 0; trial < 400; ++trial) {
    MemorySettings s;
    s.gradient_checkpointing = rng() % 2;
    s.batch_size = 1 + rng() % 8;
    s.grad_accumulation = 1 + rng() % 4;
    const int nres = 1 + rng() % 4;
    for (int i = 0; i < nres; ++i) s.resolutions.push_back(256 * (i + 1));
    s.sample_width = 256 + 64 * (rng() % 16);
    s.sample_height = 256 + 64 * (rng() % 16);
    s.disable_sampling = rng() % 4 == 0;
    s.skip_first_sample = rng() % 3 == 0;
    s.low_vram = rng() % 4 == 0;
    s.attention_chunk = rng() % 3 == 0 ? 256 * (rng() % 8) : 0;
    s.vae_tiling = rng() % 4 == 0;
    s.is_video = rng() % 3 == 0;
    s.num_frames = s.is_video ? 1 + 4 * (rng() % 30) : 1;
    s.sample_num_frames = s.num_frames;
    auto ctx = context(phases[rng() % 6], 1 + rng() % 300, s);
    ctx.largest_bucket = rng() % 2;
    if (rng() % 4 == 0) ctx.error.numbers.free = 1 * GiB;  // fits: fragmentation first
    if (rng() % 5 == 0) ctx.foreign_at_start = GiB;

    LadderHistory h;
    h.initial = s;
    std::vector<MemorySettings> seen{s};
    bool gave_up = false;
    for (int i = 0; i < 40 && !gave_up; ++i) {
      const Classified c = classify(ctx);
      const Action a = next_action(ctx, c, h);
      if (a.gives_up()) {
        gave_up = true;
        break;
      }
      if (a.kind == K::empty_cache_retry) {
        CATCH_REQUIRE(h.quick_retries_at(ctx.phase, ctx.where.step) < kTransientRetries);
        h.quick_retries.push_back({ctx.phase, ctx.where.step});
      } else {
        CATCH_REQUIRE(a.settings != ctx.settings);
        CATCH_REQUIRE(std::find(seen.begin(), seen.end(), a.settings) == seen.end());
        // Exactly one lever per retry, except the documented "step 1" pair.
        CATCH_REQUIRE(a.settings.effective_batch() == ctx.settings.effective_batch());
      }
      if (c.kind == Classification::environment) ++h.environment_failures;
      h.failed.push_back(ctx.settings);
      ctx.settings = a.settings;
      seen.push_back(a.settings);
    }
    CATCH_REQUIRE(gave_up);
  }
}

CATCH_TEST_CASE("scale_up re-enables one heavier setting at a time in playbook order", "[memory][ladder]") {
  MemorySettings initial = image_job_settings();
  initial.resolutions = {256, 512, 1024};
  initial.sample_width = initial.sample_height = 1024;
  MemorySettings cur = initial;
  cur.gradient_checkpointing = true;
  cur.batch_size = 1;
  cur.grad_accumulation = 4;
  cur.dropped_largest = 2;
  cur.disable_sampling = true;
  cur.skip_first_sample = true;

  std::vector<ScaleLever> levers;
  std::set<ScaleLever> blocked;
  for (int i = 0; i < 20; ++i) {
    auto up = next_scale_up(cur, initial, blocked);
    if (!up) break;
    levers.push_back(up->lever);
    CATCH_CHECK(up->action.kind == K::scale_up);
    CATCH_CHECK(up->action.settings.gradient_checkpointing);  // stable memory settings stay
    CATCH_CHECK(up->action.settings.effective_batch() == initial.effective_batch());
    cur = up->action.settings;
  }
  CATCH_CHECK(levers == std::vector<ScaleLever>{ScaleLever::larger_bucket, ScaleLever::larger_bucket,
                                                ScaleLever::richer_sampling, ScaleLever::larger_batch,
                                                ScaleLever::larger_batch});
  CATCH_CHECK(cur.active_resolutions() == initial.resolutions);
  CATCH_CHECK(cur.batch_size == 4);
  CATCH_CHECK(cur.grad_accumulation == 1);
  CATCH_CHECK_FALSE(cur.disable_sampling);

  // A blocked lever is skipped for good.
  MemorySettings again = cur;
  again.dropped_largest = 1;
  again.batch_size = 2;
  again.grad_accumulation = 2;
  blocked.insert(ScaleLever::larger_bucket);
  auto up = next_scale_up(again, initial, blocked);
  CATCH_REQUIRE(up);
  CATCH_CHECK(up->lever == ScaleLever::larger_batch);

  // Video: frames come back last, along the same 4k+1 grid.
  MemorySettings vinit = image_job_settings();
  vinit.is_video = true;
  vinit.num_frames = vinit.sample_num_frames = 81;
  MemorySettings v = vinit;
  v.num_frames = 21;
  v.batch_size = 1;
  v.grad_accumulation = 4;
  auto vb = next_scale_up(v, vinit, {});
  CATCH_REQUIRE(vb);
  CATCH_CHECK(vb->lever == ScaleLever::larger_batch);
  v.batch_size = 4;
  v.grad_accumulation = 1;
  auto vf = next_scale_up(v, vinit, {});
  CATCH_REQUIRE(vf);
  CATCH_CHECK(vf->lever == ScaleLever::more_frames);
  CATCH_CHECK(vf->action.settings.num_frames == 41);
}

CATCH_TEST_CASE("frame steps stay on the 4k+1 grid", "[memory][ladder]") {
  CATCH_CHECK(reduced_frames(81) == 41);
  CATCH_CHECK(reduced_frames(41) == 21);
  CATCH_CHECK(reduced_frames(21) == 9);
  CATCH_CHECK(reduced_frames(9) == 5);
  CATCH_CHECK(reduced_frames(5) == 1);
  CATCH_CHECK(reduced_frames(1) == 1);
  CATCH_CHECK(reduced_frames(48) == 21);  // off the grid: down onto it
  CATCH_CHECK(increased_frames(21, 81) == 41);
  CATCH_CHECK(increased_frames(41, 81) == 81);
  CATCH_CHECK(increased_frames(81, 81) == 81);
  CATCH_CHECK(increased_frames(9, 33) == 17);
}
