#include "unicode.h"

#include <algorithm>

namespace lt::models::unicode {

namespace {

struct CharRange {
  uint32_t first, last;
  uint8_t cls;
};
struct CodePair {
  uint32_t cp, value;
};
struct Decomposition {
  uint32_t cp, offset, length;
};
struct Composition {
  uint32_t first, second, composite;
};

#include "unicode_tables.inc"

template <typename T, size_t N>
const T* find_cp(const T (&table)[N], char32_t c) {
  const T* end = table + N;
  const T* it = std::lower_bound(table, end, static_cast<uint32_t>(c), [](const T& e, uint32_t v) { return e.cp < v; });
  return it != end && it->cp == c ? it : nullptr;
}

uint32_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const CodePair* e = find_cp(kCombiningClass, c);
  return e ? e->value : 0;
}

// Hangul syllables are composed and decomposed algorithmically (Unicode ch. 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void decompose(char32_t c, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* d = c < 0xC0 ? nullptr : find_cp(kDecompositions, c);
  if (!d) {
    out.push_back(c);
    return;
  }
  for (uint32_t i = 0; i < d->length; ++i) out.push_back(kDecompositionData[d->offset + i]);
}

char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const Composition* end = kCompositions + sizeof(kCompositions) / sizeof(kCompositions[0]);
  const Composition* it = std::lower_bound(kCompositions, end, std::make_pair(a, b), [](const Composition& e, auto v) {
    return e.first < v.first || (e.first == v.first && e.second < v.second);
  });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

char32_t lower_simple(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  const CodePair* e = find_cp(kLowerMap, c);
  return e ? e->value : c;
}

// 1 = Cased, 2 = Case_Ignorable, 0 = neither (Python's lower() looks at nothing else).
uint8_t case_property(char32_t c) {
  const CharRange* end = kCaseRanges + sizeof(kCaseRanges) / sizeof(kCaseRanges[0]);
  const CharRange* it = std::upper_bound(kCaseRanges, end, static_cast<uint32_t>(c),
                                         [](uint32_t v, const CharRange& e) { return v < e.first; });
  if (it == kCaseRanges) return 0;
  --it;
  return c <= it->last ? it->cls : 0;
}
bool is_cased(char32_t c) { return case_property(c) == 1; }
bool is_case_ignorable(char32_t c) { return case_property(c) == 2; }

}  // namespace

CharClass char_class(char32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
    if (c >= '0' && c <= '9') return CharClass::kNumber;
    if (c == ' ') return CharClass::kSpaceSeparator;
    if (c < 0x20 || c == 0x7F) return CharClass::kOther;
    return CharClass::kDefault;
  }
  const CharRange* end = kCharRanges + sizeof(kCharRanges) / sizeof(kCharRanges[0]);
  const CharRange* it = std::upper_bound(kCharRanges, end, static_cast<uint32_t>(c),
                                         [](uint32_t v, const CharRange& e) { return v < e.first; });
  if (it == kCharRanges) return CharClass::kDefault;
  --it;
  return c <= it->last ? static_cast<CharClass>(it->cls) : CharClass::kDefault;
}

bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::u32string decode_utf8(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    size_t len = 0;
    char32_t cp = 0, min = 0;
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07, min = 0x10000;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

std::u32string to_lower(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE: the one unconditional 1:2 mapping
      out.push_back('i');
      out.push_back(0x307);
    } else if (c == 0x3A3) {  // Final_Sigma: preceded by a cased letter and not followed by one
      size_t j = i;
      while (j > 0 && is_case_ignorable(s[j - 1])) --j;
      bool final_sigma = j > 0 && is_cased(s[j - 1]);
      if (final_sigma) {
        size_t k = i + 1;
        while (k < s.size() && is_case_ignorable(s[k])) ++k;
        final_sigma = k == s.size() || !is_cased(s[k]);
      }
      out.push_back(final_sigma ? 0x3C2 : 0x3C3);
    } else {
      out.push_back(lower_simple(c));
    }
  }
  return out;
}

std::u32string nfc(const std::u32string& s) {
  bool ascii = true;
  for (char32_t c : s) ascii = ascii && c < 0x80;
  if (ascii) return s;
  // 1. Full canonical decomposition.
  std::u32string d;
  d.reserve(s.size() + 8);
  for (char32_t c : s) decompose(c, d);
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(i), d.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // 3. Canonical composition: a character joins the last starter unless blocked by one in between
  //    whose class is 0 or not lower than its own.
  std::u32string out;
  out.reserve(d.size());
  std::ptrdiff_t starter = -1;
  uint32_t last_class = 0;
  for (char32_t c : d) {
    const uint32_t cc = combining_class(c);
    if (starter >= 0) {
      const bool adjacent = static_cast<std::ptrdiff_t>(out.size()) - 1 == starter;
      const bool blocked = !adjacent && (last_class == 0 || last_class >= cc);
      if (!blocked) {
        const char32_t composite = compose(out[static_cast<size_t>(starter)], c);
        if (composite != 0) {
          out[static_cast<size_t>(starter)] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<std::ptrdiff_t>(out.size());
    last_class = cc;
    out.push_back(c);
  }
  return out;
}

}  // namespace lt::models::unicode
