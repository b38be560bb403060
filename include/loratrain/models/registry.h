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
  std::string evidence;  // the key(s) that decided it, for messages
  bool is_lora() const { return format == KeyFormat::kKohyaLoRA || format == KeyFormat::kPeftLoRA; }
};

// One safetensors file (single-file checkpoint, one diffusers component file, or a LoRA file).
Detection detect_checkpoint(const io::SafetensorsFile& file);

// A diffusers folder (model_index.json, unet/, vae/, text_encoder/, ...).
Detection detect_diffusers_folder(const std::filesystem::path& folder);

}  // namespace lt::models
