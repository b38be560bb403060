// LoRA file formats: kohya/sd-scripts keys (`lora_unet_<path with '_'>.lora_down.weight`,
// `.lora_up.weight`, `.alpha`) and PEFT/diffusers keys (`unet.<path>.lora_A.weight`,
// `.lora_B.weight`): naming, detection, the module dims a file describes, and `inspect`'s summary.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/lora/network.h"

namespace lt::io {
class SafetensorsFile;
}

namespace lt::lora {

// ("lora_unet", "down_blocks.0.attentions.0.proj_in") -> "lora_unet_down_blocks_0_attentions_0_proj_in"
std::string kohya_name(const std::string& kohya_prefix, const std::string& module_path);
// ("unet", "down_blocks.0.attentions.0.proj_in") -> "unet.down_blocks.0.attentions.0.proj_in"
std::string peft_name(const std::string& peft_prefix, const std::string& module_path);

// Kohya when any key ends in .lora_down.weight / .lora_up.weight or is a LyCORIS LoKr/LoHa key
// (.lokr_w1, .lokr_w2(_a/_b), .hada_w1_a ...), PEFT for .lora_A.weight / .lora_B.weight; nullopt
// when the file is not an adapter of either kind.
std::optional<LoRAFormat> detect_lora_format(const io::SafetensorsFile& file);

// One module of a LoRA file: its stem (the key before `.lora_down.weight` / `.lora_A.weight`).
struct LoRAFileModule {
  std::string stem;
  AdapterType type = AdapterType::LoRA;  // LoKr for lokr_* keys, LoHa for hada_* keys
  // LoKr / LoHa: key suffix (e.g. "lokr_w1", "hada_w2_b") -> shape.
  std::map<std::string, std::vector<int64_t>> parts;
  std::string component;           // "unet", "te", "te1", "te2", "te3", "transformer", or the raw prefix
  std::vector<int64_t> down_shape;  // [rank, in(, k, k)]
  std::vector<int64_t> up_shape;    // [out, rank(, 1, 1)]
  std::optional<double> alpha;      // kohya `.alpha`; PEFT: from lora_adapter_metadata when present
};

// Every module of a LoRA file in key order; throws lt::InputError when the file is not a LoRA.
std::vector<LoRAFileModule> read_lora_modules(const io::SafetensorsFile& file);

// The kohya-named dims of the file's modules for LoRANetworkImpl::add_component(): PEFT stems are
// renamed through the components' prefixes (`unet.` -> `lora_unet_`...). Modules whose component is
// not among `components` are left out. Alpha defaults to the rank (scale 1) when the file has none.
std::map<std::string, ModuleDims> module_dims_from_file(const io::SafetensorsFile& file,
                                                        const std::vector<ComponentSpec>& components);

struct LoRAFileInfo {
  LoRAFormat format = LoRAFormat::Kohya;
  std::map<std::string, size_t> types;             // "lora" / "lokr" / "loha" -> modules
  size_t modules = 0;
  size_t conv_modules = 0;                         // k x k (k > 1) conv adapters (LoCon)
  std::map<std::string, size_t> modules_by_component;
  std::map<int64_t, size_t> ranks;                 // rank -> modules
  std::map<double, size_t> alphas;                 // alpha -> modules (only where known)
  size_t modules_without_alpha = 0;
  std::string dtype;                               // of the weights ("F16", "F32", or "mixed")
  std::vector<std::string> problems;               // half-missing modules, rank mismatches
  std::map<std::string, std::string> training;     // ss_* / modelspec.* metadata, as stored
};

// The base-model keys kohya writes into a LoRA's metadata (train_network.py ss_v2 and
// ss_base_model_version; sai_model_spec's modelspec.architecture / .implementation / .resolution),
// by family: "sd1" (sd_v1), "sd2" (sd_v2, or sd_v2_v with v_prediction), "sdxl" (sdxl_base_v1-0,
// stable-diffusion-xl-v1-base/lora, Stability-AI/generative-models), "flux" / "flux_schnell"
// (flux1, flux-1-dev/lora or flux-1-schnell/lora), "wan21_1.3b" / "wan21_14b" (wan21,
// wan2.1-t2v-1.3b/lora or wan2.1-t2v-14b/lora). Throws lt::InputError for other families.
std::map<std::string, std::string> kohya_base_model_metadata(const std::string& family, bool v_prediction = false);

LoRAFileInfo inspect_lora(const io::SafetensorsFile& file);
std::string describe(const LoRAFileInfo& info);  // a few human-readable lines for `inspect`

}  // namespace lt::lora
