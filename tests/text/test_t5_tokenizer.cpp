// The T5 tokenizer on a small SentencePiece model trained here with spm_train (T5's special ids:
// pad 0, eos 1, unk 2, no bos), checked against SentencePiece's own encoding (spm_encode) plus
// transformers' T5 rules: special tokens in the text, EOS appended, pad 0 to max_length, truncation
// keeping EOS.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/models/text/t5_checkpoint.h"
#include "loratrain/models/text/t5_tokenizer.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using namespace lt::models;

namespace {

// A few thousand sentences of made-up words (a fixed LCG over syllables), so spm_train has
// something with structure to learn from.
void write_corpus(const std::filesystem::path& path) {
  const char* syllables[] = {"ka", "lo", "mi", "sun", "ter", "ba", "ri", "on", "el", "dra", "qu", "zy",
                             "photo", "cat", "of", "a", "the", "red", "big", "ü", "é", "日本"};
  const size_t count = sizeof(syllables) / sizeof(syllables[0]);
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>(state >> 33);
  };
  std::ofstream out(path);
  for (int line = 0; line < 3000; ++line) {
    const size_t words = 3 + next() % 9;
    for (size_t w = 0; w < words; ++w) {
      const size_t parts = 1 + next() % 3;
      for (size_t p = 0; p < parts; ++p) out << syllables[next() % count];
      out << (w + 1 < words ? " " : ".\n");
    }
  }
}

// Trains spiece.model into a scratch folder (once per run) with T5's special ids.
std::filesystem::path train_spiece(const std::string& name, const std::string& extra_flags) {
  const auto dir = lt::test::scratch_dir(name);
  write_corpus(dir / "corpus.txt");
  const std::string cmd = "spm_train --input=" + (dir / "corpus.txt").string() + " --model_prefix=" +
                          (dir / "spiece").string() +
                          " --vocab_size=300 --model_type=unigram --character_coverage=1.0 --hard_vocab_limit=false"
                          " --unk_id=2 --bos_id=-1 " +
                          extra_flags + " > " + (dir / "spm_train.log").string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) CATCH_FAIL("spm_train failed (scripts/install-deps installs the sentencepiece package): " << cmd);
  return dir / "spiece.model";
}

const std::filesystem::path& spiece_model() {
  static const std::filesystem::path path = train_spiece("t5_tokenizer_spm", "--pad_id=0 --eos_id=1");
  return path;
}

// SentencePiece's own command-line encoder on one line of text.
std::vector<int64_t> sentencepiece_ids(const std::string& text) {
  const auto dir = spiece_model().parent_path();
  std::ofstream(dir / "line.txt") << text << "\n";
  const std::string cmd = "spm_encode --model=" + spiece_model().string() + " --output_format=id < " +
                          (dir / "line.txt").string() + " > " + (dir / "ids.txt").string();
  CATCH_REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(dir / "ids.txt");
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line);
  std::vector<int64_t> ids;
  for (int64_t id; fields >> id;) ids.push_back(id);
  return ids;
}

std::vector<int64_t> concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

CATCH_TEST_CASE("T5 tokenizer: SentencePiece's ids, then </s>", "[t5][tokenizer]") {
  const T5Tokenizer tok = T5Tokenizer::from_file(spiece_model());
  CATCH_CHECK(tok.pad_token_id() == 0);
  CATCH_CHECK(tok.eos_token_id() == 1);
  CATCH_CHECK(tok.unk_token_id() == 2);
  for (const std::string text : {"a photo of a red cat", "  kalo   misun\tterba.  ", "ü é 日本 qu zy", "Photo, OF!? x#y",
                                 "unseen ∑ symbols ☃"}) {
    CATCH_INFO("text '" << text << "'");
    const auto expected = concat({sentencepiece_ids(text), {1}});
    CATCH_CHECK(expected.size() > 2);
    CATCH_CHECK(tok.encode(text) == expected);
  }
  CATCH_CHECK(tok.encode("") == std::vector<int64_t>{1});
  CATCH_CHECK(tok.encode("   ") == std::vector<int64_t>{1});
}

CATCH_TEST_CASE("T5 tokenizer: padding with 0, mask, truncation keeps </s>", "[t5][tokenizer]") {
  const T5Tokenizer tok = T5Tokenizer::from_file(spiece_model());
  const std::string text = "a photo of a red cat";
  const auto ids = sentencepiece_ids(text);
  const auto n = static_cast<int64_t>(ids.size());

  const T5Encoding padded = tok.encode_padded(text, 16);
  CATCH_REQUIRE(padded.input_ids.size() == 16);
  CATCH_CHECK(std::vector<int64_t>(padded.input_ids.begin(), padded.input_ids.begin() + n) == ids);
  CATCH_CHECK(padded.input_ids[static_cast<size_t>(n)] == 1);
  for (size_t i = static_cast<size_t>(n) + 1; i < 16; ++i) CATCH_CHECK(padded.input_ids[i] == 0);
  for (size_t i = 0; i < 16; ++i) CATCH_CHECK(padded.attention_mask[i] == (static_cast<int64_t>(i) <= n ? 1 : 0));
  CATCH_CHECK(padded.num_tokens_untruncated == n + 1);

  // Exactly full: no pad. One over: the last text id gives way to </s>.
  const T5Encoding full = tok.encode_padded(text, n + 1);
  CATCH_CHECK(full.input_ids == concat({ids, {1}}));
  CATCH_CHECK(full.attention_mask == std::vector<int64_t>(static_cast<size_t>(n) + 1, 1));
  const T5Encoding cut = tok.encode_padded(text, n);
  CATCH_CHECK(cut.input_ids == concat({std::vector<int64_t>(ids.begin(), ids.end() - 1), {1}}));
  CATCH_CHECK(cut.num_tokens_untruncated == n + 1);
  CATCH_CHECK(tok.encode_padded(text, 1).input_ids == std::vector<int64_t>{1});
  CATCH_CHECK_THROWS_AS(tok.encode_padded(text, 0), lt::InputError);

  // Flux dev / Wan (512, the default) and schnell (256).
  CATCH_CHECK(tok.encode_padded(text).input_ids.size() == 512);
  CATCH_CHECK(tok.encode_padded(text, 256).input_ids.size() == 256);
  const auto batch = tok.encode_batch({text, "cat"}, 8);
  CATCH_REQUIRE(batch.size() == 2);
  CATCH_CHECK(batch[1].input_ids == tok.encode_padded("cat", 8).input_ids);
}

CATCH_TEST_CASE("T5 tokenizer: special tokens written in the text become their ids", "[t5][tokenizer]") {
  const T5Tokenizer tok = T5Tokenizer::from_file(spiece_model());
  const int64_t pieces = tok.vocab_size() - 100;
  // transformers numbers the sentinels down from the top: <extra_id_0> is the last id.
  const auto got = tok.encode("a cat <extra_id_0> red</s>big<pad><unk> <extra_id_99><extra_id_12>");
  const auto expected = concat({sentencepiece_ids("a cat "), {pieces + 99}, sentencepiece_ids(" red"), {1},
                                sentencepiece_ids("big"), {0, 2}, {pieces}, {pieces + 87}, {1}});
  CATCH_CHECK(got == expected);
  // Not special: beyond extra_ids, or incomplete.
  CATCH_CHECK(tok.encode("<extra_id_100>") == concat({sentencepiece_ids("<extra_id_100>"), {1}}));
  CATCH_CHECK(tok.encode("<extra_id_1 cat") == concat({sentencepiece_ids("<extra_id_1 cat"), {1}}));
  T5TokenizerOptions none;
  none.extra_ids = 0;
  const T5Tokenizer plain = T5Tokenizer::from_file(spiece_model(), none);
  CATCH_CHECK(plain.vocab_size() == pieces);
  CATCH_CHECK(plain.encode("<extra_id_0>") == concat({sentencepiece_ids("<extra_id_0>"), {1}}));
}

CATCH_TEST_CASE("T5 tokenizer: folders, tokenizer_config.json and errors", "[t5][tokenizer]") {
  const auto dir = lt::test::scratch_dir("t5_tokenizer_folder");
  std::filesystem::copy_file(spiece_model(), dir / "spiece.model");
  std::ofstream(dir / "tokenizer_config.json") << R"({"model_max_length": 256, "extra_ids": 10, "eos_token": "</s>"})";
  const T5Tokenizer tok = load_t5_tokenizer(dir);
  CATCH_CHECK(tok.options().model_max_length == 256);
  CATCH_CHECK(tok.options().extra_ids == 10);
  CATCH_CHECK(tok.encode_padded("cat").input_ids.size() == 256);
  CATCH_CHECK(load_t5_tokenizer(dir / "spiece.model").options().model_max_length == 512);

  CATCH_CHECK_THROWS_WITH(load_t5_tokenizer(dir / "nowhere"), Catch::Contains("does not exist"));
  const auto empty = lt::test::scratch_dir("t5_tokenizer_empty");
  CATCH_CHECK_THROWS_WITH(load_t5_tokenizer(empty), Catch::Contains("spiece.model"));
  std::ofstream(empty / "spiece.model") << "not a model";
  CATCH_CHECK_THROWS_WITH(load_t5_tokenizer(empty), Catch::Contains("not a SentencePiece model"));
  std::ofstream(empty / "tokenizer_config.json") << R"({"extra_ids": "many"})";
  CATCH_CHECK_THROWS_WITH(read_t5_tokenizer_options(empty), Catch::Contains("extra_ids"));

  // A SentencePiece model without T5's <pad> piece is not a T5 tokenizer.
  const auto no_pad = train_spiece("t5_tokenizer_no_pad", "--pad_id=-1 --eos_id=1");
  CATCH_CHECK_THROWS_WITH(T5Tokenizer::from_file(no_pad), Catch::Contains("<pad>"));
}

CATCH_TEST_CASE("umT5 file carrying its tokenizer as spiece_model loads, tokenizer and weights", "[t5][tokenizer][loader]") {
  T5Config c;
  c.model_type = "umt5";
  c.vocab_size = 400;
  c.d_model = 8;
  c.d_kv = 4;
  c.num_heads = 2;
  c.d_ff = 12;
  c.num_layers = 2;
  T5EncoderModel model(c);
  std::ifstream in(spiece_model(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : model->named_parameters(true)) tensors.emplace_back(p.key(), p.value().detach());
  tensors.emplace_back("spiece_model", torch::tensor(std::vector<uint8_t>(bytes.begin(), bytes.end()), torch::kByte));
  const auto path = lt::test::scratch_dir("t5_umt5_spiece") / "umt5_xxl_tiny.safetensors";
  lt::io::save_safetensors(path, tensors);

  auto file = lt::io::SafetensorsFile::open(path);
  const auto tok = embedded_t5_tokenizer(*file, "");
  CATCH_REQUIRE(tok.has_value());
  CATCH_CHECK(tok->encode("a photo of a red cat") == T5Tokenizer::from_file(spiece_model()).encode("a photo of a red cat"));
  T5EncoderModel loaded = load_t5_encoder(path);
  CATCH_CHECK(loaded->config.bias_in_every_layer());
  const at::Tensor ids = torch::tensor({{3, 7, 1}}, torch::kLong);
  torch::NoGradGuard no_grad;
  model->eval();
  CATCH_CHECK(torch::equal(loaded(ids), model(ids)));

  lt::io::save_safetensors(path, {tensors.begin(), tensors.end() - 1});
  CATCH_CHECK(!embedded_t5_tokenizer(*lt::io::SafetensorsFile::open(path), "").has_value());
}
