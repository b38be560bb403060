#include "loratrain/models/state_dict.h"

#include <torch/torch.h>

#include <sstream>

#include "loratrain/util/error.h"

namespace lt::models {

std::map<std::string, at::Tensor> module_tensors(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (auto& p : module.named_parameters(true)) out[p.key()] = p.value();
  for (auto& b : module.named_buffers(true)) out[b.key()] = b.value();
  return out;
}

size_t load_state_dict(torch::nn::Module& module, const io::SafetensorsFile& file, const LoadOptions& options) {
  auto targets = module_tensors(module);
  std::set<std::string> loaded;
  std::vector<std::string> unexpected, mismatched;
  std::map<std::string, std::string> source_of;  // module key -> file key

  for (const auto& info : file.tensors()) {
    if (!options.prefix.empty() && info.name.rfind(options.prefix, 0) != 0) continue;
    std::string key = info.name.substr(options.prefix.size());
    if (options.rename) {
      key = options.rename(key);
      if (key.empty()) continue;
    }
    auto it = targets.find(key);
    if (it == targets.end()) {
      unexpected.push_back(info.name);
      continue;
    }
    if (at::IntArrayRef(info.shape) != it->second.sizes()) {
      std::ostringstream m;
      m << key << ": file has " << at::IntArrayRef(info.shape) << ", model expects " << it->second.sizes();
      mismatched.push_back(m.str());
      continue;
    }
    source_of[key] = info.name;
  }
  std::vector<std::string> missing;
  for (const auto& [key, tensor] : targets) {
    if (!source_of.count(key) && !options.optional_keys.count(key)) missing.push_back(key);
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::ostringstream m;
    m << file.path().string() << ": checkpoint does not match the model";
    auto list = [&m](const char* what, const std::vector<std::string>& names) {
      if (names.empty()) return;
      m << "\n  " << names.size() << " " << what << ":";
      size_t shown = 0;
      for (const auto& n : names) {
        if (++shown > 12) {
          m << "\n    ... and " << names.size() - 12 << " more";
          break;
        }
        m << "\n    " << n;
      }
    };
    list("missing", missing);
    list("unexpected", unexpected);
    list("mis-shaped", mismatched);
    throw InputError(m.str());
  }
  torch::NoGradGuard no_grad;
  for (const auto& [key, file_key] : source_of) {
    at::Tensor& target = targets[key];
    at::Tensor value = file.load(file_key, options.dtype.value_or(target.scalar_type()));
    if (options.dtype && target.scalar_type() != *options.dtype) {
      target.set_data(value.to(target.device()));
    } else {
      target.copy_(value);
    }
  }
  return source_of.size();
}

}  // namespace lt::models
