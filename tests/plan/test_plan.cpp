// The planner without training: AI Toolkit's example jobs planned from the families' standard
// shapes (their checkpoints are not on this machine), the levers moving the phases they should,
// and fit() walking the guard's own ladder.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/memory/classify.h"
#include "loratrain/memory/ladder.h"
#include "loratrain/models/attention_blocks.h"
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

// A full-size FLUX.1-dev transformer as BFL's flux1-dev.safetensors lists it, header only: the
// real names, shapes and offsets, and a sparse data region (no weights are written or read).
fs::path write_flux_dev_header(const fs::path& dir) {
  const int64_t d = 3072, head = 128;
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t v : shape) n *= v;
    header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {offset, offset + 2 * uint64_t(n)}}};
    offset += 2 * uint64_t(n);
  };
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    tensor(name + ".weight", {out, in});
    tensor(name + ".bias", {out});
  };
  linear("img_in", 64, d);
  linear("txt_in", 4096, d);
  for (const char* e : {"time_in", "guidance_in"}) {
    linear(std::string(e) + ".in_layer", 256, d);
    linear(std::string(e) + ".out_layer", d, d);
  }
  linear("vector_in.in_layer", 768, d);
  linear("vector_in.out_layer", d, d);
  for (int i = 0; i < 19; ++i) {
    const std::string b = "double_blocks." + std::to_string(i) + ".";
    for (const char* s : {"img", "txt"}) {
      const std::string p = b + s;
      linear(p + "_mod.lin", d, 6 * d);
      linear(p + "_attn.qkv", d, 3 * d);
      tensor(p + "_attn.norm.query_norm.scale", {head});
      tensor(p + "_attn.norm.key_norm.scale", {head});
      linear(p + "_attn.proj", d, d);
      linear(p + "_mlp.0", d, 4 * d);
      linear(p + "_mlp.2", 4 * d, d);
    }
  }
  for (int i = 0; i < 38; ++i) {
    const std::string b = "single_blocks." + std::to_string(i) + ".";
    linear(b + "linear1", d, 7 * d);
    linear(b + "linear2", 5 * d, d);
    tensor(b + "norm.query_norm.scale", {head});
    tensor(b + "norm.key_norm.scale", {head});
    linear(b + "modulation.lin", d, 3 * d);
  }
  linear("final_layer.linear", d, 64);
  linear("final_layer.adaLN_modulation.1", d, 2 * d);
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  const fs::path path = dir / "flux1-dev.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << text;
  }
  fs::resize_file(path, 8 + text.size() + offset);  // sparse: the data region takes no disk space
  return path;
}

// Wan2.1-T2V-1.3B's transformer as the official/ComfyUI file lists it (native names), header only.
fs::path write_wan_1_3b_header(const fs::path& dir) {
  const int64_t d = 1536, ffn = 8960;
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  auto tensor = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t v : shape) n *= v;
    header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {offset, offset + 2 * uint64_t(n)}}};
    offset += 2 * uint64_t(n);
  };
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    tensor(name + ".weight", {out, in});
    tensor(name + ".bias", {out});
  };
  tensor("patch_embedding.weight", {d, 16, 1, 2, 2});
  tensor("patch_embedding.bias", {d});
  linear("text_embedding.0", 4096, d);
  linear("text_embedding.2", d, d);
  linear("time_embedding.0", 256, d);
  linear("time_embedding.2", d, d);
  linear("time_projection.1", d, 6 * d);
  for (int i = 0; i < 30; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    for (const char* attn : {"self_attn.", "cross_attn."}) {
      for (const char* p : {"q", "k", "v", "o"}) linear(b + attn + p, d, d);
      tensor(b + attn + "norm_q.weight", {d});
      tensor(b + attn + "norm_k.weight", {d});
    }
    tensor(b + "norm3.weight", {d});
    tensor(b + "norm3.bias", {d});
    linear(b + "ffn.0", d, ffn);
    linear(b + "ffn.2", ffn, d);
    tensor(b + "modulation", {1, 6, d});
  }
  linear("head.head", d, 64);
  tensor("head.modulation", {1, 2, d});
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  const fs::path path = dir / "wan2.1_t2v_1.3B_bf16.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << text;
  }
  fs::resize_file(path, 8 + text.size() + offset);
  return path;
}

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
  // Training on the CPU adds two packed copies of the UNet's stride-1 convolutions but the 1x1 ones
  // from the first step on (models/packed_conv.h), in the job's bf16; simulated VRAM stands in for a
  // GPU, which has none.
  const auto simulated = Planner::from_config(aitk("ui_sd15.yaml", {"device=cpu", "memory.simulate_vram=16GiB"}));
  const auto on_cpu = cpu->predict(cpu->configured()), on_simulated = simulated->predict(simulated->configured());
  CATCH_CHECK(on_cpu.at(Phase::train_step).weights - on_simulated.at(Phase::train_step).weights == 2 * 2 * 521'648'640LL);
  CATCH_CHECK(on_cpu.at(Phase::save).weights - on_simulated.at(Phase::save).weights == 2 * 2 * 521'648'640LL);
  CATCH_CHECK(on_cpu.at(Phase::cache).weights == on_simulated.at(Phase::cache).weights);
}

CATCH_TEST_CASE("a CPU run under memory.simulate_vram is predicted with the configured attention, as on a GPU",
                "[plan]") {
  // fp32 SD 1.5 at 512 px without chunking: the 4096-token attention of the first level is plain
  // on a GPU; a real CPU run on an AVX-512 CPU runs it in blocks (models/attention_blocks.h).
  const std::vector<std::string> shape = {"device=cpu", "train.dtype=fp32", "datasets.0.resolution=[512]",
                                          "train.gradient_checkpointing=false", "memory.attention_chunk=0"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), shape.begin(), shape.end());
    return Planner::from_config(aitk("ui_sd15.yaml", more));
  };
  const auto cpu = with({}), simulated = with({"memory.simulate_vram=24GiB"});
  // The step's activations: its weights differ too on the CPU (packed convolutions, packed_conv.h).
  const int64_t cpu_step = cpu->predict(cpu->configured()).at(Phase::train_step).activations;
  const int64_t simulated_step = simulated->predict(simulated->configured()).at(Phase::train_step).activations;
  if (lt::models::cpu_blocks_long_sequences()) {
    CATCH_CHECK(simulated_step > cpu_step);
  } else {
    CATCH_CHECK(simulated_step == cpu_step);
  }
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

CATCH_TEST_CASE("AI Toolkit's Flux examples are planned per phase in under 2 s, from FLUX.1's config or a header", "[plan][flux]") {
  for (const std::string job : {"example_flux_24gb.yaml", "example_flux_schnell_24gb.yaml", "ui_flux.yaml"}) {
    CATCH_INFO(job);
    const auto started = std::chrono::steady_clock::now();
    const auto planner = Planner::from_config(aitk(job));
    const auto prediction = planner->predict(planner->configured());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    CATCH_CHECK(seconds < 2.0);
    CATCH_CHECK(planner->family() == "flux");
    CATCH_CHECK(planner->shapes_source().find("standard shapes") != std::string::npos);
    for (size_t i = 0; i < lt::plan::kPhases; ++i) {
      CATCH_INFO(lt::playbook::to_string(static_cast<Phase>(i)));
      CATCH_CHECK(prediction.phases[i].runs);
      CATCH_CHECK(prediction.phases[i].peak() > 0);
    }
  }
  // The 24 GB example: the transformer (FLUX.1-dev's 11.9 B parameters) becomes fp8 codes on the host
  // before it is placed (its few non-Linear weights stay bf16), T5-XXL and CLIP-L likewise (quantize_te
  // defaults to quantize), the VAE in fp32: the device never holds a widened copy.
  const auto dev = Planner::from_config(aitk("example_flux_24gb.yaml"));
  const auto p = dev->predict(dev->configured());
  constexpr int64_t kTransformer = 11'901'408'320, kText = 4'762'310'656 + 123'060'480, kVae = 83'819'683;
  CATCH_CHECK(p.at(Phase::load).weights > kTransformer + kText + 4 * kVae);
  CATCH_CHECK(p.at(Phase::load).weights < kTransformer + kTransformer / 50 + kText + kText / 50 + 4 * kVae);
  CATCH_CHECK(p.at(Phase::train_step).weights < kTransformer + kText + 4 * kVae + (int64_t(1) << 30));
  // Under AI Toolkit's 24 GB: the step with checkpointing at the 1024 bucket (4096 image + 512 text tokens).
  CATCH_CHECK(peak(p, Phase::train_step) < (int64_t(24) << 30));
  CATCH_CHECK(peak(p, Phase::train_step) > kTransformer + kText);
  // A rank-16 LoRA on every Linear in the blocks: about 82 M parameters; adamw8bit + the EMA copy.
  CATCH_CHECK(p.at(Phase::train_step).adapter_optimizer > 4 * 80'000'000LL);
  // schnell: no guidance embedder, 256 text tokens.
  const auto schnell = Planner::from_config(aitk("example_flux_schnell_24gb.yaml"));
  const auto q = schnell->predict(schnell->configured());
  CATCH_CHECK(q.at(Phase::load).weights < p.at(Phase::load).weights);
  CATCH_CHECK(q.at(Phase::train_step).activations < p.at(Phase::train_step).activations);

  // The same job against a full-size FLUX.1-dev file on this machine: shapes from its header alone
  // (its 23.8 GB data region is a hole: reading any weight would fail the plan's time limit and
  // memory). The bare transformer has no companions beside it: FLUX.1's text encoders and VAE stand in.
  const fs::path dir = lt::test::scratch_dir("plan_flux_header");
  const fs::path file = write_flux_dev_header(dir);
  CATCH_REQUIRE(fs::file_size(file) > 2 * 11'901'408'320LL);  // the bf16 data region (a hole)
  const auto started = std::chrono::steady_clock::now();
  const auto from_header = Planner::from_config(aitk("example_flux_24gb.yaml", {"model.name_or_path=" + file.string()}));
  const auto h = from_header->predict(from_header->configured());
  CATCH_CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() < 2.0);
  CATCH_CHECK(from_header->shapes_source().find("header") != std::string::npos);
  CATCH_CHECK(h.at(Phase::load).weights == p.at(Phase::load).weights);
  for (size_t i = 0; i < lt::plan::kPhases; ++i) CATCH_CHECK(h.phases[i].peak() == p.phases[i].peak());
  CATCH_CHECK(from_header->describe().find("11901M denoiser") != std::string::npos);
}

CATCH_TEST_CASE("Flux's levers move the phases they act on", "[plan][flux]") {
  const auto planner = Planner::from_config(aitk("example_flux_24gb.yaml", {"train.gradient_checkpointing=false"}));
  const auto base = planner->configured();
  const auto p0 = planner->predict(base);
  auto with = [&](auto change) {
    auto s = base;
    change(s);
    return planner->predict(s);
  };
  // Without checkpointing the 1024 step holds every block's activations: far over 24 GB.
  CATCH_CHECK(peak(p0, Phase::train_step) > (int64_t(40) << 30));
  CATCH_CHECK(peak(with([](auto& s) { s.gradient_checkpointing = true; }), Phase::train_step) < 0.5 * peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.attention_chunk = 1024; }), Phase::train_step) < peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.dropped_largest = 1; }), Phase::train_step) < peak(p0, Phase::train_step));
  CATCH_CHECK(peak(with([](auto& s) { s.sample_width = s.sample_height = 512; }), Phase::sample) < peak(p0, Phase::sample));
  // Not quantized: the bf16 base is twice the 8-bit one.
  const auto p_bf16 = with([](auto& s) { s.quantize = lt::playbook::Quantize::none; });
  CATCH_CHECK(p_bf16.at(Phase::train_step).weights > 1.8 * p0.at(Phase::train_step).weights);
  // unload_text_encoder: T5 (9.5 GB in bf16) is gone after the cache phase.
  const auto unload = Planner::from_config(aitk("example_flux_24gb.yaml", {"train.unload_text_encoder=true", "model.quantize_te=false"}));
  const auto kept = Planner::from_config(aitk("example_flux_24gb.yaml", {"model.quantize_te=false"}));
  const auto u = unload->predict(unload->configured()), k = kept->predict(kept->configured());
  CATCH_CHECK(u.at(Phase::cache).weights == k.at(Phase::cache).weights);
  CATCH_CHECK(k.at(Phase::train_step).weights - u.at(Phase::train_step).weights > 2 * 4'700'000'000LL);
  CATCH_CHECK(u.at(Phase::sample).weights < k.at(Phase::sample).weights);
  // quantize_te converts Linears only: T5's shared embedding and CLIP-L's token and position
  // embeddings stay bf16, the rest of the text encoders takes a byte per weight (and a scale per row).
  const auto te8 = Planner::from_config(aitk("example_flux_24gb.yaml", {"model.quantize_te=true"}));
  const auto q = te8->predict(te8->configured());
  constexpr int64_t kEmbeddings = 32128LL * 4096 + (49408 + 77) * 768, kTextEncoders = 4'762'310'656 + 123'060'480;
  const int64_t saved = k.at(Phase::cache).weights - q.at(Phase::cache).weights;
  CATCH_CHECK(saved == (kTextEncoders - kEmbeddings) - (kTextEncoders - kEmbeddings) / 250);
  // fit() on 16 GB: the guard's ladder from the 24 GB example, one change at a time.
  const auto fitted = lt::plan::fit(*kept, kept->configured(), int64_t(16) << 30);
  CATCH_CHECK_FALSE(fitted.changes.empty());
  for (const auto& c : fitted.changes) CATCH_CHECK(c.peak_after <= c.peak_before);
}

CATCH_TEST_CASE("AI Toolkit's Wan 2.1 examples are planned per phase in under 2 s, from Wan's configs or a header", "[plan][wan]") {
  for (const std::string job : {"example_wan21_1b_24gb.yaml", "example_wan21_14b_24gb.yaml", "ui_wan21_1b.yaml", "ui_wan21_14b.yaml"}) {
    CATCH_INFO(job);
    const auto started = std::chrono::steady_clock::now();
    const auto planner = Planner::from_config(aitk(job));
    const auto prediction = planner->predict(planner->configured());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    CATCH_CHECK(seconds < 2.0);
    CATCH_CHECK(planner->family() == "wan");
    CATCH_CHECK(planner->shapes_source().find("standard shapes") != std::string::npos);
    for (size_t i = 0; i < lt::plan::kPhases; ++i) {
      CATCH_INFO(lt::playbook::to_string(static_cast<Phase>(i)));
      CATCH_CHECK(prediction.phases[i].peak() > 0);
    }
    CATCH_CHECK(!lt::plan::format_table(prediction, int64_t(24) << 30).empty());
  }
  // Wan2.1-T2V-1.3B: 1.42 B transformer parameters (30 blocks of width 1536), umT5-XXL's encoder
  // (5.68 B), the 127 M-parameter VAE; the 14B: 40 blocks of width 5120.
  const auto small = Planner::from_config(aitk("example_wan21_1b_24gb.yaml"));
  const auto big = Planner::from_config(aitk("example_wan21_14b_24gb.yaml"));
  CATCH_CHECK(small->describe().find("1419M denoiser + 5681M text + 127M VAE") != std::string::npos);
  CATCH_CHECK(big->describe().find("14288M denoiser") != std::string::npos);
  const auto s = small->predict(small->configured()), b = big->predict(big->configured());
  // The 14B example (qfloat8, low_vram): the transformer becomes fp8 codes on the host before it is
  // placed, as Flux's does, so the load holds about one byte per parameter (its few non-Linear
  // weights stay bf16) and no encoder: under AI Toolkit's 24 GB.
  CATCH_CHECK(b.at(Phase::load).weights >= 14'288'491'584LL);
  CATCH_CHECK(b.at(Phase::load).weights < 14'288'491'584LL + 14'288'491'584LL / 50);
  CATCH_CHECK(peak(b, Phase::load) < (int64_t(24) << 30));
  // The 14B example's unload_text_encoder and low_vram: umT5 and the VAE leave after the cache
  // phase, so the step holds the quantized transformer alone; the 1.3B keeps all three.
  CATCH_CHECK(b.at(Phase::train_step).weights < b.at(Phase::cache).weights);
  CATCH_CHECK(s.at(Phase::train_step).weights == s.at(Phase::cache).weights);

  // The same job against a full-size Wan2.1-T2V-1.3B file in native names on this machine: shapes from
  // its header alone (the data region is a hole); no umT5 or VAE beside it: the released ones stand in.
  const fs::path dir = lt::test::scratch_dir("plan_wan_header");
  const fs::path file = write_wan_1_3b_header(dir);
  const auto from_header = Planner::from_config(aitk("example_wan21_1b_24gb.yaml", {"model.name_or_path=" + file.string()}));
  const auto h = from_header->predict(from_header->configured());
  CATCH_CHECK(from_header->shapes_source().find("header") != std::string::npos);
  for (size_t i = 0; i < lt::plan::kPhases; ++i) CATCH_CHECK(h.phases[i].peak() == s.phases[i].peak());

  // Frame counts as `run` trains them: the example's 40-frame previews (and 40-frame clips) are 41.
  const auto forty = Planner::from_config(aitk("example_wan21_1b_24gb.yaml", {"datasets.0.num_frames=40"}));
  CATCH_CHECK(forty->configured().num_frames == 41);
  CATCH_CHECK(forty->configured().sample_num_frames == 41);
}

CATCH_TEST_CASE("Wan's levers move the phases they act on; frames make the clip's tokens", "[plan][wan]") {
  const std::vector<std::string> base = {"train.gradient_checkpointing=false", "model.low_vram=false", "model.quantize=false",
                                         "train.unload_text_encoder=false"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = base;
    all.insert(all.end(), extra.begin(), extra.end());
    const auto planner = Planner::from_config(aitk("example_wan21_1b_24gb.yaml", all));
    return planner->predict(planner->configured());
  };
  const auto images = with({});
  const auto clip17 = with({"datasets.0.num_frames=17"});
  const auto clip33 = with({"datasets.0.num_frames=33"});
  // 17 frames are 5 latent frames: five times the tokens; the step grows faster than the frames
  // (self-attention is quadratic in them).
  CATCH_CHECK(clip17.at(Phase::train_step).activations > 5 * images.at(Phase::train_step).activations);
  CATCH_CHECK(clip33.at(Phase::train_step).activations > clip17.at(Phase::train_step).activations);
  // The VAE encodes 4 frames at a time: the cache phase grows only by the clip it reads.
  const int64_t clip_bytes = 3LL * 632 * 632 * 4;
  CATCH_CHECK(clip33.at(Phase::cache).peak() - clip17.at(Phase::cache).peak() < 16 * clip_bytes + (int64_t(64) << 20));
  const auto ckpt = with({"datasets.0.num_frames=17", "train.gradient_checkpointing=true"});
  CATCH_CHECK(ckpt.at(Phase::train_step).activations < clip17.at(Phase::train_step).activations / 4);
  const auto chunked = with({"datasets.0.num_frames=17", "memory.attention_chunk=1024"});
  CATCH_CHECK(chunked.at(Phase::train_step).activations < clip17.at(Phase::train_step).activations);
  const auto quantized = with({"model.quantize=true", "model.qtype=qint8"});
  CATCH_CHECK(quantized.at(Phase::train_step).weights < images.at(Phase::train_step).weights);
  // fit() with a clip too long for 24 GiB: the guard's video ladder, attention chunked first,
  // then frames halved on the 4k+1 grid, one change at a time.
  const auto planner = Planner::from_config(aitk("example_wan21_1b_24gb.yaml", {"datasets.0.num_frames=81", "train.gradient_checkpointing=false"}));
  const auto fitted = lt::plan::fit(*planner, planner->configured(), int64_t(24) << 30);
  CATCH_REQUIRE(fitted.changes.size() >= 2);
  CATCH_CHECK(fitted.changes[0].kind == "chunk_attention");
  bool frames_reduced = false;
  for (const auto& c : fitted.changes) {
    CATCH_CHECK(c.peak_after <= c.peak_before);
    if (c.kind == "reduce_frames") frames_reduced = true;
  }
  CATCH_CHECK(frames_reduced);
  CATCH_CHECK((fitted.settings.num_frames - 1) % 4 == 0);

  // Wan's VAE does not tile: at 14 GiB the previews' ladder offers memory.vae_tiling, the planner
  // predicts the same peak with it and skips it (the guard's ladder itself still offers it).
  const auto example = Planner::from_config(aitk("example_wan21_1b_24gb.yaml"));
  const auto tight = lt::plan::fit(*example, example->configured(), int64_t(14) << 30);
  CATCH_CHECK(tight.fits);
  CATCH_REQUIRE_FALSE(tight.skipped.empty());
  CATCH_CHECK(tight.skipped[0].kind == "tile_vae");
  CATCH_CHECK(tight.skipped[0].peak_after == tight.skipped[0].peak_before);
  for (const auto& c : tight.changes) {
    CATCH_CHECK(c.kind != "tile_vae");
    CATCH_CHECK(c.peak_after <= c.peak_before);
  }
  CATCH_CHECK_FALSE(tight.settings.vae_tiling);
  lt::memory::FailureContext ctx;
  ctx.phase = Phase::sample;
  ctx.settings = example->configured();
  ctx.settings.attention_chunk = lt::memory::kGuardAttentionChunk;
  ctx.where = {1, ctx.settings.sample_width, ctx.settings.sample_height, 1, 1, 632};
  ctx.steps_completed = 1;
  lt::memory::LadderHistory history;
  history.initial = example->configured();
  CATCH_CHECK(lt::memory::next_action(ctx, lt::memory::classify(ctx), history).kind == lt::memory::ActionKind::tile_vae);
}
