// CLIP text encoders inside single-file checkpoints, in the two namings they are stored with:
//
//   SD1.x  cond_stage_model.transformer.          transformers names (CLIP ViT-L)
//   SD2.x  cond_stage_model.model.                OpenCLIP names (ViT-H, 24 resblocks)
//   SDXL   conditioner.embedders.0.transformer.   transformers names (CLIP ViT-L)
//          conditioner.embedders.1.model.         OpenCLIP names (ViT-bigG, 32 resblocks, text_projection)
//
// Each loads into the transformers-named modules of clip.h through one key map (key_maps.h), so a
// diffusers text_encoder/ folder and a single file give the same module.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/text/clip.h"

namespace lt::models {

// Roots of the text encoders in the single-file layouts above.
inline constexpr const char* kSD1TextEncoderRoot = "cond_stage_model.transformer.";
inline constexpr const char* kSD2TextEncoderRoot = "cond_stage_model.model.";
inline constexpr const char* kSDXLTextEncoderRoot = "conditioner.embedders.0.transformer.";
inline constexpr const char* kSDXLTextEncoder2Root = "conditioner.embedders.1.model.";

// True when `file` holds OpenCLIP-named text tower tensors under `root` (root + token_embedding.weight).
bool has_open_clip_text_encoder(const io::SafetensorsFile& file, const std::string& root);
// True when `file` holds transformers-named CLIP text tensors under `root`.
bool has_clip_text_encoder(const io::SafetensorsFile& file, const std::string& root);

// Config from the shapes of an OpenCLIP text tower under `root` (sizes from the weights, gelu, 64-wide
// heads, eos_token_id 2 as the SD2/SDXL configs have). projection_dim comes from text_projection
// when the file has it.
CLIPTextConfig detect_open_clip_config(const io::SafetensorsFile& file, const std::string& root);
// Config from the shapes of a transformers-named CLIP text model under `root`.
CLIPTextConfig detect_clip_config(const io::SafetensorsFile& file, const std::string& root);

// Strict loads (every missing, unexpected and mis-shaped tensor in one lt::InputError). `dtype`
// converts the weights as they are read (nullopt: the module's dtype). `config`: the encoder's
// config when it is known (e.g. heads that differ from the 64-wide convention), else detected from
// the shapes; either way the shapes are checked against it.
//
// A transformers-named CLIPTextModel under `root` (SD1.x, SDXL's first encoder).
CLIPTextModel load_clip_text_model(const io::SafetensorsFile& file, const std::string& root,
                                   std::optional<at::ScalarType> dtype = std::nullopt,
                                   std::optional<CLIPTextConfig> config = std::nullopt);
// SDXL's second encoder: OpenCLIP ViT-bigG under `root` as CLIPTextModelWithProjection (the fused
// in_proj split into q/k/v, text_projection transposed; logit_scale is not part of the text model).
CLIPTextModelWithProjection load_open_clip_text_model_with_projection(
    const io::SafetensorsFile& file, const std::string& root, std::optional<at::ScalarType> dtype = std::nullopt,
    std::optional<CLIPTextConfig> config = std::nullopt);
// SD2.x: OpenCLIP ViT-H under `root` as the CLIPTextModel diffusers converts it to: SD2 conditions on
// the penultimate resblock's output, so the model has one layer less than the file (23 of 24) and
// the last resblock, text_projection and logit_scale are left unread. A given `config` has the
// model's layer count (the file's minus one).
CLIPTextModel load_open_clip_text_model_penultimate(const io::SafetensorsFile& file, const std::string& root,
                                                    std::optional<at::ScalarType> dtype = std::nullopt,
                                                    std::optional<CLIPTextConfig> config = std::nullopt);

// The SD1.x/SD2.x single file's text encoder, whichever of the two layouts it has. Throws
// lt::InputError naming both prefixes when there is none.
CLIPTextModel load_sd_single_file_text_encoder(const io::SafetensorsFile& file,
                                               std::optional<at::ScalarType> dtype = std::nullopt);

// A CLIPTextModelWithProjection's tensors under OpenCLIP names below `root` (q/k/v fused into
// in_proj, text_projection transposed, plus the logit_scale a real checkpoint carries): how
// SDXL single files store the second encoder.
std::vector<std::pair<std::string, at::Tensor>> open_clip_tensors(CLIPTextModelWithProjectionImpl& model,
                                                                  const std::string& root);

}  // namespace lt::models
