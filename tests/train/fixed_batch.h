// The learning checks' common loop: an adapter on a tiny base fits one fixed batch with the
// trainer's own loss function (training_loss).
#pragma once

#include <torch/torch.h>

#include "loratrain/lora/network.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/sample/noise.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/objective.h"

namespace lt::test {

struct FixedBatchFit {
  double first = 0.0;  // the loss before any step
  double last = 0.0;   // the loss when the loop ended
  int steps = 0;
};

// Adds `network`'s adapters to `model`'s targets, then trains them with AdamW at `lr` on two fixed
// latents and captions until the loss is below half the first, for at most `max_steps` steps (the
// steps after that would only spend time).
inline FixedBatchFit fit_fixed_batch(train::DiffusionModel& model, lora::LoRANetwork& network, double lr, int max_steps) {
  for (const auto& target : model.lora_targets()) network->add_component(*target.spec, *target.root);
  network->apply_to();
  model.set_training(true);
  auto optimizer = optim::make_optimizer("adamw", network->trainable_parameters(), {});
  const train::TrainingObjective objective(model.traits(), {});

  auto generator = sample::make_generator(11);
  const auto latents = sample::randn({2, model.traits().latent_channels, 8, 8}, generator);
  train::Conditioning conditioning;
  {
    torch::NoGradGuard no_grad;
    conditioning.text = model.encode_text({"a red circle", "a blue square"});
  }
  conditioning.images.assign(2, {64, 64, 0, 0, 64, 64});
  const auto start = sample::generator_state(generator);
  // The same example every time: the generator goes back to where it was.
  auto loss_now = [&] {
    sample::set_generator_state(generator, start);
    return train::training_loss(model, objective, latents, conditioning, generator);
  };
  FixedBatchFit fit;
  fit.first = loss_now().item<double>();
  for (;; ++fit.steps) {
    optimizer->zero_grad();
    auto loss = loss_now();
    fit.last = loss.item<double>();
    if (fit.last < 0.5 * fit.first || fit.steps == max_steps) break;
    loss.backward();
    optimizer->step(lr);
  }
  return fit;
}

}  // namespace lt::test
