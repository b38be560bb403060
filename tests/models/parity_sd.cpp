// Parity runners for the Stable Diffusion family: UNet2DConditionModel (diffusers and LDM
// single-file weights) and AutoencoderKL.
#include <torch/torch.h>

#include "loratrain/models/sd/load.h"
#include "models/parity_runners.h"

namespace lt::test::parity {
namespace {

using namespace lt::models::sd;

Outputs run_unet(UNet2DConditionModelImpl& unet, const Case& c) {
  UNetAddedCond added;
  if (c.has_input("in.added_cond_kwargs.text_embeds")) added.text_embeds = c.input("in.added_cond_kwargs.text_embeds");
  if (c.has_input("in.added_cond_kwargs.time_ids")) added.time_ids = c.input("in.added_cond_kwargs.time_ids");
  at::Tensor out = unet.forward(c.input("in.sample"), c.input("in.timestep"), c.input("in.encoder_hidden_states"), added);
  return {{"out.sample", out}};
}

const RunnerRegistrar unet_runner("UNet2DConditionModel", [](const Case& c) {
  const UNetConfig config = UNetConfig::from_json(c.config);
  std::vector<Pass> passes;
  for (const char* file : {"weights.safetensors", "weights_ldm.safetensors"}) {
    if (!c.has_file(file)) continue;
    UNet2DConditionModel unet(config);
    unet->eval();
    load_unet(*unet, *c.open(file));
    passes.push_back({file, run_unet(*unet, c)});
  }
  return passes;
});

const RunnerRegistrar vae_runner("AutoencoderKL", [](const Case& c) {
  AutoencoderKL vae(VAEConfig::from_json(c.config));
  vae->eval();
  load_vae(*vae, *c.open("weights.safetensors"));
  Outputs out;
  if (c.has_input("in.image")) {
    DiagonalGaussian d = vae->encode(c.input("in.image"));
    out["out.latent_dist.mean"] = d.mean;
    out["out.latent_dist.logvar"] = d.logvar;
    out["out.latent_dist.std"] = d.stddev;
  }
  if (c.has_input("in.latent")) out["out.decoded"] = vae->decode(c.input("in.latent"));
  return std::vector<Pass>{{"weights.safetensors", out}};
});

}  // namespace
}  // namespace lt::test::parity
