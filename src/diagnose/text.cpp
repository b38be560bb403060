#include "text.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "loratrain/diagnose/line_reader.h"

namespace lt::diagnose::detail {

std::string snippet(std::string_view text, size_t max) {
  if (text.size() <= max) return to_valid_utf8(text);
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return to_valid_utf8(text.substr(0, cut)) + "...";
}

std::optional<int64_t> parse_size_at(std::string_view s, size_t pos, size_t* end) {
  while (pos < s.size() && s[pos] == ' ') ++pos;
  size_t i = pos;
  while (i < s.size() && (is_digit(s[i]) || s[i] == '.' || s[i] == ',')) ++i;
  if (i == pos) return std::nullopt;
  std::string num;
  for (size_t k = pos; k < i; ++k)
    if (s[k] != ',') num.push_back(s[k]);
  char* e = nullptr;
  const double v = std::strtod(num.c_str(), &e);
  if (e == num.c_str() || !std::isfinite(v)) return std::nullopt;
  size_t u = i;
  while (u < s.size() && s[u] == ' ') ++u;
  size_t ue = u;
  while (ue < s.size() && is_alpha(s[ue])) ++ue;
  std::string unit;
  for (size_t k = u; k < ue; ++k) unit.push_back(lower(s[k]));
  double scale;
  if (unit == "b" || unit == "bytes" || unit == "byte") scale = 1;
  else if (unit == "kib" || unit == "kb" || unit == "k") scale = 1024.0;
  else if (unit == "mib" || unit == "mb" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "gb" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "tb") scale = 1024.0 * 1024 * 1024 * 1024;
  else return std::nullopt;
  // PyTorch's MPS message says GB/MB for binary units too; all are read as binary.
  const double bytes = v * scale;
  if (bytes > 9.0e18) return std::nullopt;
  if (end) *end = ue;
  return static_cast<int64_t>(std::llround(bytes));
}

std::optional<int64_t> int_after(std::string_view s, size_t pos, size_t window) {
  const size_t lim = std::min(s.size(), pos + window);
  for (size_t i = pos; i < lim; ++i) {
    if (!is_digit(s[i])) continue;
    const bool neg = i > 0 && s[i - 1] == '-';
    int64_t v = 0;
    size_t k = i;
    while (k < s.size() && is_digit(s[k]) && v < (int64_t(1) << 40)) v = v * 10 + (s[k++] - '0');
    return neg ? -v : v;
  }
  return std::nullopt;
}

std::string_view strip_prefix(std::string_view s) {
  for (int round = 0; round < 4; ++round) {
    const size_t before = s.size();
    if (starts_with(s, "> ")) s.remove_prefix(2);
    if (s.size() > 3 && (starts_with(s, "[rank") || starts_with(s, "[default"))) {
      const size_t close = s.find("]:");
      if (close != std::string_view::npos && close < 16) {
        s.remove_prefix(close + 2);
        if (!s.empty() && s[0] == ' ') s.remove_prefix(1);
      }
    }
    // "2024-08-01 12:00:00[,.]123 " / "[2024-08-01 12:00:00,123] " / "12:00:00 "
    size_t i = 0;
    const bool bracket = !s.empty() && s[0] == '[';
    if (bracket) i = 1;
    const size_t start = i;
    while (i < s.size() && i - start < 32 &&
           (is_digit(s[i]) || s[i] == '-' || s[i] == ':' || s[i] == ' ' || s[i] == ',' || s[i] == '.' ||
            s[i] == 'T' || s[i] == '/'))
      ++i;
    if (i - start >= 8 && std::count(s.begin() + start, s.begin() + i, ':') >= 2) {
      if (bracket && i < s.size() && s[i] == ']') ++i;
      while (i < s.size() && (s[i] == ' ' || s[i] == '|' || s[i] == '-')) ++i;
      s.remove_prefix(i);
    }
    // "[INFO] " / "[WARNING] " (fluxgym, many GUIs) go; "[ERROR]" lines stay recognisable through
    // the caller's own check of the whole line.
    for (const char* lvl : {"[INFO]", "[WARNING]", "[WARN]", "[DEBUG]", "[ERROR]", "[CRITICAL]"}) {
      const size_t n = std::strlen(lvl);
      if (s.size() > n && s.compare(0, n, lvl) == 0) {
        s.remove_prefix(n);
        if (!s.empty() && s[0] == ' ') s.remove_prefix(1);
        break;
      }
    }
    for (const char* lvl : {"INFO", "WARNING", "WARN", "ERROR", "DEBUG", "CRITICAL"}) {
      const size_t n = std::strlen(lvl);
      if (s.size() > n && s.compare(0, n, lvl) == 0 && (s[n] == ':' || s[n] == ' ' || s[n] == ']')) {
        size_t k = n;
        while (k < s.size() && (s[k] == ':' || s[k] == ' ' || s[k] == ']' || s[k] == '|')) ++k;
        if (std::strcmp(lvl, "ERROR") != 0 && std::strcmp(lvl, "CRITICAL") != 0) s.remove_prefix(k);
        break;
      }
    }
    if (s.size() == before) break;
  }
  return s;
}

std::string_view exception_class(std::string_view s) {
  if (s.empty() || !(is_alpha(s[0]) || s[0] == '_')) return {};
  size_t i = 0;
  while (i < s.size() && (is_word(s[i]) || s[i] == '.')) ++i;
  const std::string_view name = s.substr(0, i);
  if (i < s.size() && s[i] != ':') return {};
  for (std::string_view suffix : {"Error", "Exception", "Interrupt", "Exit", "Failure"})
    if (ends_with(name, suffix)) return name;
  return {};
}

}  // namespace lt::diagnose::detail
