#include "loratrain/models/text/clip_tokenizer.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loratrain/models/json_fields.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"
#include "unicode.h"

namespace lt::models {

namespace {

namespace uc = unicode;

// The number of merges every CLIP tokenizer reads (49152 - 256 - 2), also from merges.txt.
constexpr size_t kMaxMerges = 49152 - 256 - 2;
constexpr const char* kEndOfWord = "</w>";
constexpr const char* kOpenAIVocabName = "bpe_simple_vocab_16e6.txt.gz";

// GPT-2/CLIP bytes_to_unicode: printable Latin-1 bytes map to themselves, the others to
// U+0100 onwards in byte order, so every byte is a visible, non-space character.
struct ByteTables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<std::string, 256> byte_to_utf8;
  std::vector<uint8_t> order;  // the bs order: printable bytes first (vocab order of openai/CLIP)
  std::unordered_map<char32_t, uint8_t> char_to_byte;
};

const ByteTables& byte_tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    std::array<bool, 256> printable{};
    for (int b = 0; b < 256; ++b) {
      printable[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      if (printable[b]) {
        t.order.push_back(static_cast<uint8_t>(b));
        t.byte_to_char[b] = static_cast<char32_t>(b);
      }
    }
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      if (!printable[b]) {
        t.order.push_back(static_cast<uint8_t>(b));
        t.byte_to_char[b] = next++;
      }
    }
    for (int b = 0; b < 256; ++b) {
      uc::append_utf8(t.byte_to_utf8[b], t.byte_to_char[b]);
      t.char_to_byte[t.byte_to_char[b]] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return tables;
}

std::string read_text_file(const std::filesystem::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string() + ": cannot open " + what);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string read_gzip_file(const std::filesystem::path& path) {
  gzFile f = gzopen(path.string().c_str(), "rb");
  if (!f) throw InputError(path.string() + ": cannot open the CLIP BPE vocabulary");
  std::string out;
  std::array<char, 1 << 16> buf{};
  for (;;) {
    const int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      throw InputError(path.string() + ": not a readable gzip file (" + msg + ")");
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  gzclose(f);
  return out;
}

bool is_py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Python's str.split() on ASCII whitespace (the merges files are ASCII-separated).
std::vector<std::string> split_ws(const std::string& line) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_py_space(line[i])) ++i;
    size_t j = i;
    while (j < line.size() && !is_py_space(line[j])) ++j;
    if (j > i) parts.emplace_back(line.substr(i, j - i));
    i = j;
  }
  return parts;
}

// lines[1 : 1 + kMaxMerges] of `text` (after stripping surrounding whitespace when `strip`).
std::vector<CLIPTokenizer::Merge> parse_merges(const std::string& text, bool strip) {
  size_t begin = 0, end = text.size();
  if (strip) {
    while (begin < end && is_py_space(text[begin])) ++begin;
    while (end > begin && is_py_space(text[end - 1])) --end;
  }
  std::vector<CLIPTokenizer::Merge> merges;
  size_t line_no = 0, pos = begin;
  while (pos <= end && merges.size() < kMaxMerges) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos || nl > end) nl = end;
    if (line_no >= 1) {
      if (line_no > kMaxMerges) break;
      auto parts = split_ws(text.substr(pos, nl - pos));
      if (parts.size() == 2) merges.emplace_back(parts[0], parts[1]);
    }
    ++line_no;
    if (nl == end) break;
    pos = nl + 1;
  }
  return merges;
}

// transformers' added-token strings from a config value: a string or {"content": ...}.
bool read_token(const nlohmann::json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (it->is_string()) {
    out = it->get<std::string>();
    return true;
  }
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    out = (*it)["content"].get<std::string>();
    return true;
  }
  return false;
}

void apply_token_config(const nlohmann::json& j, CLIPTokenizerOptions& o) {
  if (!j.is_object()) return;
  read_token(j, "bos_token", o.bos_token);
  read_token(j, "eos_token", o.eos_token);
  read_token(j, "unk_token", o.unk_token);
  read_token(j, "pad_token", o.pad_token);
}

// Splits a UTF-8 string into its code points' byte strings.
std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    len = std::min(len, s.size() - i);
    out.emplace_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// vocab.json text with tokens in the given (id) order; written directly because an ordered JSON
// object looks keys up linearly, which is quadratic for a 49408-token vocabulary.
std::string vocab_json_text(const std::vector<std::pair<std::string, int64_t>>& tokens) {
  std::string out = "{";
  for (size_t i = 0; i < tokens.size(); ++i) {
    out += i == 0 ? "\n " : ",\n ";
    out += nlohmann::json(tokens[i].first).dump() + ": " + std::to_string(tokens[i].second);
  }
  return out + "\n}\n";
}

std::string byte_encode(const std::string& utf8) {
  const auto& t = byte_tables();
  std::string out;
  for (unsigned char b : utf8) out += t.byte_to_utf8[b];
  return out;
}

// transformers BasicTokenizer(strip_accents=False, do_split_on_punc=False).tokenize, re-joined
// with single spaces (CLIPTokenizer._tokenize without ftfy).
std::u32string basic_clean(const std::string& text) {
  std::u32string cleaned;
  for (char32_t c : uc::decode_utf8(text)) {
    if (c == 0 || c == 0xFFFD) continue;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || uc::char_class(c) == uc::CharClass::kSpaceSeparator) {
      cleaned.push_back(' ');
      continue;
    }
    if (uc::char_class(c) == uc::CharClass::kOther) continue;  // controls, format, unassigned
    if (uc::is_cjk_ideograph(c)) {
      cleaned.push_back(' ');
      cleaned.push_back(c);
      cleaned.push_back(' ');
      continue;
    }
    cleaned.push_back(c);
  }
  const std::u32string normalized = uc::nfc(cleaned);
  // str.split(): what survives the cleanup as whitespace is ' ', U+2028 and U+2029.
  std::u32string joined;
  size_t i = 0;
  while (i < normalized.size()) {
    while (i < normalized.size() && uc::is_white_space(normalized[i])) ++i;
    size_t j = i;
    while (j < normalized.size() && !uc::is_white_space(normalized[j])) ++j;
    if (j > i) {
      if (!joined.empty()) joined.push_back(' ');
      joined += uc::to_lower(normalized.substr(i, j - i));
    }
    i = j;
  }
  return joined;
}

bool match_ascii_ci(const std::u32string& s, size_t i, const char* lit) {
  for (size_t k = 0; lit[k] != 0; ++k) {
    if (i + k >= s.size()) return false;
    char32_t c = s[i + k];
    if (c >= 'A' && c <= 'Z') c += 32;
    if (c == 0x17F) c = 's';  // LATIN SMALL LETTER LONG S case-folds to 's' (IGNORECASE)
    if (c == 0x212A) c = 'k';  // KELVIN SIGN
    if (c != static_cast<char32_t>(lit[k])) return false;
  }
  return true;
}

// [^\s\p{L}\p{N}] as the `regex` module matches it under IGNORECASE: a character is tested with
// its case variants, so U+0345 (which case-folds to the letter iota) is in neither this class nor
// [\p{L}], and findall skips it.
bool is_other_piece_char(char32_t c) {
  return !uc::is_white_space(c) && !uc::is_letter(c) && !uc::is_number(c) && c != 0x345;
}

// findall of the CLIP pattern
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// (IGNORECASE): alternatives tried in order at each position; unmatched characters are skipped.
std::vector<std::u32string> clip_pretokenize(const std::u32string& s) {
  static const char* const kLiterals[] = {"<|startoftext|>", "<|endoftext|>", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < s.size()) {
    bool matched = false;
    for (const char* lit : kLiterals) {
      if (match_ascii_ci(s, i, lit)) {
        const size_t n = std::char_traits<char>::length(lit);
        out.push_back(s.substr(i, n));
        i += n;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    const char32_t c = s[i];
    if (uc::is_letter(c)) {
      size_t j = i;
      while (j < s.size() && uc::is_letter(s[j])) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    } else if (uc::is_number(c)) {
      out.push_back(s.substr(i, 1));
      ++i;
    } else if (is_other_piece_char(c)) {
      size_t j = i;
      while (j < s.size() && is_other_piece_char(s[j])) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

}  // namespace

CLIPTokenizer::CLIPTokenizer(std::unordered_map<std::string, int64_t> vocab, const std::vector<Merge>& merges,
                             CLIPTokenizerOptions options)
    : options_(std::move(options)), encoder_(std::move(vocab)), merges_(merges), cache_(std::make_shared<Cache>()) {
  if (options_.model_max_length < 2) {
    throw InputError("CLIP tokenizer: model_max_length must be at least 2 (BOS + EOS), got " +
                     std::to_string(options_.model_max_length));
  }
  for (const auto& [token, id] : encoder_) decoder_[id] = token;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    merge_ranks_[merges[rank].first + " " + merges[rank].second] = static_cast<int64_t>(rank);
  }
  // Special tokens become added tokens: split out of the text before BPE (this is why a "!" pad
  // token turns every '!' of a caption into id 0 in SD2's tokenizer).
  int64_t next_id = 0;
  for (const auto& [token, id] : encoder_) next_id = std::max(next_id, id + 1);
  auto add = [&](const std::string& token) -> int64_t {
    if (token.empty()) throw InputError("CLIP tokenizer: a special token is empty");
    if (std::find(added_tokens_.begin(), added_tokens_.end(), token) == added_tokens_.end()) {
      added_tokens_.push_back(token);
    }
    auto it = encoder_.find(token);
    if (it != encoder_.end()) return it->second;
    encoder_[token] = next_id;
    decoder_[next_id] = token;
    return next_id++;
  };
  unk_id_ = add(options_.unk_token);
  bos_id_ = add(options_.bos_token);
  eos_id_ = add(options_.eos_token);
  pad_id_ = add(options_.pad_token);
  cache_->words["<|startoftext|>"] = {"<|startoftext|>"};
  cache_->words["<|endoftext|>"] = {"<|endoftext|>"};
}

CLIPTokenizer CLIPTokenizer::with_pad_token(const std::string& pad_token) const {
  CLIPTokenizerOptions options = options_;
  options.pad_token = pad_token;
  return CLIPTokenizer(encoder_, merges_, options);
}

CLIPTokenizer CLIPTokenizer::from_files(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt,
                                        CLIPTokenizerOptions options) {
  nlohmann::json j = read_json_file(vocab_json, "CLIP vocabulary");
  if (!j.is_object()) throw InputError(vocab_json.string() + ": vocab.json is not a JSON object of token -> id");
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer()) {
      throw InputError(vocab_json.string() + ": id of token '" + it.key() + "' is not an integer");
    }
    vocab[it.key()] = it.value().get<int64_t>();
  }
  auto merges = parse_merges(read_text_file(merges_txt, "BPE merges"), /*strip=*/true);
  return CLIPTokenizer(std::move(vocab), merges, std::move(options));
}

CLIPTokenizer CLIPTokenizer::from_openai_bpe(const std::filesystem::path& bpe_gz, CLIPTokenizerOptions options) {
  // openai/CLIP simple_tokenizer: the byte symbols, the same with '</w>', one token per merge,
  // then <|startoftext|> and <|endoftext|>.
  auto merges = parse_merges(read_gzip_file(bpe_gz), /*strip=*/false);
  if (merges.empty()) throw InputError(bpe_gz.string() + ": no BPE merges in the CLIP vocabulary file");
  std::unordered_map<std::string, int64_t> vocab;
  vocab.reserve(512 + merges.size() + 2);
  int64_t id = 0;
  const auto& t = byte_tables();
  for (uint8_t b : t.order) vocab.emplace(t.byte_to_utf8[b], id++);
  for (uint8_t b : t.order) vocab.emplace(t.byte_to_utf8[b] + kEndOfWord, id++);
  for (const auto& [a, b] : merges) vocab.emplace(a + b, id++);
  vocab.emplace("<|startoftext|>", id++);
  vocab.emplace("<|endoftext|>", id++);
  return CLIPTokenizer(std::move(vocab), merges, std::move(options));
}

std::vector<std::string> CLIPTokenizer::bpe(const std::string& byte_token) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->words.find(byte_token);
    if (it != cache_->words.end()) return it->second;
  }
  std::vector<std::string> word = utf8_chars(byte_token);
  word.back() += kEndOfWord;
  while (word.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max();
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merge_ranks_.find(word[i] + " " + word[i + 1]);
      if (it != merge_ranks_.end() && it->second < best) {
        best = it->second;
        best_i = i;
      }
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    const std::string first = word[best_i], second = word[best_i + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        ++i;
      }
    }
    word = std::move(merged);
  }
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (cache_->words.size() > 200000) {
    cache_->words.clear();
    cache_->words["<|startoftext|>"] = {"<|startoftext|>"};
    cache_->words["<|endoftext|>"] = {"<|endoftext|>"};
  }
  cache_->words.emplace(byte_token, word);
  return word;
}

void CLIPTokenizer::tokenize_segment(const std::string& text, std::vector<std::string>& out) const {
  for (const std::u32string& piece : clip_pretokenize(basic_clean(text))) {
    for (auto& token : bpe(byte_encode(uc::encode_utf8(piece)))) out.push_back(std::move(token));
  }
}

std::vector<std::string> CLIPTokenizer::tokenize(const std::string& text) const {
  // Added tokens are cut out first, leftmost and longest first (transformers' Trie.split).
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const std::string* found = nullptr;
    for (const auto& token : added_tokens_) {
      if (text.compare(i, token.size(), token) == 0 && (!found || token.size() > found->size())) found = &token;
    }
    if (!found) {
      ++i;
      continue;
    }
    if (i > start) tokenize_segment(text.substr(start, i - start), out);
    out.push_back(*found);
    i += found->size();
    start = i;
  }
  if (start < text.size()) tokenize_segment(text.substr(start), out);
  return out;
}

int64_t CLIPTokenizer::token_to_id(const std::string& token) const {
  auto it = encoder_.find(token);
  return it != encoder_.end() ? it->second : unk_id_;
}

const std::string& CLIPTokenizer::id_to_token(int64_t id) const {
  auto it = decoder_.find(id);
  if (it == decoder_.end()) throw InputError("CLIP tokenizer: unknown token id " + std::to_string(id));
  return it->second;
}

std::vector<int64_t> CLIPTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids{bos_id_};
  for (const auto& token : tokenize(text)) ids.push_back(token_to_id(token));
  ids.push_back(eos_id_);
  return ids;
}

CLIPEncoding CLIPTokenizer::encode_padded(const std::string& text, int64_t max_length) const {
  if (max_length < 0) max_length = options_.model_max_length;
  if (max_length < 2) throw InputError("CLIP tokenizer: max_length must be at least 2, got " + std::to_string(max_length));
  const auto length = static_cast<size_t>(max_length);
  std::vector<int64_t> ids = encode(text);
  if (ids.size() > length) {
    ids.resize(length - 1);
    ids.push_back(eos_id_);
  }
  CLIPEncoding e;
  e.attention_mask.assign(ids.size(), 1);
  e.attention_mask.resize(length, 0);
  e.input_ids = std::move(ids);
  e.input_ids.resize(length, pad_id_);
  return e;
}

std::vector<CLIPEncoding> CLIPTokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length) const {
  std::vector<CLIPEncoding> out;
  out.reserve(texts.size());
  for (const auto& t : texts) out.push_back(encode_padded(t, max_length));
  return out;
}

std::string CLIPTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const auto& t = byte_tables();
  auto flush = [&t](std::string& symbols) {
    // Symbols -> bytes -> text; '</w>' marks word ends.
    std::string bytes;
    for (char32_t c : uc::decode_utf8(symbols)) {
      auto it = t.char_to_byte.find(c);
      if (it != t.char_to_byte.end()) bytes.push_back(static_cast<char>(it->second));
    }
    symbols.clear();
    std::string text = uc::encode_utf8(uc::decode_utf8(bytes));  // invalid bytes -> U+FFFD
    std::string spaced;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 4, kEndOfWord) == 0) {
        spaced.push_back(' ');
        i += 4;
      } else {
        spaced.push_back(text[i++]);
      }
    }
    size_t b = spaced.find_first_not_of(' '), e = spaced.find_last_not_of(' ');
    return b == std::string::npos ? std::string() : spaced.substr(b, e - b + 1);
  };
  std::vector<std::string> parts;
  std::string symbols;
  for (int64_t id : ids) {
    const std::string& token = id_to_token(id);
    const bool special = std::find(added_tokens_.begin(), added_tokens_.end(), token) != added_tokens_.end();
    if (special) {
      if (skip_special_tokens) continue;
      if (!symbols.empty()) parts.push_back(flush(symbols));
      parts.push_back(token);
      continue;
    }
    symbols += token;
  }
  if (!symbols.empty()) parts.push_back(flush(symbols));
  std::string out;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out.push_back(' ');
    out += p;
  }
  return out;
}

void CLIPTokenizer::save_vocabulary(const std::filesystem::path& folder) const {
  std::filesystem::create_directories(folder);
  std::vector<std::pair<int64_t, std::string>> by_id;
  by_id.reserve(encoder_.size());
  for (const auto& [token, id] : encoder_) by_id.emplace_back(id, token);
  std::sort(by_id.begin(), by_id.end());
  std::vector<std::pair<std::string, int64_t>> tokens;
  tokens.reserve(by_id.size());
  for (const auto& [id, token] : by_id) tokens.emplace_back(token, id);
  std::string merges_text = "#version: 0.2\n";
  for (const auto& [a, b] : merges_) merges_text += a + " " + b + "\n";
  write_file_atomic(folder / "vocab.json", vocab_json_text(tokens));
  write_file_atomic(folder / "merges.txt", merges_text);
}

CLIPTokenizerOptions read_clip_tokenizer_options(const std::filesystem::path& folder) {
  CLIPTokenizerOptions o;
  const auto config = folder / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    nlohmann::json j = read_json_file(config, "tokenizer config");
    apply_token_config(j, o);
    auto it = j.find("model_max_length");
    // transformers writes a huge sentinel (1e30) when no length is known; keep CLIP's 77 then.
    if (it != j.end() && it->is_number() && it->get<double>() >= 2 && it->get<double>() < 1e9) {
      o.model_max_length = static_cast<int64_t>(it->get<double>());
    }
  }
  const auto special = folder / "special_tokens_map.json";
  if (std::filesystem::exists(special)) apply_token_config(read_json_file(special, "special tokens map"), o);
  return o;
}

CLIPTokenizer load_clip_tokenizer(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (path.empty()) {
    throw InputError("no CLIP tokenizer vocabulary given: a single-file checkpoint carries none; set "
                     "model.tokenizer_path to a diffusers tokenizer/ folder (vocab.json + merges.txt) or to " +
                     std::string(kOpenAIVocabName));
  }
  if (fs::is_regular_file(path)) {
    const std::string name = path.filename().string();
    if (name.size() >= 3 && name.compare(name.size() - 3, 3, ".gz") == 0) return CLIPTokenizer::from_openai_bpe(path);
    throw InputError(path.string() + ": not a CLIP tokenizer; expected a folder with vocab.json + merges.txt, or " +
                     std::string(kOpenAIVocabName));
  }
  if (fs::is_directory(path)) {
    CLIPTokenizerOptions options = read_clip_tokenizer_options(path);
    if (fs::exists(path / "vocab.json") && fs::exists(path / "merges.txt")) {
      return CLIPTokenizer::from_files(path / "vocab.json", path / "merges.txt", options);
    }
    if (fs::exists(path / kOpenAIVocabName)) return CLIPTokenizer::from_openai_bpe(path / kOpenAIVocabName, options);
    if (fs::exists(path / "tokenizer" / "vocab.json")) return load_clip_tokenizer(path / "tokenizer");
    throw InputError(path.string() + ": no CLIP tokenizer here; expected vocab.json + merges.txt (a diffusers "
                     "tokenizer/ folder) or " + std::string(kOpenAIVocabName));
  }
  throw InputError(path.string() + ": CLIP tokenizer path does not exist (model.tokenizer_path: a diffusers "
                   "tokenizer/ folder or " + std::string(kOpenAIVocabName) + ")");
}

void write_demo_vocabulary(const std::filesystem::path& folder, const std::vector<std::string>& words) {
  std::filesystem::create_directories(folder);
  const auto& t = byte_tables();
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::unordered_map<std::string, int64_t> known;
  auto add = [&vocab, &known](const std::string& token) {
    if (known.emplace(token, static_cast<int64_t>(vocab.size())).second) vocab.emplace_back(token, vocab.size());
  };
  for (uint8_t b : t.order) add(t.byte_to_utf8[b]);
  for (uint8_t b : t.order) add(t.byte_to_utf8[b] + kEndOfWord);

  // Each word's merges are learnt against the merges so far: its chain joins the symbols that the
  // earlier merges leave, left to right, so the new (higher-ranked) merges never change how an
  // earlier word splits, and every word whose pre-tokenisation is a single piece becomes one token.
  std::vector<CLIPTokenizer::Merge> merges;
  for (const auto& word : words) {
    CLIPTokenizer current(std::unordered_map<std::string, int64_t>(), merges);
    for (const std::u32string& piece : clip_pretokenize(basic_clean(word))) {
      std::vector<std::string> symbols = current.tokenize(uc::encode_utf8(piece));
      while (symbols.size() > 1) {
        CLIPTokenizer::Merge m{symbols[0], symbols[1]};
        if (std::find(merges.begin(), merges.end(), m) != merges.end()) break;
        merges.push_back(m);
        const std::string joined = m.first + m.second;
        add(joined);
        symbols.erase(symbols.begin());
        symbols[0] = joined;
      }
      current = CLIPTokenizer(std::unordered_map<std::string, int64_t>(), merges);
    }
  }
  add("<|startoftext|>");
  add("<|endoftext|>");

  std::string merges_text = "#version: 0.2\n";
  for (const auto& [a, b] : merges) merges_text += a + " " + b + "\n";
  write_file_atomic(folder / "vocab.json", vocab_json_text(vocab));
  write_file_atomic(folder / "merges.txt", merges_text);
}

}  // namespace lt::models
