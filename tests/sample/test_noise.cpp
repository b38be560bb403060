// Training noise math: schedule tables, forward-process identities, Min-SNR weights against values
// computed by hand in float64, seeded generators, noise offset, per-sample MSE.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "loratrain/sample/noise.h"
#include "loratrain/util/error.h"

using namespace lt::sample;

namespace {

// alpha-bar_t of SD's scaled_linear schedule, in float64 from the definition.
double abar_by_hand(int64_t t) {
  const double a = std::sqrt(0.00085), b = std::sqrt(0.012);
  double prod = 1.0;
  for (int64_t i = 0; i <= t; ++i) {
    const double s = a + (b - a) * static_cast<double>(i) / 999.0;
    prod *= 1.0 - s * s;
  }
  return prod;
}

bool close(const at::Tensor& a, const at::Tensor& b, double tol) {
  return (a - b).abs().max().item<double>() <= tol;
}

}  // namespace

CATCH_TEST_CASE("DDPM scaled_linear schedule matches its definition", "[sample][noise]") {
  NoiseSchedule s;  // SD defaults
  CATCH_CHECK(s.betas().size(0) == 1000);
  CATCH_CHECK(s.betas()[0].item<double>() == Approx(0.00085).epsilon(1e-6));
  CATCH_CHECK(s.betas()[999].item<double>() == Approx(0.012).epsilon(1e-6));
  for (int64_t t : {0, 1, 250, 500, 999})
    CATCH_CHECK(s.alphas_cumprod()[t].item<double>() == Approx(abar_by_hand(t)).epsilon(2e-5));

  NoiseScheduleConfig lin;
  lin.beta_schedule = BetaSchedule::kLinear;
  lin.beta_start = 0.0001;
  lin.beta_end = 0.02;
  NoiseSchedule l(lin);
  CATCH_CHECK(l.betas()[500].item<double>() == Approx(0.0001 + (0.02 - 0.0001) * 500 / 999).epsilon(1e-6));

  NoiseScheduleConfig zt;
  zt.rescale_betas_zero_snr = true;
  NoiseSchedule z(zt);
  CATCH_CHECK(z.alphas_cumprod()[999].item<double>() == Approx(0.0).margin(1e-12));
  CATCH_CHECK(z.alphas_cumprod()[0].item<double>() == Approx(s.alphas_cumprod()[0].item<double>()).epsilon(1e-5));
}

CATCH_TEST_CASE("add_noise and get_velocity satisfy the forward-process identities", "[sample][noise]") {
  NoiseSchedule s;
  auto gen = make_generator(7);
  auto x0 = torch::randn({3, 4, 5, 5}, gen);
  auto eps = torch::randn({3, 4, 5, 5}, gen);
  auto t = torch::tensor({0, 421, 999}, torch::kLong);
  auto xt = s.add_noise(x0, eps, t);
  auto v = s.get_velocity(x0, eps, t);
  auto a = s.alphas_cumprod().index({t}).sqrt().view({3, 1, 1, 1});
  auto b = (1 - s.alphas_cumprod().index({t})).sqrt().view({3, 1, 1, 1});
  CATCH_CHECK(close(xt, a * x0 + b * eps, 1e-6));
  // With a^2 + b^2 = 1: x0 = a x_t - b v and eps = b x_t + a v.
  CATCH_CHECK(close(a * xt - b * v, x0, 2e-5));
  CATCH_CHECK(close(b * xt + a * v, eps, 2e-5));
  CATCH_CHECK(torch::equal(s.target(PredictionType::kEpsilon, x0, eps, t), eps));
  CATCH_CHECK(torch::equal(s.target(PredictionType::kVPrediction, x0, eps, t), v));
  CATCH_CHECK(torch::equal(s.target(PredictionType::kSample, x0, eps, t), x0));
  CATCH_CHECK(torch::equal(s.target(PredictionType::kFlow, x0, eps, t), eps - x0));
  // Other dtypes: tables are cast to the input's dtype.
  auto xt64 = s.add_noise(x0.to(torch::kDouble), eps.to(torch::kDouble), t);
  CATCH_CHECK(xt64.scalar_type() == torch::kDouble);
  CATCH_CHECK(close(xt64.to(torch::kFloat), xt, 1e-5));
}

CATCH_TEST_CASE("Min-SNR-gamma weights equal hand-computed values", "[sample][noise][snr]") {
  NoiseSchedule s;
  const std::vector<int64_t> ts = {0, 100, 500, 999};
  auto t = torch::tensor(ts, torch::kLong);
  const double gamma = 5.0;
  auto w_eps = s.min_snr_weights(t, gamma, PredictionType::kEpsilon);
  auto w_v = s.min_snr_weights(t, gamma, PredictionType::kVPrediction);
  auto snr = s.snr(t);
  for (size_t i = 0; i < ts.size(); ++i) {
    const double ab = abar_by_hand(ts[i]);
    const double snr_h = ab / (1 - ab);
    CATCH_CHECK(snr[static_cast<int64_t>(i)].item<double>() == Approx(snr_h).epsilon(2e-4));
    CATCH_CHECK(w_eps[static_cast<int64_t>(i)].item<double>() == Approx(std::min(snr_h, gamma) / snr_h).epsilon(2e-4));
    CATCH_CHECK(w_v[static_cast<int64_t>(i)].item<double>() ==
                Approx(std::min(snr_h, gamma) / (snr_h + 1)).epsilon(2e-4));
  }
  // High-noise timesteps (SNR < gamma) keep full weight for epsilon; t = 0 is strongly damped.
  CATCH_CHECK(w_eps[3].item<double>() == 1.0);
  CATCH_CHECK(w_eps[0].item<double>() < 0.01);
  CATCH_CHECK_THROWS_AS(s.min_snr_weights(t, 0.0, PredictionType::kEpsilon), lt::InputError);

  auto deb = s.debiased_estimation_weights(t, PredictionType::kEpsilon);
  CATCH_CHECK(deb[2].item<double>() == Approx(1 / std::sqrt(snr[2].item<double>())).epsilon(1e-5));
}

CATCH_TEST_CASE("seeded generator matches PyTorch and restores its state", "[sample][noise][rng]") {
  auto g = make_generator(0);
  // torch.randn(3, generator=torch.Generator().manual_seed(0)) in PyTorch.
  auto r = torch::randn({3}, g);
  CATCH_CHECK(r[0].item<double>() == Approx(1.5410).margin(1e-4));
  CATCH_CHECK(r[1].item<double>() == Approx(-0.2934).margin(1e-4));
  CATCH_CHECK(r[2].item<double>() == Approx(-2.1788).margin(1e-4));

  auto gen = make_generator(1234);
  auto state = generator_state(gen);
  auto t1 = sample_timesteps(64, gen);
  auto after = torch::randn({4}, gen);
  set_generator_state(gen, state);
  auto t2 = sample_timesteps(64, gen);
  CATCH_CHECK(torch::equal(t1, t2));
  CATCH_CHECK(torch::equal(after, torch::randn({4}, gen)));
  CATCH_CHECK(t1.scalar_type() == torch::kLong);
  CATCH_CHECK(t1.min().item<int64_t>() >= 0);
  CATCH_CHECK(t1.max().item<int64_t>() < 1000);
  auto narrow = sample_timesteps(64, gen, 200, 300);
  CATCH_CHECK(narrow.min().item<int64_t>() >= 200);
  CATCH_CHECK(narrow.max().item<int64_t>() < 300);
  CATCH_CHECK(sample_timesteps(3, gen, 500, 500).eq(500).all().item<bool>());
}

CATCH_TEST_CASE("noise offset shifts each sample and channel by one draw", "[sample][noise]") {
  auto gen = make_generator(3);
  auto noise = torch::randn({2, 4, 6, 6}, gen);
  auto before = generator_state(gen);
  CATCH_CHECK(apply_noise_offset(noise, 0.0, gen).is_same(noise));
  CATCH_CHECK(torch::equal(generator_state(gen), before));  // nothing drawn

  auto expected_gen = make_generator(99);
  auto expected = 0.1 * torch::randn({2, 4, 1, 1}, expected_gen);
  auto gen2 = make_generator(99);
  auto shifted = apply_noise_offset(noise, 0.1, gen2);
  auto delta = shifted - noise;  // [2, 4, 6, 6], constant over H, W
  CATCH_CHECK(close(delta, expected.expand_as(delta), 1e-6));
}

CATCH_TEST_CASE("training noise replays from a saved generator state", "[sample][noise][rng]") {
  NoiseSchedule s;
  auto latents = torch::randn({2, 4, 8, 8});
  auto gen = make_generator(42);
  auto state = generator_state(gen);
  TrainingNoiseOptions opt;
  opt.noise_offset = 0.05;
  auto a = make_training_noise(s, latents, gen, opt);
  set_generator_state(gen, state);
  auto b = make_training_noise(s, latents, gen, opt);
  CATCH_CHECK(torch::equal(a.noise, b.noise));
  CATCH_CHECK(torch::equal(a.timesteps, b.timesteps));
  CATCH_CHECK(torch::equal(a.noisy_latents, s.add_noise(latents, a.noise, a.timesteps)));
  opt.max_timestep = 2000;
  CATCH_CHECK_THROWS_AS(make_training_noise(s, latents, gen, opt), lt::InputError);
}

CATCH_TEST_CASE("per-sample MSE and weighted mean", "[sample][noise][loss]") {
  auto pred = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({2, 2});
  auto target = torch::tensor({0.0f, 0.0f, 3.0f, 2.0f}).view({2, 2});
  auto l = mse_loss_per_sample(pred.to(torch::kDouble), target);
  CATCH_CHECK(l.scalar_type() == torch::kFloat);
  CATCH_CHECK(l[0].item<double>() == Approx(2.5));  // (1 + 4) / 2
  CATCH_CHECK(l[1].item<double>() == Approx(2.0));  // (0 + 4) / 2
  CATCH_CHECK(weighted_mean(l).item<double>() == Approx(2.25));
  CATCH_CHECK(weighted_mean(l, torch::tensor({1.0f, 0.5f})).item<double>() == Approx((2.5 + 1.0) / 2));
}
