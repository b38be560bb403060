#include "loratrain/models/text/t5.h"

#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "loratrain/models/attention.h"
#include "loratrain/models/json_fields.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models {

namespace {

constexpr const char* kWhat = "T5";

void validate(const T5Config& c, const std::string& source) {
  auto fail = [&source](const std::string& m) { throw InputError(source + ": T5 config: " + m); };
  if (c.model_type != "t5" && c.model_type != "umt5") {
    fail("model_type '" + printable(c.model_type) + "' is not a T5 encoder (expected t5 or umt5)");
  }
  if (c.feed_forward_proj != "gated-gelu") {
    fail("feed_forward_proj '" + printable(c.feed_forward_proj) +
         "' is not supported (only T5 v1.1 / umT5's gated-gelu; the original T5's relu FFN is not)");
  }
  if (c.vocab_size <= 0 || c.d_model <= 0 || c.d_kv <= 0 || c.d_ff <= 0 || c.num_heads <= 0 || c.num_layers <= 0 ||
      c.relative_attention_num_buckets < 4 || c.relative_attention_max_distance <= 0) {
    fail("sizes must be positive (and relative_attention_num_buckets at least 4)");
  }
  // The log-spaced buckets start at a quarter of the buckets and must end beyond it.
  if (c.relative_attention_max_distance <= c.relative_attention_num_buckets / 4) {
    fail("relative_attention_max_distance " + std::to_string(c.relative_attention_max_distance) +
         " must exceed a quarter of relative_attention_num_buckets (" +
         std::to_string(c.relative_attention_num_buckets) + ")");
  }
  if (!(c.layer_norm_epsilon > 0)) fail("layer_norm_epsilon must be positive");
}

int64_t count_blocks(const std::map<std::string, std::vector<int64_t>>& shapes) {
  int64_t n = 0;
  while (shapes.count("encoder.block." + std::to_string(n) + ".layer.0.SelfAttention.q.weight")) ++n;
  return n;
}

}  // namespace

T5Config T5Config::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": T5 config is not a JSON object");
  T5Config c;
  c.model_type = json_get_or(j, "model_type", c.model_type, kWhat);
  c.vocab_size = json_get_or(j, "vocab_size", c.vocab_size, kWhat);
  c.d_model = json_get_or(j, "d_model", c.d_model, kWhat);
  c.d_kv = json_get_or(j, "d_kv", c.d_kv, kWhat);
  c.d_ff = json_get_or(j, "d_ff", c.d_ff, kWhat);
  c.num_heads = json_get_or(j, "num_heads", c.num_heads, kWhat);
  c.num_layers = json_get_or(j, "num_layers", c.num_layers, kWhat);
  c.relative_attention_num_buckets = json_get_or(j, "relative_attention_num_buckets", c.relative_attention_num_buckets, kWhat);
  c.relative_attention_max_distance =
      json_get_or(j, "relative_attention_max_distance", c.relative_attention_max_distance, kWhat);
  c.layer_norm_epsilon = json_get_or(j, "layer_norm_epsilon", c.layer_norm_epsilon, kWhat);
  c.feed_forward_proj = json_get_or(j, "feed_forward_proj", c.feed_forward_proj, kWhat);
  c.pad_token_id = json_get_or(j, "pad_token_id", c.pad_token_id, kWhat);
  c.eos_token_id = json_get_or(j, "eos_token_id", c.eos_token_id, kWhat);
  validate(c, source);
  return c;
}

T5Config T5Config::from_file(const std::filesystem::path& config_json) {
  return from_json(read_json_file(config_json, "T5 config"), config_json.string());
}

T5Config T5Config::detect_from_weights(const std::map<std::string, std::vector<int64_t>>& shapes) {
  auto shape = [&](const std::string& key) -> const std::vector<int64_t>& {
    auto it = shapes.find(key);
    if (it == shapes.end()) throw InputError("T5 encoder weights lack '" + key + "'");
    if (it->second.size() != 2) throw InputError("T5 encoder weight '" + key + "' is not 2-D");
    return it->second;
  };
  T5Config c;
  const bool has_shared = shapes.count(kT5SharedEmbeddingKey) != 0;
  const auto& embedding = shape(has_shared ? kT5SharedEmbeddingKey : kT5TiedEmbeddingKey);
  const auto& bias = shape("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
  const auto& q = shape("encoder.block.0.layer.0.SelfAttention.q.weight");
  const auto& wi = shape("encoder.block.0.layer.1.DenseReluDense.wi_0.weight");
  c.vocab_size = embedding[0];
  c.d_model = embedding[1];
  c.relative_attention_num_buckets = bias[0];
  c.num_heads = bias[1];
  if (c.num_heads <= 0 || q[0] % c.num_heads != 0) {
    throw InputError("T5 encoder weights: q rows " + std::to_string(q[0]) + " are not a multiple of the " +
                     std::to_string(c.num_heads) + " heads of relative_attention_bias");
  }
  c.d_kv = q[0] / c.num_heads;
  c.d_ff = wi[0];
  c.num_layers = count_blocks(shapes);
  c.model_type =
      shapes.count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight") ? "umt5" : "t5";
  validate(c, "T5 encoder weights");
  return c;
}

nlohmann::json T5Config::to_json() const {
  return nlohmann::json{{"model_type", model_type},
                        {"vocab_size", vocab_size},
                        {"d_model", d_model},
                        {"d_kv", d_kv},
                        {"d_ff", d_ff},
                        {"num_heads", num_heads},
                        {"num_layers", num_layers},
                        {"relative_attention_num_buckets", relative_attention_num_buckets},
                        {"relative_attention_max_distance", relative_attention_max_distance},
                        {"layer_norm_epsilon", layer_norm_epsilon},
                        {"feed_forward_proj", feed_forward_proj},
                        {"pad_token_id", pad_token_id},
                        {"eos_token_id", eos_token_id}};
}

T5Config T5Config::t5_v1_1_xxl() { return T5Config{}; }

T5Config T5Config::umt5_xxl() {
  T5Config c;
  c.model_type = "umt5";
  c.vocab_size = 256384;
  return c;
}

LoadOptions t5_load_options(const io::SafetensorsFile& file, const std::string& prefix) {
  LoadOptions options;
  options.prefix = prefix;
  const bool has_shared = file.contains(prefix + kT5SharedEmbeddingKey);
  options.rename = [has_shared](const std::string& key) -> std::string {
    if (key != kT5TiedEmbeddingKey) return key;
    return has_shared ? std::string() : std::string(kT5SharedEmbeddingKey);
  };
  return options;
}

at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets, int64_t max_distance) {
  // Same operations in the same order and precision (fp32 log) as the reference, so the buckets at
  // the log-spaced boundaries agree.
  const int64_t half = num_buckets / 2;
  at::Tensor buckets = (relative_position > 0).to(at::kLong) * half;
  at::Tensor distance = relative_position.abs();
  const int64_t max_exact = half / 2;
  at::Tensor is_small = distance < max_exact;
  at::Tensor large = max_exact + (at::log(distance.to(at::kFloat) / static_cast<double>(max_exact)) /
                                  std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                                  static_cast<double>(half - max_exact))
                                     .to(at::kLong);
  large = at::minimum(large, at::full_like(large, half - 1));
  return buckets + at::where(is_small, distance, large);
}

T5LayerNormImpl::T5LayerNormImpl(int64_t hidden_size, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({hidden_size}));
}

at::Tensor T5LayerNormImpl::forward(const at::Tensor& x) {
  at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor h = x * torch::rsqrt(variance + eps);  // fp32
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) h = h.to(weight.scalar_type());
  return weight * h;
}

T5AttentionImpl::T5AttentionImpl(const T5Config& c, bool has_relative_attention_bias)
    : num_heads(c.num_heads),
      d_kv(c.d_kv),
      num_buckets(c.relative_attention_num_buckets),
      max_distance(c.relative_attention_max_distance) {
  q = register_module("q", Linear(c.d_model, c.inner_dim(), /*bias=*/false));
  k = register_module("k", Linear(c.d_model, c.inner_dim(), /*bias=*/false));
  v = register_module("v", Linear(c.d_model, c.inner_dim(), /*bias=*/false));
  o = register_module("o", Linear(c.inner_dim(), c.d_model, /*bias=*/false));
  if (has_relative_attention_bias) {
    relative_attention_bias =
        register_module("relative_attention_bias", torch::nn::Embedding(c.relative_attention_num_buckets, c.num_heads));
  }
}

at::Tensor T5AttentionImpl::compute_bias(int64_t query_length, int64_t key_length, const at::Device& device) {
  TORCH_CHECK(!relative_attention_bias.is_empty(), "T5 attention: this layer has no relative_attention_bias");
  const auto ids = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor query_position = torch::arange(query_length, ids).unsqueeze(1);  // [Lq, 1]
  at::Tensor key_position = torch::arange(key_length, ids).unsqueeze(0);      // [1, Lk]
  at::Tensor buckets = t5_relative_position_bucket(key_position - query_position, num_buckets, max_distance);
  at::Tensor values = relative_attention_bias(buckets);  // [Lq, Lk, H]
  return values.permute({2, 0, 1}).unsqueeze(0);        // [1, H, Lq, Lk]
}

at::Tensor T5AttentionImpl::forward(const at::Tensor& x, const at::Tensor& bias) {
  const int64_t b = x.size(0), l = x.size(1);
  auto heads = [&](const at::Tensor& t) { return t.view({b, l, num_heads, d_kv}).transpose(1, 2); };
  at::Tensor query = heads(q(x));  // [B, H, L, d_kv]
  at::Tensor key = heads(k(x));
  at::Tensor value = heads(v(x));
  AttentionOptions options;
  options.scale = 1.0;    // no 1/sqrt(d_kv)
  options.upcast = true;  // softmax in fp32, as the reference
  options.query_chunk = default_query_chunk();
  options.cpu_speed_rule = cpu_speed_rule;
  at::Tensor out = attention(query, key, value, options, bias.to(x.device()));  // [B, H, L, d_kv]
  return o(out.transpose(1, 2).reshape({b, l, num_heads * d_kv}));
}

T5LayerSelfAttentionImpl::T5LayerSelfAttentionImpl(const T5Config& c, bool has_relative_attention_bias) {
  SelfAttention = register_module("SelfAttention", T5Attention(c, has_relative_attention_bias));
  layer_norm = register_module("layer_norm", T5LayerNorm(c.d_model, c.layer_norm_epsilon));
}

at::Tensor T5LayerSelfAttentionImpl::forward(const at::Tensor& x, const at::Tensor& bias) {
  return x + SelfAttention(layer_norm(x), bias);
}

T5DenseGatedActDenseImpl::T5DenseGatedActDenseImpl(const T5Config& c) {
  wi_0 = register_module("wi_0", Linear(c.d_model, c.d_ff, /*bias=*/false));
  wi_1 = register_module("wi_1", Linear(c.d_model, c.d_ff, /*bias=*/false));
  wo = register_module("wo", Linear(c.d_ff, c.d_model, /*bias=*/false));
}

at::Tensor T5DenseGatedActDenseImpl::forward(const at::Tensor& x) {
  // gelu_new is the tanh approximation; Linear casts its input to wo's dtype.
  at::Tensor h = torch::gelu(wi_0(x), "tanh") * wi_1(x);  // [B, L, d_ff]
  return wo(h);
}

T5LayerFFImpl::T5LayerFFImpl(const T5Config& c) {
  DenseReluDense = register_module("DenseReluDense", T5DenseGatedActDense(c));
  layer_norm = register_module("layer_norm", T5LayerNorm(c.d_model, c.layer_norm_epsilon));
}

at::Tensor T5LayerFFImpl::forward(const at::Tensor& x) { return x + DenseReluDense(layer_norm(x)); }

namespace {
// transformers T5Block: in fp16, clamp to finfo.max, or to 1000 below it when an inf has appeared.
at::Tensor clamp_fp16(const at::Tensor& h) {
  if (h.scalar_type() != at::kHalf) return h;
  const double max = 65504.0;
  at::Tensor limit = at::where(h.isinf().any(), at::scalar_tensor(max - 1000.0, h.options()),
                               at::scalar_tensor(max, h.options()));
  return at::clamp(h, -limit, limit);
}
// finfo(dtype).min of the floating types a model runs in.
double lowest(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return -65504.0;
    case at::kBFloat16: return -3.3895313892515355e38;
    case at::kDouble: return std::numeric_limits<double>::lowest();
    default: return std::numeric_limits<float>::lowest();
  }
}
}  // namespace

T5BlockImpl::T5BlockImpl(const T5Config& c, bool has_relative_attention_bias) {
  layer = register_module("layer", torch::nn::ModuleList());
  self_attention = T5LayerSelfAttention(c, has_relative_attention_bias);
  feed_forward = T5LayerFF(c);
  layer->push_back(self_attention);
  layer->push_back(feed_forward);
}

at::Tensor T5BlockImpl::forward(const at::Tensor& x, const at::Tensor& bias) {
  at::Tensor h = clamp_fp16(self_attention(x, bias));
  return clamp_fp16(feed_forward(h));
}

T5StackImpl::T5StackImpl(const T5Config& c) : config(c) {
  block = register_module("block", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_layers; ++i) block->push_back(T5Block(c, i == 0 || c.bias_in_every_layer()));
  final_layer_norm = register_module("final_layer_norm", T5LayerNorm(c.d_model, c.layer_norm_epsilon));
}

at::Tensor T5StackImpl::forward(const at::Tensor& embeddings, const std::optional<at::Tensor>& attention_mask) {
  TORCH_CHECK(embeddings.dim() == 3, "T5 encoder: embeddings must be [B, L, d_model], got ", embeddings.sizes());
  const int64_t batch = embeddings.size(0), length = embeddings.size(1);
  const at::Device device = embeddings.device();
  // Padding mask [B, L] -> additive [B, 1, 1, L]: (1 - mask) * finfo(dtype).min, added to the
  // position bias of every layer (transformers' extended attention mask).
  std::optional<at::Tensor> keep;
  if (attention_mask) {
    TORCH_CHECK(attention_mask->dim() == 2 && attention_mask->size(0) == batch && attention_mask->size(1) == length,
                "T5 encoder: attention_mask must be [", batch, ", ", length, "], got ", attention_mask->sizes());
    keep = attention_mask->to(device).to(at::kBool).view({batch, 1, 1, length});
  }
  auto with_mask = [&keep](const at::Tensor& bias) {
    if (!keep) return bias;
    return bias + torch::zeros(keep->sizes(), bias.options()).masked_fill(keep->logical_not(), lowest(bias.scalar_type()));
  };
  at::Tensor shared_bias;  // T5: block 0's table, added in every layer
  at::Tensor h = embeddings;
  for (size_t i = 0; i < block->size(); ++i) {
    auto* b = block[i]->as<T5Block>();
    auto& self_attention = *b->self_attention->SelfAttention;
    at::Tensor bias;
    if (config.bias_in_every_layer()) {
      bias = with_mask(self_attention.compute_bias(length, length, device));
    } else {
      if (!shared_bias.defined()) shared_bias = with_mask(self_attention.compute_bias(length, length, device));
      bias = shared_bias;
    }
    h = b->forward(h, bias);
  }
  return final_layer_norm(h);
}

T5EncoderModelImpl::T5EncoderModelImpl(const T5Config& c) : config(c) {
  validate(c, "T5 encoder");
  shared = register_module("shared", torch::nn::Embedding(c.vocab_size, c.d_model));
  encoder = register_module("encoder", T5Stack(c));
}

at::Tensor T5EncoderModelImpl::forward(const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask) {
  TORCH_CHECK(input_ids.dim() == 2, "T5 encoder: input_ids must be [B, L], got ", input_ids.sizes());
  at::Tensor ids = input_ids.to(shared->weight.device()).to(at::kLong);
  return encoder(shared(ids), attention_mask);  // [B, L, d_model]
}

}  // namespace lt::models
