#include "loratrain/models/text/t5_tokenizer.h"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loratrain/models/json_fields.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"
#include "sentencepiece_module.h"

namespace lt::models {

namespace {

// The lt_sentencepiece module's functions, loaded once: from where the build put it, else from
// beside the running executable.
struct ModuleApi {
  lt_spm_load_fn load = nullptr;
  lt_spm_free_fn free = nullptr;
  lt_spm_piece_size_fn piece_size = nullptr;
  lt_spm_piece_to_id_fn piece_to_id = nullptr;
  lt_spm_unk_id_fn unk_id = nullptr;
  lt_spm_encode_fn encode = nullptr;
};

const ModuleApi& module_api() {
  static const ModuleApi api = [] {
    const std::string file_name = "liblt_sentencepiece.so";
    std::vector<std::string> candidates = {LT_SENTENCEPIECE_MODULE};
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) candidates.push_back((exe.parent_path() / file_name).string());
    std::string errors;
    void* handle = nullptr;
    for (const auto& path : candidates) {
      handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle) break;
      const char* e = ::dlerror();
      errors += "\n  " + path + ": " + (e ? e : "not loadable");
    }
    if (!handle) throw Error(ExitCode::kRuntime, "cannot load the SentencePiece module " + file_name + " (built with lora-train):" + errors);
    auto symbol = [handle](const char* name) {
      void* s = ::dlsym(handle, name);
      if (!s) throw Error(ExitCode::kRuntime, std::string("the SentencePiece module lacks ") + name);
      return s;
    };
    ModuleApi a;
    a.load = reinterpret_cast<lt_spm_load_fn>(symbol("lt_spm_load"));
    a.free = reinterpret_cast<lt_spm_free_fn>(symbol("lt_spm_free"));
    a.piece_size = reinterpret_cast<lt_spm_piece_size_fn>(symbol("lt_spm_piece_size"));
    a.piece_to_id = reinterpret_cast<lt_spm_piece_to_id_fn>(symbol("lt_spm_piece_to_id"));
    a.unk_id = reinterpret_cast<lt_spm_unk_id_fn>(symbol("lt_spm_unk_id"));
    a.encode = reinterpret_cast<lt_spm_encode_fn>(symbol("lt_spm_encode"));
    return a;
  }();
  return api;
}

}  // namespace

// One loaded SentencePiece model (the module's processor), freed with the last tokenizer copy.
class SentencePieceModel {
 public:
  SentencePieceModel(const std::string& bytes, const std::string& source) : api_(module_api()) {
    char error[512] = {0};
    handle_ = api_.load(bytes.data(), bytes.size(), error, sizeof(error));
    if (!handle_) throw InputError(source + ": not a SentencePiece model (" + printable(error) + ")");
  }
  ~SentencePieceModel() { api_.free(handle_); }
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  int64_t piece_size() const { return api_.piece_size(handle_); }
  int64_t piece_to_id(const std::string& piece) const { return api_.piece_to_id(handle_, piece.c_str()); }
  int64_t unk_id() const { return api_.unk_id(handle_); }
  void encode(const std::string& text, std::vector<int64_t>& out) const {
    char error[512] = {0};
    auto emit = [](void* context, int id) { static_cast<std::vector<int64_t>*>(context)->push_back(id); };
    if (api_.encode(handle_, text.data(), text.size(), emit, &out, error, sizeof(error)) != 0) {
      throw InputError("T5 tokenizer: SentencePiece cannot encode the text (" + printable(error) + ")");
    }
  }

 private:
  const ModuleApi& api_;
  lt_spm* handle_ = nullptr;
};

namespace {

constexpr const char* kSpieceName = "spiece.model";

// transformers T5Tokenizer's special-token strings.
constexpr const char* kPadPiece = "<pad>";
constexpr const char* kEosPiece = "</s>";
constexpr const char* kUnkPiece = "<unk>";

std::string extra_id_token(int64_t i) { return "<extra_id_" + std::to_string(i) + ">"; }

// The id of a special piece, which the model must define (an absent piece maps to unk).
int64_t required_piece(const SentencePieceModel& sp, const char* piece, const std::string& source) {
  const int64_t id = sp.piece_to_id(piece);
  if (id == sp.unk_id() && std::string(piece) != kUnkPiece) {
    throw InputError(source + ": the SentencePiece model has no '" + piece +
                     "' piece; it is not a T5 tokenizer (T5 models define <pad> = 0, </s> = 1, <unk> = 2)");
  }
  return id;
}

}  // namespace

T5Tokenizer::T5Tokenizer(std::shared_ptr<const SentencePieceModel> model, const std::string& source,
                         T5TokenizerOptions options)
    : model_(std::move(model)), options_(options) {
  if (options_.extra_ids < 0) throw InputError(source + ": extra_ids must be >= 0");
  if (options_.model_max_length < 1) throw InputError(source + ": model_max_length must be >= 1");
  const auto& sp = *model_;
  pad_id_ = required_piece(sp, kPadPiece, source);
  eos_id_ = required_piece(sp, kEosPiece, source);
  unk_id_ = sp.unk_id();
  special_tokens_ = {{kPadPiece, pad_id_}, {kEosPiece, eos_id_}, {kUnkPiece, unk_id_}};
  // transformers appends <extra_id_0..N-1> after the pieces, in reverse: <extra_id_0> is the last id.
  const int64_t pieces = sp.piece_size();
  for (int64_t i = 0; i < options_.extra_ids; ++i) special_tokens_.emplace_back(extra_id_token(i), pieces + options_.extra_ids - 1 - i);
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

T5Tokenizer T5Tokenizer::from_serialized(const std::string& model_bytes, const std::string& source,
                                         T5TokenizerOptions options) {
  return T5Tokenizer(std::make_shared<const SentencePieceModel>(model_bytes, source), source, options);
}

T5Tokenizer T5Tokenizer::from_file(const std::filesystem::path& spiece_model, T5TokenizerOptions options) {
  std::ifstream in(spiece_model, std::ios::binary);
  if (!in) throw InputError(spiece_model.string() + ": cannot open the SentencePiece model");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return from_serialized(bytes, spiece_model.string(), options);
}

int64_t T5Tokenizer::vocab_size() const { return model_->piece_size() + options_.extra_ids; }

std::vector<int64_t> T5Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  // Split out special tokens (longest match at each '<'), encode the text between them.
  size_t segment = 0;
  size_t pos = text.find('<');
  while (pos != std::string::npos) {
    const std::pair<std::string, int64_t>* match = nullptr;
    for (const auto& token : special_tokens_) {
      if (text.compare(pos, token.first.size(), token.first) == 0) {
        match = &token;
        break;
      }
    }
    if (!match) {
      pos = text.find('<', pos + 1);
      continue;
    }
    model_->encode(text.substr(segment, pos - segment), ids);
    ids.push_back(match->second);
    segment = pos + match->first.size();
    pos = text.find('<', segment);
  }
  model_->encode(text.substr(segment), ids);
  ids.push_back(eos_id_);
  return ids;
}

T5Encoding T5Tokenizer::encode_padded(const std::string& text, int64_t max_length) const {
  if (max_length < 0) max_length = options_.model_max_length;
  if (max_length < 1) throw InputError("T5 tokenizer: max_length must be >= 1 (room for </s>), got " + std::to_string(max_length));
  T5Encoding e;
  e.input_ids = encode(text);
  e.num_tokens_untruncated = static_cast<int64_t>(e.input_ids.size());
  if (e.num_tokens_untruncated > max_length) {
    e.input_ids.resize(static_cast<size_t>(max_length));
    e.input_ids.back() = eos_id_;
  }
  e.attention_mask.assign(e.input_ids.size(), 1);
  e.input_ids.resize(static_cast<size_t>(max_length), pad_id_);
  e.attention_mask.resize(static_cast<size_t>(max_length), 0);
  return e;
}

std::vector<T5Encoding> T5Tokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length) const {
  std::vector<T5Encoding> out;
  out.reserve(texts.size());
  for (const auto& t : texts) out.push_back(encode_padded(t, max_length));
  return out;
}

T5TokenizerOptions read_t5_tokenizer_options(const std::filesystem::path& folder) {
  T5TokenizerOptions o;
  const auto config = folder / "tokenizer_config.json";
  if (!std::filesystem::exists(config)) return o;
  const nlohmann::json j = read_json_file(config, "tokenizer config");
  if (!j.is_object()) throw InputError(config.string() + ": tokenizer config is not a JSON object");
  // transformers writes a huge sentinel (1e30) when no length is known; keep 512 then.
  auto length = j.find("model_max_length");
  if (length != j.end() && length->is_number() && length->get<double>() >= 1 && length->get<double>() < 1e9) {
    o.model_max_length = static_cast<int64_t>(length->get<double>());
  }
  auto extra = j.find("extra_ids");
  if (extra != j.end() && !extra->is_null()) {
    if (!extra->is_number_integer() || extra->get<int64_t>() < 0) {
      throw InputError(config.string() + ": extra_ids must be a non-negative integer, got " + printable(extra->dump()));
    }
    o.extra_ids = extra->get<int64_t>();
  }
  return o;
}

T5Tokenizer load_t5_tokenizer(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path)) return T5Tokenizer::from_file(path);
  if (fs::is_directory(path)) {
    if (fs::exists(path / kSpieceName)) return T5Tokenizer::from_file(path / kSpieceName, read_t5_tokenizer_options(path));
    throw InputError(path.string() + ": no T5 tokenizer here; expected " + kSpieceName +
                     " (a diffusers tokenizer_2/ folder holds it)");
  }
  throw InputError(path.string() + ": T5 tokenizer path does not exist (a " + std::string(kSpieceName) +
                   " file or the folder holding it)");
}

}  // namespace lt::models
