// Which model a checkpoint holds: family and key layout, detected from tensor names and shapes.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loratrain/io/safetensors.h"
#include "loratrain/playbook/vocabulary.h"

namespace lt::models {

using playbook::ModelFamily;
enum class KeyFormat { kUnknown, kLDM, kDiffusers, kBFL, kWanOriginal, kKohyaLoRA, kPeftLoRA };

const char* format_name(KeyFormat f);    // "ldm-single-file", "diffusers", ...

struct Component {
  std::string name;    // "unet", "vae", "text_encoder", "transformer", ...
  std::string prefix;  // key prefix in the file ("model.diffusion_model.", "" for a diffusers file)
  int64_t parameters = 0;
  int64_t tensors = 0;
  std::map<std::string, int64_t> dtypes;  // dtype name -> tensor count
};

struct Detection {
  ModelFamily family = ModelFamily::kUnknown;  // unknown for a LoRA file
  KeyFormat format = KeyFormat::kUnknown;
  std::vector<Component> components;
  // What decided the family, in words fit for a message ("an sd1 checkpoint (...)"): the keys
  // and shapes that tell the families apart (label_emb, cross-attention width, text encoders).
  std::string evidence;
  // Parts a complete checkpoint of this family has and this one lacks: component name ("unet",
  // "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2") -> the keys or folder
  // looked for. Empty when complete (and for LoRA and single-component files).
  std::map<std::string, std::string> missing;
  bool is_lora() const { return format == KeyFormat::kKohyaLoRA || format == KeyFormat::kPeftLoRA; }
};

// Throws one lt::InputError naming every missing part of `d` (except those in `optional`, e.g.
// "vae" when a separate VAE is given) as "<source>: incomplete <family> checkpoint: ...".
void require_complete(const Detection& d, const std::string& source, const std::vector<std::string>& optional = {});

// One safetensors file (single-file checkpoint, one diffusers component file, or a LoRA file).
Detection detect_checkpoint(const io::SafetensorsFile& file);

// A diffusers folder (model_index.json, unet/, vae/, text_encoder/, ...).
Detection detect_diffusers_folder(const std::filesystem::path& folder);

}  // namespace lt::models
