// Strict, name-keyed loading of checkpoint tensors into a module tree.
#pragma once
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "loratrain/io/safetensors.h"

namespace lt::models {

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
};

// Loads every parameter and buffer of `module` from `file`. Collects all missing, unexpected and
// mis-shaped names and throws one lt::InputError listing them. Returns the number loaded.
size_t load_state_dict(torch::nn::Module& module, const io::SafetensorsFile& file,
                       const LoadOptions& options = {});

// The module's parameters and buffers by name, as load_state_dict sees them.
std::map<std::string, at::Tensor> module_tensors(torch::nn::Module& module);

}  // namespace lt::models
