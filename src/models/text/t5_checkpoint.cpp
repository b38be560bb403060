#include "loratrain/models/text/t5_checkpoint.h"

#include <torch/torch.h>

#include <map>

#include "loratrain/models/scaled_fp8.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models {

namespace {

constexpr const char* kFirstQuery = "encoder.block.0.layer.0.SelfAttention.q.weight";
constexpr const char* kEmbeddedTokenizer = "spiece_model";

// Keys under the root that are not encoder tensors: the embedded tokenizer, and the decoder and LM
// head of a full T5ForConditionalGeneration checkpoint.
bool is_not_encoder(const std::string& key) {
  return key == kEmbeddedTokenizer || starts_with(key, "decoder.") || starts_with(key, "lm_head.");
}

// Modules are created with this default dtype, so a large encoder is never materialised in fp32
// first (transformers builds under torch_dtype the same way). Loading runs on one thread.
class DefaultDtypeGuard {
 public:
  explicit DefaultDtypeGuard(at::ScalarType dtype) : saved_(c10::get_default_dtype()) {
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
  }
  ~DefaultDtypeGuard() { c10::set_default_dtype(saved_); }
  DefaultDtypeGuard(const DefaultDtypeGuard&) = delete;
  DefaultDtypeGuard& operator=(const DefaultDtypeGuard&) = delete;

 private:
  caffe2::TypeMeta saved_;
};

}  // namespace

std::string find_t5_encoder_root(const io::SafetensorsFile& file) {
  std::vector<std::string> roots;
  const std::string marker = kFirstQuery;
  for (const auto& t : file.tensors()) {
    if (ends_with(t.name, marker)) roots.push_back(t.name.substr(0, t.name.size() - marker.size()));
  }
  if (roots.empty()) {
    throw InputError(file.path().string() + ": no T5 encoder weights (expected " + marker + ", or it under a prefix such as " +
                     kComfyT5XXLRoot + ")");
  }
  for (const auto& r : roots) {
    if (r.empty()) return r;
  }
  if (roots.size() > 1) {
    std::string list;
    for (const auto& r : roots) list += (list.empty() ? "" : ", ") + printable(r);
    throw InputError(file.path().string() + ": several T5 encoders (under " + list +
                     "); extract the one to use into its own file");
  }
  return roots.front();
}

T5Config detect_t5_config(const io::SafetensorsFile& file, const std::string& root) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& t : file.tensors()) {
    if (starts_with(t.name, root)) shapes[t.name.substr(root.size())] = t.shape;
  }
  if (!shapes.count(kFirstQuery)) {
    throw InputError(file.path().string() + ": no T5 encoder under '" + printable(root) + "' (expected " + root +
                     kFirstQuery + ")");
  }
  try {
    return T5Config::detect_from_weights(shapes);
  } catch (const InputError& e) {
    throw InputError(file.path().string() + ": " + e.what());
  }
}

namespace {

// The encoder built in the compute dtype, with `wo` in fp32 for fp16 (see the header).
T5EncoderModel make_t5_encoder(const T5Config& c, at::ScalarType compute) {
  T5EncoderModel model{nullptr};
  {
    DefaultDtypeGuard guard(compute);
    model = T5EncoderModel(c);
  }
  if (compute == at::kHalf) {
    for (const auto& block : *model->encoder->block) {
      auto& wo = block->as<T5Block>()->feed_forward->DenseReluDense->wo->weight;
      wo.set_data(torch::empty(wo.sizes(), wo.options().dtype(at::kFloat)));
    }
  }
  return model;
}

LoadOptions encoder_load_options(const io::SafetensorsFile& file, const std::string& root) {
  LoadOptions options = t5_load_options(file, root);
  const auto tied = options.rename;
  options.rename = [tied](const std::string& key) { return is_not_encoder(key) ? std::string() : tied(key); };
  return options;
}

}  // namespace

T5EncoderModel load_t5_encoder(const io::SafetensorsFile& file, const std::string& root,
                               std::optional<at::ScalarType> dtype, std::optional<T5Config> config, bool keep_fp8) {
  const T5Config c = config ? *config : detect_t5_config(file, root);
  T5EncoderModel model = make_t5_encoder(c, dtype.value_or(at::kFloat));
  LoadOptions options = encoder_load_options(file, root);
  options.keep_fp8_linear_weights = keep_fp8;
  apply_scaled_fp8(options, read_scaled_fp8(file, root));
  load_state_dict(*model, file, options);  // each tensor converted to its parameter's dtype
  model->eval();
  return model;
}

T5EncoderModel load_t5_encoder(const std::filesystem::path& path, std::optional<at::ScalarType> dtype, bool keep_fp8) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    const fs::path config = path / "config.json";
    if (!fs::exists(config)) {
      throw InputError(path.string() + ": not a T5 encoder folder; expected config.json and model.safetensors "
                       "(or a sharded checkpoint's model.safetensors.index.json)");
    }
    // One file or the shards (FLUX.1's text_encoder_2/ holds two) with their index.
    const auto files = open_component_weights(path);
    if (files.size() == 1) return load_t5_encoder(*files[0], "", dtype, T5Config::from_file(config), keep_fp8);
    T5EncoderModel model = make_t5_encoder(T5Config::from_file(config), dtype.value_or(at::kFloat));
    // Where shared.weight is stored decides how the tied copy is read, as for one file.
    const io::SafetensorsFile* with_shared = files[0].get();
    for (const auto& f : files) {
      if (f->contains(kT5SharedEmbeddingKey)) with_shared = f.get();
    }
    LoadOptions options = encoder_load_options(*with_shared, "");
    options.keep_fp8_linear_weights = keep_fp8;
    for (const auto& f : files) {
      if (!read_scaled_fp8(*f, "").empty()) {
        throw InputError(f->path().string() + ": a sharded T5 checkpoint with scaled fp8 weights is not supported");
      }
    }
    load_state_dict_sharded(*model, files, options);
    model->eval();
    return model;
  }
  if (!fs::is_regular_file(path)) {
    throw InputError(path.string() + ": T5 encoder path does not exist (a transformers folder with config.json + "
                     "model.safetensors, or a .safetensors file such as t5xxl_fp16.safetensors)");
  }
  auto file = io::SafetensorsFile::open(path);
  return load_t5_encoder(*file, find_t5_encoder_root(*file), dtype, std::nullopt, keep_fp8);
}

std::optional<T5Tokenizer> embedded_t5_tokenizer(const io::SafetensorsFile& file, const std::string& root,
                                                 T5TokenizerOptions options) {
  const std::string key = root + kEmbeddedTokenizer;
  if (!file.contains(key)) return std::nullopt;
  const at::Tensor bytes = file.load(key, at::kByte).contiguous();
  const std::string model(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
  return T5Tokenizer::from_serialized(model, file.path().string() + " (" + key + ")", options);
}

}  // namespace lt::models
