// The CLIP byte-level BPE tokenizer, as transformers' (slow) CLIPTokenizer computes it without ftfy,
// which is what diffusers' SD pipelines and the trainers use:
//   split out added/special tokens -> BasicTokenizer cleanup (drop control chars, whitespace to ' ',
//   spaces around CJK ideographs, NFC, lower-case) -> the CLIP regex -> bytes_to_unicode -> BPE
//   with '</w>' word ends -> ids, BOS ... EOS, truncated/padded to 77.
// Vocabularies: a diffusers `tokenizer/` folder (vocab.json + merges.txt, optional
// tokenizer_config.json / special_tokens_map.json) or OpenAI's bpe_simple_vocab_16e6.txt.gz.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lt::models {

// Special tokens and length, as tokenizer_config.json / special_tokens_map.json state them.
// SD1.x and SDXL's first tokenizer pad with <|endoftext|>; SD2.x and SDXL's tokenizer_2 with "!".
struct CLIPTokenizerOptions {
  std::string bos_token = "<|startoftext|>";
  std::string eos_token = "<|endoftext|>";
  std::string unk_token = "<|endoftext|>";
  std::string pad_token = "<|endoftext|>";
  int64_t model_max_length = 77;
};

// One encoded text at a fixed length: ids and the attention mask (1 = token, 0 = padding).
struct CLIPEncoding {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> attention_mask;
};

class CLIPTokenizer {
 public:
  using Merge = std::pair<std::string, std::string>;

  // vocab: token string (bytes_to_unicode form) -> id; merges in rank order. Special tokens
  // missing from vocab are appended after the largest id, as transformers adds them.
  CLIPTokenizer(std::unordered_map<std::string, int64_t> vocab, const std::vector<Merge>& merges,
                CLIPTokenizerOptions options = {});

  // vocab.json + merges.txt (first line is the "#version" header; at most 48894 merges are read,
  // as transformers does).
  static CLIPTokenizer from_files(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt,
                                  CLIPTokenizerOptions options = {});
  // OpenAI's bpe_simple_vocab_16e6.txt.gz; the vocabulary is built as openai/CLIP builds it.
  static CLIPTokenizer from_openai_bpe(const std::filesystem::path& bpe_gz, CLIPTokenizerOptions options = {});

  // The BPE token strings of `text` (no BOS/EOS); added tokens appear as themselves.
  std::vector<std::string> tokenize(const std::string& text) const;
  // BOS, the ids of `text`, EOS; no truncation, no padding.
  std::vector<int64_t> encode(const std::string& text) const;
  // As SD pipelines call it: padding="max_length", truncation=True. max_length < 0 means
  // model_max_length. Truncation keeps BOS + the first max_length-2 tokens + EOS.
  CLIPEncoding encode_padded(const std::string& text, int64_t max_length = -1) const;
  std::vector<CLIPEncoding> encode_batch(const std::vector<std::string>& texts, int64_t max_length = -1) const;
  // Ids back to text ('</w>' becomes a space); special tokens are dropped when asked.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;

  // The same vocabulary and merges padding with `pad_token` (SDXL's tokenizer_2 pads with "!",
  // which is id 0 of the CLIP vocabulary).
  CLIPTokenizer with_pad_token(const std::string& pad_token) const;

  // Writes vocab.json + merges.txt (transformers' save_vocabulary layout) into `folder`, e.g. to
  // export the OpenAI vocabulary as a diffusers tokenizer/ folder.
  void save_vocabulary(const std::filesystem::path& folder) const;

  // id of a token string, or the unk id when absent.
  int64_t token_to_id(const std::string& token) const;
  const std::string& id_to_token(int64_t id) const;  // throws lt::InputError for unknown ids
  int64_t bos_token_id() const { return bos_id_; }
  int64_t eos_token_id() const { return eos_id_; }
  int64_t pad_token_id() const { return pad_id_; }
  int64_t unk_token_id() const { return unk_id_; }
  int64_t vocab_size() const { return static_cast<int64_t>(encoder_.size()); }
  int64_t model_max_length() const { return options_.model_max_length; }
  const CLIPTokenizerOptions& options() const { return options_; }

 private:
  std::vector<std::string> bpe(const std::string& byte_token) const;
  void tokenize_segment(const std::string& text, std::vector<std::string>& out) const;

  CLIPTokenizerOptions options_;
  std::unordered_map<std::string, int64_t> encoder_;
  std::unordered_map<int64_t, std::string> decoder_;
  std::vector<Merge> merges_;                              // in rank order
  std::unordered_map<std::string, int64_t> merge_ranks_;  // "first second" -> rank
  std::vector<std::string> added_tokens_;                 // split out of the text before BPE
  int64_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0, unk_id_ = 0;
  // BPE results per pre-token; shared by copies, guarded for use from loader threads.
  struct Cache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<std::string>> words;
  };
  std::shared_ptr<Cache> cache_;
};

// Reads special tokens and model_max_length from a tokenizer folder's tokenizer_config.json, then
// special_tokens_map.json (which wins, as in transformers); absent files keep the defaults.
CLIPTokenizerOptions read_clip_tokenizer_options(const std::filesystem::path& folder);

// The tokenizer at `path`: a folder with vocab.json + merges.txt (a diffusers `tokenizer/`), a
// folder holding bpe_simple_vocab_16e6.txt.gz, or that .txt.gz file itself. Throws lt::InputError
// naming what was looked for when nothing usable is there.
CLIPTokenizer load_clip_tokenizer(const std::filesystem::path& path);

// Writes a tiny project-own vocabulary (vocab.json + merges.txt) into `folder`: the 512 byte
// symbols, merges that make each of `words` (lower-cased) one token where possible, then
// <|startoftext|> and <|endoftext|>. The embedded demo trains with it.
void write_demo_vocabulary(const std::filesystem::path& folder, const std::vector<std::string>& words);

}  // namespace lt::models
