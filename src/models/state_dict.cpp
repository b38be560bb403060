#include "loratrain/models/state_dict.h"

#include <torch/torch.h>

#include <sstream>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

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
  std::map<std::string, std::function<at::Tensor(const at::Tensor&)>> make_of;  // derived module keys

  for (const auto& info : file.tensors()) {
    if (!options.prefix.empty() && info.name.rfind(options.prefix, 0) != 0) continue;
    std::string key = info.name.substr(options.prefix.size());
    if (options.rename) {
      key = options.rename(key);
      if (key.empty()) continue;
    }
    std::vector<DerivedTensor> derived;
    if (options.derive) derived = options.derive(key, info.shape);
    if (derived.empty()) derived.push_back(DerivedTensor{key, info.shape, nullptr});
    for (auto& d : derived) {
      auto it = targets.find(d.module_key);
      if (it == targets.end()) {
        unexpected.push_back(derived.size() == 1 ? printable(info.name) : printable(info.name) + " (as " + printable(d.module_key) + ")");
        continue;
      }
      if (at::IntArrayRef(d.shape) != it->second.sizes()) {
        std::ostringstream m;
        m << printable(d.module_key) << ": file has " << at::IntArrayRef(d.shape)
          << (d.make ? " (derived from " + printable(info.name) + ")" : std::string()) << ", model expects " << it->second.sizes();
        mismatched.push_back(m.str());
        continue;
      }
      source_of[d.module_key] = info.name;
      if (d.make) make_of[d.module_key] = std::move(d.make);
    }
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
    if (auto it = make_of.find(key); it != make_of.end()) value = it->second(value).contiguous();
    if (options.dtype && target.scalar_type() != *options.dtype) {
      target.set_data(value.to(target.device()));
    } else {
      target.copy_(value);
    }
  }
  return source_of.size();
}

}  // namespace lt::models
