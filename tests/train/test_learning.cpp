// The gradient path learns: the trainer's own loss function (training_loss) with a LoRA on each
// family's tiny base fits a fixed batch.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/lora/network.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/sample/noise.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/objective.h"
#include "train_fixture.h"

CATCH_TEST_CASE("a LoRA on each family's tiny base halves the loss on a fixed batch", "[train][learning]") {
  const auto base = GENERATE(std::string("sd1"), std::string("sdxl"));
  lt::train::ModelLoadOptions options;
  options.name_or_path = base == "sd1" ? lt::test::tiny_assets() / "base" / "model.safetensors"
                                       : lt::test::tiny_sdxl() / "sdxl" / "model.safetensors";
  auto model = lt::train::load_diffusion_model(options);
  CATCH_INFO(base);
  CATCH_REQUIRE(lt::playbook::to_string(model->traits().family) == base);
  // Seeded after loading: the tiny bases are made on first use, by whichever test comes first, and
  // that must not change the adapters' initialisation here.
  torch::manual_seed(3);

  lt::lora::NetworkConfig net;
  net.linear = 8;
  net.linear_alpha = 8;
  lt::lora::LoRANetwork network(net);
  for (const auto& target : model->lora_targets()) network->add_component(*target.spec, *target.root);
  CATCH_REQUIRE(network->count(true) > 0);
  CATCH_INFO("adapters " << network->count(true));
  network->apply_to();
  model->set_training(true);
  auto optimizer = lt::optim::make_optimizer("adamw", network->trainable_parameters(), {});
  const lt::train::TrainingObjective objective(model->traits(), {});

  auto generator = lt::sample::make_generator(11);
  const auto latents = lt::sample::randn({2, model->traits().latent_channels, 8, 8}, generator);
  lt::train::Conditioning conditioning;
  {
    torch::NoGradGuard no_grad;
    conditioning.text = model->encode_text({"a red circle", "a blue square"});
  }
  conditioning.images.assign(2, {64, 64, 0, 0, 64, 64});
  const auto start = lt::sample::generator_state(generator);
  // The same example every time: the generator goes back to where it was.
  auto loss_now = [&] {
    lt::sample::set_generator_state(generator, start);
    return lt::train::training_loss(*model, objective, latents, conditioning, generator);
  };
  // At most 100 steps; the loop ends as soon as the loss is below half the first (the steps after
  // that would only spend time).
  const double first = loss_now().item<double>();
  double last = first;
  int steps = 0;
  for (;; ++steps) {
    optimizer->zero_grad();
    auto loss = loss_now();
    last = loss.item<double>();
    if (last < 0.5 * first || steps == 100) break;
    loss.backward();
    optimizer->step(1e-2);
  }
  CATCH_INFO("loss " << first << " -> " << last << " after " << steps << " steps");
  CATCH_CHECK(last < 0.5 * first);
}
