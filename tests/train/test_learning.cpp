// The gradient path learns: the trainer's own loss function (training_loss) with a LoRA on the
// tiny SD1-architecture base fits a fixed batch.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/lora/network.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/sample/noise.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/objective.h"
#include "train_fixture.h"

CATCH_TEST_CASE("a LoRA on the tiny SD base halves the loss on a fixed batch", "[train][learning]") {
  torch::manual_seed(3);
  lt::train::ModelLoadOptions options;
  options.name_or_path = lt::test::tiny_assets() / "base" / "model.safetensors";
  auto model = lt::train::load_diffusion_model(options);
  CATCH_REQUIRE(model->traits().family == lt::train::ModelFamily::kSD1);

  lt::lora::NetworkConfig net;
  net.linear = 8;
  net.linear_alpha = 8;
  lt::lora::LoRANetwork network(net);
  for (const auto& target : model->lora_targets()) network->add_component(*target.spec, *target.root);
  CATCH_REQUIRE(network->count(true) > 0);
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
  const auto start = lt::sample::generator_state(generator);
  // The same example every time: the generator goes back to where it was.
  auto loss_now = [&] {
    lt::sample::set_generator_state(generator, start);
    return lt::train::training_loss(*model, objective, latents, conditioning, generator);
  };
  const double first = loss_now().item<double>();
  for (int step = 0; step < 60; ++step) {
    optimizer->zero_grad();
    loss_now().backward();
    optimizer->step(3e-3);
  }
  const double last = loss_now().item<double>();
  CATCH_INFO("loss " << first << " -> " << last);
  CATCH_CHECK(last < 0.5 * first);
}
