// The planner sizes every adapter type as the trainer builds it: its parameter count for LoRA, LoKr
// (factored and full-rank) and LoHa equals the trained network's on the tiny SD1 base.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/config/config.h"
#include "loratrain/lora/network.h"
#include "loratrain/plan/plan.h"
#include "loratrain/train/diffusion_model.h"
#include "train_fixture.h"

CATCH_TEST_CASE("the planner counts LoKr and LoHa parameters as the network has them", "[plan][lycoris]") {
  const auto root = lt::test::scratch_dir("plan_adapters");
  const auto config = lt::test::write_tiny_config(root, "adapters", 10);
  struct Case {
    std::string type;
    bool full_rank;
    std::optional<int64_t> conv;
  };
  const auto c = GENERATE(Case{"lora", false, std::nullopt}, Case{"lora", false, 4}, Case{"lokr", false, std::nullopt},
                          Case{"lokr", false, 4}, Case{"lokr", true, std::nullopt}, Case{"loha", false, std::nullopt},
                          Case{"loha", false, 4});
  CATCH_INFO(c.type << (c.full_rank ? " full rank" : "") << (c.conv ? " with conv" : ""));
  std::vector<std::string> overrides = {"network.type=" + c.type, "network.linear=4", "train.optimizer=adamw",
                                        "network.lokr_full_rank=" + std::string(c.full_rank ? "true" : "false")};
  if (c.conv) overrides.push_back("network.conv=" + std::to_string(*c.conv));
  const auto planner = lt::plan::Planner::from_config(lt::config::load_config(config, overrides));
  // adamw: the fp32 weights, their gradients and two fp32 moments, 16 bytes per parameter.
  const int64_t planned = planner->predict(planner->configured()).at(lt::plan::Phase::train_step).adapter_optimizer / 16;

  lt::train::ModelLoadOptions options;
  options.name_or_path = lt::test::tiny_assets() / "base" / "model.safetensors";
  auto model = lt::train::load_diffusion_model(options);
  lt::lora::NetworkConfig net;
  net.type = c.type == "lokr" ? lt::lora::AdapterType::LoKr : c.type == "loha" ? lt::lora::AdapterType::LoHa : lt::lora::AdapterType::LoRA;
  net.linear = 4;
  net.lokr_full_rank = c.full_rank;
  net.conv = c.conv;
  if (c.full_rank && !net.conv) net.conv = net.linear;  // as the trainer does
  lt::lora::LoRANetwork network(net);
  for (const auto& target : model->lora_targets()) network->add_component(*target.spec, *target.root);
  int64_t actual = 0;
  for (const auto& p : network->trainable_parameters()) actual += p.numel();
  const auto modules = static_cast<int64_t>(network->modules().size());
  CATCH_INFO("planned " << planned << ", network " << actual << " + " << modules << " alphas");
  CATCH_CHECK(planned == actual + modules);
}
