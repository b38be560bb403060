# Stable Diffusion 1.x/2.x and XL family (UNet2DConditionModel, AutoencoderKL, the SDXL bundle), their shared blocks,
# gradient checkpointing and the LDM single-file key maps.
list(APPEND LT_MODELS_SOURCES
  checkpointing.cpp
  key_maps.cpp
  sd/blocks.cpp
  sd/transformer.cpp
  sd/unet.cpp
  sd/vae.cpp
  sd/load.cpp
  sd/sdxl.cpp
)
