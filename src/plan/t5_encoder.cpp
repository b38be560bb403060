#include "t5_encoder.h"

namespace lt::plan {

int64_t t5_encode_bytes(const T5Shape& t5, int64_t batch, int64_t tokens, int bytes) {
  const int64_t T = tokens;
  return batch * (T * (4 * t5.width + 3 * t5.ff) * bytes + 3 * t5.heads * T * T * 4) + T * T * 8;
}

void read_t5_shape(const io::SafetensorsFile& file, const std::string& root, T5Shape& out) {
  const std::string wi = root + "encoder.block.0.layer.1.DenseReluDense.wi_0.weight";
  const std::string bias = root + "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
  if (file.contains(wi) && file.info(wi).shape.size() == 2) {
    out.ff = file.info(wi).shape[0];
    out.width = file.info(wi).shape[1];
  }
  if (file.contains(bias) && file.info(bias).shape.size() == 2) out.heads = file.info(bias).shape[1];
  for (const char* embedding : {"shared.weight", "encoder.embed_tokens.weight"}) {
    const std::string key = root + embedding;
    if (file.contains(key) && file.info(key).shape.size() == 2) {
      out.vocab = file.info(key).shape[0];
      break;
    }
  }
}

}  // namespace lt::plan
