// The sampling loop: every scheduler, driven by the ideal denoiser of a one-point data
// distribution, lands on that point (epsilon and v-prediction); CFG semantics; batched and
// per-branch denoisers agree; the loop is seeded and leaves the global RNG alone.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include "loratrain/sample/sampler.h"
#include "loratrain/util/error.h"

using namespace lt::sample;
using nlohmann::json;

namespace {

// alpha-bar of the state the denoiser sees at timestep value t.
double abar_at(const Scheduler& s, const at::Tensor& t) {
  if (auto* d = dynamic_cast<const DDPMScheduler*>(&s)) return d->alphas_cumprod()[t.item<int64_t>()].item<double>();
  if (auto* d = dynamic_cast<const DDIMScheduler*>(&s)) return d->alphas_cumprod()[t.item<int64_t>()].item<double>();
  // Euler: the scaled input is the VP state with alpha-bar = 1 / (sigma^2 + 1).
  const double sigma = s.sigmas()[s.index_for_timestep(t.item<double>())].item<double>();
  return 1.0 / (sigma * sigma + 1.0);
}

// The exact prediction of a model whose data distribution is the single point `x0`.
DenoiseFn oracle(const Scheduler& s, const at::Tensor& x0) {
  return [&s, x0](const at::Tensor& x, const at::Tensor& t, bool /*uncond*/) {
    if (s.prediction_type() == PredictionType::kFlow) {
      const double sigma = s.sigmas()[s.index_for_timestep(t.item<double>())].item<double>();
      return ((x.to(torch::kDouble) - x0) / sigma).to(x.scalar_type());  // v = noise - x0
    }
    const double ab = abar_at(s, t);
    const double a = std::sqrt(ab), b = std::sqrt(1 - ab);
    auto xd = x.to(torch::kDouble);
    auto eps = (xd - a * x0) / b;
    if (s.prediction_type() == PredictionType::kVPrediction) return (a * eps - b * x0).to(x.scalar_type());
    return eps.to(x.scalar_type());
  };
}

json sd_config() {
  return json{{"beta_start", 0.00085}, {"beta_end", 0.012}, {"beta_schedule", "scaled_linear"},
              {"clip_sample", false},  {"set_alpha_to_one", false}, {"steps_offset", 1},
              {"timestep_spacing", "leading"}};
}

}  // namespace

CATCH_TEST_CASE("every sampler reaches the data point with an exact denoiser", "[sample][sampler]") {
  auto x0 = torch::linspace(-0.8, 0.8, 2 * 4 * 4 * 4, torch::kDouble).view({2, 4, 4, 4});
  struct Case {
    SamplerKind kind;
    json config;
    PredictionType pred;
  };
  json euler_karras = sd_config();
  euler_karras["use_karras_sigmas"] = true;
  // set_alpha_to_one: the last DDIM step goes to the clean sample (SD's false stops at t = 0's
  // noise level, sqrt(1 - abar_0) ~ 0.03 away).
  json ddim = sd_config();
  ddim["set_alpha_to_one"] = true;
  json trailing = ddim;
  trailing["timestep_spacing"] = "trailing";
  const std::vector<Case> cases = {
      {SamplerKind::kDDIM, ddim, PredictionType::kEpsilon},
      {SamplerKind::kDDIM, ddim, PredictionType::kVPrediction},
      {SamplerKind::kDDIM, trailing, PredictionType::kEpsilon},
      {SamplerKind::kDDPM, sd_config(), PredictionType::kEpsilon},
      {SamplerKind::kDDPM, sd_config(), PredictionType::kVPrediction},
      {SamplerKind::kEuler, sd_config(), PredictionType::kEpsilon},
      {SamplerKind::kEuler, sd_config(), PredictionType::kVPrediction},
      {SamplerKind::kEuler, euler_karras, PredictionType::kEpsilon},
      {SamplerKind::kFlowMatch, default_scheduler_config("wan"), PredictionType::kFlow},
      {SamplerKind::kUniPC, default_scheduler_config("wan"), PredictionType::kFlow},
  };
  for (const auto& c : cases) {
    CATCH_INFO(to_string(c.kind) << " " << to_string(c.pred) << " " << c.config.dump());
    auto s = make_scheduler(c.kind, c.config);
    SamplerOptions o;
    o.steps = 12;
    o.guidance_scale = 1.0;
    o.seed = 5;
    o.latent_shape = {2, 4, 4, 4};
    o.prediction_type = c.pred;
    auto out = sample(*s, oracle(*s, x0), o);
    CATCH_CHECK(out.scalar_type() == torch::kFloat);
    CATCH_CHECK((out.to(torch::kDouble) - x0).abs().max().item<double>() < 2e-3);
  }
  // Flux-style dynamic shifting through the options.
  auto flux = make_scheduler(SamplerKind::kFlowMatch, default_scheduler_config("flux"));
  SamplerOptions o;
  o.steps = 8;
  o.guidance_scale = 1.0;
  o.latent_shape = {2, 4, 4, 4};
  o.timestep_options.mu = calculate_shift(1024);
  auto out = sample(*flux, oracle(*flux, x0), o);
  CATCH_CHECK((out.to(torch::kDouble) - x0).abs().max().item<double>() < 2e-3);
  o.timestep_options.mu.reset();
  CATCH_CHECK_THROWS_AS(sample(*flux, oracle(*flux, x0), o), lt::InputError);
}

CATCH_TEST_CASE("the loop is the diffusers loop, seeded by its own generator", "[sample][sampler]") {
  auto s = make_scheduler(SamplerKind::kEuler, sd_config());
  auto denoise = [](const at::Tensor& x, const at::Tensor& t, bool) { return 0.1 * x + 1e-4 * t.to(torch::kFloat); };
  SamplerOptions o;
  o.steps = 6;
  o.guidance_scale = 1.0;
  o.seed = 42;
  o.latent_shape = {1, 4, 8, 8};
  int64_t calls = 0;
  o.on_step = [&](int64_t i, int64_t n) {
    CATCH_CHECK(i == calls + 1);
    CATCH_CHECK(n == 6);
    ++calls;
  };
  auto out = sample(*s, denoise, o);
  CATCH_CHECK(calls == 6);
  o.on_step = nullptr;

  // The same by hand: randn(seed) * init_noise_sigma, scale, predict, step.
  auto ref = make_scheduler(SamplerKind::kEuler, sd_config());
  ref->set_timesteps(6);
  auto gen = make_generator(42);
  auto x = torch::randn({1, 4, 8, 8}, gen) * ref->init_noise_sigma();
  for (int64_t i = 0; i < 6; ++i) {
    auto t = ref->timesteps()[i];
    x = ref->step(denoise(ref->scale_model_input(x, i), t, false), i, x).prev_sample;
  }
  CATCH_CHECK(torch::equal(out, x));
  CATCH_CHECK(torch::equal(initial_noise({1, 4, 8, 8}, 42), torch::randn({1, 4, 8, 8}, make_generator(42))));
  // Same seed, same image; another seed, another image.
  CATCH_CHECK(torch::equal(sample(*s, denoise, o), out));
  o.seed = 43;
  CATCH_CHECK(!torch::equal(sample(*s, denoise, o), out));
}

CATCH_TEST_CASE("classifier-free guidance", "[sample][sampler][cfg]") {
  auto cond_fn = [](const at::Tensor& x) { return 0.05 * x + 0.2; };
  auto uncond_fn = [](const at::Tensor& x) { return 0.05 * x - 0.3; };
  int64_t uncond_calls = 0;
  DenoiseFn denoise = [&](const at::Tensor& x, const at::Tensor&, bool uncond) {
    if (uncond) ++uncond_calls;
    return uncond ? uncond_fn(x) : cond_fn(x);
  };
  DenoiseFn cond_only = [&](const at::Tensor& x, const at::Tensor&, bool) { return cond_fn(x); };
  BatchedDenoiseFn batched = [&](const at::Tensor& x, const at::Tensor&, bool with_uncond) {
    if (!with_uncond) return cond_fn(x);
    auto h = x.chunk(2, 0);
    return torch::cat({uncond_fn(h[0]), cond_fn(h[1])});
  };
  SamplerOptions o;
  o.steps = 5;
  o.seed = 1;
  o.latent_shape = {2, 4, 4, 4};

  auto ddim = make_scheduler(SamplerKind::kDDIM, sd_config());
  o.guidance_scale = 1.0;
  auto g1 = sample(*ddim, denoise, o);
  CATCH_CHECK(uncond_calls == 0);  // guidance <= 1 runs the conditional branch only
  CATCH_CHECK(torch::equal(g1, sample(*ddim, cond_only, o)));
  CATCH_CHECK(torch::equal(g1, sample_batched(*ddim, batched, o)));
  // The formula itself at scale 1 is the conditional prediction.
  auto u = torch::randn({2, 3}), c = torch::randn({2, 3});
  CATCH_CHECK(torch::allclose(apply_cfg(u, c, 1.0), c, 1e-6, 1e-6));
  CATCH_CHECK(torch::allclose(apply_cfg(u, c, 3.0), u + 3.0 * (c - u)));

  o.guidance_scale = 7.5;
  auto g7 = sample(*ddim, denoise, o);
  CATCH_CHECK(uncond_calls == 5);
  CATCH_CHECK(!torch::allclose(g7, g1));
  CATCH_CHECK(torch::allclose(g7, sample_batched(*ddim, batched, o), 1e-6, 1e-6));

  // guidance_rescale = 1 makes the guided prediction's per-sample std equal the conditional one's.
  auto r = apply_cfg(u, c, 5.0, 1.0);
  CATCH_CHECK(torch::allclose(r.std({1}), c.std({1}), 1e-5, 1e-6));
}

CATCH_TEST_CASE("sampling leaves the global RNG untouched", "[sample][sampler][rng]") {
  auto& global = const_cast<at::Generator&>(at::detail::getDefaultCPUGenerator());
  auto before = global.get_state();
  // DDPM draws noise every step; the denoiser itself is deterministic.
  auto s = make_scheduler(SamplerKind::kDDPM, sd_config());
  SamplerOptions o;
  o.steps = 4;
  o.guidance_scale = 3.0;
  o.latent_shape = {1, 4, 4, 4};
  sample(*s, [](const at::Tensor& x, const at::Tensor&, bool u) { return u ? 0.1 * x : 0.2 * x; }, o);
  CATCH_CHECK(torch::equal(global.get_state(), before));
  // A stochastic step without a generator is refused rather than drawing from the global RNG.
  s->set_timesteps(4);
  CATCH_CHECK_THROWS(s->step(torch::zeros({1, 4, 4, 4}), 0, torch::zeros({1, 4, 4, 4}), nullptr));
  CATCH_CHECK(torch::equal(global.get_state(), before));
}

CATCH_TEST_CASE("scheduler construction and names", "[sample][scheduler]") {
  CATCH_CHECK(sampler_kind_from_name("DDIM") == SamplerKind::kDDIM);
  CATCH_CHECK(sampler_kind_from_name("k_euler") == SamplerKind::kEuler);
  CATCH_CHECK(sampler_kind_from_name("flowmatch") == SamplerKind::kFlowMatch);
  CATCH_CHECK(sampler_kind_from_name("FlowMatchEulerDiscreteScheduler") == SamplerKind::kFlowMatch);
  CATCH_CHECK(sampler_kind_from_name("unipc") == SamplerKind::kUniPC);
  CATCH_CHECK(sampler_kind_from_name("UniPCMultistepScheduler") == SamplerKind::kUniPC);
  CATCH_CHECK_THROWS_WITH(sampler_kind_from_name("euler_a"), Catch::Contains("not implemented"));
  // UniPC is the flow-sigmas one only (Wan's); an SD config is refused with the reason.
  CATCH_CHECK_THROWS_WITH(make_scheduler(SamplerKind::kUniPC, sd_config()), Catch::Contains("use_flow_sigmas: true"));
  auto unipc = make_scheduler_from_config(default_scheduler_config("wan"));
  CATCH_CHECK(unipc->class_name() == std::string("UniPCMultistepScheduler"));
  unipc->set_timesteps(4);
  CATCH_CHECK(unipc->timesteps().scalar_type() == torch::kInt64);
  CATCH_CHECK(unipc->timesteps()[0].item<int64_t>() == 999);  // sigma 1 - 1e-6, truncated
  // Multistep: the steps come in order.
  const auto z = torch::zeros({1, 4, 2, 2});
  CATCH_CHECK_THROWS_WITH(unipc->step(z, 1, z), Catch::Contains("out of order"));
  unipc->step(z, 0, z);
  unipc->step(z, 1, z);
  unipc->set_timesteps(4);
  CATCH_CHECK_NOTHROW(unipc->step(z, 0, z));
  CATCH_CHECK_THROWS_WITH(sampler_kind_from_name("dim"), Catch::Contains("did you mean 'ddim'"));

  // A model's PNDM config carries over to DDIM like diffusers' from_config.
  json pndm = sd_config();
  pndm["_class_name"] = "PNDMScheduler";
  pndm["skip_prk_steps"] = true;
  auto d = make_scheduler(SamplerKind::kDDIM, pndm);
  d->set_timesteps(50);
  CATCH_CHECK(d->timesteps()[0].item<int64_t>() == 981);
  CATCH_CHECK(d->timesteps()[49].item<int64_t>() == 1);
  CATCH_CHECK_THROWS_AS(make_scheduler_from_config(pndm), lt::InputError);
  CATCH_CHECK(make_scheduler_from_config(default_scheduler_config("sdxl"))->class_name() ==
              std::string("EulerDiscreteScheduler"));
  CATCH_CHECK(json(d->config_json())["steps_offset"] == 1);

  json bad = sd_config();
  bad["beta_start"] = "small";
  CATCH_CHECK_THROWS_WITH(make_scheduler(SamplerKind::kDDPM, bad), Catch::Contains("beta_start"));
  json beta_sig = sd_config();
  beta_sig["use_beta_sigmas"] = true;
  CATCH_CHECK_THROWS_AS(make_scheduler(SamplerKind::kEuler, beta_sig), lt::InputError);

  // Spacings of DDPM/DDIM (diffusers Table 2 of Lin et al.).
  json lin = sd_config();
  lin["timestep_spacing"] = "linspace";
  auto l = make_scheduler(SamplerKind::kDDIM, lin);
  l->set_timesteps(4);
  CATCH_CHECK(torch::equal(l->timesteps(), torch::tensor({999, 666, 333, 0}, torch::kLong)));
  json tr = sd_config();
  tr["timestep_spacing"] = "trailing";
  auto t = make_scheduler(SamplerKind::kDDIM, tr);
  t->set_timesteps(4);
  CATCH_CHECK(torch::equal(t->timesteps(), torch::tensor({999, 749, 499, 249}, torch::kLong)));
  CATCH_CHECK_THROWS_AS(t->set_timesteps(0), lt::InputError);
  CATCH_CHECK_THROWS_AS(t->set_timesteps(1001), lt::InputError);
}

CATCH_TEST_CASE("preview images and grids", "[sample][grid]") {
  auto decoded = torch::tensor({-1.0f, -0.5f, 0.0f, 1.5f}).view({1, 1, 2, 2}).expand({2, 3, 2, 2}).contiguous();
  auto ims = to_uint8_images(decoded);
  CATCH_REQUIRE(ims.size() == 2);
  CATCH_CHECK(ims[0].sizes() == at::IntArrayRef({2, 2, 3}));
  // (x / 2 + 0.5) * 255, clamped, rounded half to even: 0, 63.75 -> 64, 127.5 -> 128, 255.
  CATCH_CHECK(ims[0][0][0][0].item<int>() == 0);
  CATCH_CHECK(ims[0][0][1][0].item<int>() == 64);
  CATCH_CHECK(ims[0][1][0][0].item<int>() == 128);
  CATCH_CHECK(ims[0][1][1][2].item<int>() == 255);

  auto a = torch::full({4, 6, 3}, 10, torch::kByte), b = torch::full({2, 2, 3}, 20, torch::kByte);
  auto c = torch::full({4, 6, 3}, 30, torch::kByte);
  auto grid = make_image_grid({a, b, c}, 2, 1, 255);
  CATCH_CHECK(grid.sizes() == at::IntArrayRef({9, 13, 3}));  // 2 rows x 2 cols of 4x6 cells, 1 px apart
  CATCH_CHECK(grid[0][0][0].item<int>() == 10);
  CATCH_CHECK(grid[2][9][0].item<int>() == 20);   // b centred in cell (0, 1): rows 1-2, cols 9-10
  CATCH_CHECK(grid[0][9][0].item<int>() == 255);  // background around the small image
  CATCH_CHECK(grid[5][0][0].item<int>() == 30);
  CATCH_CHECK(grid[4][0][0].item<int>() == 255);  // padding row
  CATCH_CHECK(make_image_grid({a, b, c}).sizes() == at::IntArrayRef({8, 12, 3}));  // ceil(sqrt(3)) = 2 columns
}
