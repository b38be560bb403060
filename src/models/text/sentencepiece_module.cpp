// lt_sentencepiece: the SentencePiece library behind the C interface of sentencepiece_module.h
// (loaded with dlopen by t5_tokenizer.cpp; see that header for why).
#include "sentencepiece_module.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <string>
#include <vector>

namespace {
void set_error(char* error, size_t error_size, const std::string& message) {
  if (error_size == 0) return;
  std::strncpy(error, message.c_str(), error_size - 1);
  error[error_size - 1] = '\0';
}
const sentencepiece::SentencePieceProcessor& get(const lt_spm* p) {
  return *reinterpret_cast<const sentencepiece::SentencePieceProcessor*>(p);
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) lt_spm* lt_spm_load(const char* bytes, size_t size, char* error, size_t error_size) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto status = sp->LoadFromSerializedProto(std::string(bytes, size));
  if (!status.ok()) {
    set_error(error, error_size, status.ToString());
    delete sp;
    return nullptr;
  }
  return reinterpret_cast<lt_spm*>(sp);
}

__attribute__((visibility("default"))) void lt_spm_free(lt_spm* p) {
  delete reinterpret_cast<sentencepiece::SentencePieceProcessor*>(p);
}

__attribute__((visibility("default"))) int lt_spm_piece_size(const lt_spm* p) { return get(p).GetPieceSize(); }

__attribute__((visibility("default"))) int lt_spm_piece_to_id(const lt_spm* p, const char* piece) {
  return get(p).PieceToId(piece);
}

__attribute__((visibility("default"))) int lt_spm_unk_id(const lt_spm* p) { return get(p).unk_id(); }

__attribute__((visibility("default"))) int lt_spm_encode(const lt_spm* p, const char* text, size_t size,
                                                          void (*emit)(void*, int), void* context, char* error,
                                                          size_t error_size) {
  std::vector<int> ids;
  const auto status = get(p).Encode(std::string_view(text, size), &ids);
  if (!status.ok()) {
    set_error(error, error_size, status.ToString());
    return -1;
  }
  for (int id : ids) emit(context, id);
  return 0;
}

}  // extern "C"
