// The planner without training: AI Toolkit's example jobs planned from the families' standard
// shapes (their checkpoints are not on this machine), the levers moving the phases they should,
// and fit() walking the guard's own ladder.
#include <catch2/catch.hpp>

#include <chrono>

#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/memory/classify.h"
#include "loratrain/memory/ladder.h"
#include "loratrain/plan/plan.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using lt::plan::Phase;
using lt::plan::Planner;

namespace {

lt::config::JobConfig aitk(const std::string& name, std::vector<std::string> overrides = {}) {
  return lt::config::load_config(lt::test::source_dir() / "tests/config/data/aitk" / name, overrides);
}

int64_t peak(const lt::plan::Prediction& p, Phase phase) { return p.at(phase).peak(); }

}  // namespace

CATCH_TEST_CASE("AI Toolkit's SD 1.5 and SDXL jobs are planned per phase in well under 2 s", "[plan]") {
  for (const std::string job : {"ui_sd15.yaml", "ui_sdxl.yaml"}) {
    CATCH_INFO(job);
    const auto started = std::chrono::steady_clock::now();
    const auto planner = Planner::from_config(aitk(job));
    const auto prediction = planner->predict(planner->configured());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    CATCH_CHECK(seconds < 2.0);
    CATCH_CHECK(planner->shapes_source().find("standard shapes") != std::string::npos);
    for (size_t i = 0; i < lt::plan::kPhases; ++i) {
      CATCH_INFO(lt::playbook::to_string(static_cast<Phase>(i)));
      CATCH_CHECK(prediction.phases[i].runs);
      CATCH_CHECK(prediction.phases[i].peak() > 0);
    }
    const auto j = lt::plan::to_json(prediction, int64_t(24) << 30);
    CATCH_CHECK(j.at("phases").at("train_step").at("peak_bytes").get<int64_t>() == peak(prediction, Phase::train_step));
    CATCH_CHECK(j.at("fits").is_boolean());
  }
  // At the same bucket SDXL needs more; at 1024 SD 1.5's full-resolution attention (128 x 128
  // latents, 16384 tokens) outgrows SDXL's, whose attention starts at the second level.
  const auto sd15 = Planner::from_config(aitk("ui_sd15.yaml", {"datasets.0.resolution=[512]"}));
  const auto sdxl = Planner::from_config(aitk("ui_sdxl.yaml", {"datasets.0.resolution=[512]"}));
  const auto a = sd15->predict(sd15->configured()), b = sdxl->predict(sdxl->configured());
  // On CUDA: the bf16 UNet and text encoders, the VAE in fp32 (force_upcast): SD 1.5's 1.07 B
  // parameters, SDXL's 3.47 B.
  CATCH_CHECK(a.at(Phase::load).weights == 2 * (859'520'964LL + 123'060'480LL) + 4 * 83'653'863LL);
  CATCH_CHECK(b.at(Phase::load).weights == 2 * (2'567'463'684LL + 123'060'480LL + 694'659'840LL) + 4 * 83'653'863LL);
  CATCH_CHECK(peak(b, Phase::train_step) > peak(a, Phase::train_step));
  CATCH_CHECK(a.at(Phase::load).dominant() == lt::plan::Part::weights);
  // On the CPU each component is built in fp32 before it is converted: SD 1.5's UNet alone.
  const auto cpu = Planner::from_config(aitk("ui_sd15.yaml", {"device=cpu"}));
  CATCH_CHECK(cpu->predict(cpu->configured()).at(Phase::load).weights == 4 * 859'520'964LL);
}

CATCH_TEST_CASE("each memory lever lowers the phase it acts on", "[plan]") {
  const auto planner = Planner::from_config(aitk("ui_sd15.yaml", {"train.gradient_checkpointing=false", "train.batch_size=2"}));
  const auto base = planner->configured();
  const auto p0 = planner->predict(base);
  auto with = [&](auto change) {
    auto s = base;
    change(s);
    return planner->predict(s);
  };
  CATCH_CHECK(peak(with([](auto& s) { s.gradient_checkpointing = true; }), Phase::train_step) < 0.6 * peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.batch_size = 1; }), Phase::train_step) < peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.dropped_largest = 1; }), Phase::train_step) < peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.attention_chunk = 1024; }), Phase::train_step) < peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.sample_width = s.sample_height = 256; }), Phase::sample) < peak(p0, Phase::sample));
  CATCH_CHECK(peak(with([](auto& s) { s.quantize = lt::playbook::Quantize::int8; }), Phase::train_step) < peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.low_vram = true; }), Phase::train_step) < peak(p0, Phase::train_step));
  CATCH_CHECK_FALSE(with([](auto& s) { s.disable_sampling = true; }).at(Phase::sample).runs);
  CATCH_CHECK_FALSE(with([](auto& s) { s.skip_first_sample = true; }).at(Phase::baseline_sample).runs);
  // VAE tiling: the latent cache's encode at the 1024 bucket.
  const auto cached = Planner::from_config(aitk("ui_sd15.yaml", {"datasets.0.cache_latents=true"}));
  auto tiled = cached->configured();
  tiled.vae_tiling = true;
  CATCH_CHECK(peak(cached->predict(tiled), Phase::cache) < peak(cached->predict(cached->configured()), Phase::cache));
  CATCH_CHECK(cached->predict(cached->configured()).at(Phase::cache).activations > (int64_t(1) << 30));
  // The optimizer's state: adamw 8 bytes per adapter parameter, adamw8bit about 2.
  const auto adamw = Planner::from_config(aitk("ui_sd15.yaml", {"train.optimizer=adamw"}));
  const auto adamw8 = Planner::from_config(aitk("ui_sd15.yaml", {"train.optimizer=adamw8bit"}));
  CATCH_CHECK(adamw->predict(adamw->configured()).at(Phase::train_step).adapter_optimizer >
              adamw8->predict(adamw8->configured()).at(Phase::train_step).adapter_optimizer);
  // Rank: the adapter grows with it.
  const auto r64 = Planner::from_config(aitk("ui_sd15.yaml", {"network.linear=64"}));
  CATCH_CHECK(r64->predict(r64->configured()).at(Phase::train_step).adapter_optimizer >
              adamw8->predict(adamw8->configured()).at(Phase::train_step).adapter_optimizer);
}

CATCH_TEST_CASE("fit walks the guard's ladder one change at a time until the prediction fits", "[plan]") {
  const auto planner = Planner::from_config(
      aitk("ui_sdxl.yaml", {"train.gradient_checkpointing=false", "train.batch_size=4"}));
  const auto start = planner->configured();
  const auto p0 = planner->predict(start);
  // Room for the weights and the optimizer but not for batch 4 without checkpointing.
  const int64_t budget = p0.at(Phase::load).peak() + (p0.at(Phase::train_step).peak() - p0.at(Phase::load).peak()) / 4;
  const auto fitted = lt::plan::fit(*planner, start, budget);
  CATCH_REQUIRE(fitted.fits);
  CATCH_CHECK(fitted.prediction.peak() <= budget);
  CATCH_REQUIRE_FALSE(fitted.changes.empty());
  // The first rungs the guard takes at step 1 on the largest bucket: attention chunking, then
  // checkpointing (an exact lever before anything that changes the batch).
  CATCH_CHECK(fitted.changes[0].kind == "chunk_attention");
  CATCH_CHECK(fitted.changes[0].phase == Phase::train_step);
  for (const auto& c : fitted.changes) CATCH_CHECK(c.peak_after < c.peak_before);
  // The same ladder: replaying the guard's next_action on each predicted failure gives the same kinds.
  lt::memory::LadderHistory history;
  history.initial = start;
  auto s = start;
  for (const auto& c : fitted.changes) {
    lt::memory::FailureContext ctx;
    ctx.phase = c.phase;
    ctx.where = {1, s.largest_resolution(), s.largest_resolution(), 1, s.batch_size, s.largest_resolution()};
    ctx.largest_bucket = true;
    ctx.settings = s;
    const auto action = lt::memory::next_action(ctx, lt::memory::classify(ctx), history);
    CATCH_CHECK(c.kind == lt::memory::to_string(action.kind));
    history.failed.push_back(s);
    s = action.settings;
  }
  CATCH_CHECK(s == fitted.settings);
  // A budget below the weights: nothing fits, and fit says so.
  const auto hopeless = lt::plan::fit(*planner, start, int64_t(1) << 30);
  CATCH_CHECK_FALSE(hopeless.fits);
}

CATCH_TEST_CASE("a family without a memory model is one clear error", "[plan]") {
  CATCH_CHECK_THROWS_WITH(Planner::from_config(aitk("ui_flux.yaml")), Catch::Contains("no memory model"));
}
