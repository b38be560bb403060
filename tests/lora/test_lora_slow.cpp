// kohya's module counts on the full-size SD1.5 UNet built from diffusers' default config.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/lora/network.h"
#include "loratrain/models/sd/unet.h"

using namespace lt::lora;

CATCH_TEST_CASE("full-size SD1.5 UNet: 192 default targets, 278 with conv (kohya's counts)", "[lora][naming][slow]") {
  lt::models::sd::UNet2DConditionModel unet(lt::models::sd::UNetConfig::sd15());
  LoRANetwork net(NetworkConfig{});
  CATCH_CHECK(net->add_component(ComponentSpec::sd_unet(), *unet) == 192);
  for (const auto& m : net->modules()) {
    if (m->lora_name == "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k") {
      CATCH_CHECK(m->lora_down.sizes() == torch::IntArrayRef({4, 768}));  // cross-attention from CLIP-L
      CATCH_CHECK(m->lora_up.sizes() == torch::IntArrayRef({320, 4}));
    }
    if (m->lora_name == "lora_unet_up_blocks_3_attentions_2_transformer_blocks_0_ff_net_0_proj")
      CATCH_CHECK(m->lora_up.sizes() == torch::IntArrayRef({2560, 4}));  // GEGLU: 2 x 4 x 320
  }
  NetworkConfig locon;
  locon.conv = 8;
  LoRANetwork with_conv(locon);
  CATCH_CHECK(with_conv->add_component(ComponentSpec::sd_unet(), *unet) == 278);
}
