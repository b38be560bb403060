// The gradient path learns: the trainer's own loss function (training_loss) with a LoRA on each
// family's tiny base fits a fixed batch.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/train/diffusion_model.h"
#include "fixed_batch.h"
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
  const auto fit = lt::test::fit_fixed_batch(*model, network, 1e-2, 100);
  CATCH_REQUIRE(network->count(true) > 0);
  CATCH_INFO("adapters " << network->count(true));
  CATCH_INFO("loss " << fit.first << " -> " << fit.last << " after " << fit.steps << " steps");
  CATCH_CHECK(fit.last < 0.5 * fit.first);
}
