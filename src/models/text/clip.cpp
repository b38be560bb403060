#include "loratrain/models/text/clip.h"

#include <torch/torch.h>

#include <fstream>
#include <limits>
#include <sstream>

#include "loratrain/models/attention.h"
#include "loratrain/models/checkpointing.h"
#include "loratrain/models/json_fields.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::models {

namespace {

template <typename T>
void read_key(const nlohmann::json& j, const char* key, T& out, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(source + ": CLIP text config key '" + key + "' has the wrong type (" + it->dump() + ")");
  }
}

void validate(const CLIPTextConfig& c, const std::string& source) {
  auto fail = [&source](const std::string& m) { throw InputError(source + ": CLIP text config: " + m); };
  if (c.hidden_act != "quick_gelu" && c.hidden_act != "gelu") {
    fail("hidden_act '" + c.hidden_act + "' is not supported (use quick_gelu or gelu)");
  }
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 ||
      c.num_attention_heads <= 0 || c.max_position_embeddings <= 0 || c.projection_dim <= 0) {
    fail("sizes must be positive");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    fail("hidden_size " + std::to_string(c.hidden_size) + " is not divisible by num_attention_heads " +
         std::to_string(c.num_attention_heads));
  }
}

}  // namespace

CLIPTextConfig CLIPTextConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": CLIP text config is not a JSON object");
  // CLIPConfig (the two-tower model) nests the text part; accept it too.
  const nlohmann::json& t = j.contains("text_config") && j["text_config"].is_object() ? j["text_config"] : j;
  CLIPTextConfig c;
  read_key(t, "vocab_size", c.vocab_size, source);
  read_key(t, "hidden_size", c.hidden_size, source);
  read_key(t, "intermediate_size", c.intermediate_size, source);
  read_key(t, "num_hidden_layers", c.num_hidden_layers, source);
  read_key(t, "num_attention_heads", c.num_attention_heads, source);
  read_key(t, "max_position_embeddings", c.max_position_embeddings, source);
  read_key(t, "hidden_act", c.hidden_act, source);
  read_key(t, "layer_norm_eps", c.layer_norm_eps, source);
  read_key(t, "projection_dim", c.projection_dim, source);
  read_key(t, "eos_token_id", c.eos_token_id, source);
  read_key(t, "bos_token_id", c.bos_token_id, source);
  read_key(t, "pad_token_id", c.pad_token_id, source);
  validate(c, source);
  return c;
}

CLIPTextConfig CLIPTextConfig::from_file(const std::filesystem::path& config_json) {
  return from_json(read_json_file(config_json, "CLIP text config"), config_json.string());
}

CLIPTextConfig CLIPTextConfig::detect_from_weights(const std::map<std::string, std::vector<int64_t>>& shapes,
                                                   const std::string& prefix) {
  auto shape = [&](const std::string& key) -> const std::vector<int64_t>& {
    auto it = shapes.find(prefix + key);
    if (it == shapes.end()) throw InputError("CLIP text encoder weights lack '" + prefix + key + "'");
    return it->second;
  };
  CLIPTextConfig c;
  const auto& tok = shape("text_model.embeddings.token_embedding.weight");
  const auto& pos = shape("text_model.embeddings.position_embedding.weight");
  const auto& fc1 = shape("text_model.encoder.layers.0.mlp.fc1.weight");
  if (tok.size() != 2 || pos.size() != 2 || fc1.size() != 2) throw InputError("CLIP text encoder weights are not 2-D");
  c.vocab_size = tok[0];
  c.hidden_size = tok[1];
  c.max_position_embeddings = pos[0];
  c.intermediate_size = fc1[0];
  int64_t layers = 0;
  while (shapes.count(prefix + "text_model.encoder.layers." + std::to_string(layers) + ".mlp.fc1.weight")) ++layers;
  c.num_hidden_layers = layers;
  c.num_attention_heads = c.hidden_size / 64 > 0 ? c.hidden_size / 64 : 1;
  c.hidden_act = c.hidden_size == 768 ? "quick_gelu" : "gelu";
  c.eos_token_id = 2;
  auto proj = shapes.find(prefix + "text_projection.weight");
  if (proj != shapes.end() && proj->second.size() == 2) c.projection_dim = proj->second[0];
  validate(c, "CLIP text encoder weights");
  return c;
}

nlohmann::json CLIPTextConfig::to_json() const {
  return nlohmann::json{{"vocab_size", vocab_size},
                        {"hidden_size", hidden_size},
                        {"intermediate_size", intermediate_size},
                        {"num_hidden_layers", num_hidden_layers},
                        {"num_attention_heads", num_attention_heads},
                        {"max_position_embeddings", max_position_embeddings},
                        {"hidden_act", hidden_act},
                        {"layer_norm_eps", layer_norm_eps},
                        {"projection_dim", projection_dim},
                        {"eos_token_id", eos_token_id},
                        {"bos_token_id", bos_token_id},
                        {"pad_token_id", pad_token_id}};
}

LoadOptions clip_text_load_options(const std::string& prefix) {
  static const std::string kPositionIds = "text_model.embeddings.position_ids";
  LoadOptions options;
  options.prefix = prefix;
  options.optional_keys = {kPositionIds};
  options.rename = [](const std::string& key) { return key == kPositionIds ? std::string() : key; };
  return options;
}

CLIPTextEmbeddingsImpl::CLIPTextEmbeddingsImpl(const CLIPTextConfig& c) {
  token_embedding = register_module("token_embedding", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  position_embedding =
      register_module("position_embedding", torch::nn::Embedding(c.max_position_embeddings, c.hidden_size));
  position_ids = register_buffer("position_ids", torch::arange(c.max_position_embeddings).unsqueeze(0));
}

at::Tensor CLIPTextEmbeddingsImpl::forward(const at::Tensor& input_ids) {
  const int64_t length = input_ids.size(-1);
  TORCH_CHECK(length <= position_ids.size(1), "CLIP text encoder: sequence length ", length,
              " exceeds max_position_embeddings ", position_ids.size(1));
  // Module::to(dtype) converts every buffer, so the ids are cast back (exact for lengths < 256).
  at::Tensor positions = position_ids.narrow(1, 0, length).to(at::kLong);
  return token_embedding(input_ids) + position_embedding(positions);  // [B, L, hidden]
}

CLIPAttentionImpl::CLIPAttentionImpl(const CLIPTextConfig& c)
    : num_heads(c.num_attention_heads), head_dim(c.hidden_size / c.num_attention_heads) {
  q_proj = register_module("q_proj", Linear(c.hidden_size, c.hidden_size));
  k_proj = register_module("k_proj", Linear(c.hidden_size, c.hidden_size));
  v_proj = register_module("v_proj", Linear(c.hidden_size, c.hidden_size));
  out_proj = register_module("out_proj", Linear(c.hidden_size, c.hidden_size));
}

at::Tensor CLIPAttentionImpl::forward(const at::Tensor& x, const std::optional<at::Tensor>& mask) {
  const int64_t b = x.size(0), l = x.size(1);
  auto heads = [&](const at::Tensor& t) { return t.view({b, l, num_heads, head_dim}).transpose(1, 2); };
  at::Tensor q = heads(q_proj(x));  // [B, H, L, D]
  at::Tensor k = heads(k_proj(x));
  at::Tensor v = heads(v_proj(x));
  AttentionOptions options;
  options.causal = true;
  options.query_chunk = default_query_chunk();
  options.cpu_speed_rule = cpu_speed_rule;
  at::Tensor o = attention(q, k, v, options, mask);  // [B, H, L, D]
  return out_proj(o.transpose(1, 2).reshape({b, l, num_heads * head_dim}));
}

CLIPMLPImpl::CLIPMLPImpl(const CLIPTextConfig& c) : quick_gelu(c.hidden_act == "quick_gelu") {
  fc1 = register_module("fc1", Linear(c.hidden_size, c.intermediate_size));
  fc2 = register_module("fc2", Linear(c.intermediate_size, c.hidden_size));
}

at::Tensor CLIPMLPImpl::forward(const at::Tensor& x) {
  at::Tensor h = fc1(x);
  // quick_gelu: x * sigmoid(1.702 x) (OpenAI CLIP); gelu: the exact erf form (OpenCLIP).
  h = quick_gelu ? h * torch::sigmoid(1.702 * h) : torch::gelu(h);
  return fc2(h);
}

CLIPEncoderLayerImpl::CLIPEncoderLayerImpl(const CLIPTextConfig& c) {
  auto norm = [&c] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps)); };
  self_attn = register_module("self_attn", CLIPAttention(c));
  layer_norm1 = register_module("layer_norm1", norm());
  mlp = register_module("mlp", CLIPMLP(c));
  layer_norm2 = register_module("layer_norm2", norm());
}

at::Tensor CLIPEncoderLayerImpl::forward(const at::Tensor& x, const std::optional<at::Tensor>& mask) {
  at::Tensor h = x + self_attn(layer_norm1(x), mask);  // [B, L, hidden]
  return h + mlp(layer_norm2(h));
}

CLIPEncoderImpl::CLIPEncoderImpl(const CLIPTextConfig& c) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(CLIPEncoderLayer(c));
}

CLIPTextTransformerImpl::CLIPTextTransformerImpl(const CLIPTextConfig& c) : config(c) {
  embeddings = register_module("embeddings", CLIPTextEmbeddings(c));
  encoder = register_module("encoder", CLIPEncoder(c));
  final_layer_norm = register_module(
      "final_layer_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps)));
}

CLIPTextOutput CLIPTextTransformerImpl::forward(const at::Tensor& input_ids, bool output_hidden_states,
                                                const std::optional<at::Tensor>& attention_mask) {
  TORCH_CHECK(input_ids.dim() == 2, "CLIP text encoder: input_ids must be [B, L], got ", input_ids.sizes());
  CLIPTextOutput out;
  at::Tensor h = embeddings(input_ids);  // [B, L, hidden]
  std::optional<at::Tensor> mask;
  if (attention_mask) {
    // Padding mask [B, L] -> additive [B, 1, 1, L] (transformers' _prepare_4d_attention_mask).
    at::Tensor keep = attention_mask->to(h.device()).to(at::kBool).view({h.size(0), 1, 1, h.size(1)});
    mask = torch::zeros(keep.sizes(), h.options())
               .masked_fill(keep.logical_not(), std::numeric_limits<float>::lowest());
  }
  if (output_hidden_states) out.hidden_states.push_back(h);
  const bool recompute = gradient_checkpointing && is_training();
  for (const auto& module : *encoder->layers) {
    auto* layer = module->as<CLIPEncoderLayer>();
    if (recompute) {
      h = checkpoint(
          [layer](const std::vector<at::Tensor>& in) {
            return layer->forward(in[0], in[1].defined() ? std::optional<at::Tensor>(in[1]) : std::nullopt);
          },
          {h, mask ? *mask : at::Tensor()});
    } else {
      h = layer->forward(h, mask);
    }
    if (output_hidden_states) out.hidden_states.push_back(h);
  }
  out.last_hidden_state = final_layer_norm(h);

  // transformers: eos_token_id == 2 marks configs from before the tokenizer's eos id was stored;
  // they pool at the largest id (the first <|endoftext|> of the real vocabulary).
  at::Tensor ids = input_ids.to(out.last_hidden_state.device()).to(at::kInt);
  at::Tensor eos_index = config.eos_token_id == 2 ? ids.argmax(-1)
                                                  : ids.eq(config.eos_token_id).to(at::kInt).argmax(-1);
  at::Tensor rows = torch::arange(out.last_hidden_state.size(0), eos_index.options().dtype(at::kLong));
  out.pooler_output = out.last_hidden_state.index({rows, eos_index.to(at::kLong)});  // [B, hidden]
  return out;
}

CLIPTextModelImpl::CLIPTextModelImpl(const CLIPTextConfig& c) : config(c) {
  text_model = register_module("text_model", CLIPTextTransformer(c));
}

CLIPTextOutput CLIPTextModelImpl::forward(const at::Tensor& input_ids, bool output_hidden_states,
                                          const std::optional<at::Tensor>& attention_mask) {
  return text_model(input_ids, output_hidden_states, attention_mask);
}

CLIPTextModelWithProjectionImpl::CLIPTextModelWithProjectionImpl(const CLIPTextConfig& c) : config(c) {
  text_model = register_module("text_model", CLIPTextTransformer(c));
  text_projection = register_module("text_projection", Linear(c.hidden_size, c.projection_dim, /*bias=*/false));
}

CLIPTextOutput CLIPTextModelWithProjectionImpl::forward(const at::Tensor& input_ids, bool output_hidden_states,
                                                        const std::optional<at::Tensor>& attention_mask) {
  CLIPTextOutput out = text_model(input_ids, output_hidden_states, attention_mask);
  out.text_embeds = text_projection(out.pooler_output);  // [B, projection_dim]
  return out;
}

at::Tensor clip_skip_hidden_state(CLIPTextTransformerImpl& text_model, const CLIPTextOutput& out,
                                  int64_t clip_skip, bool apply_final_layer_norm) {
  if (clip_skip < 1) throw InputError("clip_skip must be >= 1, got " + std::to_string(clip_skip));
  if (clip_skip == 1) return out.last_hidden_state;
  const auto count = static_cast<int64_t>(out.hidden_states.size());
  if (count == 0) throw InputError("clip_skip > 1 needs the encoder run with output_hidden_states");
  if (clip_skip > count - 1) {
    throw InputError("clip_skip " + std::to_string(clip_skip) + " exceeds the text encoder's " +
                     std::to_string(count - 1) + " layers");
  }
  at::Tensor h = out.hidden_states[static_cast<size_t>(count - clip_skip)];
  return apply_final_layer_norm ? text_model.final_layer_norm(h) : h;
}

}  // namespace lt::models
