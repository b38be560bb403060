// One vocabulary: every lever the guard pulls, logged by the real guard, is read back by `diagnose`
// into the settings the guard is now running with. Each phase's ladder is walked to its end on a
// request that never fits, and after each log line the diagnosis must agree with guard.settings().
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include <set>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/fixes.h"
#include "loratrain/memory/budget_allocator.h"
#include "loratrain/memory/guard.h"
#include "test_support.h"

using namespace lt::memory;
using K = ActionKind;

using lt::test::MiB;

namespace {

class LogLines {
 public:
  LogLines() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%v");
    auto logger = std::make_shared<spdlog::logger>("roundtrip", sink);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  }
  ~LogLines() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

struct Walk {
  std::vector<K> kinds;
  std::set<K> checked;  // levers whose line diagnose read back
};

// The diagnosis of the log so far against the guard's settings now.
void check_read_back(const std::string& log, const MemorySettings& s) {
  const auto d = lt::diagnose::diagnose_text(log);
  CATCH_CHECK(d.oom);
  CATCH_CHECK(d.trainer == lt::diagnose::Trainer::kLoraTrain);
  const auto& r = d.settings;
  CATCH_CHECK(r.gradient_checkpointing == s.gradient_checkpointing);
  CATCH_CHECK(r.batch_size == s.batch_size);
  CATCH_CHECK(r.gradient_accumulation == s.grad_accumulation);
  CATCH_CHECK(r.resolutions == s.active_resolutions());
  CATCH_CHECK(r.disable_sampling.value_or(false) == s.disable_sampling);
  if (!s.disable_sampling) {
    CATCH_CHECK(r.sample_width == s.sample_width);
    CATCH_CHECK(r.sample_height == s.sample_height);
    CATCH_CHECK(r.sample_steps == s.sample_steps);
    CATCH_CHECK(r.skip_first_sample.value_or(false) == s.skip_first_sample);
  }
  CATCH_CHECK(r.attention_chunk.value_or(0) == s.attention_chunk);
  CATCH_CHECK(r.vae_tiling.value_or(false) == s.vae_tiling);
  CATCH_CHECK(r.low_vram.value_or(false) == s.low_vram);
  CATCH_CHECK(r.quantize.value_or(false) == (s.quantize != Quantize::none));
  if (s.is_video) CATCH_CHECK(r.num_frames == s.num_frames);
}

// The guard in `phase` on a request that never fits, until it gives up.
Walk walk(Phase phase, PhaseContext where, const MemorySettings& initial) {
  LogLines log;
  CpuMemory mem(1 * MiB);
  OomGuard guard(mem, {}, initial);
  // What the trainer logs when training starts (src/train/trainer.cpp), which diagnose reads first.
  const std::string start = "lora-train 0.1.0 (LibTorch 2.5.1): run roundtrip in /work\n"
                            "training 100 steps from step 1; memory settings: " +
                            lt::playbook::summarize(initial) + "\n";
  Walk w;
  for (int i = 0; i < 30; ++i) {
    Decision d;
    try {
      auto scope = guard.enter(phase, where);
      auto t = torch::empty({8 * MiB}, torch::kUInt8);
      CATCH_FAIL("8 MiB fitted in a 1 MiB budget");
    } catch (...) {
      d = guard.recover(std::current_exception());
    }
    const K kind = guard.attempts().back().action;
    w.kinds.push_back(kind);
    CATCH_INFO("after " << to_string(kind) << ":\n" << log.text());
    check_read_back(start + log.text(), guard.settings());
    w.checked.insert(kind);
    if (d.give_up()) break;
    where.batch = d.settings.batch_size;
    if (where.frames > 1) where.frames = d.settings.num_frames;
  }
  return w;
}

MemorySettings image() {
  MemorySettings s;
  s.batch_size = 4;
  s.resolutions = {256, 512};
  s.sample_width = s.sample_height = 1024;
  s.sample_steps = 20;
  return s;
}

}  // namespace

CATCH_TEST_CASE("diagnose reads back every lever the guard logs, in every phase's ladder", "[memory][guard][diagnose]") {
  std::set<K> levers;
  auto add = [&](const Walk& w) { levers.insert(w.checked.begin(), w.checked.end()); };

  // Training steps: batch 4, then batch 1 at the first step (both levers at once).
  Walk early = walk(Phase::train_step, {1, 512, 512, 1, 4, 512}, image());
  CATCH_CHECK(early.kinds == std::vector<K>{K::chunk_attention, K::enable_checkpointing, K::batch_to_one,
                                            K::drop_largest_bucket, K::disable_sampling, K::enable_low_vram,
                                            K::quantize_base, K::give_up_exhausted});
  add(early);
  MemorySettings one = image();
  one.batch_size = 1;
  Walk first = walk(Phase::train_step, {1, 512, 512, 1, 1, 512}, one);
  CATCH_CHECK(first.kinds.at(1) == K::checkpointing_and_lower_resolution);
  add(first);
  // Previews: tiled decode, then smaller previews, then none.
  Walk sampling = walk(Phase::sample, {100, 1024, 1024, 1, 1, 0}, image());
  CATCH_CHECK(sampling.kinds == std::vector<K>{K::chunk_attention, K::tile_vae, K::shrink_samples, K::shrink_samples,
                                               K::disable_sampling, K::give_up_exhausted});
  add(sampling);
  Walk baseline = walk(Phase::baseline_sample, {0, 1024, 1024, 1, 1, 0}, image());
  CATCH_CHECK(baseline.kinds == std::vector<K>{K::chunk_attention, K::tile_vae, K::skip_baseline_sample,
                                               K::enable_low_vram, K::quantize_base, K::give_up_exhausted});
  add(baseline);
  // Caching: the VAE's levers, then a give-up; never the quantized denoiser.
  Walk cache = walk(Phase::cache, {0, 160, 128, 1, 1, 0}, image());
  CATCH_CHECK(cache.kinds == std::vector<K>{K::chunk_attention, K::enable_low_vram, K::tile_vae, K::give_up_exhausted});
  add(cache);
  Walk load = walk(Phase::load, {}, image());
  CATCH_CHECK(load.kinds == std::vector<K>{K::enable_low_vram, K::quantize_base, K::give_up_exhausted});
  add(load);
  // Video: frames first.
  MemorySettings video = image();
  video.is_video = true;
  video.num_frames = 81;
  video.sample_num_frames = 81;
  Walk clip = walk(Phase::train_step, {1, 512, 512, 81, 4, 512}, video);
  CATCH_CHECK(clip.kinds.at(1) == K::reduce_frames);
  CATCH_CHECK(clip.kinds.at(2) == K::reduce_frames);
  add(clip);

  for (K k : {K::chunk_attention, K::tile_vae, K::enable_checkpointing, K::batch_to_one, K::drop_largest_bucket,
              K::checkpointing_and_lower_resolution, K::shrink_samples, K::disable_sampling, K::skip_baseline_sample,
              K::enable_low_vram, K::quantize_base, K::reduce_frames, K::give_up_exhausted}) {
    CATCH_INFO(to_string(k));
    CATCH_CHECK(levers.count(k) == 1);
  }
}

CATCH_TEST_CASE("after the guard gives up while caching, diagnose does not advise quantizing the denoiser",
                "[memory][guard][diagnose]") {
  LogLines log;
  CpuMemory mem(1 * MiB);
  OomGuard guard(mem, {}, image());
  for (int i = 0; i < 10; ++i) {
    try {
      auto scope = guard.enter(Phase::cache, {0, 160, 128, 1, 1, 0});
      auto t = torch::empty({8 * MiB}, torch::kUInt8);
    } catch (...) {
      if (guard.recover(std::current_exception()).give_up()) break;
    }
  }
  const auto d = lt::diagnose::diagnose_text("lora-train 0.1.0 (LibTorch 2.5.1): run roundtrip in /work\n" + log.text());
  CATCH_INFO(log.text());
  CATCH_CHECK(d.oom);
  CATCH_CHECK(d.stage == lt::diagnose::Stage::kCaching);
  for (const auto& fix : lt::diagnose::plan_fixes(d)) {
    CATCH_INFO(fix.id << ": " << fix.setting);
    CATCH_CHECK(fix.setting.find("quantize") == std::string::npos);
  }
}
