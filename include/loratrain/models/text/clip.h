// The CLIP text encoder: transformers' CLIPTextModel (SD1.x/SD2.x text_encoder, SDXL text_encoder)
// and CLIPTextModelWithProjection (SDXL text_encoder_2). Module names equal the transformers
// state-dict keys, so a diffusers `text_encoder/model.safetensors` loads by name.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/models/layers.h"
#include "loratrain/models/state_dict.h"

namespace lt::models {

// Fields are transformers' CLIPTextConfig config.json keys; defaults are transformers' defaults.
struct CLIPTextConfig {
  int64_t vocab_size = 49408;              // token embedding rows
  int64_t hidden_size = 512;               // model width (768 SD1, 1024 SD2, 1280 SDXL text_encoder_2)
  int64_t intermediate_size = 2048;        // MLP width
  int64_t num_hidden_layers = 12;          // encoder layers
  int64_t num_attention_heads = 8;         // heads per self-attention
  int64_t max_position_embeddings = 77;    // position embedding rows (the context length)
  std::string hidden_act = "quick_gelu";   // "quick_gelu" (OpenAI CLIP) or "gelu" (OpenCLIP)
  double layer_norm_eps = 1e-5;            // every LayerNorm's eps
  int64_t projection_dim = 512;            // text_projection width (WithProjection only)
  int64_t eos_token_id = 49407;            // 2 = legacy configs: pool at argmax(input_ids)
  int64_t bos_token_id = 49406;
  int64_t pad_token_id = 1;

  // Missing keys keep the defaults above; wrong types or unsupported values throw lt::InputError.
  static CLIPTextConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  static CLIPTextConfig from_file(const std::filesystem::path& config_json);
  // From tensor shapes of a checkpoint (keys after `prefix`, e.g. "text_model...."): sizes come
  // from the weights; hidden_act and heads follow the known CLIP widths (768 -> OpenAI ViT-L,
  // quick_gelu; otherwise OpenCLIP, gelu; head width 64). eos_token_id is the legacy 2, as in
  // the SD/SDXL text encoder configs.
  static CLIPTextConfig detect_from_weights(const std::map<std::string, std::vector<int64_t>>& shapes,
                                            const std::string& prefix = "");
  nlohmann::json to_json() const;
};

// Keys a checkpoint may have or lack: `text_model.embeddings.position_ids` (a persistent buffer in
// older transformers). The file's copy is ignored (transformers no longer loads it, and some merged
// checkpoints carry corrupted float copies); the buffer is always arange(max_position_embeddings).
LoadOptions clip_text_load_options(const std::string& prefix = "");

// Outputs of one forward pass; hidden_states only when asked for.
struct CLIPTextOutput {
  at::Tensor last_hidden_state;            // [B, L, hidden], after final_layer_norm
  at::Tensor pooler_output;                // [B, hidden], last_hidden_state at the EOS token
  std::vector<at::Tensor> hidden_states;   // num_hidden_layers + 1: embeddings, then each layer
  at::Tensor text_embeds;                  // [B, projection_dim], WithProjection only
};

// Mirrors transformers CLIPTextEmbeddings.
class CLIPTextEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit CLIPTextEmbeddingsImpl(const CLIPTextConfig& config);
  // input_ids [B, L] (L <= max_position_embeddings) -> [B, L, hidden]
  at::Tensor forward(const at::Tensor& input_ids);

  torch::nn::Embedding token_embedding{nullptr};
  torch::nn::Embedding position_embedding{nullptr};
  at::Tensor position_ids;  // [1, max_position_embeddings] int64 buffer
};
TORCH_MODULE(CLIPTextEmbeddings);

// Mirrors transformers CLIPAttention (eager): causal multi-head self-attention.
class CLIPAttentionImpl : public torch::nn::Module {
 public:
  explicit CLIPAttentionImpl(const CLIPTextConfig& config);
  // x [B, L, hidden], additive mask broadcastable to [B, H, L, L] -> [B, L, hidden]
  at::Tensor forward(const at::Tensor& x, const std::optional<at::Tensor>& mask = std::nullopt);

  int64_t num_heads;
  int64_t head_dim;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  // AttentionOptions::cpu_speed_rule: off where a CPU run stands for a GPU (the trainer's ComputeMode).
  bool cpu_speed_rule = true;
};
TORCH_MODULE(CLIPAttention);

// Mirrors transformers CLIPMLP.
class CLIPMLPImpl : public torch::nn::Module {
 public:
  explicit CLIPMLPImpl(const CLIPTextConfig& config);
  at::Tensor forward(const at::Tensor& x);  // [B, L, hidden] -> [B, L, hidden]

  bool quick_gelu;
  Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(CLIPMLP);

// Mirrors transformers CLIPEncoderLayer (pre-norm residual block).
class CLIPEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit CLIPEncoderLayerImpl(const CLIPTextConfig& config);
  at::Tensor forward(const at::Tensor& x, const std::optional<at::Tensor>& mask = std::nullopt);

  CLIPAttention self_attn{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr};
  CLIPMLP mlp{nullptr};
  torch::nn::LayerNorm layer_norm2{nullptr};
};
TORCH_MODULE(CLIPEncoderLayer);

// Mirrors transformers CLIPEncoder: holds `layers`.
class CLIPEncoderImpl : public torch::nn::Module {
 public:
  explicit CLIPEncoderImpl(const CLIPTextConfig& config);
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(CLIPEncoder);

// Mirrors transformers CLIPTextTransformer (`text_model`).
class CLIPTextTransformerImpl : public torch::nn::Module {
 public:
  explicit CLIPTextTransformerImpl(const CLIPTextConfig& config);
  // input_ids [B, L] int64; attention_mask [B, L] (1 = keep, 0 = padding; SD pipelines pass none).
  CLIPTextOutput forward(const at::Tensor& input_ids, bool output_hidden_states = false,
                         const std::optional<at::Tensor>& attention_mask = std::nullopt);

  CLIPTextConfig config;
  // Recompute each encoder layer in backward (transformers: only while training).
  bool gradient_checkpointing = false;
  CLIPTextEmbeddings embeddings{nullptr};
  CLIPEncoder encoder{nullptr};
  torch::nn::LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(CLIPTextTransformer);

// Mirrors transformers CLIPTextModel.
class CLIPTextModelImpl : public torch::nn::Module {
 public:
  explicit CLIPTextModelImpl(const CLIPTextConfig& config);
  CLIPTextOutput forward(const at::Tensor& input_ids, bool output_hidden_states = false,
                         const std::optional<at::Tensor>& attention_mask = std::nullopt);

  CLIPTextConfig config;
  CLIPTextTransformer text_model{nullptr};
};
TORCH_MODULE(CLIPTextModel);

// Mirrors transformers CLIPTextModelWithProjection: text_embeds = text_projection(pooler_output).
class CLIPTextModelWithProjectionImpl : public torch::nn::Module {
 public:
  explicit CLIPTextModelWithProjectionImpl(const CLIPTextConfig& config);
  CLIPTextOutput forward(const at::Tensor& input_ids, bool output_hidden_states = false,
                         const std::optional<at::Tensor>& attention_mask = std::nullopt);

  CLIPTextConfig config;
  CLIPTextTransformer text_model{nullptr};
  Linear text_projection{nullptr};  // [projection_dim, hidden], no bias
};
TORCH_MODULE(CLIPTextModelWithProjection);

// The conditioning an SD pipeline takes from the encoder for a "clip skip" value (1 = last layer).
// clip_skip = k > 1 takes hidden_states[-k] (needs output_hidden_states); final_layer_norm is then
// applied when `apply_final_layer_norm` (diffusers' SD1.x/SD2.x pipelines and kohya do; SDXL uses
// the penultimate state as is). clip_skip = 1 returns last_hidden_state.
at::Tensor clip_skip_hidden_state(CLIPTextTransformerImpl& text_model, const CLIPTextOutput& out,
                                  int64_t clip_skip, bool apply_final_layer_norm);

}  // namespace lt::models
