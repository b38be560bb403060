// Inside the planner: the working set of diffusers' AutoencoderKL (SD 1.x/2.x, SDXL and Flux.1's
// 16-channel VAE share the architecture), in fp32 (force_upcast) and without gradients.
#pragma once
#include <cstdint>

#include "architecture.h"
#include "loratrain/models/sd/vae.h"

namespace lt::plan {

// The largest level's working tensors, or the mid block's single-head attention over every latent
// cell, at `s` (tiled when c.vae_tiling asks for it).
int64_t autoencoder_kl_encode(const models::sd::VAEConfig& vae, const Shape& s, const Compute& c);
// The same for decode; tiled decoding also keeps the whole decoded image while tiles are blended.
int64_t autoencoder_kl_decode(const models::sd::VAEConfig& vae, const Shape& s, const Compute& c);

}  // namespace lt::plan
