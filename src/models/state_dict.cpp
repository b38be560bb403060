#include "loratrain/models/state_dict.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "loratrain/models/layers.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models {

std::optional<std::filesystem::path> find_companion(const std::filesystem::path& dir, const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  for (const auto& name : names) {
    if (name.back() != '*' && fs::exists(dir / name)) return dir / name;
  }
  if (!fs::is_directory(dir)) return std::nullopt;
  for (const auto& name : names) {
    if (name.back() != '*') continue;
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string file = e.path().filename().string();
      if (starts_with(file, name.substr(0, name.size() - 1)) && ends_with(file, ".safetensors")) found.push_back(e.path());
    }
    if (!found.empty()) return *std::min_element(found.begin(), found.end());
  }
  return std::nullopt;
}

std::map<std::string, at::Tensor> module_tensors(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> out;
  for (auto& p : module.named_parameters(true)) out[p.key()] = p.value();
  for (auto& b : module.named_buffers(true)) out[b.key()] = b.value();
  return out;
}

namespace {

// Module key of each Linear's weight -> the Linear (the leaves an fp8 file's codes can go to).
std::map<std::string, LinearImpl*> linear_weights(torch::nn::Module& module) {
  std::map<std::string, LinearImpl*> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (auto* linear = dynamic_cast<LinearImpl*>(item.value().get())) {
      out[item.key().empty() ? "weight" : item.key() + ".weight"] = linear;
    }
  }
  return out;
}

}  // namespace

size_t load_state_dict(torch::nn::Module& module, const io::SafetensorsFile& file, const LoadOptions& options) {
  auto targets = module_tensors(module);
  const auto linears = linear_weights(module);
  // A quantized Linear's codes and scales are not checkpoint keys (an earlier shard may have set them).
  for (const auto& [key, linear] : linears) {
    if (!linear->quantized()) continue;
    const std::string stem = key.substr(0, key.size() - std::string("weight").size());
    targets.erase(stem + "weight_int8");
    targets.erase(stem + "weight_scale");
  }
  std::set<std::string> loaded;
  std::vector<std::string> unexpected, mismatched;
  std::map<std::string, std::string> source_of;  // module key -> file key
  std::map<std::string, std::function<at::Tensor(const at::Tensor&)>> make_of;  // derived module keys
  std::map<std::string, at::Tensor> scale_of;                                   // scaled fp8 weights

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
      if (d.scale.defined()) scale_of[d.module_key] = d.scale;
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
    const auto make = make_of.find(key);
    const auto scale = scale_of.find(key);
    const io::TensorInfo& info = file.info(file_key);
    if (auto linear = linears.find(key); options.keep_fp8_linear_weights && linear != linears.end() &&
                                         (info.dtype == io::DType::F8_E4M3 || info.dtype == io::DType::F8_E5M2) &&
                                         info.shape.size() == 2) {
      // The stored bytes are the codes; a scale (per tensor or per row) goes to every row.
      at::Tensor codes = torch::from_blob(const_cast<uint8_t*>(file.data(info)), info.shape, torch::kByte).clone();
      at::Tensor row_scale = (scale != scale_of.end() ? scale->second.to(at::kFloat) : torch::ones({}, at::kFloat))
                                 .expand({info.shape[0], 1})
                                 .contiguous();
      if (make != make_of.end()) {
        codes = make->second(codes);
        row_scale = make->second(row_scale);
      }
      linear->second->set_fp8_weight(codes, row_scale,
                                     info.dtype == io::DType::F8_E5M2 ? Fp8Format::e5m2 : Fp8Format::e4m3fn);
      continue;
    }
    at::Tensor value = file.load(file_key, options.dtype.value_or(target.scalar_type()));
    if (scale != scale_of.end()) {
      // In fp32, rounded once to the target dtype (fp8 values are exact in fp16/bf16/fp32).
      value = (value.to(at::kFloat) * scale->second.to(value.device())).to(value.scalar_type());
    }
    if (make != make_of.end()) value = make->second(value).contiguous();
    if (options.dtype && target.scalar_type() != *options.dtype) {
      target.set_data(value.to(target.device()));
    } else {
      target.copy_(value);
    }
  }
  return source_of.size();
}

size_t load_state_dict_sharded(torch::nn::Module& module, const std::vector<std::shared_ptr<io::SafetensorsFile>>& files,
                               const LoadOptions& options) {
  if (files.size() == 1) return load_state_dict(module, *files[0], options);
  const auto targets = module_tensors(module);
  // The module keys each file provides, found as load_state_dict finds them.
  std::vector<std::set<std::string>> provided(files.size());
  std::set<std::string> all;
  for (size_t i = 0; i < files.size(); ++i) {
    for (const auto& info : files[i]->tensors()) {
      if (!options.prefix.empty() && info.name.rfind(options.prefix, 0) != 0) continue;
      std::string key = info.name.substr(options.prefix.size());
      if (options.rename) key = options.rename(key);
      if (key.empty()) continue;
      std::vector<DerivedTensor> derived;
      if (options.derive) derived = options.derive(key, info.shape);
      if (derived.empty()) derived.push_back(DerivedTensor{key, info.shape, nullptr});
      for (const auto& d : derived) {
        provided[i].insert(d.module_key);
        all.insert(d.module_key);
      }
    }
  }
  std::vector<std::string> missing;
  for (const auto& [key, tensor] : targets) {
    if (!all.count(key) && !options.optional_keys.count(key)) missing.push_back(key);
  }
  if (!missing.empty()) {
    std::ostringstream m;
    m << files[0]->path().parent_path().string() << ": the " << files.size() << " shards do not hold the whole model\n  "
      << missing.size() << " missing:";
    for (size_t i = 0; i < missing.size() && i < 12; ++i) m << "\n    " << missing[i];
    if (missing.size() > 12) m << "\n    ... and " << missing.size() - 12 << " more";
    throw InputError(m.str());
  }
  size_t loaded = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    LoadOptions part = options;
    for (const auto& [key, tensor] : targets) {
      if (!provided[i].count(key)) part.optional_keys.insert(key);
    }
    loaded += load_state_dict(module, *files[i], part);
  }
  return loaded;
}

std::vector<std::shared_ptr<io::SafetensorsFile>> open_component_weights(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  for (const char* stem : {"diffusion_pytorch_model", "model"}) {
    const fs::path single = folder / (std::string(stem) + ".safetensors");
    if (fs::exists(single)) return {io::SafetensorsFile::open(single)};
    const fs::path index_path = folder / (std::string(stem) + ".safetensors.index.json");
    if (!fs::exists(index_path)) continue;
    std::ifstream in(index_path);
    const auto index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw InputError(index_path.string() + ": not a sharded-checkpoint index (no weight_map object)");
    }
    std::set<std::string> names;
    for (const auto& [key, file] : index["weight_map"].items()) {
      if (!file.is_string()) throw InputError(index_path.string() + ": weight_map['" + key + "'] is not a file name");
      const std::string name = file.get<std::string>();
      if (name.find('/') != std::string::npos || name.find("..") != std::string::npos) {
        throw InputError(index_path.string() + ": shard name '" + printable(name) + "' leaves the folder");
      }
      names.insert(name);
    }
    std::vector<std::shared_ptr<io::SafetensorsFile>> files;
    for (const auto& name : names) {
      if (!fs::exists(folder / name)) {
        throw InputError((folder / name).string() + ": shard missing (named by " + index_path.filename().string() + ")");
      }
      files.push_back(io::SafetensorsFile::open(folder / name));
    }
    if (files.empty()) throw InputError(index_path.string() + ": the index names no shards");
    return files;
  }
  throw InputError(folder.string() + ": no .safetensors weights (diffusion_pytorch_model.safetensors, model.safetensors "
                   "or a sharded checkpoint's .safetensors.index.json); .bin files are not read: convert them to safetensors");
}

}  // namespace lt::models
