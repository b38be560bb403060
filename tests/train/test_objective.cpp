// The flow-matching objective: x_t, the target and the noise levels AI Toolkit draws for each
// timestep_type.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>

#include "loratrain/sample/noise.h"
#include "loratrain/train/objective.h"
#include "loratrain/util/error.h"

namespace {

lt::train::ModelTraits flow_traits(bool dynamic) {
  lt::train::ModelTraits traits;
  traits.objective = lt::train::Objective::flow_matching;
  traits.latent_channels = 16;
  traits.latent_patch_size = 2;
  traits.flow_schedule.shift = 3.0;
  traits.flow_schedule.use_dynamic_shifting = dynamic;
  return traits;
}

lt::train::ObjectiveOptions with_type(const std::string& type) {
  lt::train::ObjectiveOptions options;
  options.timestep_type = type;
  return options;
}

at::Tensor sigmas(const lt::train::TrainingObjective& objective, int64_t n, int64_t side, uint64_t seed) {
  auto rng = lt::sample::make_generator(seed);
  return objective.draw_flow_sigmas(n, side, side, rng).to(torch::kDouble);
}

}  // namespace

CATCH_TEST_CASE("flow matching: x_t = (1 - sigma) x0 + sigma noise, target noise - x0, t = 1000 sigma", "[train][objective]") {
  const lt::train::TrainingObjective objective(flow_traits(true), with_type("sigmoid"));
  auto data = lt::sample::make_generator(1);
  const auto x0 = lt::sample::randn({3, 16, 8, 8}, data);
  auto rng = lt::sample::make_generator(2);
  const auto example = objective.make_example(x0, rng);
  CATCH_REQUIRE(example.timesteps.scalar_type() == torch::kFloat32);
  CATCH_REQUIRE(!example.weights.defined());
  const auto sigma = (example.timesteps / 1000.0).view({3, 1, 1, 1});
  const auto noise = example.target + x0;
  CATCH_CHECK(torch::allclose(example.noisy, (1 - sigma) * x0 + sigma * noise, 1e-5, 1e-6));
  // The noise is the generator's first draw: the same stream replays the same example.
  auto again = lt::sample::make_generator(2);
  CATCH_CHECK(torch::equal(objective.make_example(x0, again).noisy, example.noisy));
  auto fresh = lt::sample::make_generator(2);
  CATCH_CHECK(torch::allclose(noise, lt::sample::randn({3, 16, 8, 8}, fresh), 1e-5, 1e-6));
}

CATCH_TEST_CASE("flow matching: the noise levels of each timestep_type", "[train][objective]") {
  const int64_t n = 20000;
  CATCH_SECTION("sigmoid: sigmoid(N(0, 1)), centred, std 0.208") {
    const auto s = sigmas(lt::train::TrainingObjective(flow_traits(true), with_type("sigmoid")), n, 64, 5);
    CATCH_CHECK(s.min().item<double>() > 0);
    CATCH_CHECK(s.max().item<double>() < 1);
    CATCH_CHECK(std::abs(s.mean().item<double>() - 0.5) < 0.01);
    CATCH_CHECK(std::abs(s.std().item<double>() - 0.208) < 0.01);
  }
  CATCH_SECTION("linear: the table 1, 0.999, ..., 0.002, uniformly") {
    const auto s = sigmas(lt::train::TrainingObjective(flow_traits(true), with_type("linear")), n, 64, 5);
    const auto k = s * 1000;
    CATCH_CHECK(torch::allclose(k, k.round(), 0, 1e-3));
    CATCH_CHECK(s.min().item<double>() >= 0.002 - 1e-9);
    CATCH_CHECK(s.max().item<double>() <= 1.0);
    CATCH_CHECK(std::abs(s.mean().item<double>() - 0.501) < 0.01);
  }
  CATCH_SECTION("flux_shift: the linear levels shifted by mu of the image's token count") {
    const auto linear = sigmas(lt::train::TrainingObjective(flow_traits(true), with_type("linear")), 64, 128, 9);
    for (const std::string type : {"flux_shift", "shift"}) {
      // 128 x 128 latent cells in 2 x 2 patches = 4096 tokens: mu = max_shift = 1.15.
      const auto big = sigmas(lt::train::TrainingObjective(flow_traits(true), with_type(type)), 64, 128, 9);
      const double e = std::exp(1.15);
      CATCH_CHECK(torch::allclose(big, e / (e + (1 / linear - 1)), 1e-6, 1e-6));
      // 32 x 32 cells = 256 tokens: mu = base_shift = 0.5, a smaller shift.
      const auto small = sigmas(lt::train::TrainingObjective(flow_traits(true), with_type(type)), 64, 32, 9);
      const double e_small = std::exp(0.5);
      CATCH_CHECK(torch::allclose(small, e_small / (e_small + (1 / linear - 1)), 1e-6, 1e-6));
      CATCH_CHECK((small <= big).all().item<bool>());
    }
  }
  CATCH_SECTION("shift without dynamic shifting: shift s / (1 + (shift - 1) s)") {
    const auto linear = sigmas(lt::train::TrainingObjective(flow_traits(false), with_type("linear")), 64, 32, 9);
    const auto shifted = sigmas(lt::train::TrainingObjective(flow_traits(false), with_type("shift")), 64, 32, 9);
    CATCH_CHECK(torch::allclose(shifted, 3 * linear / (1 + 2 * linear), 1e-6, 1e-6));
  }
}

CATCH_TEST_CASE("flow matching: settings that belong to DDPM are refused", "[train][objective]") {
  auto options = with_type("sigmoid");
  options.min_snr_gamma = 5.0;
  CATCH_CHECK_THROWS_AS(lt::train::TrainingObjective(flow_traits(true), options), lt::InputError);
  CATCH_CHECK_THROWS_AS(lt::train::TrainingObjective(flow_traits(true), with_type("lognorm_blend")), lt::InputError);
  // A DDPM model ignores timestep_type, as AI Toolkit does.
  CATCH_CHECK_NOTHROW(lt::train::TrainingObjective(lt::train::ModelTraits{}, with_type("lognorm_blend")));
}
