// ComfyUI's "scaled fp8" checkpoints (t5xxl_fp8_e4m3fn_scaled, *_fp8_scaled): each quantized Linear
// stores its weight as F8_E4M3 with a per-tensor scale beside it, and the true weight is
// fp8 value * scale. Two spellings exist:
//   older:  a `scaled_fp8` marker tensor, `X.scale_weight` (F32, 0-d) and optionally `X.scale_input`
//   newer:  `X.weight_scale`, optionally `X.input_scale`, and a per-layer `X.comfy_quant` (JSON bytes
//           as a U8 tensor, {"format": "float8_e4m3fn"})
// The input scales only serve fp8 matmuls and are not read. Plain fp8 files (every tensor F8, no
// scales) need nothing here: the safetensors reader decodes F8 into the compute dtype.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <set>
#include <string>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/state_dict.h"

namespace lt::models {

struct ScaledFp8Weights {
  std::map<std::string, at::Tensor> scales;  // file key of a weight -> fp32 scale, shaped to broadcast over it
  std::set<std::string> not_weights;         // file keys that are scales, input scales or markers
  bool empty() const { return scales.empty() && not_weights.empty(); }
};

// The scales and marker keys under `prefix` of `file`. A scale whose weight is absent is left out
// (the strict loader then reports it as unexpected); a comfy_quant format other than fp8, or a scale
// that is not per-tensor or per-output-row, throws lt::InputError naming the key.
ScaledFp8Weights read_scaled_fp8(const io::SafetensorsFile& file, const std::string& prefix);

// Makes `options` (whose prefix is the one given to read_scaled_fp8) skip the non-weight keys and
// load each scaled weight as weight * scale (in the target dtype). Its rename and derive stay in force
// for every other key.
void apply_scaled_fp8(LoadOptions& options, const ScaledFp8Weights& scaled);

}  // namespace lt::models
