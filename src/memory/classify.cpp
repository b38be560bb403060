#include "loratrain/memory/classify.h"

#include <ostream>

#include <fmt/format.h>

#include "loratrain/util/strings.h"

namespace lt::memory {

bool is_conservative(const MemorySettings& s) {
  if (!s.gradient_checkpointing || s.batch_size > 1) return false;
  if (s.largest_resolution() > kConservativeResolution) return false;
  if (s.is_video && s.num_frames > kConservativeFrames) return false;
  return true;
}

namespace {

bool before_training(const FailureContext& ctx) {
  switch (ctx.phase) {
    case Phase::load:
    case Phase::cache:
    case Phase::baseline_sample: return true;
    case Phase::train_step: return ctx.steps_completed == 0;
    case Phase::sample:
    case Phase::save: return false;
  }
  return false;
}

// The class by phase alone (§2 A-D and the video row).
Classification by_phase(const FailureContext& ctx, std::string& reason) {
  // Caching a clip's latents: the VAE's encode of one clip grows with its frames, so the video
  // ladder (frames first) applies, not the load one. A caption (frames 0) or an image stays `load`.
  if (ctx.phase == Phase::cache && ctx.settings.is_video && ctx.where.frames > 1) {
    reason = fmt::format("caching the latents of a clip of {} frames, before training started", ctx.where.frames);
    return Classification::video_spike;
  }
  switch (ctx.phase) {
    case Phase::load:
    case Phase::cache:
    case Phase::baseline_sample:
      reason = fmt::format("failed in {}, before training started", to_string(ctx.phase));
      return Classification::load;
    case Phase::sample:
      reason = "failed while generating previews; training steps fit";
      return Classification::sampling;
    case Phase::train_step:
    case Phase::save: break;
  }
  const int frames = std::max(ctx.where.frames, ctx.settings.num_frames);
  if (ctx.settings.is_video && frames > 1) {
    reason = fmt::format("video training step with {} frames", frames);
    return Classification::video_spike;
  }
  const int64_t step = ctx.where.step > 0 ? ctx.where.step : ctx.steps_completed + 1;
  if (step <= kEarlyStepLimit) {
    reason = fmt::format("training step {} (early: steps 1-{})", step, kEarlyStepLimit);
    return Classification::early_steps;
  }
  if (ctx.largest_bucket) {
    reason = fmt::format("step {} after {} good steps, on the largest bucket", step,
                         ctx.steps_completed);
    return Classification::sometimes;
  }
  // A late failure on a smaller bucket is not the largest bucket's fault: treat it like an early
  // one (the general ladder).
  reason = fmt::format("step {} after {} good steps, not on the largest bucket", step,
                       ctx.steps_completed);
  return Classification::early_steps;
}

}  // namespace

Classified classify(const FailureContext& ctx) {
  Classified c;
  c.largest_bucket = ctx.largest_bucket;
  c.first_step = ctx.phase == Phase::train_step && ctx.steps_completed == 0;
  std::string phase_reason;
  c.ladder = by_phase(ctx, phase_reason);
  c.kind = c.ladder;
  c.reason = phase_reason;

  const OomNumbers& n = ctx.error.numbers;
  const int64_t total = n.total.value_or(ctx.at_start.total);

  // E. Environment: settings already conservative, failing before training really started, and
  // evidence that the memory is not ours (held at start, held by another process at the failure,
  // a completely full card, or cuBLAS unable to get its workspace).
  const bool held_at_start =
      ctx.at_start.total > 0 && ctx.foreign_at_start > kForeignFraction * ctx.at_start.total;
  const bool held_now =
      total > 0 && n.other_process && *n.other_process > kForeignFraction * total;
  if (is_conservative(ctx.settings) && before_training(ctx) &&
      (held_at_start || held_now || ctx.error.environment_signature())) {
    c.kind = Classification::environment;
    c.ladder = Classification::environment;
    if (held_at_start) {
      c.reason = fmt::format("conservative settings fail before training while {} of {} was held "
                             "by something else at start",
                             format_bytes(ctx.foreign_at_start), format_bytes(ctx.at_start.total));
    } else if (held_now) {
      c.reason = fmt::format("conservative settings fail before training; another process holds {}",
                             format_bytes(*n.other_process));
    } else {
      c.reason = fmt::format("conservative settings fail before training ({})",
                             n.zero_free ? "0 bytes is free" : ctx.error.signature);
    }
    return c;
  }

  // Fragmentation: the request would have fit. Either the allocator holds much cached but
  // unallocated memory (more than the request, and > 25% of the card or > 1 GiB), or free memory
  // itself exceeds the request (a transient failure: nothing to shrink).
  if (n.tried && *n.tried > 0) {
    const int64_t cached = n.reserved_unallocated.value_or(0);
    const bool fragmented = cached > *n.tried &&
                            ((total > 0 && cached > kFragmentedFraction * total) ||
                             cached > kFragmentedBytes);
    const bool fits = n.free && *n.free >= *n.tried;
    if (fragmented || fits) {
      c.kind = Classification::fragmentation;
      c.transient = fits && !fragmented;
      c.reason = fragmented
                     ? fmt::format("{} reserved but unallocated exceeds the {} request",
                                   format_bytes(cached), format_bytes(*n.tried))
                     : fmt::format("{} free exceeds the {} request", format_bytes(*n.free),
                                   format_bytes(*n.tried));
      c.reason += "; then " + phase_reason;
    }
  }
  return c;
}

}  // namespace lt::memory
