# Flux.1 (dev, schnell): FluxTransformer2DModel and the checkpoint layouts users have.
list(APPEND LT_MODELS_SOURCES
  flux/transformer.cpp
  flux/checkpoint.cpp
)
