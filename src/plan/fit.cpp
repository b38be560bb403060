// The guard's ladder on predictions: the same classification and the same next_action() the OOM
// guard uses after a real failure, asked as if the phase predicted over budget had failed at
// step 1 on the largest bucket. A rung the prediction says changes nothing for that phase (chunked
// attention on a sequence shorter than the chunk, VAE tiling on a VAE that does not tile) is
// skipped: recorded as tried, so the ladder offers the next one, and the settings stay as they are.
// The guard at run time still takes every rung (it has only the OOM to go by).
#include <fmt/format.h>

#include "loratrain/memory/classify.h"
#include "loratrain/memory/ladder.h"
#include "loratrain/plan/plan.h"

namespace lt::plan {

FitResult fit(const Planner& planner, const MemorySettings& start, int64_t budget) {
  FitResult r;
  r.settings = start;
  r.prediction = planner.predict(start);
  memory::LadderHistory history;
  history.initial = start;
  // Each rung changes one lever; the ladder has fewer rungs than this.
  for (int guard = 0; guard < 64; ++guard) {
    const std::optional<Phase> over = r.prediction.first_over(budget);
    if (!over) {
      r.fits = true;
      return r;
    }
    memory::FailureContext ctx;
    ctx.phase = *over;
    const int largest = r.settings.largest_resolution();
    ctx.where = {1, largest, largest, r.settings.num_frames, r.settings.batch_size, largest};
    if (*over == Phase::sample || *over == Phase::baseline_sample) {
      ctx.where.width = r.settings.sample_width;
      ctx.where.height = r.settings.sample_height;
    }
    ctx.largest_bucket = true;
    ctx.settings = r.settings;
    ctx.steps_completed = *over == Phase::sample || *over == Phase::save ? 1 : 0;
    const memory::Classified classified = memory::classify(ctx);
    const memory::Action action = memory::next_action(ctx, classified, history);
    if (action.gives_up() || action.kind == memory::ActionKind::empty_cache_retry) break;
    const Prediction next = planner.predict(action.settings);
    const PlannedChange change{memory::to_string(action.kind), action.description, *over, r.prediction.at(*over).peak(),
                               next.at(*over).peak()};
    // A change that stops the phase (no baseline, no previews) lowers it whatever its peak would be.
    if (next.at(*over).runs && change.peak_after >= change.peak_before) {
      history.failed.push_back(action.settings);
      r.skipped.push_back(change);
      continue;
    }
    history.failed.push_back(r.settings);
    r.changes.push_back(change);
    r.settings = action.settings;
    r.prediction = next;
  }
  r.fits = r.prediction.fits(budget);
  return r;
}

}  // namespace lt::plan
