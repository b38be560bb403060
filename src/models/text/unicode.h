// The few Unicode operations the CLIP tokenizer's text cleanup needs (private to src/models/text).
// Properties come from unicode_tables.inc, generated from Python's unicodedata so that they agree
// with the reference tokenizer's own database.
#pragma once
#include <cstdint>
#include <string>

namespace lt::models::unicode {

enum class CharClass : uint8_t {
  kDefault = 0,         // punctuation, symbols, marks other than Mn, Zl/Zp
  kLetter = 1,          // L*
  kNumber = 2,          // N*
  kSpaceSeparator = 3,  // Zs
  kOther = 4,           // C* (controls, format, surrogates, private use, unassigned)
  kNonspacingMark = 5,  // Mn
};

CharClass char_class(char32_t c);
inline bool is_letter(char32_t c) { return char_class(c) == CharClass::kLetter; }
inline bool is_number(char32_t c) { return char_class(c) == CharClass::kNumber; }
// The Unicode White_Space property (what `\s` matches in the `regex` module).
bool is_white_space(char32_t c);
// transformers BasicTokenizer._is_chinese_char: the CJK ideograph blocks.
bool is_cjk_ideograph(char32_t c);

// UTF-8 <-> code points; each invalid byte decodes to U+FFFD.
std::u32string decode_utf8(const std::string& s);
void append_utf8(std::string& out, char32_t c);
std::string encode_utf8(const std::u32string& s);

// Python's str.lower(): the Unicode lower-case mapping, U+0130 -> "i\u0307", and Greek capital
// sigma -> final sigma at the end of a word (the Final_Sigma context, with Cased/Case_Ignorable).
std::u32string to_lower(const std::u32string& s);
// Canonical composition (Unicode normalisation form C).
std::u32string nfc(const std::u32string& s);

}  // namespace lt::models::unicode
