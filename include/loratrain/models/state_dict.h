// Strict, name-keyed loading of checkpoint tensors into a module tree.
#pragma once
#include <torch/nn/module.h>

#include <functional>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "loratrain/io/safetensors.h"

namespace lt::models {

// A module tensor that a file stores inside, or in another layout than, one file tensor (OpenCLIP's
// fused q/k/v projection, its transposed text_projection).
struct DerivedTensor {
  std::string module_key;
  std::vector<int64_t> shape;                          // the derived tensor's shape, checked before loading
  std::function<at::Tensor(const at::Tensor&)> make;   // file tensor -> module tensor
  // ComfyUI's scaled fp8: the stored tensor times this fp32 scale (0-d or [out, 1]), applied to the
  // whole file tensor before `make`. Undefined: none.
  at::Tensor scale{};
};

struct LoadOptions {
  // Prefix stripped from file keys before matching (e.g. "model.diffusion_model." after mapping);
  // keys without it are not part of this module and are ignored.
  std::string prefix;
  // Module keys that may be absent from the file (declared next to the model's config).
  std::set<std::string> optional_keys;
  // Convert each loaded tensor to this dtype (default: the module parameter's dtype).
  std::optional<at::ScalarType> dtype;
  // Rename a file key (after the prefix is stripped) to a module key; empty result = skip it.
  std::function<std::string(const std::string&)> rename;
  // For a key (after rename) that is not stored as is: the module tensors derived from it, given
  // the file tensor's shape; an empty result means the key maps one to one.
  std::function<std::vector<DerivedTensor>(const std::string& key, const std::vector<int64_t>& shape)> derive;
  // A Linear weight stored as float8 (e4m3fn or e5m2) stays in 8 bits: its byte codes (through `make`, e.g.
  // the rows of a fused qkv) and scale become the Linear's fp8 weight (LinearImpl::set_fp8_weight),
  // never widened. For frozen bases that train with model.quantize (qfloat8).
  bool keep_fp8_linear_weights = false;
};

// Loads every parameter and buffer of `module` from `file`. Collects all missing, unexpected and
// mis-shaped names and throws one lt::InputError listing them. Returns the number loaded.
size_t load_state_dict(torch::nn::Module& module, const io::SafetensorsFile& file,
                       const LoadOptions& options = {});

// A module stored across several files (a diffusers or transformers sharded checkpoint). Each
// file loads as above with the keys the other files hold allowed to be absent; a key no file holds
// is reported as missing in one lt::InputError. Returns the number loaded.
size_t load_state_dict_sharded(torch::nn::Module& module, const std::vector<std::shared_ptr<io::SafetensorsFile>>& files,
                               const LoadOptions& options = {});

// The weight files of a component folder: `<stem>.safetensors`, or the shards its
// `<stem>.safetensors.index.json` names (stem: diffusion_pytorch_model or model). Every shard is
// opened (a missing or truncated one is an lt::InputError naming it).
std::vector<std::shared_ptr<io::SafetensorsFile>> open_component_weights(const std::filesystem::path& folder);

// The first file in `dir` named like one of `names` (tried in order; a name ending in '*' matches
// any .safetensors file starting with the rest, the first in sorted order): where a bare
// transformer's companions (text encoders, VAE) sit in a ComfyUI models folder. nullopt when none.
std::optional<std::filesystem::path> find_companion(const std::filesystem::path& dir, const std::vector<std::string>& names);

// The module's parameters and buffers by name, as load_state_dict sees them.
std::map<std::string, at::Tensor> module_tensors(torch::nn::Module& module);

}  // namespace lt::models
