# Wan 2.1 (text-to-video 1.3B, 14B): WanTransformer3DModel, AutoencoderKLWan and the checkpoint layouts users have.
list(APPEND LT_MODELS_SOURCES
  wan/transformer.cpp
  wan/vae.cpp
  wan/checkpoint.cpp
)
