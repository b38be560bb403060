// The T5 / umT5 tokenizer: a SentencePiece model (`spiece.model`; diffusers' Flux folders keep it in
// tokenizer_2/, Wan's in tokenizer/) run by the SentencePiece library (loaded as the lt_sentencepiece
// module, see src/models/text/sentencepiece_module.h), with the conventions of
// transformers' T5Tokenizer / T5TokenizerFast as diffusers' Flux and Wan pipelines call them
// (padding="max_length", truncation=True, add_special_tokens=True):
//   - special tokens written in the text (</s>, <pad>, <unk>, <extra_id_N>) are split out first and
//     become their ids; the text between them is encoded by SentencePiece;
//   - no BOS; EOS (</s>, id 1) is appended; truncation keeps the first max_length-1 ids + EOS;
//   - padded with <pad> (id 0) to max_length; attention_mask 1 for the ids and EOS, 0 for padding.
// Flux dev and Wan use max_length 512, Flux schnell 256.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace lt::models {

class SentencePieceModel;  // a loaded .model (t5_tokenizer.cpp)

struct T5TokenizerOptions {
  int64_t model_max_length = 512;  // tokenizer_config.json `model_max_length`; the default max_length
  int64_t extra_ids = 100;         // sentinel tokens <extra_id_0..N-1>, ids counting down from pieces+N-1
};

// One encoded text at a fixed length.
struct T5Encoding {
  std::vector<int64_t> input_ids;       // max_length ids: text, EOS, pads
  std::vector<int64_t> attention_mask;  // 1 = id (EOS included), 0 = padding
  int64_t num_tokens_untruncated = 0;   // ids + EOS before truncation (to warn that text was cut)
};

class T5Tokenizer {
 public:
  // A spiece.model file; throws lt::InputError naming the file when SentencePiece cannot read it or
  // it lacks the T5 special pieces.
  static T5Tokenizer from_file(const std::filesystem::path& spiece_model, T5TokenizerOptions options = {});
  // The bytes of a spiece.model (ComfyUI umT5 files carry them as the `spiece_model` tensor);
  // `source` names them in errors.
  static T5Tokenizer from_serialized(const std::string& model_bytes, const std::string& source,
                                     T5TokenizerOptions options = {});

  // The ids of `text` followed by EOS; no truncation, no padding.
  std::vector<int64_t> encode(const std::string& text) const;
  // max_length < 0 means options().model_max_length; it must be at least 1 (room for EOS).
  T5Encoding encode_padded(const std::string& text, int64_t max_length = -1) const;
  std::vector<T5Encoding> encode_batch(const std::vector<std::string>& texts, int64_t max_length = -1) const;

  int64_t pad_token_id() const { return pad_id_; }
  int64_t eos_token_id() const { return eos_id_; }
  int64_t unk_token_id() const { return unk_id_; }
  // SentencePiece pieces plus the extra ids (32100 for T5 v1.1; the embedding has 32128 rows).
  int64_t vocab_size() const;
  const T5TokenizerOptions& options() const { return options_; }

 private:
  T5Tokenizer(std::shared_ptr<const SentencePieceModel> model, const std::string& source, T5TokenizerOptions options);

  std::shared_ptr<const SentencePieceModel> model_;
  T5TokenizerOptions options_;
  // Special tokens matched in the text, longest first, with their ids.
  std::vector<std::pair<std::string, int64_t>> special_tokens_;
  int64_t pad_id_ = 0, eos_id_ = 1, unk_id_ = 2;
};

// Reads model_max_length and extra_ids from a tokenizer folder's tokenizer_config.json (absent file
// or keys keep the defaults).
T5TokenizerOptions read_t5_tokenizer_options(const std::filesystem::path& folder);

// The tokenizer at `path`: a spiece.model file, or a folder holding one (a diffusers tokenizer_2/ or
// transformers tokenizer folder, whose tokenizer_config.json is read too). Throws lt::InputError
// naming what was looked for when there is none.
T5Tokenizer load_t5_tokenizer(const std::filesystem::path& path);

}  // namespace lt::models
