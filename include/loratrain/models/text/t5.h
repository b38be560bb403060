// The T5 text encoder: transformers' T5EncoderModel (T5 v1.1, Flux's text_encoder_2) and
// UMT5EncoderModel (umT5, Wan's text encoder). Module names equal the transformers state-dict keys
// (`shared.weight`, `encoder.block.N.layer.0.SelfAttention.q.weight`, ...), so a transformers
// `model.safetensors` and ComfyUI's t5xxl/umt5 single files load by name (t5_checkpoint.h).
//
// Block (pre-norm, no biases anywhere):
//   h += o(attention(q(RMS(h)), k(RMS(h)), v(RMS(h)), bias = relative position bias [+ mask]))
//   h += wo(gelu_tanh(wi_0(RMS(h))) * wi_1(RMS(h)))
// then final_layer_norm. The attention logits are q·kᵀ without 1/sqrt(d_kv) (Mesh-TF folds the
// scale into the initialisation).
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/models/layers.h"
#include "loratrain/models/state_dict.h"

namespace lt::models {

// Fields are transformers' T5Config / UMT5Config config.json keys; defaults are T5-XXL v1.1
// (google/t5-v1_1-xxl, the encoder Flux ships).
struct T5Config {
  std::string model_type = "t5";                 // "t5" (bias table in block 0, shared) or "umt5" (one per block)
  int64_t vocab_size = 32128;                    // `shared` embedding rows (32128 T5, 256384 umT5)
  int64_t d_model = 4096;                        // model width
  int64_t d_kv = 64;                             // width of one attention head
  int64_t d_ff = 10240;                          // gated feed-forward width
  int64_t num_heads = 64;                        // attention heads (inner width = num_heads * d_kv)
  int64_t num_layers = 24;                       // encoder blocks
  int64_t relative_attention_num_buckets = 32;   // relative position buckets (half per direction)
  int64_t relative_attention_max_distance = 128; // distances beyond share the last bucket
  double layer_norm_epsilon = 1e-6;              // every T5LayerNorm's eps
  std::string feed_forward_proj = "gated-gelu";  // only the gated tanh-GELU FFN of T5 v1.1/umT5 is supported
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 1;

  // T5 v1.1 has one relative_attention_bias table, in block 0, added in every layer; umT5 has one
  // per block.
  bool bias_in_every_layer() const { return model_type == "umt5"; }
  int64_t inner_dim() const { return num_heads * d_kv; }

  // Missing keys keep the defaults above; wrong types or unsupported values throw lt::InputError.
  static T5Config from_json(const nlohmann::json& j, const std::string& source = "config.json");
  static T5Config from_file(const std::filesystem::path& config_json);
  // From tensor shapes of a T5/umT5 encoder state dict (keys after any prefix): sizes from the
  // weights, heads from the relative_attention_bias table, umt5 when block 1 has its own table.
  // max_distance and eps are not in the weights and keep the v1.1/umT5 values (128, 1e-6).
  static T5Config detect_from_weights(const std::map<std::string, std::vector<int64_t>>& shapes);
  nlohmann::json to_json() const;

  // The published configs: google/t5-v1_1-xxl (Flux) and google/umt5-xxl (Wan).
  static T5Config t5_v1_1_xxl();
  static T5Config umt5_xxl();
};

// Keys a T5 checkpoint may have or lack: the encoder's `encoder.embed_tokens.weight` is tied to
// `shared.weight` (transformers' save_pretrained stores only `shared.weight`; t5xxl_fp16 stores
// both). The module holds one embedding; the tied copy is read only when `shared.weight` is absent.
inline constexpr const char* kT5SharedEmbeddingKey = "shared.weight";
inline constexpr const char* kT5TiedEmbeddingKey = "encoder.embed_tokens.weight";

// Load options for a T5 encoder under `prefix` of `file` (the tied embedding handled as above).
LoadOptions t5_load_options(const io::SafetensorsFile& file, const std::string& prefix = "");

// Relative position -> bucket, as transformers' T5Attention._relative_position_bucket with
// bidirectional=True: half the buckets per direction (+half for keys after the query); distances
// below a quarter of the buckets exact, larger ones log-spaced up to max_distance, beyond it the
// last bucket. relative_position = key_pos - query_pos (int64, any shape) -> int64 buckets.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets,
                                       int64_t max_distance);

// Mirrors transformers T5LayerNorm: x * rsqrt(mean(x²) + eps) * weight, the mean taken in fp32,
// no mean subtraction, no bias; the result is cast to the weight's dtype when that is half/bf16.
class T5LayerNormImpl : public torch::nn::Module {
 public:
  T5LayerNormImpl(int64_t hidden_size, double eps);
  at::Tensor forward(const at::Tensor& x);  // [..., hidden] -> [..., hidden]

  double eps;
  at::Tensor weight;  // [hidden]
};
TORCH_MODULE(T5LayerNorm);

// Mirrors transformers T5Attention (encoder self-attention; UMT5Attention alike).
class T5AttentionImpl : public torch::nn::Module {
 public:
  T5AttentionImpl(const T5Config& config, bool has_relative_attention_bias);
  // Relative position bias for an [Lq, Lk] attention: [1, H, Lq, Lk] in the table's dtype.
  at::Tensor compute_bias(int64_t query_length, int64_t key_length, const at::Device& device);
  // x [B, L, d_model], bias broadcastable to [B, H, L, L] (position bias plus padding mask)
  // -> [B, L, d_model]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias);

  int64_t num_heads;
  int64_t d_kv;
  int64_t num_buckets;
  int64_t max_distance;
  Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};  // [inner, d_model] / [d_model, inner], no bias
  torch::nn::Embedding relative_attention_bias{nullptr};  // [num_buckets, num_heads]; block 0 only in T5
  // AttentionOptions::cpu_speed_rule: off where a CPU run stands for a GPU (the trainer's ComputeMode).
  bool cpu_speed_rule = true;
};
TORCH_MODULE(T5Attention);

// Mirrors transformers T5LayerSelfAttention (`layer.0`): pre-norm residual self-attention.
class T5LayerSelfAttentionImpl : public torch::nn::Module {
 public:
  T5LayerSelfAttentionImpl(const T5Config& config, bool has_relative_attention_bias);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias);  // [B, L, d_model] -> same

  T5Attention SelfAttention{nullptr};
  T5LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerSelfAttention);

// Mirrors transformers T5DenseGatedActDense: wo(gelu_new(wi_0 x) * wi_1 x). The product is cast to
// wo's dtype first, so a `wo` kept in fp32 (transformers' _keep_in_fp32_modules) runs in fp32.
class T5DenseGatedActDenseImpl : public torch::nn::Module {
 public:
  explicit T5DenseGatedActDenseImpl(const T5Config& config);
  at::Tensor forward(const at::Tensor& x);  // [B, L, d_model] -> [B, L, d_model]

  Linear wi_0{nullptr}, wi_1{nullptr};  // [d_ff, d_model], no bias
  Linear wo{nullptr};                   // [d_model, d_ff], no bias
};
TORCH_MODULE(T5DenseGatedActDense);

// Mirrors transformers T5LayerFF (`layer.1`): pre-norm residual feed-forward.
class T5LayerFFImpl : public torch::nn::Module {
 public:
  explicit T5LayerFFImpl(const T5Config& config);
  at::Tensor forward(const at::Tensor& x);  // [B, L, d_model] -> same

  T5DenseGatedActDense DenseReluDense{nullptr};
  T5LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerFF);

// Mirrors transformers T5Block (encoder): `layer` = [T5LayerSelfAttention, T5LayerFF]. In fp16 the
// hidden states are clamped after each sub-layer, as transformers does (to finfo.max, or 1000 below
// it once an inf has appeared), so an overflow does not become NaN in the next norm.
class T5BlockImpl : public torch::nn::Module {
 public:
  T5BlockImpl(const T5Config& config, bool has_relative_attention_bias);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias);  // [B, L, d_model] -> same

  torch::nn::ModuleList layer{nullptr};
  T5LayerSelfAttention self_attention{nullptr};  // layer[0]
  T5LayerFF feed_forward{nullptr};               // layer[1]
};
TORCH_MODULE(T5Block);

// Mirrors transformers T5Stack as the encoder uses it (`encoder`); embed_tokens is the model's
// `shared` embedding (tied), so the stack owns only the blocks and the final norm.
class T5StackImpl : public torch::nn::Module {
 public:
  explicit T5StackImpl(const T5Config& config);
  // embeddings [B, L, d_model], attention_mask [B, L] (1 = token, 0 = padding) -> [B, L, d_model]
  at::Tensor forward(const at::Tensor& embeddings, const std::optional<at::Tensor>& attention_mask);

  T5Config config;
  torch::nn::ModuleList block{nullptr};
  T5LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(T5Stack);

// Mirrors transformers T5EncoderModel / UMT5EncoderModel (config.model_type chooses the bias layout).
class T5EncoderModelImpl : public torch::nn::Module {
 public:
  explicit T5EncoderModelImpl(const T5Config& config);
  // input_ids [B, L] int64; attention_mask [B, L] (1 = token, 0 = padding). Flux passes no mask
  // (pads attend and are attended to); Wan passes the tokenizer's mask.
  // -> last_hidden_state [B, L, d_model]
  at::Tensor forward(const at::Tensor& input_ids, const std::optional<at::Tensor>& attention_mask = std::nullopt);

  T5Config config;
  torch::nn::Embedding shared{nullptr};  // [vocab_size, d_model]
  T5Stack encoder{nullptr};
};
TORCH_MODULE(T5EncoderModel);

}  // namespace lt::models
