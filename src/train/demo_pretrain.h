// Pretraining of the tiny SD1 demo base (see DemoPretrainOptions in loratrain/train/demo_base.h).
#pragma once
#include <cstdint>

#include "loratrain/models/sd/unet.h"
#include "loratrain/models/sd/vae.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/models/text/clip_tokenizer.h"
#include "loratrain/train/demo_base.h"

namespace lt::train {

// Trains `vae`, then `unet` on the features of `text_encoder` (which stays as it is), in place (CPU, fp32). Afterwards the VAE's latents of the
// shapes, times its scaling factor, have zero mean and unit variance per channel, as the diffusion
// schedule expects of real SD latents.
void pretrain_sd_demo(models::sd::UNet2DConditionModel& unet, models::sd::AutoencoderKL& vae,
                      models::CLIPTextModel& text_encoder, const models::CLIPTokenizer& tokenizer,
                      const DemoPretrainOptions& options, uint64_t seed);

}  // namespace lt::train
