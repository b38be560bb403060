// The gradient path learns: a LoRA on the tiny SD UNet fits a fixed batch.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/lora/network.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/sample/noise.h"

CATCH_TEST_CASE("a LoRA on the tiny SD UNet halves the loss on a fixed batch", "[train][learning]") {
  torch::manual_seed(3);
  nlohmann::json config = {{"down_block_types", {"CrossAttnDownBlock2D", "DownBlock2D"}},
                           {"up_block_types", {"UpBlock2D", "CrossAttnUpBlock2D"}},
                           {"block_out_channels", {32, 64}},
                           {"layers_per_block", 1},
                           {"attention_head_dim", 2},
                           {"cross_attention_dim", 32},
                           {"norm_num_groups", 16}};
  lt::models::sd::UNet2DConditionModel unet(lt::models::sd::UNetConfig::from_json(config));
  lt::lora::NetworkConfig net;
  net.linear = 8;
  net.linear_alpha = 8;
  lt::lora::LoRANetwork network(net);
  CATCH_REQUIRE(network->add_component(lt::lora::ComponentSpec::sd_unet(), *unet) > 0);
  network->apply_to();
  auto optimizer = lt::optim::make_optimizer("adamw", network->trainable_parameters(), {});

  lt::sample::NoiseSchedule schedule;
  auto generator = lt::sample::make_generator(11);
  auto latents = lt::sample::randn({2, 4, 8, 8}, generator);
  auto context = lt::sample::randn({2, 6, 32}, generator);
  auto noise = lt::sample::make_training_noise(schedule, latents, generator);
  auto loss_now = [&] {
    auto prediction = unet->forward(noise.noisy_latents, noise.timesteps, context);
    return lt::sample::weighted_mean(lt::sample::mse_loss_per_sample(prediction, noise.noise));
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
