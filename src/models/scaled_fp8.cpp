#include "loratrain/models/scaled_fp8.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models {

namespace {

constexpr const char* kMarker = "scaled_fp8";
// Suffix -> whether the key holds the weight's scale (true) or an input scale / marker (false).
const std::pair<const char*, bool> kSiblings[] = {
    {".scale_weight", true}, {".weight_scale", true}, {".scale_input", false}, {".input_scale", false}, {".comfy_quant", false}};

// The scale shaped to broadcast over a weight of `weight_shape`: one value, or one per output row.
at::Tensor shape_scale(const at::Tensor& scale, const std::vector<int64_t>& weight_shape, const std::string& key,
                       const std::string& file) {
  if (scale.numel() == 1) return scale.reshape({});
  const bool per_row = !weight_shape.empty() && scale.numel() == weight_shape[0] &&
                       (scale.dim() == 1 || (scale.dim() == 2 && scale.size(1) == 1));
  if (!per_row) {
    std::ostringstream m;
    m << file << ": scale " << printable(key) << " has shape " << scale.sizes() << " for a weight of shape "
      << at::IntArrayRef(weight_shape) << "; only per-tensor and per-output-row fp8 scales are supported";
    throw InputError(m.str());
  }
  std::vector<int64_t> shape(weight_shape.size(), 1);
  shape[0] = weight_shape[0];
  return scale.reshape(shape);
}

void check_comfy_quant(const io::SafetensorsFile& file, const std::string& key) {
  const at::Tensor bytes = file.load(key, at::kByte).contiguous();
  const std::string text(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
  std::string format;
  try {
    format = nlohmann::json::parse(text).value("format", std::string());
  } catch (const nlohmann::json::exception&) {
    throw InputError(file.path().string() + ": " + printable(key) + " is not a JSON quantization marker");
  }
  if (format != "float8_e4m3fn" && format != "float8_e5m2") {
    throw InputError(file.path().string() + ": " + printable(key) + " declares quantization format '" +
                     printable(format) + "'; only fp8 (float8_e4m3fn, float8_e5m2) weights can be loaded");
  }
}

}  // namespace

ScaledFp8Weights read_scaled_fp8(const io::SafetensorsFile& file, const std::string& prefix) {
  ScaledFp8Weights out;
  if (file.contains(prefix + kMarker)) out.not_weights.insert(prefix + kMarker);
  for (const auto& t : file.tensors()) {
    if (!starts_with(t.name, prefix)) continue;
    for (const auto& [suffix, is_weight_scale] : kSiblings) {
      if (!ends_with(t.name, suffix)) continue;
      const std::string weight = t.name.substr(0, t.name.size() - std::string(suffix).size()) + ".weight";
      if (!file.contains(weight)) break;
      out.not_weights.insert(t.name);
      if (is_weight_scale) {
        out.scales[weight] = shape_scale(file.load(t.name, at::kFloat), file.info(weight).shape, t.name, file.path().string());
      } else if (ends_with(t.name, ".comfy_quant")) {
        check_comfy_quant(file, t.name);
      }
      break;
    }
  }
  return out;
}

void apply_scaled_fp8(LoadOptions& options, const ScaledFp8Weights& scaled) {
  if (scaled.empty()) return;
  const std::string prefix = options.prefix;
  auto rename = options.rename;
  auto module_key = [rename](const std::string& stripped) { return rename ? rename(stripped) : stripped; };
  std::map<std::string, at::Tensor> scale_of;  // module key -> scale
  for (const auto& [file_key, scale] : scaled.scales) {
    const std::string key = module_key(file_key.substr(prefix.size()));
    if (!key.empty()) scale_of[key] = scale;
  }
  std::set<std::string> skip;
  for (const auto& k : scaled.not_weights) skip.insert(k.substr(prefix.size()));
  options.rename = [skip, module_key](const std::string& key) -> std::string {
    return skip.count(key) ? std::string() : module_key(key);
  };
  auto derive = options.derive;
  options.derive = [scale_of, derive](const std::string& key, const std::vector<int64_t>& shape) {
    auto it = scale_of.find(key);
    if (it == scale_of.end()) return derive ? derive(key, shape) : std::vector<DerivedTensor>{};
    const at::Tensor scale = it->second;
    // A fused weight (Flux's qkv) is scaled whole, then split as the layout says.
    std::vector<DerivedTensor> parts = derive ? derive(key, shape) : std::vector<DerivedTensor>{};
    if (parts.empty()) parts.push_back(DerivedTensor{key, shape, nullptr});
    for (auto& part : parts) part.scale = scale;
    return parts;
  };
}

}  // namespace lt::models
