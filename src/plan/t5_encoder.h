// Inside the planner: the working set of a T5 encoder (T5-XXL for Flux, umT5-XXL for Wan) encoding
// one batch of prompts without gradients, as src/models/text/t5.cpp runs it.
#pragma once
#include <cstdint>
#include <string>

#include "loratrain/io/safetensors.h"

namespace lt::plan {

struct T5Shape {
  int64_t width = 4096;  // d_model
  int64_t heads = 64;
  int64_t ff = 10240;    // d_ff of the gated MLP
  int64_t vocab = 32128;  // rows of the shared token embedding (umT5: 256384)
};

// Hidden states, the gated MLP's two projections, and the attention's scores, their sum with the
// position bias and the probabilities (fp32: T5's attention upcasts) beside the bias, over every
// one of `tokens` positions (pads included); the int64 position buckets the bias was computed
// from. umT5 computes a bias per layer, T5 one shared by every layer: one is alive at a time either way.
int64_t t5_encode_bytes(const T5Shape& t5, int64_t batch, int64_t tokens, int bytes);

// The widths from the encoder's block 0 under `root` (the gated MLP and the position-bias table)
// and the token embedding's rows; what the file lacks keeps its value in `out`.
void read_t5_shape(const io::SafetensorsFile& file, const std::string& root, T5Shape& out);

}  // namespace lt::plan
