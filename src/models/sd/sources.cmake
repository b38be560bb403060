# Stable Diffusion 1.x/2.x family (UNet2DConditionModel, AutoencoderKL), their shared blocks,
# gradient checkpointing and the LDM single-file key maps.
list(APPEND LT_MODELS_SOURCES
  checkpointing.cpp
  key_maps.cpp
  sd/blocks.cpp
  sd/transformer.cpp
  sd/unet.cpp
  sd/vae.cpp
  sd/load.cpp
)
