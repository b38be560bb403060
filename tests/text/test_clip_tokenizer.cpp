// CLIP BPE tokenizer: the real vocabulary against transformers' CLIPTokenizer (fixture), and
// small vocabularies of our own for the mechanics.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>

#include "../../src/models/text/unicode.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/models/text/clip_tokenizer.h"
#include "loratrain/util/error.h"
#include "test_support.h"

using namespace lt::models;

using lt::test::read_json;
using lt::test::write_file;

namespace {

std::filesystem::path fixture_dir() { return lt::test::fixtures_dir() / "parity" / "clip_tokenizer"; }

std::optional<std::filesystem::path> real_vocabulary() {
  auto shared = lt::test::shared_dir();
  if (!shared) return std::nullopt;
  auto p = *shared / "fixtures" / "clip_tokenizer" / "bpe_simple_vocab_16e6.txt.gz";
  if (!std::filesystem::exists(p)) return std::nullopt;
  return p;
}

std::vector<int64_t> row(const at::Tensor& t, int64_t i) {
  auto r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// A tiny vocabulary: byte symbols, a few merges, the two special tokens.
std::filesystem::path small_vocab_folder(const std::string& name) {
  auto dir = lt::test::scratch_dir(name);
  write_demo_vocabulary(dir, {"cat", "a", "photo", "of", "dog"});
  return dir;
}

std::u32string u32(const std::string& s) { return unicode::decode_utf8(s); }

}  // namespace

CATCH_TEST_CASE("CLIP tokenizer matches transformers on the real vocabulary", "[text][tokenizer][parity]") {
  auto vocab = real_vocabulary();
  if (!vocab) {
    CATCH_WARN("skipped: ../shared/fixtures/clip_tokenizer/bpe_simple_vocab_16e6.txt.gz is not available");
    return;
  }
  const auto config = read_json(fixture_dir() / "config.json");
  CLIPTokenizer tok = CLIPTokenizer::from_openai_bpe(*vocab);
  CLIPTokenizerOptions pad0;
  pad0.pad_token = config["pad_token_tokenizer_2"].get<std::string>();
  CLIPTokenizer tok2 = CLIPTokenizer::from_openai_bpe(*vocab, pad0);
  CATCH_CHECK(tok.vocab_size() == config["vocab_size"].get<int64_t>());
  CATCH_CHECK(tok.bos_token_id() == config["bos_token_id"].get<int64_t>());
  CATCH_CHECK(tok.eos_token_id() == config["eos_token_id"].get<int64_t>());
  CATCH_CHECK(tok.pad_token_id() == config["pad_token_id"].get<int64_t>());
  CATCH_CHECK(tok2.pad_token_id() == config["pad_token_id_tokenizer_2"].get<int64_t>());

  // The same vocabulary exported as vocab.json + merges.txt tokenizes identically.
  auto exported = lt::test::scratch_dir("clip_tokenizer_export");
  tok.save_vocabulary(exported);
  CLIPTokenizer from_folder = load_clip_tokenizer(exported);
  CATCH_CHECK(from_folder.vocab_size() == tok.vocab_size());

  const auto captions = read_json(fixture_dir() / "captions.json");
  auto io = lt::io::SafetensorsFile::open(fixture_dir() / "io.safetensors");
  auto ids = io->load("out.input_ids"), mask = io->load("out.attention_mask");
  auto ids0 = io->load("out.input_ids_pad0"), mask0 = io->load("out.attention_mask_pad0");
  auto counts = io->load("out.num_tokens_untruncated");
  CATCH_REQUIRE(static_cast<int64_t>(captions.size()) == ids.size(0));
  for (size_t i = 0; i < captions.size(); ++i) {
    const auto text = captions[i]["text"].get<std::string>();
    CATCH_INFO("caption " << i << ": " << text);
    const auto i64 = static_cast<int64_t>(i);
    CATCH_CHECK(tok.tokenize(text) == captions[i]["bpe_tokens"].get<std::vector<std::string>>());
    const auto untruncated = tok.encode(text);
    CATCH_CHECK(untruncated == captions[i]["ids_untruncated"].get<std::vector<int64_t>>());
    CATCH_CHECK(static_cast<int64_t>(untruncated.size()) == counts[i64].item<int64_t>());
    auto e = tok.encode_padded(text);
    CATCH_CHECK(e.input_ids == row(ids, i64));
    CATCH_CHECK(e.attention_mask == row(mask, i64));
    auto e0 = tok2.encode_padded(text);
    CATCH_CHECK(e0.input_ids == row(ids0, i64));
    CATCH_CHECK(e0.attention_mask == row(mask0, i64));
    CATCH_CHECK(from_folder.encode_padded(text).input_ids == e.input_ids);
  }
  // Decoding inverts the byte-level encoding (lower-cased, words separated by spaces).
  CATCH_CHECK(tok.decode(tok.encode("A photo of a café, 日本")) == "a photo of a café , 日 本");
}

CATCH_TEST_CASE("CLIP tokenizer: BPE merges by rank with </w> word ends", "[text][tokenizer]") {
  auto dir = lt::test::scratch_dir("clip_tokenizer_bpe");
  // Bytes 'a'..'e' and their word-end forms, merges in a chosen rank order.
  nlohmann::json vocab;
  int64_t id = 0;
  for (std::string c : {"a", "b", "c", "d", "e"}) vocab[c] = id++;
  for (std::string c : {"a", "b", "c", "d", "e"}) vocab[c + "</w>"] = id++;
  for (std::string t : {"bc", "ab", "abc</w>", "bc</w>", "<|startoftext|>", "<|endoftext|>"}) vocab[t] = id++;
  write_file(dir / "vocab.json", vocab.dump());
  write_file(dir / "merges.txt", "#version: 0.2\nb c\na b\na bc</w>\nb c</w>\n");
  CLIPTokenizer tok = load_clip_tokenizer(dir);
  // "abc": pairs (a,b)=rank1, (b,c</w>)=rank3 -> "ab" first, then no merge for (ab, c</w>).
  CATCH_CHECK(tok.tokenize("abc") == std::vector<std::string>{"ab", "c</w>"});
  // "abcd": (b,c) rank0 first -> a bc d</w>; (a,bc) unknown -> stays.
  CATCH_CHECK(tok.tokenize("abcd") == std::vector<std::string>{"a", "bc", "d</w>"});
  CATCH_CHECK(tok.tokenize("bc") == std::vector<std::string>{"bc</w>"});
  CATCH_CHECK(tok.tokenize("e") == std::vector<std::string>{"e</w>"});
  // Unknown symbols map to unk (= <|endoftext|>).
  CATCH_CHECK(tok.encode("z") == std::vector<int64_t>{tok.bos_token_id(), tok.eos_token_id(), tok.eos_token_id()});
  CATCH_CHECK(tok.bos_token_id() == vocab["<|startoftext|>"].get<int64_t>());
  // The merges file's first line is a header and is always skipped, as transformers does.
  write_file(dir / "merges.txt", "b c\na b\n");
  CATCH_CHECK(load_clip_tokenizer(dir).tokenize("abc") == std::vector<std::string>{"ab", "c</w>"});
}

CATCH_TEST_CASE("CLIP tokenizer: text cleanup and pre-tokenisation", "[text][tokenizer]") {
  CLIPTokenizer tok = load_clip_tokenizer(small_vocab_folder("clip_tokenizer_clean"));
  auto words = [&tok](const std::string& text) { return tok.decode(tok.encode(text)); };
  CATCH_CHECK(tok.tokenize("A PHOTO of\ta\n\nCAT") == tok.tokenize("a photo of a cat"));
  CATCH_CHECK(tok.tokenize("a photo of a cat") == std::vector<std::string>{"a</w>", "photo</w>", "of</w>", "a</w>", "cat</w>"});
  CATCH_CHECK(words("  a\u00a0cat\u200b ") == "a cat");           // NBSP is a space, ZWSP is dropped
  // "'s" is one pre-token (no merge for it here), not "'" + "s" as two words.
  CATCH_CHECK(tok.tokenize("cat's") == std::vector<std::string>{"cat</w>", "'", "s</w>"});
  CATCH_CHECK(tok.tokenize("cat!?") == std::vector<std::string>{"cat</w>", "!", "?</w>"});
  CATCH_CHECK(tok.tokenize("12") == std::vector<std::string>{"1</w>", "2</w>"});  // numbers one digit each
  // U+0345 matches no branch of the pattern under IGNORECASE (it folds to a letter): dropped.
  CATCH_CHECK(tok.tokenize("a\u0345a") == std::vector<std::string>{"a</w>", "a</w>"});
  CATCH_CHECK(words("e\u0301t\u00c9") == "été");                   // NFC, then lower-case
  auto cjk = tok.tokenize("猫猫");                                   // CJK ideographs are words of their own
  CATCH_CHECK(std::count_if(cjk.begin(), cjk.end(), [](const std::string& t) { return t.size() > 4 && t.compare(t.size() - 4, 4, "</w>") == 0; }) == 2);
  // Special token strings in the text become those tokens.
  CATCH_CHECK(tok.encode("a<|endoftext|>cat") ==
              std::vector<int64_t>{tok.bos_token_id(), tok.token_to_id("a</w>"), tok.eos_token_id(),
                                   tok.token_to_id("cat</w>"), tok.eos_token_id()});
}

CATCH_TEST_CASE("CLIP tokenizer: truncation and padding as SD uses them", "[text][tokenizer]") {
  auto dir = small_vocab_folder("clip_tokenizer_pad");
  CLIPTokenizer tok = load_clip_tokenizer(dir);
  auto e = tok.encode_padded("a cat");
  CATCH_REQUIRE(e.input_ids.size() == 77);
  CATCH_CHECK(e.input_ids[0] == tok.bos_token_id());
  CATCH_CHECK(e.input_ids[3] == tok.eos_token_id());
  CATCH_CHECK(e.input_ids[76] == tok.eos_token_id());  // SD1.x pads with <|endoftext|>
  CATCH_CHECK(std::count(e.attention_mask.begin(), e.attention_mask.end(), 1) == 4);
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "cat ";
  auto t = tok.encode_padded(long_text);
  CATCH_CHECK(t.input_ids.size() == 77);
  CATCH_CHECK(t.input_ids[75] == tok.token_to_id("cat</w>"));
  CATCH_CHECK(t.input_ids[76] == tok.eos_token_id());
  CATCH_CHECK(std::count(t.attention_mask.begin(), t.attention_mask.end(), 1) == 77);
  CATCH_CHECK(tok.encode_padded("a cat", 3).input_ids == std::vector<int64_t>{tok.bos_token_id(), tok.token_to_id("a</w>"), tok.eos_token_id()});
  CATCH_CHECK_THROWS_AS(tok.encode_padded("a", 1), lt::InputError);

  // SD2 / SDXL tokenizer_2: pad "!" from special_tokens_map.json; a '!' in the text is that token too.
  write_file(dir / "tokenizer_config.json", R"({"model_max_length": 16, "pad_token": "<|endoftext|>"})");
  write_file(dir / "special_tokens_map.json", R"({"pad_token": {"content": "!", "lstrip": false}})");
  CLIPTokenizer tok2 = load_clip_tokenizer(dir);
  CATCH_CHECK(tok2.model_max_length() == 16);
  CATCH_CHECK(tok2.pad_token_id() == tok2.token_to_id("!"));
  auto p = tok2.encode_padded("cat!");
  CATCH_CHECK(p.input_ids.size() == 16);
  CATCH_CHECK(p.input_ids[2] == tok2.pad_token_id());
  CATCH_CHECK(p.attention_mask[2] == 1);
  CATCH_CHECK(p.input_ids[15] == tok2.pad_token_id());
  CATCH_CHECK(p.attention_mask[15] == 0);
  CATCH_CHECK(tok.tokenize("cat!") != tok2.tokenize("cat!"));
}

CATCH_TEST_CASE("with_pad_token: SDXL's tokenizer_2 convention for single files", "[text][tokenizer][sdxl]") {
  auto dir = small_vocab_folder("clip_tokenizer_pad2");
  const CLIPTokenizer tok = load_clip_tokenizer(dir);
  const CLIPTokenizer tok2 = tok.with_pad_token("!");
  // "!" is the first byte symbol: id 0, as in the real vocabulary (kohya: pad_token_id = 0).
  CATCH_CHECK(tok2.pad_token_id() == 0);
  CATCH_CHECK(tok2.eos_token_id() == tok.eos_token_id());
  CATCH_CHECK(tok2.vocab_size() == tok.vocab_size());
  const auto e = tok2.encode_padded("a photo of a cat");
  CATCH_CHECK(e.input_ids[6] == tok.eos_token_id());
  CATCH_CHECK(e.input_ids[7] == 0);
  CATCH_CHECK(e.input_ids[76] == 0);
  CATCH_CHECK(e.attention_mask[6] == 1);
  CATCH_CHECK(e.attention_mask[7] == 0);
  CATCH_CHECK(tok.encode_padded("a photo of a cat").input_ids[7] == tok.eos_token_id());
  // The same as a tokenizer_2/ folder that says so in special_tokens_map.json.
  write_file(dir / "special_tokens_map.json", R"({"pad_token": "!"})");
  const CLIPTokenizer folder = load_clip_tokenizer(dir);
  for (const std::string text : {"a cat!", "", "photo of a dog , a cat"}) {
    CATCH_CHECK(folder.encode_padded(text).input_ids == tok2.encode_padded(text).input_ids);
    CATCH_CHECK(folder.encode_padded(text).attention_mask == tok2.encode_padded(text).attention_mask);
  }
  if (auto vocab = real_vocabulary()) {
    const CLIPTokenizer real = CLIPTokenizer::from_openai_bpe(*vocab).with_pad_token("!");
    CATCH_CHECK(real.pad_token_id() == 0);
    CATCH_CHECK(real.encode_padded("a cat").input_ids[4] == 0);
  }
}

CATCH_TEST_CASE("load_clip_tokenizer: folder forms and clear errors", "[text][tokenizer][loader]") {
  CATCH_CHECK_THROWS_AS(load_clip_tokenizer(""), lt::InputError);
  CATCH_CHECK_THROWS_AS(load_clip_tokenizer(lt::test::scratch_dir("clip_tok_missing") / "nope"), lt::InputError);
  auto empty = lt::test::scratch_dir("clip_tok_empty");
  try {
    load_clip_tokenizer(empty);
    CATCH_FAIL("expected an error");
  } catch (const lt::InputError& e) {
    CATCH_CHECK(std::string(e.what()).find("vocab.json") != std::string::npos);
  }
  write_file(empty / "weights.bin", "x");
  CATCH_CHECK_THROWS_AS(load_clip_tokenizer(empty / "weights.bin"), lt::InputError);
  write_file(empty / "broken.txt.gz", "not gzip at all");
  CATCH_CHECK_THROWS_AS(load_clip_tokenizer(empty / "broken.txt.gz"), lt::InputError);
  // A diffusers model folder: the tokenizer/ subfolder is found.
  auto model = lt::test::scratch_dir("clip_tok_model");
  write_demo_vocabulary(model / "tokenizer", {"cat"});
  CATCH_CHECK(load_clip_tokenizer(model).tokenize("cat") == std::vector<std::string>{"cat</w>"});
  if (auto vocab = real_vocabulary()) {
    auto folder = lt::test::scratch_dir("clip_tok_gz");
    std::filesystem::copy_file(*vocab, folder / "bpe_simple_vocab_16e6.txt.gz");
    CATCH_CHECK(load_clip_tokenizer(folder).vocab_size() == 49408);
    CATCH_CHECK(load_clip_tokenizer(*vocab).encode("a cat") == std::vector<int64_t>{49406, 320, 2368, 49407});
  }
}

CATCH_TEST_CASE("write_demo_vocabulary round-trips", "[text][tokenizer]") {
  auto dir = lt::test::scratch_dir("clip_demo_vocab");
  const std::vector<std::string> words{"ohwx", "Dog", "sitting", "sit", "in", "a", "bucket", "café"};
  write_demo_vocabulary(dir, words);
  CLIPTokenizer tok = load_clip_tokenizer(dir);
  CATCH_CHECK(tok.vocab_size() > 512 + 2);
  CATCH_CHECK(tok.bos_token_id() == tok.vocab_size() - 2);
  CATCH_CHECK(tok.eos_token_id() == tok.vocab_size() - 1);
  for (const auto& w : words) {
    CATCH_INFO(w);
    CATCH_CHECK(tok.tokenize(w).size() == 1);  // every listed word is one token
  }
  const std::string text = "ohwx dog sitting in a bucket, zebra café";
  CATCH_CHECK(tok.decode(tok.encode(text)) == "ohwx dog sitting in a bucket , zebra café");
  CATCH_CHECK(tok.tokenize("zebra").size() == 5);  // unknown words fall back to byte symbols
  // Deterministic: the same words give the same files.
  auto again = lt::test::scratch_dir("clip_demo_vocab_again");
  write_demo_vocabulary(again, words);
  std::ifstream a(dir / "merges.txt"), b(again / "merges.txt");
  CATCH_CHECK(std::string(std::istreambuf_iterator<char>(a), {}) == std::string(std::istreambuf_iterator<char>(b), {}));
}

CATCH_TEST_CASE("unicode helpers: classes, lower-case, NFC", "[text][tokenizer][unicode]") {
  using namespace unicode;
  CATCH_CHECK(is_letter(U'é'));
  CATCH_CHECK(is_letter(U'ж'));
  CATCH_CHECK(is_letter(U'日'));
  CATCH_CHECK(is_number(U'٣'));  // ARABIC-INDIC DIGIT THREE
  CATCH_CHECK(is_number(U'½'));
  CATCH_CHECK(!is_letter(U'∑'));
  CATCH_CHECK(char_class(0x200B) == CharClass::kOther);
  CATCH_CHECK(char_class(0x3000) == CharClass::kSpaceSeparator);
  CATCH_CHECK(char_class(0x0301) == CharClass::kNonspacingMark);
  CATCH_CHECK(to_lower(u32("ÜBER ΟΔΟΣ.")) == u32("über οδος."));
  CATCH_CHECK(to_lower(u32("ΟΔΟΣ")) == u32("οδος"));
  CATCH_CHECK(to_lower(u32("ΣΑ")) == u32("σα"));
  CATCH_CHECK(to_lower(u32("İ")) == u32("i\u0307"));
  CATCH_CHECK(to_lower(u32("ΣΐΣ")) == u32("σΐς"));               // ΐ is cased though it has no upper-case pair
  CATCH_CHECK(to_lower(u32("Σ\u0345Σ")) == u32("σ\u0345ς"));     // U+0345 is case-ignorable
  CATCH_CHECK(nfc(u32("e\u0301")) == u32("é"));
  CATCH_CHECK(nfc(u32("\u1100\u1161\u11A8")) == u32("각"));         // Hangul L V T
  CATCH_CHECK(nfc(u32("a\u0323\u0302")) == u32("ậ"));              // reordered marks compose
  CATCH_CHECK(nfc(u32("a\u0302\u0323")) == u32("ậ"));
  CATCH_CHECK(nfc(u32("\u212B")) == u32("Å"));                     // singleton ANGSTROM SIGN
  CATCH_CHECK(encode_utf8(decode_utf8("caf\xC3\xA9 \xF0\x9F\x90\xB1")) == "caf\xC3\xA9 \xF0\x9F\x90\xB1");
  CATCH_CHECK(decode_utf8("a\xFF") == (std::u32string{U'a', 0xFFFD}));
}
