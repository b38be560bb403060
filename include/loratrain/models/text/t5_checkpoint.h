// T5 / umT5 encoders as users have the files, all loaded into the transformers-named modules of t5.h:
//
//   transformers folder   text_encoder_2/config.json + model.safetensors (no prefix; shared.weight only)
//   single file           t5xxl_fp16.safetensors: the same keys, plus the tied encoder.embed_tokens.weight
//   ComfyUI all-in-one    the same keys under text_encoders.t5xxl.transformer.
//   plain fp8             t5xxl_fp8_e4m3fn: every tensor F8_E4M3 (norms and embeddings too), widened at load
//   scaled fp8            t5xxl_fp8_e4m3fn_scaled: Linear weights F8_E4M3 times their scale_weight (scaled_fp8.h)
//   ComfyUI umT5          umt5_xxl_*.safetensors: umT5 under transformers names, plus `spiece_model`
//                         (the tokenizer's bytes as a U8 tensor)
//
// Single files carry no config: the sizes come from the shapes (T5Config::detect_from_weights),
// which for T5-XXL gives google/t5-v1_1-xxl's config. Loading is strict: every missing, unexpected
// and mis-shaped tensor is listed in one lt::InputError. A full T5ForConditionalGeneration file's
// decoder.* and lm_head.* are not part of the encoder and are not read (transformers ignores them too).
#pragma once
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/models/text/t5_tokenizer.h"

namespace lt::models {

// Where ComfyUI's all-in-one checkpoints (Flux, SD3) keep T5-XXL.
inline constexpr const char* kComfyT5XXLRoot = "text_encoders.t5xxl.transformer.";

// The prefix of the T5 encoder in `file`: "" or the text before `encoder.block.0.layer.0.SelfAttention.q.weight`
// (e.g. kComfyT5XXLRoot). Throws lt::InputError when there is none, or several that are not "".
std::string find_t5_encoder_root(const io::SafetensorsFile& file);

// Config from the shapes of the encoder under `root`.
T5Config detect_t5_config(const io::SafetensorsFile& file, const std::string& root);

// Loads the encoder under `root` of `file`. `config`: the encoder's config when known (a folder's
// config.json), else detected from the shapes; either way the shapes are checked against it.
// `dtype` is the compute dtype every tensor is converted to as it is read (fp8 widened, scaled fp8
// multiplied out); nullopt keeps fp32. The model is built directly in that dtype. In fp16 the `wo`
// projections stay fp32, as transformers keeps them (_keep_in_fp32_modules), so the feed-forward
// output and the residual stream after it do not overflow fp16.
// `keep_fp8`: Linear weights stored as fp8 (e4m3fn, e5m2) stay 8-bit codes (LoadOptions::keep_fp8_linear_weights).
T5EncoderModel load_t5_encoder(const io::SafetensorsFile& file, const std::string& root,
                               std::optional<at::ScalarType> dtype = std::nullopt,
                               std::optional<T5Config> config = std::nullopt, bool keep_fp8 = false);

// `path`: a transformers folder (config.json + model.safetensors) or a single .safetensors file
// (the encoder found by find_t5_encoder_root). Throws lt::InputError naming what was looked for.
T5EncoderModel load_t5_encoder(const std::filesystem::path& path, std::optional<at::ScalarType> dtype = std::nullopt,
                               bool keep_fp8 = false);

// The tokenizer a ComfyUI umT5 file carries as `<root>spiece_model`; nullopt when it has none.
std::optional<T5Tokenizer> embedded_t5_tokenizer(const io::SafetensorsFile& file, const std::string& root,
                                                 T5TokenizerOptions options = {});

}  // namespace lt::models
